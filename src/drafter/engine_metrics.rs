//! `--engine-metrics FILE` (`drafter`, `triage`): a serving engine's own
//! speculative-decoding counters, read as the engine writes them, put beside
//! hsparity's τ on the same prompts and tokens with the definitions aligned,
//! and the place a gap lies named (`docs/engines.md`, "Engine metrics").
//!
//! Two files are read:
//! - vLLM's Prometheus text (`/metrics` of `vllm serve`):
//!   `vllm:spec_decode_num_drafts`, `…_num_draft_tokens`,
//!   `…_num_accepted_tokens`, `…_num_accepted_tokens_per_pos{position="k"}`,
//!   with or without `_total` (`vllm/v1/spec_decode/metrics.py`,
//!   `SpecDecodingProm`); samples of several engines are summed.
//! - vLLM's per-request metrics, JSON lines in prompt order: each request's
//!   `metrics.speculative_decoding` object (`RequestSpecDecodeMetrics.to_dict`,
//!   `vllm/v1/metrics/stats.py`, with `--per-request-spec-decode-metrics
//!   summary|detailed`), bare or inside the response's `metrics`.
//!
//! vLLM's mean acceptance length is `1 + accepted / drafts` pooled over
//! requests, which is hsparity's pooled τ (Σ(a+1) / rounds); a request's
//! `mean_acceptance_length` is that prompt's τ, so their mean is the macro τ.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::eval::{EndRule, PromptTau};
use crate::error::{Error, Result};

mod prometheus;

/// Draft positions a file may name: no DFlash block is wider.
pub const MAX_POSITIONS: usize = 1024;

/// Which file the counters came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MetricsFormat {
    /// Prometheus text exposition (`/metrics`): pooled counters only.
    Prometheus,
    /// vLLM's per-request `speculative_decoding` objects, one per prompt.
    VllmPerRequest,
}

/// One request's counters (`RequestSpecDecodeMetrics.to_dict`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestMetrics {
    /// Verify steps that had drafts (`num_spec_steps`): hsparity's rounds.
    pub num_spec_steps: u64,
    /// Draft tokens accepted (`num_accepted_draft_tokens`): Σ a.
    pub num_accepted_draft_tokens: u64,
    /// Draft tokens proposed (`num_draft_tokens`).
    pub num_draft_tokens: u64,
    /// Steps by accepted draft tokens j (`acceptance_histogram`).
    pub acceptance_histogram: Vec<u64>,
    /// Accepted draft tokens per step, in order (`per_step_accepted`, the
    /// `detailed` level only).
    pub per_step_accepted: Option<Vec<u64>>,
}

/// The engine's counters over the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineMetrics {
    /// The file given.
    pub file: String,
    /// What it is.
    pub format: MetricsFormat,
    /// Rounds with drafts (`num_drafts`).
    pub num_drafts: u64,
    /// Draft tokens proposed (`num_draft_tokens`).
    pub num_draft_tokens: u64,
    /// Draft tokens accepted (`num_accepted_tokens`).
    pub num_accepted_tokens: u64,
    /// Rounds that accepted draft position k (k = 0 first), as
    /// `num_accepted_tokens_per_pos`.
    pub accepted_per_position: Vec<u64>,
    /// Per request, in prompt order (the per-request file only).
    pub per_request: Option<Vec<RequestMetrics>>,
}

impl EngineMetrics {
    /// Reads `path`: per-request metrics (JSON) when its first non-blank
    /// character opens a JSON object or array, else Prometheus text.
    ///
    /// Errors ([`Error::Input`]): unreadable; neither format; a counter
    /// that is not a whole number ≥ 0; counters that contradict each other;
    /// no round with drafts.
    pub fn read(path: &Path) -> Result<Self> {
        let text = crate::input::read_to_string(path)?;
        let file = path.display().to_string();
        let m = match text
            .trim_start_matches('\u{feff}')
            .trim_start()
            .starts_with(['{', '['])
        {
            true => per_request(&file, &text)?,
            false => prometheus::read(&file, &text)?,
        };
        if m.num_drafts == 0 {
            return Err(Error::Input(format!(
                "{file}: the engine recorded no speculative round (num_drafts 0): was speculative decoding on for these requests?"
            )));
        }
        Ok(m)
    }

