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

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};

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
        let m = match text.trim_start().starts_with(['{', '[']) {
            true => per_request(&file, &text)?,
            false => prometheus(&file, &text)?,
        };
        if m.num_drafts == 0 {
            return Err(Error::Input(format!(
                "{file}: the engine recorded no speculative round (num_drafts 0): was speculative decoding on for these requests?"
            )));
        }
        Ok(m)
    }

    /// `1 + accepted / drafts`: vLLM's mean acceptance length, hsparity's
    /// pooled τ.
    pub fn tau_pooled(&self) -> f64 {
        1.0 + self.num_accepted_tokens as f64 / self.num_drafts as f64
    }

    /// Mean over requests of each request's mean acceptance length (the
    /// per-request file only): hsparity's macro τ.
    pub fn tau_macro(&self) -> Option<f64> {
        let r = self.per_request.as_ref()?;
        let taus = r
            .iter()
            .filter(|q| q.num_spec_steps > 0)
            .map(|q| 1.0 + q.num_accepted_draft_tokens as f64 / q.num_spec_steps as f64);
        Some(taus.sum::<f64>() / r.len().max(1) as f64)
    }

    /// Draft tokens per round (vLLM's `num_speculative_tokens`: block size − 1
    /// for DFlash), when every round proposed the same number.
    pub fn drafts_per_round(&self) -> Option<u64> {
        self.num_draft_tokens
            .is_multiple_of(self.num_drafts)
            .then(|| self.num_draft_tokens / self.num_drafts)
    }
}

/// [`EngineMetrics::read`], checked against a run of `prompts` prompts with
/// a drafter of block size `block`: a per-request file holds one request
/// per prompt, and every round proposed `block − 1` drafts.
///
/// Errors ([`Error::Input`]): as [`EngineMetrics::read`]; another number of
/// requests; another number of drafts per round.
pub fn read_for(path: &Path, prompts: usize, block: usize) -> Result<EngineMetrics> {
    let m = EngineMetrics::read(path)?;
    if let Some(r) = &m.per_request {
        if r.len() != prompts {
            return Err(Error::Input(format!(
                "{}: {} requests, the run has {prompts} prompts: give the engine's metrics of exactly these prompts, in their order",
                m.file,
                r.len()
            )));
        }
    }
    match m.drafts_per_round() {
        Some(k) if k == block as u64 - 1 => Ok(m),
        k => Err(Error::Input(format!(
            "{}: the engine proposed {} draft tokens per round, the drafter's block size {block} makes {}: were these counters from this drafter (vLLM num_speculative_tokens = block_size − 1)?",
            m.file,
            k.map_or(format!("{} over {} rounds (not a whole number)", m.num_draft_tokens, m.num_drafts), |k| k.to_string()),
            block - 1
        ))),
    }
}

/// The observed τ of `triage`: `--observed-tau`, or the τ of the engine's
/// counters in `file` (checked as [`read_for`] with `(prompts, block)`) —
/// the macro τ of per-request metrics, the definition triage ranks by, else
/// the pooled τ of a Prometheus scrape, with a note saying so.
///
/// Errors ([`Error::Input`]): both given; as [`read_for`].
pub fn observed_tau(
    file: Option<&Path>,
    given: Option<f64>,
    (prompts, block): (usize, usize),
    notes: &mut Vec<String>,
) -> Result<Option<f64>> {
    let Some(f) = file else { return Ok(given) };
    if given.is_some() {
        return Err(Error::Input(
            "--observed-tau and --engine-metrics both give the observed τ: pass one".into(),
        ));
    }
    let m = read_for(f, prompts, block)?;
    Ok(Some(match m.tau_macro() {
        Some(t) => {
            notes.push(format!(
                "observed τ {t:.4}: the mean of the engine's per-request mean acceptance lengths in {} (its pooled τ, 1 + accepted/drafts, is {:.4})",
                m.file,
                m.tau_pooled()
            ));
            t
        }
        None => {
            notes.push(format!(
                "observed τ {:.4}: the engine's pooled τ (1 + accepted/drafts) from {}; the variants' τ are per-prompt means, which weigh a long prompt's rounds less — per-request metrics give the same definition",
                m.tau_pooled(),
                m.file
            ));
            m.tau_pooled()
        }
    }))
}

