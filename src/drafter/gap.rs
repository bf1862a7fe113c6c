//! The τ gap between loading paths with its uncertainty: the 95 % paired
//! bootstrap interval ([`super::bootstrap`]) on τ(path) − τ(reference path)
//! for the path whose gap is the largest (τ(path) − τ(file) under `drafter
//! --features`), what `drafter` and `compare --drafter` print beside the
//! gap `--max-tau-gap` judges.

use serde::Serialize;

use super::bootstrap::{Bootstrap, DeltaInterval};
use super::eval::PathTau;
use super::paths::DrafterEval;

/// The largest τ gap between paths, with its interval (`tau_gap_interval`
/// of a drafter report).
#[derive(Debug, Clone, Serialize)]
pub struct TauGap {
    /// The path with the largest gap.
    pub path: String,
    /// The reference path (the first).
    pub reference: String,
    /// τ(path) − τ(reference), signed (`tau_gap` is its magnitude).
    pub delta_tau: f64,
    /// 95 % interval on `delta_tau` (`None` with one prompt).
    pub interval: Option<DeltaInterval>,
    /// How the interval was drawn.
    pub bootstrap: Bootstrap,
}

impl TauGap {
    /// `95% [-0.12, +0.05], not distinguishable with 15 prompts` (or `no
    /// interval with one prompt`).
    pub fn describe(&self) -> String {
        match &self.interval {
            Some(i) => match i.verdict() {
                Some(v) => format!("95% {}, {v}", i.describe()),
                None => format!("95% {}", i.describe()),
            },
            None => "no interval with one prompt".into(),
        }
    }
}

/// The gap of `eval`'s paths with its interval, resampled with `seed`;
/// `None` with a single path.
pub fn gap(eval: &DrafterEval, seed: u64) -> Option<TauGap> {
    let (reference, others) = eval.paths.split_first()?;
    gap_from(reference, others, seed)
}

/// The largest gap of `others` from `reference` (a path, or the file of
/// `drafter --features`) with its interval, resampled with `seed`; `None`
/// without another.
pub fn gap_from(reference: &PathTau, others: &[PathTau], seed: u64) -> Option<TauGap> {
    let (path, delta) = others
        .iter()
        .map(|p| (p, p.summary.tau_macro - reference.summary.tau_macro))
        .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))?;
    let taus = |p: &PathTau| p.per_prompt.iter().map(|x| x.tau).collect::<Vec<_>>();
    let bootstrap = Bootstrap::seeded(seed);
    Some(TauGap {
        path: path.name.clone(),
        reference: reference.name.clone(),
        delta_tau: delta,
        interval: bootstrap.delta(&taus(path), &taus(reference)),
        bootstrap,
    })
}
