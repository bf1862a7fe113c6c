//! hsparity's τ beside a serving engine's own acceptance counters
//! ([`super::engine_metrics`]) on the same prompts, and where a gap lies:
//! the harness (the engine's tokens are not this target's greedy
//! continuation), the engine's forward (same tokens, other acceptance: its
//! hidden states at the taps or its drafter's forward), or unknown (the
//! engine's tokens were not given).

use serde::Serialize;

use super::engine_metrics::EngineMetrics;
use super::eval::PathTau;
use super::trajectories::PathDepartures;

/// Draft position k (1 = the first draft token) accepted in this fraction
/// of rounds, by the engine and by hsparity.
#[derive(Debug, Clone, Serialize)]
pub struct PositionRate {
    /// Draft slot, 1-based.
    pub position: usize,
    /// The engine's `accepted_per_pos[k-1] / drafts`.
    pub engine: f64,
    /// hsparity's `per_position_acceptance[k-1]`.
    pub hsparity: f64,
}

/// The first round where the engine's accepted drafts differ from
/// hsparity's (per-request metrics only).
#[derive(Debug, Clone, Serialize)]
pub struct RoundApart {
    /// Prompt index.
    pub prompt: usize,
    /// Round index within the prompt (`None`: the engine recorded no
    /// per-step list, only the prompt's totals differ).
    pub round: Option<usize>,
    /// The engine's accepted drafts there (its totals: accepted over rounds).
    pub engine: String,
    /// hsparity's.
    pub hsparity: String,
}

/// Where the gap between the engine's acceptance and hsparity's lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GapIn {
    /// No gap: the same rounds and accepted drafts (or within near-ties).
    None,
    /// The engine's tokens leave this target's greedy continuation.
    Harness,
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
    /// The loading path compared (the first).
    pub path: String,
    /// `1 + accepted / drafts`: vLLM's mean acceptance length (over the
    /// rounds hsparity replays).
    pub engine_tau_pooled: f64,
    /// hsparity's pooled τ (Σ(a+1) / rounds), the same definition.
    pub tau_pooled: f64,
    /// Mean of the engine's per-request mean acceptance lengths (per-request
    /// file only, and only when no round was left out).
    pub engine_tau_macro: Option<f64>,
    /// hsparity's macro τ.
    pub tau_macro: f64,
    /// Rounds with drafts: the engine's (over the rounds hsparity replays).
    pub engine_rounds: u64,
    /// The engine's rounds left out: on its own outputs hsparity replays the
    /// rounds whose block they cover, and per-step metrics are cut to those.
    pub rounds_left_out: u64,
    /// hsparity's rounds.
    pub rounds: u64,
    /// Accepted draft tokens: the engine's.
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

    /// The summary's clause: `engine τ 7.651 vs 7.854 pooled: a serving-side loss`.
    pub fn headline(&self) -> String {
        let what = match self.gap_in {
            GapIn::None => "the engine accepts as hsparity does",
            GapIn::Harness => "the engine's tokens depart (harness)",
            GapIn::EngineForward => "a serving-side loss (same tokens)",
            GapIn::Unknown => "a gap hsparity cannot place as given",
        };
        format!(
            "engine τ {:.4} vs {:.4} on {} (pooled): {what}",
            self.engine_tau_pooled, self.tau_pooled, self.path
        )
    }
}

/// Accepted drafts the engine may differ by and still agree: near-ties its
/// numerics break the other way, 0.5 % of hsparity's accepted drafts, at least 1.
fn near_ties(accepted: u64) -> u64 {
    (accepted / 200).max(1)
}

/// The engine's side of the comparison: its counters over the rounds
/// hsparity replayed.
struct Side {
    rounds: u64,
    accepted: u64,
    /// Rounds that accepted draft position k (k = 0 first).
    per_position: Vec<u64>,
    /// The engine's rounds left out (past the given outputs).
    left_out: u64,
    /// The counters cover rounds hsparity could not replay and cannot be cut.
    unaligned: bool,
}

