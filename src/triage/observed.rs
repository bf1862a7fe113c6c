//! `triage --engine-metrics`: the observed τ from a serving engine's own
//! per-request counters, on the definition triage ranks by (the macro τ
//! over the rounds hsparity replays), and the engine beside the baseline:
//! when the engine accepts what the baseline does there is no regression
//! to explain, and the summary says so first.

use super::{Baseline, TriageSettings};
use crate::drafter::engine_gap::{self, EngineComparison, GapIn, Ours};
use crate::drafter::engine_metrics::{self, prompt_tau, EngineMetrics};
use crate::drafter::trajectories::{Given, TrajectoryReport};
use crate::error::{Error, Result};
use crate::models::dflash::Drafter;
use crate::session::Session;

/// `settings` with the observed τ `--engine-metrics` gives, and the metrics
/// (for [`beside`]); unchanged without the flag. The note goes to `notes`.
///
/// Errors ([`Error::Input`]): `--observed-tau` too; a `/metrics` scrape
/// (pooled counters: triage ranks by per-prompt means); as
/// [`engine_metrics::read_for`].
pub fn with_observed(
    settings: &TriageSettings,
    session: &Session,
    drafter: &Drafter,
    given: Option<&Given>,
    notes: &mut Vec<String>,
) -> Result<(TriageSettings, Option<EngineMetrics>)> {
    let block = drafter.cfg.block_size;
    let Some(f) = settings.engine_metrics.as_deref() else {
        return Ok((settings.clone(), None));
    };
    if settings.observed_tau.is_some() {
        return Err(Error::Input(
            "--observed-tau and --engine-metrics both give the observed τ: pass one".into(),
        ));
    }
    let n = session.prompts.len();
    let m = engine_metrics::read_for(f, n, block, settings.replay.rule, given.is_some())?;
    if m.per_request.is_none() {
        return Err(Error::Input(format!(
            "{}: a /metrics scrape gives only the pooled τ, and triage ranks by per-prompt means: give vLLM's per-request metrics (--per-request-spec-decode-metrics detailed), or compare the scrape with `hsparity drafter --engine-metrics`",
            m.file
        )));
    }
    let replayed = engine_gap::replayed(given, settings.replay.max_new, n);
    let tau = m.tau_macro(&replayed).unwrap_or_default();
    notes.push(format!(
        "observed τ {}: the engine's macro τ (its per-request 1 + accepted/rounds, averaged over the prompts, over the rounds hsparity replays) from {}",
        crate::text::decimals4(tau),
        m.file
    ));
    let settings = TriageSettings {
        observed_tau: Some(tau),
        ..settings.clone()
    };
    Ok((settings, Some(m)))
}

/// The engine's counters `m` beside the baseline's rounds (the baseline's
/// departures from the supplied outputs in `trajectories`), put first in
/// `summary` ([`lead`]).
pub fn beside(
    m: Option<EngineMetrics>,
    baseline: &Baseline,
    (settings, drafter, given): (&TriageSettings, &Drafter, Option<&Given>),
    trajectories: Option<&TrajectoryReport>,
    summary: &mut String,
) -> Option<EngineComparison> {
    let m = m?;
    let block = drafter.cfg.block_size;
    let rounds: Vec<_> = baseline
        .per_prompt
        .iter()
        .map(|p| prompt_tau(p.acceptance_lengths.clone()))
        .collect();
    let replayed = engine_gap::replayed(given, settings.replay.max_new, rounds.len());
    let ours = Ours {
        name: "the baseline",
        rounds: &rounds,
        replayed: &replayed,
        block,
    };
    let departures = trajectories.map(|t| &t.paths[0]);
    let e = engine_gap::compare(m, &ours, departures);
    *summary = lead(&e, summary);
    Some(e)
}

/// The summary with the engine first: no regression to explain when it
/// accepts what the baseline does, else where its gap lies.
fn lead(e: &EngineComparison, summary: &str) -> String {
    match e.gap_in {
        GapIn::None => format!(
            "no regression to explain: the engine accepts what the baseline does (engine pooled τ {:.4} vs {:.4}), so the suspects below are what each would cost, not causes; {summary}",
            e.engine_tau_pooled, e.tau_pooled
        ),
        _ => format!("{}; {summary}", e.headline()),
    }
}
