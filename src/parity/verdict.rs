//! Tolerances and verdicts. Defaults depend on the dtype the compared paths
//! ran in: f32 is held to round-off, half precisions looser.

use serde::{Deserialize, Serialize};

use super::metrics::Metrics;
use crate::precision::Precision;

/// Outcome for one compared tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Within the pass tolerance (or bitwise equal).
    Pass,
    /// Within the warn tolerance only.
    Warn,
    /// Beyond it, or NaN/Inf.
    Fail,
}

impl Verdict {
    /// `"PASS"`, `"WARN"`, `"FAIL"`.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        }
    }

    /// The more severe of `self` and `other`.
    pub fn max_by_severity(self, other: Verdict) -> Verdict {
        if other as u8 > self as u8 {
            other
        } else {
            self
        }
    }

    /// `"pass"`, `"warn"`, `"fail"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

/// Thresholds: pass needs `cos_min ≥ pass_cos` and `rel_l2 ≤ pass_rel_l2`;
/// warn needs `cos_min ≥ warn_cos` and `rel_l2 ≤ warn_rel_l2`; else fail.
/// NaN/Inf always fail.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// Smallest per-token cosine that passes.
    pub pass_cos: f64,
    /// Largest relative L2 that passes.
    pub pass_rel_l2: f64,
    /// Smallest per-token cosine that warns (below: fail).
    pub warn_cos: f64,
    /// Largest relative L2 that warns.
    pub warn_rel_l2: f64,
}

impl Tolerance {
    /// Default for a compute dtype. f32: two f32 implementations of the
    /// same math agree to ~1e-6 relative (transformers' eager and sdpa
    /// attention on Qwen3.5 differ by 8e-7), so 1e-4 leaves room for long
    /// prompts while catching any real change. bf16 has 8 mantissa bits:
    /// cos ≈ 0.9995 after four random layers against exact math.
    pub fn for_precision(p: Precision) -> Self {
        match p {
            Precision::Bf16 => Self {
                pass_cos: 0.999,
                pass_rel_l2: 5e-2,
                warn_cos: 0.99,
                warn_rel_l2: 2e-1,
            },
            Precision::F16 => Self {
                pass_cos: 0.9999,
                pass_rel_l2: 1e-2,
                warn_cos: 0.999,
                warn_rel_l2: 5e-2,
            },
            Precision::F32 => Self {
                pass_cos: 0.99999,
                pass_rel_l2: 1e-4,
                warn_cos: 0.999,
                warn_rel_l2: 1e-2,
            },
        }
    }

    /// `pass cos_min ≥ 0.999 and rel L2 ≤ 5e-2`.
    pub fn describe(&self) -> String {
        format!(
            "pass cos_min ≥ {} and rel L2 ≤ {:.0e}",
            self.pass_cos, self.pass_rel_l2
        )
    }

    /// Verdict for `m`.
    pub fn judge(&self, m: &Metrics) -> Verdict {
        self.judge_values(
            m.cos_min,
            m.rel_l2,
            m.bitwise,
            m.nan_count + m.inf_count > 0,
        )
    }

    /// Verdict for a smallest cosine and a relative L2 (`bitwise`: every
    /// element equal; `non_finite`: a NaN or ±Inf among them).
    pub fn judge_values(
        &self,
        cos_min: f64,
        rel_l2: f64,
        bitwise: bool,
        non_finite: bool,
    ) -> Verdict {
        if non_finite {
            return Verdict::Fail;
        }
        if bitwise || (cos_min >= self.pass_cos && rel_l2 <= self.pass_rel_l2) {
            Verdict::Pass
        } else if cos_min >= self.warn_cos && rel_l2 <= self.warn_rel_l2 {
            Verdict::Warn
        } else {
            Verdict::Fail
        }
    }

    /// The loosest tolerance `m` needed to pass, for failure messages:
    /// `"cos_min ≥ 0.998710 and rel L2 ≤ 3.10e-2"`.
    pub fn needed_to_pass(m: &Metrics) -> String {
        if m.nan_count + m.inf_count > 0 {
            return format!(
                "no tolerance: {} NaN and {} Inf values",
                m.nan_count, m.inf_count
            );
        }
        format!("cos_min ≥ {:.6} and rel L2 ≤ {:.2e}", m.cos_min, m.rel_l2)
    }
}

/// `hs 0–3` / `hs 2, 5–6`: `hidden_states` indices as runs.
pub fn index_runs(indices: &[usize]) -> String {
    format!("hs {}", runs_text(&runs(indices), ""))
}

/// Ascending indices as inclusive `[first, last]` runs of neighbours.
pub fn runs(indices: &[usize]) -> Vec<[usize; 2]> {
    let mut runs: Vec<[usize; 2]> = Vec::new();
    for &i in indices {
        match runs.last_mut() {
            Some(r) if r[1] + 1 == i => r[1] = i,
            _ => runs.push([i, i]),
        }
    }
    runs
}

/// Runs as text, each led by `prefix`: `p0–3, p5` (`prefix` `p`), `0–39, 44`.
pub fn runs_text(runs: &[[usize; 2]], prefix: &str) -> String {
    runs.iter()
        .map(|&[lo, hi]| {
            if lo == hi {
                format!("{prefix}{lo}")
            } else {
                format!("{prefix}{lo}–{hi}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parity::metrics::Accumulator;

    #[test]
    fn index_runs_join_neighbours() {
        assert_eq!(index_runs(&[0, 1, 2, 3]), "hs 0–3");
        assert_eq!(index_runs(&[2, 5, 6]), "hs 2, 5–6");
        assert_eq!(index_runs(&[4]), "hs 4");
    }

    #[test]
    fn verdicts_follow_thresholds() {
        let tol = Tolerance::for_precision(Precision::F32);
        let mut same = Accumulator::default();
        same.add_rows(0, &[1.0, 2.0], &[1.0, 2.0], 2);
        assert_eq!(tol.judge(&same.finish()), Verdict::Pass);
        let mut far = Accumulator::default();
        far.add_rows(0, &[1.0, 0.0], &[0.0, 1.0], 2);
        assert_eq!(tol.judge(&far.finish()), Verdict::Fail);
        let mut near = Accumulator::default();
        near.add_rows(0, &[1.0, 1.001], &[1.0, 1.0], 2);
        let near = near.finish();
        assert_eq!(tol.judge(&near), Verdict::Warn);
        assert_eq!(
            Tolerance::for_precision(Precision::Bf16).judge(&near),
            Verdict::Pass
        );
    }
}
