//! `drafter --features`' report: τ on the file's taps next to τ on each
//! loading path's own taps over the same tokens, and the gap between them.

use super::format::tau;
use super::tabular::{Cell, Column, Row, Sinks, Table};
use super::{Body, Environment, Kind, Report};
use crate::drafter::eval::PathTau;
use crate::drafter::features::FeaturesEval;
use crate::parity::Verdict;
use crate::width::Width;

/// `drafter --features`' report: the envelope around [`FeaturesEval`] (kind `drafter`).
pub type FeaturesReport = Report<FeaturesEval>;

/// The report of `eval`: fails when a path's τ is further than the limit from the file's.
pub fn build(
    eval: FeaturesEval,
    environment: Environment,
    command: String,
    notes: Vec<String>,
) -> FeaturesReport {
    let verdict = if eval.tau_gap > eval.max_tau_gap {
        Verdict::Fail
    } else {
        Verdict::Pass
    };
    let f = &eval.features.tau;
    let paths: Vec<String> = eval
        .paths
        .iter()
        .map(|p| format!("{} {:.2}", p.name, p.summary.tau_macro))
        .collect();
    let gap = crate::drafter::gap::gap_clause(
        eval.tau_gap,
        eval.max_tau_gap,
        eval.tau_gap_interval.as_ref(),
    );
    let summary = format!(
        "drafter τ on the file's taps {:.2} vs {} on the paths' own taps over the same tokens (DDTree-{} {:.2}){}",
        f.summary.tau_macro,
        paths.join(" vs "),
        f.ddtree.budget,
        f.ddtree.tau_macro,
        gap.map(|g| format!("; {g}")).unwrap_or_default()
    );
    let summary = format!("{summary}; τ on {}", eval.measured_on);
    let mut notes = notes;
    if let Some(n) = eval.drafter.window_note() {
        notes.insert(0, n);
    }
    if let Some(n) = eval.drafter.unexpected_note() {
        notes.insert(0, n);
    }
    Report::new(
        Kind::Drafter,
        verdict,
        &summary,
        environment,
        command,
        notes,
        eval,
    )
}

fn row(what: Cell, p: &PathTau) -> Row {
    let rounds: usize = p
        .per_prompt
        .iter()
        .map(|x| x.acceptance_lengths.len())
        .sum();
    let acc: Vec<String> = p
        .summary
        .per_position_acceptance
        .iter()
        .map(|a| format!("{a:.2}"))
        .collect();
    Row::new(vec![
        what,
        p.dtype.name().into(),
        tau(p.summary.tau_macro).into(),
        tau(p.summary.tau_pooled).into(),
        tau(p.ddtree.tau_macro).into(),
        rounds.to_string().into(),
        acc.join(" ").into(),
        p.lm_head_from.to_string().into(),
    ])
}

/// The τ table: the file's taps, then each path's own taps over the same tokens.
pub fn tau_table(e: &FeaturesEval) -> Table {
    let mut t = Table::new(vec![
        Column::new("taps"),
        Column::new("dtype"),
        Column::new("τ (macro)"),
        Column::new("τ (pooled)"),
        Column::new(format!("DDTree-{} τ", e.features.tau.ddtree.budget)),
        Column::new("rounds").only(Sinks::Terminal),
        Column::new("accept@1..").only(Sinks::Terminal),
        Column::new("lm_head"),
    ]);
    t.push(row(
        Cell::plain(format!("the file's ({})", e.features.format)),
        &e.features.tau,
    ));
    for p in &e.paths {
        t.push(row(Cell::code(format!("{} (own taps)", p.name)), p));
    }
    t
}

/// The terminal rendering.
pub fn render(r: &FeaturesReport, width: Width) -> String {
    let f = &r.features;
    let tokens: usize = f.prompts.iter().map(|p| p.replayed_new_tokens).sum();
    let mut out = format!(
        "{}\ndrafter {}: taps {:?} read from {} of {}; {} sequence(s), {tokens} response tokens replayed (at most {} each)\n",
        r.summary,
        r.drafter.source,
        r.drafter.target_layer_ids,
        f.taps.join(", "),
        f.file,
        f.prompts.len(),
        r.max_new_tokens
    );
    out.push_str(&format!(
        "drafter vs target: {}\n",
        crate::drafter::audit::describe(&r.drafter.audit)
    ));
    out.push_str(&tau_table(r).render(width));
    out.push_str(&format!("\nτ rule: {}\n", r.end_rule.describe()));
    for n in &r.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

impl Body for FeaturesEval {
    fn terminal(report: &Report<Self>, width: Width) -> String {
        render(report, width)
    }
}