    /// Draft tokens per round (vLLM's `num_speculative_tokens`: block size − 1
    /// for DFlash), when every round proposed the same number.
    pub fn drafts_per_round(&self) -> Option<u64> {
        self.num_draft_tokens
            .is_multiple_of(self.num_drafts)
            .then(|| self.num_draft_tokens / self.num_drafts)
    }

    /// Per prompt, the engine's rounds as hsparity records them (`a + 1`),
    /// cut to the rounds hsparity replays: a round at output position j
    /// (j = 0 for the prefill's token, then + a + 1 per round) is kept while
    /// j < `replayed[k]`. Generating M tokens hsparity replays every round of
    /// an engine run with `max_tokens = M + 1` (its rounds all start before
    /// output M); on the engine's own outputs it replays those whose block
    /// the outputs cover. `None` without per-step lists.
    pub fn rounds_within(&self, replayed: &[usize]) -> Option<Vec<PromptTau>> {
        let reqs = self.per_request.as_ref()?;
        reqs.iter()
            .zip(replayed)
            .map(|(r, &limit)| {
                let steps = r.per_step_accepted.as_ref()?;
                let (mut j, mut lens) = (0u64, Vec::new());
                for &a in steps {
                    if j >= limit as u64 {
                        break;
                    }
                    lens.push(a as usize + 1);
                    j += a + 1;
                }
                Some(prompt_tau(lens))
            })
            .collect()
    }

    /// The engine's macro τ (the mean of its per-prompt τ, as hsparity's)
    /// over the rounds hsparity replays ([`Self::rounds_within`]); from the
    /// per-request totals where there are no per-step lists; `None` for
    /// pooled counters.
    pub fn tau_macro(&self, replayed: &[usize]) -> Option<f64> {
        let taus: Vec<f64> = match self.rounds_within(replayed) {
            Some(r) => r.iter().map(|p| p.tau).collect(),
            None => self.request_taus()?,
        };
        Some(taus.iter().sum::<f64>() / taus.len().max(1) as f64)
    }

    /// Per prompt, the engine's rounds from its totals only (`summary`
    /// level, or when no cut is needed): as many rounds of mean length.
    pub fn request_taus(&self) -> Option<Vec<f64>> {
        let reqs = self.per_request.as_ref()?;
        Some(
            reqs.iter()
                .map(|r| match r.num_spec_steps {
                    0 => 0.0,
                    n => 1.0 + r.num_accepted_draft_tokens as f64 / n as f64,
                })
                .collect(),
        )
    }
}

/// A prompt's τ from its rounds' lengths, as [`super::eval`] records it (0
/// for a prompt with no round: the engine's `mean_acceptance_length` says
/// 1.0 there, hsparity's macro τ counts 0).
pub fn prompt_tau(acceptance_lengths: Vec<usize>) -> PromptTau {
    let tau = match acceptance_lengths.len() {
        0 => 0.0,
        n => acceptance_lengths.iter().sum::<usize>() as f64 / n as f64,
    };
    PromptTau {
        tau,
        acceptance_lengths,
    }
}

