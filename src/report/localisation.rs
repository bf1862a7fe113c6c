//! The "where agreement ends" section of `compare`'s and `diff`'s
//! `report.md`: the localisation sentence and cause, each prompt's own
//! verdict at that hidden state, and its position profile.

use super::format::{cos, sci};
use super::tabular::{Cell, Column, Row, Table};
use crate::parity::localise::prompt_runs;
use crate::parity::{PairReport, PromptAgreement, Verdict};

/// `[[0, 39], [44, 47]]` as `0–39, 44–47`.
fn runs(r: &[[usize; 2]]) -> String {
    if r.is_empty() {
        return "none".into();
    }
    crate::parity::verdict::runs_text(r, "")
}

/// The Markdown section, when the pair has a localisation.
pub fn markdown(pair: &PairReport) -> Option<String> {
    let l = pair.localisation.as_ref()?;
    let row = pair.hidden_states.iter().find(|r| r.index == l.index)?;
    let mut md = format!("\n### Where agreement ends\n\n{}.\n\n", l.sentence);
    let mut t = Table::new(vec![
        Column::new("prompt").strong(),
        Column::new("positions"),
        Column::new("cos min"),
        Column::new("rel L2"),
        Column::new("agreeing positions"),
        Column::new("first departing"),
        Column::new("verdict").strong(),
    ]);
    for p in &row.prompts {
        t.push(Row {
            cells: vec![
                format!("p{}", p.prompt).into(),
                p.positions.to_string().into(),
                cos(p.cos_min).into(),
                sci(p.rel_l2).into(),
                runs(&p.agreeing).into(),
                p.first_departing
                    .map_or("-".to_string(), |f| f.to_string())
                    .into(),
                Cell::verdict(p.verdict),
            ],
            highlight: false,
        });
    }
    md.push_str(&t.markdown());
    if !l.profile.is_empty() {
        let per = |n: usize| {
            if n == 1 {
                "1 position".to_string()
            } else {
                format!("{n} positions")
            }
        };
        let uniform = l
            .profile
            .iter()
            .all(|p| p.positions_per_char == l.profile[0].positions_per_char);
        let head = if uniform {
            format!("{} per character", per(l.profile[0].positions_per_char))
        } else {
            "per character as noted".to_string()
        };
        md.push_str(&format!(
            "\nPosition profile of hidden_states[{}] ({head}; `.` agree, `#` depart, `+` mixed):\n\n```\n",
            l.index
        ));
        for p in &l.profile {
            let note = if uniform {
                String::new()
            } else {
                format!("  ({} per character)", per(p.positions_per_char))
            };
            md.push_str(&format!("p{:<3} {}{note}\n", p.prompt, p.strip));
        }
        md.push_str("```\n");
    }
    Some(md)
}

/// The departure cell of a table row: `p0–3 t40`, `p1 t0, p2 t3; p0 agrees`.
pub fn departure_cell(prompts: &[PromptAgreement]) -> String {
    let departing: Vec<&PromptAgreement> = prompts
        .iter()
        .filter(|p| p.verdict != Verdict::Pass)
        .collect();
    if departing.is_empty() {
        return "-".into();
    }
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for p in &departing {
        let f = p.first_departing.unwrap_or(0);
        match groups.iter_mut().find(|(g, _)| *g == f) {
            Some((_, v)) => v.push(p.prompt),
            None => groups.push((f, vec![p.prompt])),
        }
    }
    let mut cell = if groups.len() > 3 {
        let first = groups.iter().map(|(f, _)| *f).min().unwrap_or(0);
        format!("{} prompts, first t{first}", departing.len())
    } else {
        groups
            .iter()
            .map(|(f, v)| format!("{} t{f}", prompt_runs(v)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let clean: Vec<usize> = prompts
        .iter()
        .filter(|p| p.verdict == Verdict::Pass)
        .map(|p| p.prompt)
        .collect();
    if !clean.is_empty() {
        let verb = if clean.len() == 1 { "agrees" } else { "agree" };
        cell.push_str(&format!("; {} {verb}", prompt_runs(&clean)));
    }
    cell
}
