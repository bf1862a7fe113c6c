//! The parts of `compare`'s report made from the opened session: each path
//! as run (with the notes on dtype overrides and MISSING tensors), the NaN /
//! Inf counts of the weights it read, the prompts as run, and the drafter's
//! τ added to the summary.

use super::{LmHeadOrigin, PathRun, PromptInfo};
use crate::loading::{self, Inventory, WeightOrigin};
use crate::parity::IncrementalCheck;
use crate::parity::Verdict;
use crate::prompts::preview;
use crate::report::DrafterReport;
use crate::session::Session;

/// Each path as it runs (class, dtypes, lm_head origin), with notes on
/// `--dtype` overrides and MISSING tensors (initialised from `seed`).
pub fn paths_as_run(session: &Session, seed: u64, notes: &mut Vec<String>) -> Vec<PathRun> {
    session
        .paths
        .iter()
        .map(|p| {
            let prec = p.compute;
            if prec != p.dtype {
                notes.push(format!(
                    "{} would load in {} ({}); --dtype {prec} overrides it",
                    p.path.name(),
                    p.dtype,
                    p.inventory.dtype_reason
                ));
            }
            if p.inventory.missing > 0 {
                notes.push(format!(
                    "{} has {} MISSING tensor{}, initialised as transformers would (seed {seed}): {}",
                    p.path.name(),
                    p.inventory.missing,
                    if p.inventory.missing == 1 { "" } else { "s" },
                    p.inventory
                        .missing_names
                        .iter()
                        .take(3)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            PathRun {
                name: p.path,
                class: p.inventory.class.clone(),
                dtype: p.dtype,
                dtype_reason: p.inventory.dtype_reason.clone(),
                compute_dtype: prec,
                missing: p.inventory.missing,
                tie: p.inventory.tied_lm_head,
                lm_head: match p.view.origin("lm_head.weight") {
                    None => LmHeadOrigin::None,
                    Some(WeightOrigin::Checkpoint { .. } | WeightOrigin::Converted { .. }) => {
                        LmHeadOrigin::Checkpoint
                    }
                    Some(WeightOrigin::Tied { key }) => LmHeadOrigin::Tied(key.clone()),
                    Some(WeightOrigin::Missing { init, .. }) => {
                        LmHeadOrigin::Missing(init.to_string())
                    }
                },
                non_finite_weights: Default::default(),
            }
        })
        .collect()
}

/// Gives each path the NaN/Inf counts of the checkpoint keys its view reads
/// ([`Session::weight_findings`]; call after the run, which counts them).
pub fn attach_non_finite(session: &Session, paths_run: &mut [PathRun], notes: &mut Vec<String>) {
    for (run, f) in paths_run.iter_mut().zip(session.weight_findings()) {
        run.non_finite_weights = f.non_finite;
        for (name, nf) in &run.non_finite_weights {
            notes.push(format!(
                "{}: weight {name} holds {} NaN and {} Inf values",
                run.name, nf.nan, nf.inf
            ));
        }
    }
}

/// The prompts as run.
pub fn prompt_infos(session: &Session) -> Vec<PromptInfo> {
    session
        .prompts
        .iter()
        .enumerate()
        .map(|(k, p)| PromptInfo {
            index: k,
            source: p.source_kind(),
            tokens: p.ids.len(),
            preview: p.fed_text().map(preview),
            origin: p.origin.clone(),
            chat: p.chat.is_some(),
            rendered_sha256: p.rendered_sha256(),
        })
        .collect()
}

/// Adds the drafter's τ per path to the summary, with what it was measured
/// on; a τ gap over the limit (or a drafter made for another target) fails
/// the run.
pub fn append_drafter(d: &DrafterReport, verdict: &mut Verdict, summary: &mut String) {
    let taus: Vec<String> = d
        .paths
        .iter()
        .map(|p| format!("{} {:.2}", p.name, p.summary.tau_macro))
        .collect();
    summary.push_str(&format!("; drafter τ {}", taus.join(" vs ")));
    if d.verdict != Verdict::Pass {
        *verdict = Verdict::Fail;
        summary.push_str(&format!(" ({})", d.failures().join("; ")));
    } else if let Some(g) = &d.tau_gap_interval {
        summary.push_str(&format!(" ({})", g.sentence()));
    }
    summary.push_str(&format!(", on {}", d.measured_on));
    // `--engine-metrics`: a gap is among the failures above; agreement is said here.
    if let Some(e) = d.engine.as_ref().filter(|e| !e.is_gap()) {
        summary.push_str(&format!("; {}", e.headline()));
    }
}

/// Fails the run on every path whose cached decode departs from its full
/// forward, saying so in the summary.
pub fn append_incremental(
    checks: &[IncrementalCheck],
    verdict: &mut Verdict,
    summary: &mut String,
) {
    for c in checks.iter().filter(|c| c.verdict != Verdict::Pass) {
        *verdict = Verdict::Fail;
        summary.push_str(&format!(
            "; {}: cached decode departs from the full forward (max abs diff {:.3e})",
            c.path, c.metrics.max_abs
        ));
    }
}

/// The tensor inventory of the session's paths.
pub fn inventory(session: &Session) -> Inventory {
    loading::inventory::inventory_of(
        &session.ckpt,
        session.paths.iter().map(|p| p.inventory.clone()).collect(),
    )
}