/// What the comparison of `m` with a run needs, checked before the run:
/// one request per prompt (`prompts`), `block − 1` drafts every round and
/// per draft position, GitHub main's end rule (the engine verifies full
/// blocks to the end, as vLLM does), and on the engine's own outputs
/// (`given`) per-step lists, to cut the engine's rounds to those replayed.
///
/// Errors ([`Error::Input`]): as [`EngineMetrics::read`]; each of those.
pub fn read_for(
    path: &Path,
    prompts: usize,
    block: usize,
    rule: EndRule,
    given: bool,
) -> Result<EngineMetrics> {
    let m = EngineMetrics::read(path)?;
    let refuse = |why: String| Err(Error::Input(format!("{}: {why}", m.file)));
    if rule != EndRule::GithubMain {
        return refuse(format!(
            "--end-rule {} with --engine-metrics: the engine verifies full blocks to the end of generation (its max_tokens = --max-new-tokens + 1), which is --end-rule main",
            rule.flag()
        ));
    }
    let k = block as u64 - 1;
    match m.drafts_per_round() {
        Some(d) if d == k => {}
        d => return refuse(format!(
            "the engine proposed {} per round, the drafter's block size {block} makes {k}: were these counters from this drafter (vLLM num_speculative_tokens = block_size − 1)?",
            d.map_or(format!("{} draft tokens over {} rounds (not a whole number)", m.num_draft_tokens, m.num_drafts), |d| format!("{d} draft tokens"))
        )),
    }
    if m.accepted_per_position.len() as u64 > k {
        return refuse(format!(
            "accepted tokens at draft position {}, past the {k} a block of {block} drafts",
            m.accepted_per_position.len() - 1
        ));
    }
    let Some(r) = &m.per_request else {
        return match given {
            true => refuse("pooled counters (a /metrics scrape) hold every round of the engine's outputs, and on those outputs hsparity replays only the rounds whose block they cover: give per-request metrics with per-step lists (vLLM --per-request-spec-decode-metrics detailed), or compare on the prompts (without --trajectories)".into()),
            false => Ok(m),
        };
    };
    if r.len() != prompts {
        return refuse(format!(
            "{} requests, the run has {}: give the engine's metrics of exactly these prompts, in their order",
            r.len(),
            crate::text::counted(prompts, "prompt", None)
        ));
    }
    if let Some(q) = r
        .iter()
        .position(|q| q.acceptance_histogram.len() as u64 != k + 1)
    {
        return refuse(format!(
            "request {q}: an acceptance histogram of {} entries, the drafter's block size {block} makes {} (0..={k} accepted)",
            r[q].acceptance_histogram.len(),
            k + 1
        ));
    }
    if given && r.iter().any(|q| q.per_step_accepted.is_none()) {
        return refuse("requests without per_step_accepted: on the engine's outputs hsparity replays only the rounds whose block they cover, and cutting the engine's rounds to those needs its per-step lists (vLLM --per-request-spec-decode-metrics detailed)".into());
    }
    Ok(m)
}

/// A whole, non-negative counter value.
fn count(file: &str, what: &str, v: f64) -> Result<u64> {
    if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 2f64.powi(53) {
        Ok(v as u64)
    } else {
        let shown = match v.abs() < 1e15 {
            true => format!("{v}"),
            false => format!("{v:e}"),
        };
        Err(Error::Input(format!(
            "{file}: {what} is {shown}, not a count"
        )))
    }
}

/// The per-request objects in prompt order: one JSON document (an array of
/// requests, or an object whose `requests` (or `responses`) lists them) or
/// JSON lines, one request each. A request is vLLM's `speculative_decoding`
/// object, bare or inside the response's `metrics` (or under
/// `speculative_decoding`).
fn per_request(file: &str, text: &str) -> Result<EngineMetrics> {
    let text = text.trim_start_matches('\u{feff}');
    let listed = |o: &serde_json::Map<String, Value>| {
        ["requests", "responses"]
            .iter()
            .find_map(|k| o.get(*k).and_then(Value::as_array).map(|a| (*k, a.clone())))
    };
    let items: Vec<(String, Value)> = match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(a)) => a
            .into_iter()
            .enumerate()
            .map(|(k, v)| (format!("{file}: request {k}"), v))
            .collect(),
        Ok(Value::Object(o)) if listed(&o).is_some() => {
            let (key, a) = listed(&o).unwrap_or_default();
            a.into_iter()
                .enumerate()
                .map(|(k, v)| (format!("{file}: {key}[{k}]"), v))
                .collect()
        }
        Ok(v) => vec![(format!("{file}:1"), v)],
        Err(_) => text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .map(|v| (format!("{file}:{}", i + 1), v))
                    .map_err(|e| {
                        Error::Input(format!(
                            "{file}:{}: not JSON ({e}); expected vLLM's per-request metrics (JSON) or its /metrics text (Prometheus)",
                            i + 1
                        ))
                    })
            })
            .collect::<Result<_>>()?,
    };
    let reqs = items
        .iter()
        .map(|(at, v)| request(at, v))
        .collect::<Result<Vec<_>>>()?;
    if reqs.is_empty() {
        return Err(Error::Input(format!("{file}: no requests")));
    }
    let width = reqs
        .iter()
        .map(|r| r.acceptance_histogram.len())
        .max()
        .unwrap_or(1);
    let mut by_pos = vec![0u64; width.saturating_sub(1)];
    for r in &reqs {
        // Steps that accepted j drafts accepted positions 0..j.
        let mut at_least = 0;
        for (j, &c) in r.acceptance_histogram.iter().enumerate().rev() {
            if j > 0 {
                at_least += c;
                by_pos[j - 1] += at_least;
            }
        }
    }
    Ok(EngineMetrics {
        file: file.into(),
        format: MetricsFormat::VllmPerRequest,
        num_drafts: reqs.iter().map(|r| r.num_spec_steps).sum(),
        num_draft_tokens: reqs.iter().map(|r| r.num_draft_tokens).sum(),
        num_accepted_tokens: reqs.iter().map(|r| r.num_accepted_draft_tokens).sum(),
        accepted_per_position: by_pos,
        per_request: Some(reqs),
    })
}

