//! Uncertainty on a τ difference: a paired bootstrap over prompts. τ (macro)
//! is the mean of the per-prompt τ, so the difference of two runs on the
//! same prompts is the mean of the per-prompt differences `d_k`; resampling
//! the prompts with replacement (the same prompts for both runs: paired)
//! gives the distribution of that mean, and its 2.5th and 97.5th
//! percentiles are the 95 % interval (the percentile method). Resampling
//! draws from statrs' `DiscreteUniform` with a ChaCha8 generator seeded by
//! `--seed`; percentiles use statrs' quantile estimator (R's type 8), so
//! one seed gives the same interval on every machine.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use statrs::distribution::DiscreteUniform;
use statrs::statistics::{Data, OrderStatistics};

/// Resamples drawn for every interval.
pub const RESAMPLES: usize = 10_000;

/// Confidence level of every interval.
pub const LEVEL: f64 = 0.95;

/// The method, as reports state it.
pub const METHOD: &str = "paired bootstrap over prompts: the prompts resampled with replacement \
(the same prompts for both runs), the mean per-prompt τ difference of each resample, \
the 2.5th and 97.5th percentiles of those means (percentile method; statrs DiscreteUniform \
draws from a ChaCha8 generator seeded by --seed, statrs quantile estimator R-8)";

/// How intervals are drawn: resamples, level and seed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bootstrap {
    /// Resamples ([`RESAMPLES`]).
    pub resamples: usize,
    /// Confidence level ([`LEVEL`]).
    pub level: f64,
    /// Seed of the resampling (`--seed`).
    pub seed: u64,
    /// [`METHOD`].
    pub method: &'static str,
}

/// A 95 % interval on a τ difference (`variant − baseline`, or `path −
/// reference path`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DeltaInterval {
    /// Lower end.
    pub low: f64,
    /// Upper end.
    pub high: f64,
    /// Prompts resampled.
    pub prompts: usize,
    /// True when the interval holds 0: the difference is not
    /// distinguishable from noise with this many prompts.
    pub contains_zero: bool,
}

impl DeltaInterval {
    /// True when `x` lies inside.
    pub fn contains(&self, x: f64) -> bool {
        self.low <= x && x <= self.high
    }

    /// `[-0.40, +0.12]`.
    pub fn describe(&self) -> String {
        format!("[{:+.2}, {:+.2}]", self.low, self.high)
    }

    /// `not distinguishable with 5 prompts` when the interval holds 0.
    pub fn verdict(&self) -> Option<String> {
        self.contains_zero.then(|| {
            format!(
                "not distinguishable with {} prompt{}",
                self.prompts,
                if self.prompts == 1 { "" } else { "s" }
            )
        })
    }
}

impl Bootstrap {
    /// [`RESAMPLES`] resamples at [`LEVEL`], seeded with `seed`.
    pub fn seeded(seed: u64) -> Self {
        Self {
            resamples: RESAMPLES,
            level: LEVEL,
            seed,
            method: METHOD,
        }
    }

    /// The interval on `mean(a) − mean(b)` for per-prompt values `a`, `b` of
    /// the same prompts (paired). `None` with fewer than two prompts (a
    /// single prompt has nothing to resample) or when the counts differ.
    pub fn delta(&self, a: &[f64], b: &[f64]) -> Option<DeltaInterval> {
        if a.len() != b.len() {
            return None;
        }
        let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
        self.mean(&d)
    }

    /// The interval on the mean of per-prompt differences `d`.
    pub fn mean(&self, d: &[f64]) -> Option<DeltaInterval> {
        let n = d.len();
        if n < 2 || self.resamples == 0 {
            return None;
        }
        let pick = DiscreteUniform::new(0, n as i64 - 1).ok()?;
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let means: Vec<f64> = (0..self.resamples)
            .map(|_| {
                let s: f64 = (0..n)
                    .map(|_| {
                        d[rand::distributions::Distribution::<i64>::sample(&pick, &mut rng)
                            as usize]
                    })
                    .sum();
                s / n as f64
            })
            .collect();
        let mut data = Data::new(means);
        let tail = (1.0 - self.level) / 2.0;
        let (low, high) = (data.quantile(tail), data.quantile(1.0 - tail));
        Some(DeltaInterval {
            low,
            high,
            prompts: n,
            contains_zero: low <= 0.0 && 0.0 <= high,
        })
    }
}