/// The engine's counters over the rounds hsparity replays. Generating
/// (`given` false) hsparity runs every round the engine ran (its
/// `--max-new-tokens M` is the engine's `max_tokens = M + 1`). On the
/// engine's own outputs it replays only the rounds whose block the outputs
/// cover, so per-step metrics are cut to each prompt's first rounds; pooled
/// counters cannot be cut.
fn engine_side(m: &EngineMetrics, path: &PathTau, given: bool) -> Side {
    let whole = Side {
        rounds: m.num_drafts,
        accepted: m.num_accepted_tokens,
        per_position: m.accepted_per_position.clone(),
        left_out: 0,
        unaligned: given,
    };
    if !given {
        return whole;
    }
    let Some(steps) = m.per_request.as_ref().and_then(|r| {
        r.iter()
            .map(|q| q.per_step_accepted.as_ref())
            .collect::<Option<Vec<_>>>()
    }) else {
        return whole;
    };
    let kept: Vec<&[u64]> = steps
        .iter()
        .zip(&path.per_prompt)
        .map(|(s, p)| &s[..s.len().min(p.acceptance_lengths.len())])
        .collect();
    let rounds = kept.iter().map(|s| s.len() as u64).sum();
    let mut per_position = vec![0u64; m.accepted_per_position.len()];
    for &a in kept.iter().flat_map(|s| s.iter()) {
        per_position
            .iter_mut()
            .take(a as usize)
            .for_each(|p| *p += 1);
    }
    Side {
        rounds,
        accepted: kept.iter().flat_map(|s| s.iter()).sum(),
        per_position,
        left_out: m.num_drafts - rounds,
        unaligned: false,
    }
}

/// Compares `m` with `path`'s replay; `departures`: this path's departures
/// from the supplied trajectories (the engine's outputs), `None` when the
/// tokens were generated here.
pub fn compare(
    m: EngineMetrics,
    path: &PathTau,
    departures: Option<&PathDepartures>,
) -> EngineComparison {
    let lens = || path.per_prompt.iter().flat_map(|p| &p.acceptance_lengths);
    let rounds = lens().count() as u64;
    let accepted: u64 = lens().map(|&l| l as u64 - 1).sum();
    let e = engine_side(&m, path, departures.is_some());
    let per_position = path
        .summary
        .per_position_acceptance
        .iter()
        .enumerate()
        .map(|(k, &h)| PositionRate {
            position: k + 1,
            engine: e.per_position.get(k).copied().unwrap_or(0) as f64 / e.rounds.max(1) as f64,
            hsparity: h,
        })
        .collect();
    let same = rounds == e.rounds && accepted == e.accepted;
    let close = rounds == e.rounds && accepted.abs_diff(e.accepted) <= near_ties(accepted);
    let gap_in = match (same || close, departures) {
        (true, _) => GapIn::None,
        (false, Some(d)) if d.first_failure.is_some() => GapIn::Harness,
        (false, Some(_)) if !e.unaligned => GapIn::EngineForward,
        (false, _) => GapIn::Unknown,
    };
    let pooled = |r: u64, a: u64| 1.0 + a as f64 / r.max(1) as f64;
    let mut c = EngineComparison {
        engine_tau_pooled: pooled(e.rounds, e.accepted),
        engine_tau_macro: m.tau_macro().filter(|_| e.left_out == 0),
        engine_rounds: e.rounds,
        engine_accepted: e.accepted,
        rounds_left_out: e.left_out,
        first_apart: first_apart(&m, path, departures.is_some()),
        metrics: m,
        path: path.name.clone(),
        tau_pooled: path.summary.tau_pooled,
        tau_macro: path.summary.tau_macro,
        rounds,
        accepted,
        per_position,
        gap_in,
        conclusion: String::new(),
    };
    c.conclusion = conclusion(&c, same, departures, e.unaligned);
    c
}