/// One request's counters from `v` (`at`: where it is, for errors).
fn request(at: &str, v: &Value) -> Result<RequestMetrics> {
    let bad = |e: String| Error::Input(format!("{at}: {e}"));
    let o = [
        &v["metrics"]["speculative_decoding"],
        &v["speculative_decoding"],
        v,
    ]
    .into_iter()
    .find(|o| o.get("num_spec_steps").is_some())
    .ok_or_else(|| bad("no speculative_decoding metrics (num_spec_steps): run vLLM with --per-request-spec-decode-metrics summary or detailed".into()))?;
    let n = |k: &str| -> Result<u64> {
        let x = o[k]
            .as_f64()
            .ok_or_else(|| bad(format!("{k} missing or not a number")))?;
        count(at, k, x)
    };
    let list = |k: &str| -> Result<Option<Vec<u64>>> {
        match &o[k] {
            Value::Null => Ok(None),
            Value::Array(a) if a.len() > 1 << 20 => {
                Err(bad(format!("{k} has {} entries", a.len())))
            }
            Value::Array(a) => a
                .iter()
                .enumerate()
                .map(|(i, x)| match x.as_f64() {
                    Some(x) => count(at, &format!("{k}[{i}]"), x),
                    None => Err(bad(format!("{k}[{i}] is {x}, not a count"))),
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            _ => Err(bad(format!("{k} is not a list"))),
        }
    };
    let r = RequestMetrics {
        num_spec_steps: n("num_spec_steps")?,
        num_accepted_draft_tokens: n("num_accepted_draft_tokens")?,
        num_draft_tokens: n("num_draft_tokens")?,
        acceptance_histogram: list("acceptance_histogram")?
            .ok_or_else(|| bad("acceptance_histogram missing".into()))?,
        per_step_accepted: list("per_step_accepted")?,
    };
    request_consistent(&r).map_err(bad)?;
    Ok(r)
}

/// A request's histogram, step list and totals agree: the histogram counts
/// the steps and the accepted drafts, at most [`MAX_POSITIONS`] drafts a
/// step and no more accepted than proposed, and the step list is the
/// histogram's steps in order.
fn request_consistent(r: &RequestMetrics) -> std::result::Result<(), String> {
    let h = &r.acceptance_histogram;
    if h.is_empty() || h.len() > MAX_POSITIONS + 1 {
        return Err(format!("an acceptance_histogram of {} entries", h.len()));
    }
    let steps: u64 = h.iter().sum();
    let acc: u64 = h.iter().enumerate().map(|(j, &c)| j as u64 * c).sum();
    if steps != r.num_spec_steps || acc != r.num_accepted_draft_tokens {
        return Err(format!(
            "acceptance_histogram counts {steps} steps and {acc} accepted tokens, num_spec_steps {} and num_accepted_draft_tokens {}",
            r.num_spec_steps, r.num_accepted_draft_tokens
        ));
    }
    if acc > r.num_draft_tokens {
        return Err(format!(
            "{acc} accepted draft tokens of {} proposed",
            r.num_draft_tokens
        ));
    }
    if let Some(p) = &r.per_step_accepted {
        let mut counts = vec![0u64; h.len()];
        for &a in p {
            match counts.get_mut(a as usize) {
                Some(c) => *c += 1,
                None => {
                    return Err(format!(
                        "per_step_accepted holds {a}, past the histogram's {} drafts a step",
                        h.len() - 1
                    ))
                }
            }
        }
        if counts != *h {
            return Err(
                "per_step_accepted does not count the steps acceptance_histogram counts".into(),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
