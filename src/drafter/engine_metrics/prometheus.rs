//! vLLM's speculative-decoding counters from Prometheus text (`/metrics` of
//! `vllm serve`; the exposition format of `prometheus_client`, which vLLM
//! uses: `vllm/v1/spec_decode/metrics.py`, `SpecDecodingProm`). Only the
//! four `vllm:spec_decode_*` counter families are read; the rest of a
//! scrape is skipped. (prometheus-parse 0.2.5 drops every name with a `:`,
//! which all of vLLM's have, so the few lines needed are parsed here.)

use std::collections::{BTreeMap, BTreeSet};

use super::{count, EngineMetrics, MetricsFormat, MAX_POSITIONS};
use crate::error::{Error, Result};

/// A sample line's metric name, labels and value text.
type Sample<'a> = (&'a str, BTreeMap<String, String>, &'a str);

/// Where the scrape is refused, as `FILE:LINE: why`.
fn at(file: &str, line: usize, why: impl std::fmt::Display) -> Error {
    Error::Input(format!("{file}:{line}: {why}"))
}

/// One sample line: `name{labels} value [timestamp]`; `None` for comments
/// and blank lines.
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
    let rest = rest.trim_start();
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(r) => match label_set(r) {
            Ok(x) => x,
            Err(e) => return Some(Err(format!("{name}: {e}"))),
        },
        None => (BTreeMap::new(), rest),
    };
    match rest.split_whitespace().next() {
        Some(v) => Some(Ok((name, labels, v))),
        None => Some(Err(format!("{name}: no value"))),
    }
}

/// `k="v",…}` → the labels and what follows the closing brace (values may
/// hold `,` `}` and the escapes `\\` `\"` `\n`). A label named twice, a
/// missing comma or an open brace is refused.
fn label_set(s: &str) -> std::result::Result<(BTreeMap<String, String>, &str), String> {
    let mut out = BTreeMap::new();
    let mut rest = s.trim_start();
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((out, r));
        }
        let eq = rest.find('=').ok_or("labels without a closing brace")?;
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
        if out.insert(key.clone(), val).is_some() {
            return Err(format!("the label {key} twice"));
        }
        rest = body[close + 1..].trim_start();
        rest = match (rest.strip_prefix(','), rest.starts_with('}')) {
            (Some(r), _) => r.trim_start(),
            (None, true) => rest,
            (None, false) => return Err("labels not separated by commas".into()),
        };
    }
}

/// The counters of a scrape, summed over engines (the `engine` label).
/// Refused: several models (which served the prompts?), a series given
/// twice (also once with and once without `_total`), a value that is not a
/// count, a position label past [`MAX_POSITIONS`], per-position counts that
/// are not a count of rounds accepting positions 0, 1, … in turn.
pub(super) fn read(file: &str, text: &str) -> Result<EngineMetrics> {
    let mut sums: BTreeMap<&str, u64> = BTreeMap::new();
    let mut per_pos: BTreeMap<usize, u64> = BTreeMap::new();
    let (mut models, mut seen) = (BTreeSet::new(), BTreeSet::new());
    let text = text.trim_start_matches('\u{feff}');
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let Some(s) = sample(line) else { continue };
        let (name, labels, value) = s.map_err(|e| at(file, n, e))?;
        let Some(base) = name.strip_prefix("vllm:spec_decode_") else {
            continue;
        };
        let base = base.strip_suffix("_total").unwrap_or(base);
        let known = [
            "num_drafts",
            "num_draft_tokens",
            "num_accepted_tokens",
            "num_accepted_tokens_per_pos",
        ];
        let Some(&base) = known.iter().find(|k| **k == base) else {
            continue;
        };
        if !seen.insert((base, labels.clone())) {
            return Err(at(file, n, format!("the series vllm:spec_decode_{base}{labels:?} again (with and without _total, or repeated): one scrape of one server")));
        }
        let v: f64 = value
            .parse()
            .map_err(|_| at(file, n, format!("{name} has value {value:?}")))?;
        let v = count(file, &format!("line {n}: {name}"), v)?;
        if let Some(m) = labels.get("model_name") {
            models.insert(m.clone());
        }
        if base != "num_accepted_tokens_per_pos" {
            *sums.entry(base).or_default() += v;
            continue;
        }
        let pos = labels
            .get("position")
            .and_then(|p| p.parse::<usize>().ok())
            .ok_or_else(|| at(file, n, format!("{name} without a numeric position label")))?;
        if pos >= MAX_POSITIONS {
            return Err(at(file, n, format!("{name} at position {pos}: a draft position past {MAX_POSITIONS} is no DFlash block")));
        }
        *per_pos.entry(pos).or_default() += v;
    }
    if models.len() > 1 {
        let names: Vec<&str> = models.iter().map(String::as_str).collect();
        return Err(Error::Input(format!(
            "{file}: counters of several models ({}): scrape a server that served only the target",
            names.join(", ")
        )));
    }
    let get = |k: &str| -> Result<u64> {
        sums.get(k).copied().ok_or_else(|| {
            Error::Input(format!(
                "{file}: no vllm:spec_decode_{k} counter; expected vLLM's /metrics text (Prometheus) or its per-request metrics (JSON)"
            ))
        })
    };
    let width = per_pos.keys().last().map_or(0, |&k| k + 1);
    let mut by_pos = vec![0u64; width];
    per_pos.into_iter().for_each(|(k, v)| by_pos[k] = v);
    let m = EngineMetrics {
        file: file.into(),
        format: MetricsFormat::Prometheus,
        num_drafts: get("num_drafts")?,
        num_draft_tokens: get("num_draft_tokens")?,
        num_accepted_tokens: get("num_accepted_tokens")?,
        accepted_per_position: by_pos,
        per_request: None,
    };
    consistent(&m)?;
    Ok(m)
}

/// Pooled counters one run can give: accepted ≤ proposed; position k
/// accepted in at most as many rounds as there were and as position k − 1
/// (a draft is accepted only after the ones before it); the positions sum
/// to the accepted tokens.
fn consistent(m: &EngineMetrics) -> Result<()> {
    let bad = |why: String| Err(Error::Input(format!("{}: {why}", m.file)));
    if m.num_accepted_tokens > m.num_draft_tokens {
        return bad(format!(
            "{} accepted draft tokens of {} proposed",
            m.num_accepted_tokens, m.num_draft_tokens
        ));
    }
    let mut prev = m.num_drafts;
    for (k, &c) in m.accepted_per_position.iter().enumerate() {
        if c > prev {
            return bad(format!(
                "position {k} accepted in {c} rounds, more than {} (the rounds{}): not one run's counters",
                prev,
                if k == 0 { "" } else { " that accepted the position before" }
            ));
        }
        prev = c;
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
