//! `--align`: for every `hidden_states` index of a compared capture, the index
//! of the reference it matches best, and the offset between the two — the
//! one-line diagnosis of a capture read with the wrong layer-index convention
//! (vLLM's blanket +1 over aux ids, GGUF converters' off-by-one).
//!
//! Plain data in, plain data out: per index, one `[T_k, H]` tensor per prompt
//! (the same prompts, in the same order, on both sides), independent of where
//! the states came from ([`crate::dump::Dump`], [`crate::import::Imported`]).
//! "Best" is the highest mean per-token cosine over all prompts (the parity
//! metrics' `cos_mean`); ties go to the lower relative L2, then to the smaller
//! |offset|.

use std::collections::BTreeMap;

use candle_core::Tensor;
use serde::Serialize;

use super::metrics::{Accumulator, Metrics};
use crate::error::{Error, Result};

/// One compared index and its best match in the reference.
#[derive(Debug, Clone, Serialize)]
pub struct AlignRow {
    /// Index in the compared capture (as it was labelled).
    pub compared: usize,
    /// Reference index it matches best.
    pub best: usize,
    /// `best - compared`: the correction to apply to the compared labels.
    pub offset: i64,
    /// Mean per-token cosine with the best reference index.
    pub cos_mean: f64,
    /// Smallest per-token cosine with the best reference index.
    pub cos_min: f64,
    /// Relative L2 against the best reference index.
    pub rel_l2: f64,
    /// Mean cosine with the reference index of the same label (None when the reference lacks it).
    pub same_index_cos_mean: Option<f64>,
    /// The second-best reference index and its mean cosine (None with a one-index reference).
    pub runner_up: Option<(usize, f64)>,
}

/// The alignment of a compared capture against a reference.
#[derive(Debug, Clone, Serialize)]
pub struct Alignment {
    /// One row per compared index, in index order.
    pub rows: Vec<AlignRow>,
    /// The offset every row agrees on (None when rows disagree).
    pub offset: Option<i64>,
}

impl Alignment {
    /// One line: `offset +1 on all 4 indices (hidden_states[i] of B is hidden_states[i+1] of A)`, or the disagreement.
    pub fn diagnosis(&self) -> String {
        // `all 7 indices`, or `the 6 indices with a counterpart (1 has none)`.
        let on = |o: i64| {
            let n = self
                .rows
                .iter()
                .filter(|r| matches(r) && r.offset == o)
                .count();
            match self.rows.len() - n {
                0 => format!("all {n} indices"),
                k => format!("the {n} indices with a counterpart ({k} without one)"),
            }
        };
        match self.offset {
            Some(0) => format!(
                "offset 0 on {}: every index matches the reference's index of the same number",
                on(0)
            ),
            Some(o) => format!(
                "offset {o:+} on {}: compared hidden_states[i] is reference hidden_states[i{o:+}] \
                 (the capture was read with a layer-index convention off by {o:+}; \
                 `diff --tap-offset {:+}` compares them aligned)",
                on(o),
                -o
            ),
            None if !self.rows.iter().any(matches) => format!(
                "no index matches: the best mean cosine of any index is {:.3} (below {MATCH_COS}): the compared \
                 dump holds other states than the reference's at every index (zeros, NaN/Inf, another model's)",
                self.rows
                    .iter()
                    .map(|r| if r.cos_mean.is_finite() { r.cos_mean } else { f64::NEG_INFINITY })
                    .fold(f64::NEG_INFINITY, f64::max)
            ),
            None => {
                let parts: Vec<String> = self
                    .rows
                    .iter()
                    .map(|r| format!("{}->{} ({:+})", r.compared, r.best, r.offset))
                    .collect();
                format!("no common offset: {}", parts.join(", "))
            }
        }
    }
}

