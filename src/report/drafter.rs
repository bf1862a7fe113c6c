//! The drafter report (`drafter --json`, and `compare --json`'s `drafter`
//! member): τ per loading path side by side, the cross runs, the τ gap.

use super::format::tau;
use super::tabular::{Cell, Column, Row, Sinks, Span, Table};
use super::{Body, Environment, Kind, Report};
use crate::drafter::engine_gap::EngineComparison;
use crate::drafter::engine_metrics::MetricsFormat;
use crate::drafter::paths::DrafterEval;
use crate::parity::Verdict;
use crate::width::Width;

/// The drafter report: the envelope around [`DrafterEval`].
pub type DrafterReport = Report<DrafterEval>;

/// The report of `eval`: fails when the τ gap between paths exceeds the limit.
pub fn build(
    eval: DrafterEval,
    environment: Environment,
    command: String,
    notes: Vec<String>,
) -> DrafterReport {
    let verdict = if eval.failures().is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail
    };
    let join = |f: &dyn Fn(&crate::drafter::eval::PathTau) -> String| {
        eval.paths.iter().map(f).collect::<Vec<_>>().join(" vs ")
    };
    let gap = crate::drafter::gap::gap_clause(
        eval.tau_gap,
        eval.max_tau_gap,
        eval.tau_gap_interval.as_ref(),
    );
    let summary = format!(
        "drafter τ {} (DDTree-{} {}){}",
        join(&|p| format!("{} {:.2}", p.name, p.summary.tau_macro)),
        eval.paths.first().map(|p| p.ddtree.budget).unwrap_or(0),
        join(&|p| format!("{:.2}", p.ddtree.tau_macro)),
        gap.map(|g| format!("; {g}")).unwrap_or_default()
    );
    let summary = match eval.departures().first() {
        Some(first) => format!("{summary}; {first}"),
        None => summary,
    };
    let summary = match &eval.engine {
        Some(e) => format!("{summary}; {}", e.headline()),
        None => summary,
    };
    let summary = format!("{summary}; τ on {}", eval.measured_on);
    // The findings about the drafter itself lead: with them, τ is not the
    // trained drafter's on this target.
    let mut findings = crate::drafter::audit::mismatches(&eval.drafter.audit);
    findings.extend(eval.drafter.unexpected_finding());
    let summary = match findings.is_empty() {
        true => summary,
        false => format!("{}; {summary}", findings.join("; ")),
    };
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

/// The τ table: one row per loading path, then the cross runs.
pub fn tau_table(d: &DrafterEval) -> Table {
    let budget = d.paths.first().map(|p| p.ddtree.budget).unwrap_or(0);
    let mut t = Table::new(vec![
        Column::new("path"),
        Column::new("dtype"),
        Column::new("τ (macro)"),
        Column::new("τ (pooled)"),
        Column::new(format!("DDTree-{budget} τ")),
        Column::new("rounds").only(Sinks::Terminal),
        Column::new("sweeps").only(Sinks::Terminal),
        Column::new("accept@1..").only(Sinks::Terminal),
        Column::new("lm_head"),
    ]);
    for p in &d.paths {
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
        t.push(Row::new(vec![
            Cell::code(&p.name),
            p.dtype.name().into(),
            tau(p.summary.tau_macro).into(),
            tau(p.summary.tau_pooled).into(),
            tau(p.ddtree.tau_macro).into(),
            rounds.to_string().into(),
            p.sweeps.to_string().into(),
            acc.join(" ").into(),
            p.lm_head_from.to_string().into(),
        ]));
    }
    for c in &d.cross {
        t.push(Row::new(vec![
            Cell::Text(vec![
                Span::Code(c.features.clone()),
                Span::Plain(" features on ".into()),
                Span::Code(c.trajectory.clone()),
                Span::Plain(" trajectory".into()),
            ]),
            "-".into(),
            tau(c.tau_macro).into(),
            tau(c.tau_pooled).into(),
            tau(c.ddtree_tau_macro).into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
        ]));
    }
    t
}

/// One line about the drafter: taps, block size, mask token, dtype, tokens.
fn drafter_line(d: &DrafterEval, source: &str) -> String {
    let tokens = match &d.trajectories {
        Some(t) => format!(
            "τ on the supplied trajectories {} (sha256 {}): {} prompts, up to {} output tokens replayed per prompt",
            t.file,
            t.sha256,
            t.output_tokens.len(),
            d.max_new_tokens
        ),
        None => format!("{} new tokens per prompt", d.max_new_tokens),
    };
    format!(
        "{source}: taps {:?}, block size {}, mask token {}, computed in {}; {tokens}",
        d.drafter.target_layer_ids, d.drafter.block_size, d.drafter.mask_token_id, d.drafter.dtype,
    )
}

