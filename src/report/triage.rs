//! `triage`'s report: the baseline and the ranked suspects (terminal and
//! Markdown, from one table).

use super::format::{cos6, delta, sci, seconds, tau};
use super::tabular::{Column, Row, Sinks, Table};
use super::{Body, Environment, Kind, Report};
use crate::drafter::trajectories::PathDepartures;
use crate::error::Result;
use crate::triage::{SuspectGroup, Triage, VariantResult};
use crate::width::Width;

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

/// The 95 % interval cell: `[-0.40, +0.12] holds 0` when it holds 0
/// (explained under the table, [`not_distinguishable`]), `[-6.90, -6.53]`
/// when it does not, `-` without an interval.
fn interval_cell(v: &VariantResult) -> String {
    match &v.delta_tau_interval {
        Some(i) if i.contains_zero => format!("{} holds 0", i.describe()),
        Some(i) => i.describe(),
        None => "-".into(),
    }
}

/// What an interval that holds 0 means, when a variant has one.
fn not_distinguishable(r: &Triage) -> Option<String> {
    let n = r
        .variants
        .iter()
        .filter_map(|v| v.delta_tau_interval.as_ref())
        .find(|i| i.contains_zero)?;
    Some(format!(
        "an interval that holds 0: the variant's τ is not distinguishable from the baseline's with {} prompt{}",
        n.prompts,
        if n.prompts == 1 { "" } else { "s" }
    ))
}

/// The first divergent tap of a variant: `1 (hs 2)`, `-` when none; with
/// the baseline's tap noise floor, `- (0.22× floor)` inside it.
fn first_tap_cell(v: &VariantResult) -> String {
    let tap = match v.first_divergent {
        Some(hs) if hs > 0 => format!("{} (hs {hs})", hs - 1),
        Some(hs) => format!("hs {hs}"),
        None => "-".into(),
    };
    match (v.tap_noise_ratio, v.first_divergent) {
        (Some(Some(r)), None) if r > 0.0 => format!("{tap} ({r:.2}× floor)"),
        _ => tap,
    }
}

/// The baseline's tap noise floor as a line (`None` without one).
fn tap_floor_line(r: &Triage) -> Option<String> {
    let f = r.baseline.tap_noise_floor.as_ref()?;
    let bands: Vec<String> = f
        .rows
        .iter()
        .filter_map(|row| {
            let b = f.band(row.index)?;
            Some(format!(
                "tap {} rel L2 ≤ {}, cos ≥ {}",
                row.index - 1,
                sci(b.rel_l2),
                cos6(b.cos_min)
            ))
        })
        .collect();
    Some(format!(
        "tap noise floor ({}): {}: how far two valid {} implementations of the baseline part at its taps on its \
         tokens; a variant in the baseline's dtype, compared on those tokens, whose taps stay inside it differs by \
         numerics noise, shown as `- (r× floor)` (docs/noise-floor.md)",
        f.dtype,
        bands.join("; "),
        f.dtype
    ))
}

/// What each variant emulates, one line each keyed by its name (the
/// terminal's footnotes to the table; the Markdown has them as a column).
fn descriptions(r: &Triage) -> String {
    let mut out = String::from("what each variant emulates:\n");
    for v in &r.variants {
        out.push_str(&format!("  {}: {}\n", v.name, description(v)));
    }
    out
}

/// Where each variant's first divergent tap departs along the rows, one
/// line each keyed by its name (variants whose taps diverge only).
fn taps_depart(r: &Triage) -> Vec<String> {
    r.variants
        .iter()
        .filter_map(|v| Some(format!("{}: {}", v.name, v.taps_depart.as_ref()?)))
        .collect()
}

/// What the inputs show about each variant, present ones first (the
/// ranking's order), one line each keyed by its name.
fn evidence(r: &Triage) -> Vec<String> {
    r.variants
        .iter()
        .map(|v| {
            format!(
                "{} [{}]: {}",
                v.name,
                v.evidence.presence.name(),
                v.evidence.reason
            )
        })
        .collect()
}

/// A variant's description, with where its divergence is measured.
fn description(v: &VariantResult) -> String {
    let own = if v.divergence_on == crate::triage::DivergenceOn::OwnTrajectory {
        " (divergence on its own trajectory)"
    } else {
        ""
    };
    format!("{}{own}", v.description)
}

/// Which variants a table holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rows {
    /// Every variant.
    All,
    /// The variants of one group (no group column).
    Group(SuspectGroup),
    /// The variants present in the inputs.
    Present,
}