/// A whole, non-negative counter value.
fn count(file: &str, what: &str, v: f64) -> Result<u64> {
    if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 2f64.powi(53) {
        Ok(v as u64)
    } else {
        Err(Error::Input(format!("{file}: {what} is {v}, not a count")))
    }
}

/// A sample line's metric name, labels and value text.
type Sample<'a> = (&'a str, BTreeMap<String, String>, &'a str);

/// One sample line of the text format: `name{labels} value [timestamp]`.
/// `None` for comments and blank lines.
fn sample(line: &str) -> Option<std::result::Result<Sample<'_>, String>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let (name, rest) = line.split_at(end);
    let name_ok = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    if !name_ok {
        return Some(Err(format!(
            "not a Prometheus sample line ({:?}); expected vLLM's /metrics text or its per-request metrics (JSON)",
            crate::text::preview(line)
        )));
    }
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(r) => match label_set(r) {
            Ok(x) => x,
            Err(e) => return Some(Err(e)),
        },
        None => (BTreeMap::new(), rest),
    };
    match rest.split_whitespace().next() {
        Some(v) => Some(Ok((name, labels, v))),
        None => Some(Err(format!("{name}: no value"))),
    }
}

/// `k="v",…}` → the labels and what follows the closing brace (values may
/// hold `,` `}` and the escapes `\\` `\"` `\n`).
fn label_set(s: &str) -> std::result::Result<(BTreeMap<String, String>, &str), String> {
    let mut out = BTreeMap::new();
    let mut rest = s.trim_start();
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((out, r));
        }
        let eq = rest.find('=').ok_or("a label without a value")?;
        let key = rest[..eq].trim().to_string();
        let body = rest[eq + 1..]
            .trim_start()
            .strip_prefix('"')
            .ok_or("a label value without quotes")?;
        let (mut val, mut chars) = (String::new(), body.char_indices());
        let close = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => val.push('\n'),
                    Some((_, c)) => val.push(c),
                    None => return Err("an unterminated label value".into()),
                },
                Some((_, c)) => val.push(c),
                None => return Err("an unterminated label value".into()),
            }
        };
        out.insert(key, val);
        rest = body[close + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
}

/// The counters of a Prometheus scrape, summed over engines; refused when
/// they name several models (which of them served the prompts?).
fn prometheus(file: &str, text: &str) -> Result<EngineMetrics> {
    let mut sums: BTreeMap<&str, f64> = BTreeMap::new();
    let mut per_pos: BTreeMap<u64, f64> = BTreeMap::new();
    let mut models = std::collections::BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let Some(s) = sample(line) else { continue };
        let (name, labels, value) =
            s.map_err(|e| Error::Input(format!("{file}:{}: {e}", i + 1)))?;
        let Some(base) = name.strip_prefix("vllm:spec_decode_") else {
            continue;
        };
        let base = base.strip_suffix("_total").unwrap_or(base);
        let v: f64 = value
            .parse()
            .map_err(|_| Error::Input(format!("{file}:{}: {name} has value {value:?}", i + 1)))?;
        if let Some(m) = labels.get("model_name") {
            models.insert(m.clone());
        }
        match base {
            "num_drafts" | "num_draft_tokens" | "num_accepted_tokens" => {
                *sums.entry(base).or_default() += v
            }
            "num_accepted_tokens_per_pos" => {
                let pos = labels
                    .get("position")
                    .and_then(|p| p.parse::<u64>().ok())
                    .ok_or_else(|| {
                        Error::Input(format!(
                            "{file}:{}: {name} without a numeric position label",
                            i + 1
                        ))
                    })?;
                *per_pos.entry(pos).or_default() += v;
            }
            _ => {}
        }
    }
    if models.len() > 1 {
        let names: Vec<&str> = models.iter().map(String::as_str).collect();
        return Err(Error::Input(format!(
            "{file}: counters of several models ({}): scrape a server that served only the target",
            names.join(", ")
        )));
    }
    let get = |k: &str| -> Result<u64> {
        let v = sums.get(k).ok_or_else(|| {
            Error::Input(format!(
                "{file}: no vllm:spec_decode_{k} counter; expected vLLM's /metrics text (Prometheus) or its per-request metrics (JSON lines)"
            ))
        })?;
        count(file, &format!("vllm:spec_decode_{k}"), *v)
    };
    let (drafts, tokens, accepted) = (
        get("num_drafts")?,
        get("num_draft_tokens")?,
        get("num_accepted_tokens")?,
    );
    let positions = per_pos.keys().last().map_or(0, |&k| k as usize + 1);
    let mut by_pos = vec![0u64; positions];
    for (k, v) in per_pos {
        by_pos[k as usize] = count(file, &format!("accepted tokens at position {k}"), v)?;
    }
    let m = EngineMetrics {
        file: file.into(),
        format: MetricsFormat::Prometheus,
        num_drafts: drafts,
        num_draft_tokens: tokens,
        num_accepted_tokens: accepted,
        accepted_per_position: by_pos,
        per_request: None,
    };
    consistent(&m)?;
    Ok(m)
}

