//! hsparity's τ beside a serving engine's own acceptance counters
//! ([`super::engine_metrics`]) on the same prompts, with the definitions
//! aligned (the engine's rounds cut to those hsparity replays, both sides
//! summarised by [`super::eval::summarize`]), and where a gap lies: other
//! tokens (the engine's outputs are not this target's greedy continuation),
//! the engine's forward (same tokens, other acceptance: its hidden states at
//! the taps or its drafter's forward), or unknown (the engine's tokens were
//! not given).

use serde::Serialize;

use super::engine_metrics::EngineMetrics;
use super::eval::{summarize, PromptTau, TauSummary};
use super::trajectories::PathDepartures;

/// Draft position k (1 = the first draft token) accepted in this fraction
/// of rounds, by the engine and by hsparity.
#[derive(Debug, Clone, Serialize)]
pub struct PositionRate {
    /// Draft slot, 1-based.
    pub position: usize,
    /// The engine's fraction of rounds accepting it.
    pub engine: f64,
    /// hsparity's (`per_position_acceptance[k-1]`).
    pub hsparity: f64,
}

/// The first round where the engine's accepted drafts differ from
/// hsparity's (per-request metrics only; prompts and rounds from 0).
#[derive(Debug, Clone, Serialize)]
pub struct RoundApart {
    /// Prompt index.
    pub prompt: usize,
    /// Round index within the prompt; `None` when the engine recorded only
    /// the prompt's totals (then the accepted drafts are the prompt's).
    pub round: Option<usize>,
    /// Drafts the engine accepted there (`None`: no such round).
    pub engine_accepted: Option<u64>,
    /// Drafts hsparity accepted there (`None`: no such round).
    pub hsparity_accepted: Option<u64>,
}

/// Where the gap between the engine's acceptance and hsparity's lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GapIn {
    /// No gap: the same rounds and accepted drafts (or within 0.5 %).
    None,
    /// The engine's outputs leave this target's greedy continuation: the
    /// acceptance was measured on other tokens (its harness, or its own
    /// target forward).
    OtherTokens,
    /// Same tokens, other acceptance: a serving-side loss in the engine's
    /// hidden states at the taps or its drafter's forward.
    EngineForward,
    /// A gap, but the engine's tokens were not given (`--trajectories`).
    Unknown,
}

/// The engine's counters beside hsparity's τ of one loading path.
#[derive(Debug, Clone, Serialize)]
pub struct EngineComparison {
    /// The counters as read.
    pub metrics: EngineMetrics,
    /// The loading path (or triage's baseline) compared.
    pub path: String,
    /// `1 + accepted / rounds` over the rounds compared: vLLM's mean
    /// acceptance length.
    pub engine_tau_pooled: f64,
    /// hsparity's pooled τ (Σ(a+1) / rounds), the same definition.
    pub tau_pooled: f64,
    /// Mean over prompts of the engine's per-prompt τ (per-request files only).
    pub engine_tau_macro: Option<f64>,
    /// hsparity's macro τ.
    pub tau_macro: f64,
    /// The engine's rounds compared.
    pub engine_rounds: u64,
    /// The engine's rounds left out: those past what hsparity replays (on
    /// the engine's own outputs, the rounds whose block they do not cover).
    pub rounds_left_out: u64,
    /// hsparity's rounds.
    pub rounds: u64,
    /// Draft tokens the engine accepted in the rounds compared.
    pub engine_accepted: u64,
    /// hsparity's (Σ a).
    pub accepted: u64,
    /// Per draft position.
    pub per_position: Vec<PositionRate>,
    /// The first round apart, with per-request metrics.
    pub first_apart: Option<RoundApart>,
    /// Where a gap lies.
    pub gap_in: GapIn,
    /// One sentence: the comparison and its conclusion.
    pub conclusion: String,
}

impl EngineComparison {
    /// True when there is a gap (the run fails).
    pub fn is_gap(&self) -> bool {
        self.gap_in != GapIn::None
    }

    /// The summary's clause: `engine pooled τ 7.6967 vs hsparity 7.8525 on causal-lm: …`.
    pub fn headline(&self) -> String {
        let what = match self.gap_in {
            GapIn::None => "the engine accepts as hsparity does",
            GapIn::OtherTokens => "the engine's outputs are other tokens",
            GapIn::EngineForward => "a serving-side loss (same tokens)",
            GapIn::Unknown => "a gap (give the engine's outputs to place it)",
        };
        format!(
            "engine pooled τ {:.4} vs hsparity {:.4} on {}: {what}",
            self.engine_tau_pooled, self.tau_pooled, self.path
        )
    }
}