/// The first prompt (and round, with per-step lists) whose accepted drafts
/// differ (`given`: on the engine's outputs, where its rounds past
/// hsparity's are left out, not a difference).
fn first_apart(m: &EngineMetrics, path: &PathTau, given: bool) -> Option<RoundApart> {
    let reqs = m.per_request.as_ref()?;
    reqs.iter()
        .zip(&path.per_prompt)
        .enumerate()
        .find_map(|(k, (r, p))| {
            let ours: Vec<u64> = p.acceptance_lengths.iter().map(|&l| l as u64 - 1).collect();
            match &r.per_step_accepted {
                Some(steps) => {
                    let i = steps.iter().zip(&ours).position(|(a, b)| a != b);
                    let short = steps.len() < ours.len() || (!given && steps.len() > ours.len());
                    let i = i.or(short.then(|| steps.len().min(ours.len())))?;
                    let at = |v: &[u64]| {
                        v.get(i)
                            .map_or("no round".into(), |a| format!("{a} accepted"))
                    };
                    Some(RoundApart {
                        prompt: k,
                        round: Some(i),
                        engine: at(steps),
                        hsparity: at(&ours),
                    })
                }
                None if given => None,
                None => {
                    let sum: u64 = ours.iter().sum();
                    (r.num_spec_steps != ours.len() as u64 || r.num_accepted_draft_tokens != sum)
                        .then(|| RoundApart {
                            prompt: k,
                            round: None,
                            engine: format!(
                                "{} accepted over {} rounds",
                                r.num_accepted_draft_tokens, r.num_spec_steps
                            ),
                            hsparity: format!("{sum} accepted over {} rounds", ours.len()),
                        })
                }
            }
        })
}

/// `engine τ 7.651 vs 7.854 here (pooled, 1 + accepted/drafts): …`.
fn conclusion(
    c: &EngineComparison,
    same: bool,
    departures: Option<&PathDepartures>,
    unaligned: bool,
) -> String {
    let left_out = match c.rounds_left_out {
        0 => String::new(),
        n => format!(
            ", the engine's {} past the given outputs left out",
            crate::text::counted(n as usize, "round", None)
        ),
    };
    let head = format!(
        "engine τ {:.4} vs {:.4} on {} (pooled, 1 + accepted/drafts; {} vs {} rounds, {} vs {} accepted drafts{left_out})",
        c.engine_tau_pooled, c.tau_pooled, c.path, c.engine_rounds, c.rounds, c.engine_accepted, c.accepted
    );
    let apart = c
        .first_apart
        .as_ref()
        .map(|a| match a.round {
            Some(r) => format!(
                "; first apart at prompt {} round {} (engine {}, hsparity {})",
                a.prompt, r, a.engine, a.hsparity
            ),
            None => format!(
                "; first apart at prompt {} (engine {}, hsparity {})",
                a.prompt, a.engine, a.hsparity
            ),
        })
        .unwrap_or_default();
    let tail = match c.gap_in {
        GapIn::None if same => "the engine accepts exactly what hsparity does: no serving-side loss".to_string(),
        GapIn::None => format!(
            "within {} accepted drafts (0.5 %, near-ties the engine's numerics break otherwise): no serving-side loss",
            near_ties(c.accepted)
        ),
        GapIn::Harness => format!(
            "the harness: {} — the engine's tokens are not this target's greedy continuation, so its acceptance is measured on other tokens",
            departures.map(PathDepartures::describe).unwrap_or_default()
        ),
        GapIn::EngineForward => "a serving-side loss: on the same tokens the engine accepts otherwise, so its hidden states at the taps or its drafter's forward differ; `hsparity diff` its capture of the taps against `hsparity dump` (docs/engines.md): taps that agree put the loss in the engine's drafter forward".to_string(),
        GapIn::Unknown if unaligned => "not comparable as given: on the engine's outputs hsparity replays only the rounds whose block they cover, and pooled counters also hold each prompt's last rounds; give per-request metrics with per-step lists (vLLM --per-request-spec-decode-metrics detailed), or compare without --trajectories (vLLM's max_tokens = --max-new-tokens + 1)".to_string(),
        GapIn::Unknown => "the engine's tokens were not given: pass its outputs with --trajectories to tell the harness (other tokens) from the engine's forward (same tokens); vLLM's max_tokens must be --max-new-tokens + 1".to_string(),
    };
    format!("{head}{apart}: {tail}")
}