/// The per-request objects in prompt order: one JSON document (an array of
/// requests, or an object whose `requests` lists them) or JSON lines, one
/// request each. A request is vLLM's `speculative_decoding` object, bare or
/// inside the response's `metrics` (or under `speculative_decoding`).
fn per_request(file: &str, text: &str) -> Result<EngineMetrics> {
    let items: Vec<(String, Value)> = match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(a)) => a
            .into_iter()
            .enumerate()
            .map(|(k, v)| (format!("{file}: request {k}"), v))
            .collect(),
        Ok(Value::Object(o)) if o.get("requests").is_some_and(Value::is_array) => {
            let Some(Value::Array(a)) = o.get("requests").cloned() else {
                unreachable!("checked above")
            };
            a.into_iter()
                .enumerate()
                .map(|(k, v)| (format!("{file}: requests[{k}]"), v))
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
        for (j, &c) in r.acceptance_histogram.iter().enumerate() {
            by_pos.iter_mut().take(j).for_each(|p| *p += c);
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
            Value::Array(a) => a
                .iter()
                .map(|x| count(at, k, x.as_f64().unwrap_or(-1.0)))
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

/// A request's histogram, step list and totals agree.
fn request_consistent(r: &RequestMetrics) -> std::result::Result<(), String> {
    let h = &r.acceptance_histogram;
    let steps: u64 = h.iter().sum();
    let acc: u64 = h.iter().enumerate().map(|(j, &c)| j as u64 * c).sum();
    if steps != r.num_spec_steps || acc != r.num_accepted_draft_tokens {
        return Err(format!(
            "acceptance_histogram counts {steps} steps and {acc} accepted tokens, num_spec_steps {} and num_accepted_draft_tokens {}",
            r.num_spec_steps, r.num_accepted_draft_tokens
        ));
    }
    if let Some(p) = &r.per_step_accepted {
        if p.len() as u64 != steps || p.iter().sum::<u64>() != acc {
            return Err(format!(
                "per_step_accepted has {} steps summing to {}, the histogram {steps} and {acc}",
                p.len(),
                p.iter().sum::<u64>()
            ));
        }
    }
    Ok(())
}

/// Pooled counters that cannot come from one run are refused.
fn consistent(m: &EngineMetrics) -> Result<()> {
    let bad = |why: String| Err(Error::Input(format!("{}: {why}", m.file)));
    if m.num_accepted_tokens > m.num_draft_tokens {
        return bad(format!(
            "{} accepted draft tokens of {} proposed",
            m.num_accepted_tokens, m.num_draft_tokens
        ));
    }
    let per_pos: u64 = m.accepted_per_position.iter().sum();
    if !m.accepted_per_position.is_empty() && per_pos != m.num_accepted_tokens {
        return bad(format!(
            "accepted tokens per position sum to {per_pos}, num_accepted_tokens is {}",
            m.num_accepted_tokens
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