/// hsparity's side: a path's (or the baseline's) rounds per prompt and the
/// output tokens replayed per prompt.
pub struct Ours<'a> {
    /// Loading path or `baseline`.
    pub name: &'a str,
    /// Per prompt, its rounds.
    pub rounds: &'a [PromptTau],
    /// Output tokens replayed per prompt (`--max-new-tokens`, or what the
    /// engine's outputs cover).
    pub replayed: &'a [usize],
    /// The drafter's block size.
    pub block: usize,
}

/// Output tokens replayed per prompt: the supplied outputs' (`given`, as
/// [`super::trajectories::Given::with_replay`] set them), else `max_new` on
/// every one of `prompts`.
pub fn replayed(
    given: Option<&super::trajectories::Given>,
    max_new: usize,
    prompts: usize,
) -> Vec<usize> {
    match given {
        Some(g) => g.replayed.clone(),
        None => vec![max_new; prompts],
    }
}

/// Accepted drafts the engine may differ by and still agree: near-ties its
/// numerics resolve the other way, 0.5 % of hsparity's accepted drafts, at
/// least 1.
fn within(accepted: u64) -> u64 {
    (accepted / 200).max(1)
}

/// Rounds and accepted drafts of per-prompt rounds.
fn totals(p: &[PromptTau]) -> (u64, u64) {
    let lens = || p.iter().flat_map(|x| &x.acceptance_lengths);
    (lens().count() as u64, lens().map(|&l| l as u64 - 1).sum())
}

/// The engine's side: its rounds within what hsparity replays, summarised
/// as hsparity's (with per-step lists), else its counters.
struct Side {
    rounds: Option<Vec<PromptTau>>,
    /// Pooled τ and per-position rates (its `tau_macro` is not read: a
    /// scrape has none, see `tau_macro`).
    summary: TauSummary,
    /// Mean of the per-prompt τ, where the file is per request.
    tau_macro: Option<f64>,
    count: u64,
    accepted: u64,
}

fn engine_side(m: &EngineMetrics, ours: &Ours) -> Side {
    if let Some(r) = m.rounds_within(ours.replayed) {
        let (count, accepted) = totals(&r);
        return Side {
            tau_macro: m.tau_macro(ours.replayed),
            summary: summarize(&r, ours.block),
            rounds: Some(r),
            count,
            accepted,
        };
    }
    let n = m.num_drafts as f64;
    Side {
        rounds: None,
        tau_macro: m.tau_macro(ours.replayed),
        summary: TauSummary {
            tau_macro: 0.0,
            tau_pooled: 1.0 + m.num_accepted_tokens as f64 / n,
            histogram: Vec::new(),
            per_position_acceptance: m
                .accepted_per_position
                .iter()
                .map(|&c| c as f64 / n)
                .collect(),
        },
        count: m.num_drafts,
        accepted: m.num_accepted_tokens,
    }
}

/// Compares `m` with `ours`; `departures`: the path's departures from the
/// supplied trajectories (the engine's outputs), `None` when the tokens were
/// generated here.
pub fn compare(
    m: EngineMetrics,
    ours: &Ours,
    departures: Option<&PathDepartures>,
) -> EngineComparison {
    let (rounds, accepted) = totals(ours.rounds);
    let s = summarize(ours.rounds, ours.block);
    let e = engine_side(&m, ours);
    let per_position = s
        .per_position_acceptance
        .iter()
        .enumerate()
        .map(|(k, &h)| PositionRate {
            position: k + 1,
            engine: e
                .summary
                .per_position_acceptance
                .get(k)
                .copied()
                .unwrap_or(0.0),
            hsparity: h,
        })
        .collect();
    let same = rounds == e.count && accepted == e.accepted;
    let close = rounds == e.count && accepted.abs_diff(e.accepted) <= within(accepted);
    let gap_in = match (same || close, departures) {
        (true, _) => GapIn::None,
        (false, Some(d)) if d.first_failure.is_some() => GapIn::OtherTokens,
        (false, Some(_)) => GapIn::EngineForward,
        (false, None) => GapIn::Unknown,
    };
    let mut c = EngineComparison {
        engine_tau_pooled: e.summary.tau_pooled,
        engine_tau_macro: e.tau_macro,
        engine_rounds: e.count,
        rounds_left_out: m.num_drafts - e.count,
        engine_accepted: e.accepted,
        first_apart: first_apart(&m, e.rounds.as_deref(), ours.rounds),
        metrics: m,
        path: ours.name.to_string(),
        tau_pooled: s.tau_pooled,
        tau_macro: s.tau_macro,
        rounds,
        accepted,
        per_position,
        gap_in,
        conclusion: String::new(),
    };
    c.conclusion = conclusion(&c, same, departures);
    c
}