/// The ranked variants `rows` selects, with their rank in the whole
/// ranking; seconds on the terminal only (the Markdown stays stable for
/// tickets).
pub fn variants_table(r: &Triage, rows: Rows) -> Table {
    let group = match rows {
        Rows::Group(g) => Some(g),
        _ => None,
    };
    let mut cols = vec![Column::new("rank").key(), Column::new("variant").key()];
    if group.is_none() {
        cols.push(Column::new("group"));
    }
    cols.push(Column::new("evidence"));
    cols.extend([
        Column::new("first divergent tap"),
        Column::new("cos min at taps"),
        Column::new("τ"),
        Column::new("Δτ"),
        Column::new("Δτ 95% interval"),
        Column::new("DDTree τ"),
        Column::new("batch seconds").only(Sinks::Terminal),
    ]);
    if let Some(o) = r.observed_tau {
        cols.push(Column::new(format!(
            "≈ observed {}",
            crate::text::decimals4(o)
        )));
    }
    if r.trajectories.is_some() {
        cols.push(Column::new("departs from the given tokens"));
    }
    cols.push(Column::new("what it emulates").only(Sinks::Markdown));
    let mut t = Table::new(cols);
    for (i, v) in r.variants.iter().enumerate() {
        let shown = match rows {
            Rows::All => true,
            Rows::Group(g) => g == v.group,
            Rows::Present => v.evidence.presence == crate::triage::Presence::Present,
        };
        if !shown {
            continue;
        }
        let mut row = vec![(i + 1).to_string().into(), v.name.clone().into()];
        if group.is_none() {
            row.push(v.group.name().into());
        }
        row.push(v.evidence.presence.name().into());
        row.extend([
            first_tap_cell(v).into(),
            cos6(v.cos_min_at_taps).into(),
            tau(v.tau_macro).into(),
            delta(v.delta_tau).into(),
            interval_cell(v).into(),
            tau(v.ddtree_tau_macro).into(),
            seconds(v.wall_s).into(),
        ]);
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
        row.push(description(v).into());
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
    let form = match b.linear_attention {
        true => format!("{} Gated DeltaNet, ", b.gdn_form.name()),
        false => String::new(),
    };
    format!(
        "{path} ({}, {form}taps {:?}): τ {}, DDTree τ {}",
        b.dtype,
        b.taps,
        tau(b.tau_macro),
        tau(b.ddtree_tau_macro)
    )
}

/// The uncertainty line: method, resamples, seed.
fn uncertainty_line(r: &Triage) -> String {
    let u = &r.uncertainty;
    format!(
        "Δτ intervals: {:.0}% {} ({} resamples, seed {}; {})",
        u.level * 100.0,
        u.method,
        u.resamples,
        u.seed,
        crate::text::counted(r.baseline.per_prompt.len(), "prompt", None)
    )
}

/// Where the top suspect's harness leaves the greedy continuation, per
/// prompt (only when some prompt does).
fn departure_line(r: &Triage) -> Option<String> {
    let v = r.variants.iter().find(|v| v.name == "harness-gdn-crop")?;
    let d = v.departs_from_greedy_at.as_ref()?;
    let left: Vec<String> = d
        .iter()
        .enumerate()
        .filter_map(|(k, x)| x.map(|x| format!("prompt {k} at new token {x}")))
        .collect();
    Some(format!(
        "harness-gdn-crop leaves the greedy continuation on {} of {} prompts{}",
        left.len(),
        d.len(),
        if left.is_empty() {
            String::new()
        } else {
            format!(": {}", left.join(", "))
        }
    ))
}

/// Terminal rendering.
pub fn render(r: &TriageReport, width: Width) -> String {
    let mut out = format!(
        "{}\n\nbaseline: {}\n",
        r.summary,
        baseline_line(r, r.baseline.path.name())
    );
    if let Some(line) = r.environment.rendering_line() {
        out.push_str(&format!("prompts: {line}\n"));
    }
    out.push_str(&format!(
        "drafter vs target: {}\nτ rule: {}\n",
        crate::drafter::audit::describe(&r.drafter_audit),
        r.end_rule.describe()
    ));
    out.push_str(&variants_table(r, Rows::All).render(width));
    out.push('\n');
    if let Some(l) = tap_floor_line(r) {
        out.push_str(&crate::width::fill(&format!("{l}\n"), width));
    }
    if let Some(n) = not_distinguishable(r) {
        out.push_str(&format!("{n}\n"));
    }
    out.push_str(
        "first divergent tap: the first tap whose features on the baseline's tokens leave the pass tolerance of the baseline's dtype (in bf16/f16, its tap noise floor); batch seconds: the variants of one batch share its time (the tap variants reuse the baseline's forward)\n",
    );
    out.push_str(&descriptions(r));
    let departs = taps_depart(r);
    if !departs.is_empty() {
        out.push_str("where the taps part (rows of the baseline's tokens both runs share):\n");
        for d in departs {
            out.push_str(&format!("  {d}\n"));
        }
    }
    out.push_str("evidence: present = the checkpoint, drafter or prompts show it; possible = it depends on a harness or engine hsparity does not see; hypothetical = it cannot occur with these inputs\n");
    for e in evidence(r) {
        out.push_str(&format!("  {e}\n"));
    }
    out.push_str(&format!(
        "wall time {:.1} s (tap variants reuse the baseline forward)\n{}\n",
        r.wall_time_s,
        uncertainty_line(r)
    ));
    if let Some(d) = departure_line(r) {
        out.push_str(&format!("{d}\n"));
    }
    for n in &r.not_applicable {
        out.push_str(&format!("not applicable: {}: {}\n", n.name, n.reason));
    }
    if let Some(c) = &r.next_check {
        out.push_str(&format!("next check: {c}\n"));
    }
    for n in &r.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// Markdown rendering (`report.md` of `triage`): the suspects grouped as
/// loading / numerics / harness / engine, the suspects that do not apply,
/// the next check. Timings stay in the JSON and on the terminal, so the
/// Markdown is stable for tickets.
pub fn markdown(r: &TriageReport) -> String {
    let mut md = format!(
        "{}\n\nBaseline: {}.\n\n",
        r.summary,
        baseline_line(r, &format!("`{}`", r.baseline.path.name()))
    );
    if let Some(line) = r.environment.rendering_line() {
        md.push_str(&format!("Prompts: {line}.\n\n"));
    }
    md.push_str(&format!("τ rule: {}.\n\n", r.end_rule.describe()));
    if let Some(l) = tap_floor_line(r) {
        md.push_str(&format!("{l}.\n\n"));
    }
    if let Some(c) = &r.next_check {
        md.push_str(&format!("**Next check:** {c}.\n\n"));
    }
    if r.variants
        .iter()
        .any(|v| v.evidence.presence == crate::triage::Presence::Present)
    {
        md.push_str("## Present in the inputs\n\nThe suspects the checkpoint, drafter or prompts show, ranked first (their reasons under \"What the inputs show\").\n\n");
        md.push_str(&variants_table(r, Rows::Present).markdown());
        md.push('\n');
    }
    for g in SuspectGroup::ALL {
        if r.variants.iter().any(|v| v.group == g) {
            md.push_str(&format!(
                "## {} suspects\n\n",
                crate::text::capitalised(g.name())
            ));
            md.push_str(&variants_table(r, Rows::Group(g)).markdown());
            md.push('\n');
        }
    }
    md.push_str("## What the inputs show\n\nPresent: the checkpoint, drafter or prompts show it; possible: it depends on a harness or engine hsparity does not see; hypothetical: it cannot occur with these inputs (emulated to show its cost).\n\n");
    for e in evidence(r) {
        md.push_str(&format!("- {e}\n"));
    }
    md.push('\n');
    let departs = taps_depart(r);
    if !departs.is_empty() {
        md.push_str("## Where the taps part\n\nPer variant, where along the rows of the baseline's tokens (those both runs share) its first divergent tap departs.\n\n");
        for d in departs {
            md.push_str(&format!("- {d}\n"));
        }
        md.push('\n');
    }
    if let Some(n) = not_distinguishable(r) {
        md.push_str(&format!("{}.\n\n", crate::text::capitalised(&n)));
    }
    md.push_str(&format!("{}.\n", uncertainty_line(r)));
    if let Some(d) = departure_line(r) {
        md.push_str(&format!("\n{d}.\n"));
    }
    if !r.not_applicable.is_empty() {
        md.push_str("\n## Not applicable\n");
        for n in &r.not_applicable {
            md.push_str(&format!("\n- `{}`: {}", n.name, n.reason));
        }
        md.push('\n');
    }
    for n in &r.notes {
        md.push_str(&format!("\n- {n}"));
    }
    md.push_str(&format!("\n\n## Reproduce\n\n```\n{}\n```\n", r.command));
    md
}

impl Body for Triage {
    const FILES: &'static [&'static str] = &["report.md", "report.json"];

    fn terminal(report: &Report<Self>, width: Width) -> String {
        render(report, width)
    }

    fn files(report: &Report<Self>) -> Result<Vec<(&'static str, String)>> {
        Ok(vec![("report.md", markdown(report))])
    }
}