fn compare(reference: &[Tensor], compared: &[Tensor], ri: usize, ci: usize) -> Result<Metrics> {
    let mut acc = Accumulator::default();
    for (k, (a, b)) in compared.iter().zip(reference).enumerate() {
        acc.add(k, a, b).map_err(|e| {
            Error::Input(format!(
                "prompt {k}: compared index {ci} vs reference index {ri}: {e} (trim both to the same tokens first)"
            ))
        })?;
    }
    Ok(acc.finish())
}

/// For each index of `compared`, the index of `reference` it matches best.
///
/// Errors ([`Error::Input`]): an empty side, a different number of prompts
/// on the two sides or between indices, or tensors of different shapes.
pub fn align(
    reference: &BTreeMap<usize, Vec<Tensor>>,
    compared: &BTreeMap<usize, Vec<Tensor>>,
) -> Result<Alignment> {
    if reference.is_empty() || compared.is_empty() {
        return Err(Error::Input(format!(
            "alignment needs states on both sides (reference has {} indices, compared {})",
            reference.len(),
            compared.len()
        )));
    }
    let prompts = reference.values().next().map(Vec::len).unwrap_or(0);
    for (side, m) in [("reference", reference), ("compared", compared)] {
        if let Some((i, v)) = m.iter().find(|(_, v)| v.len() != prompts) {
            return Err(Error::Input(format!(
                "{side} index {i} has {} prompts, reference index {} has {prompts}",
                v.len(),
                reference.keys().next().expect("non-empty")
            )));
        }
    }
    let mut rows = Vec::new();
    for (&ci, c) in compared {
        let mut scored: Vec<(usize, Metrics)> = Vec::new();
        for (&ri, r) in reference {
            scored.push((ri, compare(r, c, ri, ci)?));
        }
        let key = |(ri, m): &(usize, Metrics)| {
            let cos = if m.cos_mean.is_nan() {
                f64::NEG_INFINITY
            } else {
                m.cos_mean
            };
            (cos, -m.rel_l2, -((*ri as i64 - ci as i64).abs()))
        };
        scored.sort_by(|a, b| {
            key(b)
                .partial_cmp(&key(a))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        let (best, m) = scored[0].clone();
        rows.push(AlignRow {
            compared: ci,
            best,
            offset: best as i64 - ci as i64,
            cos_mean: m.cos_mean,
            cos_min: m.cos_min,
            rel_l2: m.rel_l2,
            same_index_cos_mean: scored
                .iter()
                .find(|(ri, _)| *ri == ci)
                .map(|(_, m)| m.cos_mean),
            runner_up: scored.get(1).map(|(ri, m)| (*ri, m.cos_mean)),
        });
    }
    let offset = common_offset(&rows, reference);
    Ok(Alignment { rows, offset })
}

/// A best match below this mean cosine is no match (zeros, NaN, another
/// model's states).
const MATCH_COS: f64 = 0.5;

/// Whether a row's best match is a match at all.
fn matches(r: &AlignRow) -> bool {
    r.cos_mean.is_finite() && r.cos_mean >= MATCH_COS
}

/// The offset every row agrees on: the commonest offset among the rows that
/// match, accepted when every row either has it or has no counterpart at it
/// in the reference (the last index of a shifted capture has none); `None`
/// when no row matches or the rows disagree.
fn common_offset(rows: &[AlignRow], reference: &BTreeMap<usize, Vec<Tensor>>) -> Option<i64> {
    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    for r in rows.iter().filter(|r| matches(r)) {
        *counts.entry(r.offset).or_default() += 1;
    }
    let (&o, _) = counts.iter().max_by_key(|(o, n)| (**n, -o.abs()))?;
    let counterpart = |r: &AlignRow| {
        usize::try_from(r.compared as i64 + o)
            .ok()
            .is_some_and(|i| reference.contains_key(&i))
    };
    rows.iter()
        .all(|r| (matches(r) && r.offset == o) || !counterpart(r))
        .then_some(o)
}