/// The first prompt (and round, with per-step lists) whose accepted drafts
/// differ: from the engine's rounds cut as compared (`engine`), else from
/// its per-request totals.
fn first_apart(
    m: &EngineMetrics,
    engine: Option<&[PromptTau]>,
    ours: &[PromptTau],
) -> Option<RoundApart> {
    let drafts = |p: &PromptTau| -> Vec<u64> {
        p.acceptance_lengths.iter().map(|&l| l as u64 - 1).collect()
    };
    if let Some(engine) = engine {
        return engine.iter().zip(ours).enumerate().find_map(|(k, (e, o))| {
            let (e, o) = (drafts(e), drafts(o));
            let i = e.iter().zip(&o).position(|(a, b)| a != b);
            let i = i.or((e.len() != o.len()).then(|| e.len().min(o.len())))?;
            Some(RoundApart {
                prompt: k,
                round: Some(i),
                engine_accepted: e.get(i).copied(),
                hsparity_accepted: o.get(i).copied(),
            })
        });
    }
    let reqs = m.per_request.as_ref()?;
    reqs.iter().zip(ours).enumerate().find_map(|(k, (r, o))| {
        let (n, a) = totals(std::slice::from_ref(o));
        (r.num_spec_steps != n || r.num_accepted_draft_tokens != a).then_some(RoundApart {
            prompt: k,
            round: None,
            engine_accepted: Some(r.num_accepted_draft_tokens),
            hsparity_accepted: Some(a),
        })
    })
}

/// The comparison in one sentence, with its conclusion.
fn conclusion(c: &EngineComparison, same: bool, departures: Option<&PathDepartures>) -> String {
    let left_out = match c.rounds_left_out {
        0 => String::new(),
        n => format!(
            "; the engine's {} past the outputs replayed left out",
            crate::text::counted(n as usize, "round", None)
        ),
    };
    let head = format!(
        "engine pooled τ {:.4} vs hsparity {:.4} on {} (1 + accepted/rounds: {} vs {} rounds, {} vs {} accepted drafts{left_out})",
        c.engine_tau_pooled, c.tau_pooled, c.path, c.engine_rounds, c.rounds, c.engine_accepted, c.accepted
    );
    let n = |a: Option<u64>| a.map_or("no round".to_string(), |a| format!("{a}"));
    let apart = c
        .first_apart
        .as_ref()
        .map(|a| match a.round {
            Some(r) => format!(
                "; first differs at prompt {} round {} (counted from 0): the engine accepted {} drafts, hsparity {}",
                a.prompt, r, n(a.engine_accepted), n(a.hsparity_accepted)
            ),
            None => format!(
                "; first differs at prompt {} (counted from 0): the engine accepted {} drafts over the prompt, hsparity {}",
                a.prompt, n(a.engine_accepted), n(a.hsparity_accepted)
            ),
        })
        .unwrap_or_default();
    let tail = match c.gap_in {
        GapIn::None if same => "the engine accepts exactly what hsparity does: no serving-side loss".to_string(),
        GapIn::None => format!(
            "within {} accepted drafts (0.5 %: near-ties the engine's numerics resolve otherwise): no serving-side loss",
            within(c.accepted)
        ),
        GapIn::OtherTokens => format!(
            "other tokens: {} — the engine's outputs are not this target's greedy continuation (its harness, or its own target forward), so its acceptance was measured on other tokens",
            departures.map(PathDepartures::describe).unwrap_or_default()
        ),
        GapIn::EngineForward => "a serving-side loss: on the same tokens the engine accepts otherwise, so its hidden states at the taps or its drafter's forward differ; `hsparity diff` its capture of the taps against `hsparity dump` (docs/engines.md): taps that agree put the loss in the engine's drafter forward".to_string(),
        GapIn::Unknown => "the engine's tokens were not given: pass its outputs with --trajectories to tell other tokens from the engine's forward (and check that its max_tokens was --max-new-tokens + 1)".to_string(),
    };
    format!("{head}{apart}: {tail}")
}