/// The trajectory check, one line per path, with the near-tie threshold.
fn trajectory_lines(d: &DrafterEval) -> Vec<String> {
    let Some(t) = &d.trajectories else {
        return Vec::new();
    };
    let mut out: Vec<String> = t.paths.iter().map(|p| p.describe()).collect();
    out.push(format!(
        "near-tie: top-1 logit minus the given token's ≤ {} × max(1, |top-1|) (listed, not failed)",
        t.near_tie_margin
    ));
    out
}

/// The engine's acceptance beside hsparity's, per draft position
/// (`--engine-metrics`), with the conclusion.
fn engine_table(e: &EngineComparison) -> Table {
    let mut t = Table::new(vec![
        Column::new("measure"),
        Column::new("engine"),
        Column::new(format!("hsparity ({})", e.path)),
    ]);
    let row = |t: &mut Table, m: String, a: String, b: String| {
        t.push(Row::new(vec![m.into(), a.into(), b.into()]))
    };
    row(
        &mut t,
        "τ (pooled: 1 + accepted/drafts)".into(),
        tau(e.engine_tau_pooled),
        tau(e.tau_pooled),
    );
    if let Some(m) = e.engine_tau_macro {
        row(
            &mut t,
            "τ (macro: mean per request)".into(),
            tau(m),
            tau(e.tau_macro),
        );
    }
    row(
        &mut t,
        "rounds with drafts".into(),
        e.engine_rounds.to_string(),
        e.rounds.to_string(),
    );
    row(
        &mut t,
        "accepted draft tokens".into(),
        e.engine_accepted.to_string(),
        e.accepted.to_string(),
    );
    for p in &e.per_position {
        row(
            &mut t,
            format!("accepted at draft position {}", p.position),
            format!("{:.4}", p.engine),
            format!("{:.4}", p.hsparity),
        );
    }
    t
}

/// The engine comparison's heading line.
fn engine_line(e: &EngineComparison) -> String {
    let what = match e.metrics.format {
        MetricsFormat::Prometheus => "Prometheus counters",
        MetricsFormat::VllmPerRequest => "vLLM per-request metrics",
    };
    format!("engine metrics: {} ({what})", e.metrics.file)
}

/// The terminal rendering.
pub fn render(d: &DrafterReport, width: Width) -> String {
    let mut out = format!(
        "{}\ndrafter {}\n",
        d.summary,
        drafter_line(d, &d.drafter.source)
    );
    if let Some(line) = d.environment.rendering_line() {
        out.push_str(&format!("prompts: {line}\n"));
    }
    out.push_str(&format!(
        "drafter vs target: {}\n",
        crate::drafter::audit::describe(&d.drafter.audit)
    ));
    out.push_str(&format!("memory: {}\n", d.plan.describe()));
    out.push_str(&tau_table(d).render(width));
    out.push_str(&format!("\nτ rule: {}\n", d.end_rule.describe()));
    for l in trajectory_lines(d) {
        out.push_str(&format!("trajectories: {l}\n"));
    }
    if let Some(e) = &d.engine {
        out.push_str(&format!("{}\n", engine_line(e)));
        out.push_str(&engine_table(e).render(width));
        out.push_str(&format!("\nengine comparison: {}\n", e.conclusion));
    }
    for n in &d.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// The Markdown section (`compare --drafter`'s `report.md`).
pub fn markdown(d: &DrafterReport) -> String {
    let mut out = format!(
        "\n## Drafter τ\n\n{}\n\nDrafter {}.\n\n{}\nτ rule: {}.\n",
        d.summary,
        drafter_line(d, &format!("`{}`", d.drafter.source)),
        tau_table(d).markdown(),
        d.end_rule.describe()
    );
    let lines = trajectory_lines(d);
    if !lines.is_empty() {
        out.push_str("\nSupplied trajectories:\n\n");
        for l in lines {
            out.push_str(&format!("- {l}\n"));
        }
    }
    if let Some(e) = &d.engine {
        out.push_str(&format!(
            "\n### Engine acceptance\n\n{}.\n\n{}\n{}.\n",
            crate::text::capitalised(&engine_line(e)),
            engine_table(e).markdown(),
            crate::text::capitalised(&e.conclusion)
        ));
    }
    out
}

impl Body for DrafterEval {
    fn terminal(report: &Report<Self>, width: Width) -> String {
        render(report, width)
    }
}
