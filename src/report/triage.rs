//! `triage`'s report: the baseline and the ranked suspects (terminal and
//! Markdown, from one table).

use super::format::{cos6, delta, seconds, tau};
use super::tabular::{Column, Row, Sinks, Table};
use super::{Document, Environment, Kind, Report};
use crate::drafter::trajectories::PathDepartures;
use crate::error::Result;
use crate::triage::Triage;

/// `triage`'s report: the envelope around [`Triage`].
pub type TriageReport = Report<Triage>;

/// The report of a triage run (a ranking: it always exits 0).
pub fn build(
    triage: Triage,
    summary: String,
    environment: Environment,
    command: String,
    notes: Vec<String>,
) -> TriageReport {
    Report::ranking(Kind::Triage, summary, environment, command, notes, triage)
}

/// The ranked variants; seconds on the terminal only (the Markdown stays
/// stable for tickets).
pub fn variants_table(r: &Triage) -> Table {
    let mut cols = vec![
        Column::new("rank"),
        Column::new("variant"),
        Column::new("first divergent hs"),
        Column::new("cos min at taps"),
        Column::new("τ"),
        Column::new("Δτ"),
        Column::new("DDTree τ"),
        Column::new("seconds").only(Sinks::Terminal),
    ];
    if let Some(o) = r.observed_tau {
        cols.push(Column::new(format!("≈ observed {o}")));
    }
    if r.trajectories.is_some() {
        cols.push(Column::new("departs from the given tokens"));
    }
    cols.push(Column::new("what it emulates"));
    let mut t = Table::new(cols);
    for (i, v) in r.variants.iter().enumerate() {
        let mut row = vec![
            (i + 1).to_string().into(),
            v.name.clone().into(),
            v.first_divergent
                .map(|x| x.to_string())
                .unwrap_or_else(|| "-".into())
                .into(),
            cos6(v.cos_min_at_taps).into(),
            tau(v.tau_macro).into(),
            delta(v.delta_tau).into(),
            tau(v.ddtree_tau_macro).into(),
            seconds(v.wall_s).into(),
        ];
        if r.observed_tau.is_some() {
            row.push(
                match v.consistent_with_observed {
                    Some(true) => "yes",
                    _ => "",
                }
                .into(),
            );
        }
        if r.trajectories.is_some() {
            row.push(departs(v.departures.as_ref()).into());
        }
        row.push(v.description.clone().into());
        t.push(Row::new(row));
    }
    t
}

/// A variant's departures from the supplied trajectories: `no`, `prompt k
/// position j (n)`, near-ties only, or `-` for variants reading the
/// baseline's logits.
fn departs(d: Option<&PathDepartures>) -> String {
    match d {
        None => "- (baseline's logits)".into(),
        Some(d) => match &d.first_failure {
            Some(f) => format!(
                "prompt {} position {} ({} of {})",
                f.prompt, f.position, d.departures, d.checked
            ),
            None if d.near_ties > 0 => format!("near-ties only ({})", d.near_ties),
            None => "no".into(),
        },
    }
}

/// `baseline: causal-lm (bf16, chunked Gated DeltaNet, taps [1, 2]): τ …, DDTree τ …`.
fn baseline_line(r: &Triage, path: &str) -> String {
    let b = &r.baseline;
    format!(
        "{path} ({}, {} Gated DeltaNet, taps {:?}): τ {}, DDTree τ {}",
        b.dtype,
        b.gdn_form.name(),
        b.taps,
        tau(b.tau_macro),
        tau(b.ddtree_tau_macro)
    )
}

/// Terminal rendering.
pub fn render(r: &TriageReport) -> String {
    let mut out = format!(
        "{}\n\nbaseline: {}\n",
        r.summary,
        baseline_line(r, r.baseline.path.name())
    );
    if let Some(line) = r.environment.rendering_line() {
        out.push_str(&format!("prompts: {line}\n"));
    }
    out.push_str(&variants_table(r).terminal().to_string());
    out.push_str(&format!(
        "\nwall time {:.1} s (tap variants reuse the baseline forward)\n",
        r.wall_time_s
    ));
    for n in &r.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// Markdown rendering (`report.md` of `triage`). Timings stay in the JSON
/// and on the terminal, so the Markdown is stable for tickets.
pub fn markdown(r: &TriageReport) -> String {
    let mut md = format!(
        "{}\n\nBaseline: {}.\n\n",
        r.summary,
        baseline_line(r, &format!("`{}`", r.baseline.path.name()))
    );
    if let Some(line) = r.environment.rendering_line() {
        md.push_str(&format!("Prompts: {line}.\n\n"));
    }
    md.push_str(&variants_table(r).markdown());
    for n in &r.notes {
        md.push_str(&format!("\n- {n}"));
    }
    md.push_str(&format!("\n\n## Reproduce\n\n```\n{}\n```\n", r.command));
    md
}

impl Document for TriageReport {
    const FILES: &'static [&'static str] = &["report.md", "report.json"];

    fn terminal(&self) -> String {
        render(self)
    }

    fn files(&self) -> Result<Vec<(&'static str, String)>> {
        Ok(vec![("report.md", markdown(self))])
    }

    fn exit_code(&self) -> u8 {
        self.exit_code as u8
    }
}
