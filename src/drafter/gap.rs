//! The τ gap between loading paths with its uncertainty: the 95 % paired
//! bootstrap interval ([`super::bootstrap`]) on τ(path) − τ(reference path)
//! for the path whose gap is the largest (τ(path) − τ(file) under `drafter
//! --features`), what `drafter` and `compare --drafter` print beside the
//! gap `--max-tau-gap` judges.

use serde::Serialize;

use super::bootstrap::{Bootstrap, DeltaInterval};
use super::eval::PathTau;
use super::paths::DrafterEval;

/// How the paths' τ compare, as a gate reads it (`tau_gap_interval.reading`).
/// The verdict is the gap against `--max-tau-gap` alone; the reading says
/// how much the prompts can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GapReading {
    /// Every prompt's τ is the same on both paths (the paths accepted the
    /// same drafts): no prompt count would tell them apart.
    Identical,
    /// The 95 % interval holds 0: with these prompts the gap cannot be told
    /// from noise (PASS while within the limit; more prompts tell).
    NotDistinguishable,
    /// The interval excludes 0: the paths' τ differ (PASS while within the
    /// limit).
    Distinguishable,
    /// One prompt: no interval.
    NoInterval,
}

impl GapReading {
    /// The reading of per-prompt τ `a` against `b` with their interval.
    pub fn of(a: &[f64], b: &[f64], interval: Option<&DeltaInterval>) -> Self {
        match interval {
            _ if a == b => GapReading::Identical,
            None => GapReading::NoInterval,
            Some(i) if i.contains_zero => GapReading::NotDistinguishable,
            Some(_) => GapReading::Distinguishable,
        }
    }

    /// In words, for the summary.
    pub fn describe(self, prompts: usize) -> String {
        match self {
            GapReading::Identical if prompts == 1 => "identical on its one prompt".into(),
            GapReading::Identical => format!("identical on all {prompts} prompts"),
            GapReading::NotDistinguishable => {
                format!("not distinguishable with {prompts} prompts (more prompts tell)")
            }
            GapReading::Distinguishable => "distinguishable: the interval excludes 0".into(),
            GapReading::NoInterval => "no interval with one prompt".into(),
        }
    }
}

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
    /// What the prompts can tell ([`GapReading`]).
    pub reading: GapReading,
    /// Prompts compared.
    pub prompts: usize,
}

impl TauGap {
    /// `Δτ vlm − causal-lm -6.880`: the signed gap, its direction stated.
    pub fn signed(&self) -> String {
        format!(
            "Δτ {} − {} {:+.3}",
            self.path, self.reference, self.delta_tau
        )
    }

    /// The signed gap, its interval (same sign) and what it tells:
    /// `Δτ vlm − causal-lm -6.880, 95% [-6.99, -6.66], distinguishable: …`.
    pub fn sentence(&self) -> String {
        format!("{}, {}", self.signed(), self.describe())
    }

    /// `95% [-0.12, +0.05], not distinguishable with 15 prompts (more
    /// prompts tell)`, `identical on all 10 prompts`, `no interval with one
    /// prompt`.
    pub fn describe(&self) -> String {
        match (&self.interval, self.reading) {
            (_, GapReading::Identical) | (None, _) => self.reading.describe(self.prompts),
            (Some(i), r) => format!("95% {}, {}", i.describe(), r.describe(self.prompts)),
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
    let (a, b) = (taus(path), taus(reference));
    let interval = bootstrap.delta(&a, &b);
    let reading = GapReading::of(&a, &b, interval.as_ref());
    Some(TauGap {
        path: path.name.clone(),
        reference: reference.name.clone(),
        delta_tau: delta,
        interval,
        bootstrap,
        reading,
        prompts: a.len(),
    })
}

/// A τ gap beyond `--max-tau-gap`: `Δτ vlm − causal-lm -6.880 beyond
/// ±0.05, 95% [-6.99, -6.66], distinguishable: …` (the unsigned gap when
/// there is no signed one to show).
pub fn over_limit(gap: f64, limit: f64, signed: Option<&TauGap>) -> String {
    match signed {
        Some(g) => format!("{} beyond ±{limit}, {}", g.signed(), g.describe()),
        None => format!("τ gap {gap:.3} beyond ±{limit}"),
    }
}

/// The gap clause of a summary: [`over_limit`] when `gap` is beyond
/// `limit`, else `Δτ vlm − causal-lm +0.000, identical on all 15 prompts,
/// within ±0.05` (`None` without a second path).
pub fn gap_clause(gap: f64, limit: f64, signed: Option<&TauGap>) -> Option<String> {
    if gap > limit {
        Some(over_limit(gap, limit, signed))
    } else {
        signed.map(|g| format!("{}, within ±{limit}", g.sentence()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reading_follows_the_per_prompt_taus_and_the_interval() {
        let b = Bootstrap::seeded(0);
        let same = [2.0, 3.0, 4.0];
        assert_eq!(
            GapReading::of(&same, &same, b.delta(&same, &same).as_ref()),
            GapReading::Identical
        );
        // One prompt up, one down: the interval holds 0.
        let (x, y) = ([2.5, 2.5, 4.0], [2.0, 3.0, 4.0]);
        assert_eq!(
            GapReading::of(&x, &y, b.delta(&x, &y).as_ref()),
            GapReading::NotDistinguishable
        );
        // Every prompt lower by 1: the interval excludes 0.
        let z = [1.0, 2.0, 3.0];
        let i = b.delta(&z, &same);
        assert!(i.is_some_and(|i| !i.contains_zero));
        assert_eq!(
            GapReading::of(&z, &same, i.as_ref()),
            GapReading::Distinguishable
        );
        assert_eq!(GapReading::of(&[1.0], &[2.0], None), GapReading::NoInterval);
    }
}
