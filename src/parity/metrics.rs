//! Streaming comparison metrics between two captures of the same tensor,
//! computed in f64 from f32 rows, per token row, aggregated over
//! rows and prompts without keeping the tensors.

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where the largest absolute difference sits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Location {
    /// Prompt index.
    pub prompt: usize,
    /// Token (row) index within the prompt.
    pub token: usize,
    /// Feature (column) index.
    pub feature: usize,
    /// Value in capture `a`.
    pub a: f32,
    /// Value in capture `b`.
    pub b: f32,
}

/// Final metrics of one compared tensor (one `hidden_states` index, over all prompts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Smallest per-token cosine similarity.
    pub cos_min: f64,
    /// Mean per-token cosine similarity.
    pub cos_mean: f64,
    /// Largest |a − b| over all elements.
    pub max_abs: f64,
    /// Where `max_abs` occurs (None when nothing was compared).
    pub max_abs_at: Option<Location>,
    /// Mean |a − b|.
    pub mean_abs: f64,
    /// `‖a − b‖₂ / ‖b‖₂` over all elements (0 when both are zero).
    pub rel_l2: f64,
    /// Largest |b| (the scale of the reference).
    pub max_ref_abs: f64,
    /// Every element bitwise equal (as f32 bit patterns).
    pub bitwise: bool,
    /// NaN elements in a plus b.
    pub nan_count: usize,
    /// ±Inf elements in a plus b.
    pub inf_count: usize,
    /// Token rows compared.
    pub rows: usize,
    /// Per prompt, per token row: what [`super::localise`] reads to say where
    /// agreement ends (not serialised; the report carries its summary).
    #[serde(skip)]
    pub profile: Vec<PromptRows>,
}

/// One token row's agreement.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RowStat {
    /// Cosine similarity of the row (NaN rows: −∞).
    pub cos: f32,
    /// `‖a − b‖₂ / ‖b‖₂` of the row (∞ when b's row is zero and a's is not).
    pub rel_l2: f32,
    /// Every element bitwise equal.
    pub bitwise: bool,
    /// A NaN or ±Inf in either row.
    pub non_finite: bool,
}

/// The rows of one prompt, with the prompt's own aggregates.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PromptRows {
    /// Prompt index.
    pub prompt: usize,
    /// Row by row, in token order.
    pub rows: Vec<RowStat>,
    /// Σ (a − b)² over the prompt.
    pub sum_sq_diff: f64,
    /// Σ b² over the prompt.
    pub sum_sq_ref: f64,
}

impl PromptRows {
    /// The prompt's relative L2 (0 when both are zero).
    pub fn rel_l2(&self) -> f64 {
        rel(self.sum_sq_diff, self.sum_sq_ref)
    }

    /// The prompt's smallest row cosine (1 without rows).
    pub fn cos_min(&self) -> f64 {
        self.rows.iter().map(|r| r.cos as f64).fold(1.0, f64::min)
    }
}

/// `sqrt(diff / ref)`: 0 when both are zero, ∞ when only `ref` is.
fn rel(sum_sq_diff: f64, sum_sq_ref: f64) -> f64 {
    if sum_sq_ref > 0.0 {
        (sum_sq_diff / sum_sq_ref).sqrt()
    } else if sum_sq_diff == 0.0 {
        0.0
    } else {
        f64::INFINITY
    }
}

/// Accumulates [`Metrics`] row by row.
#[derive(Debug, Clone)]
pub struct Accumulator {
    rows: usize,
    elems: usize,
    cos_min: f64,
    cos_sum: f64,
    max_abs: f64,
    max_abs_at: Option<Location>,
    sum_abs: f64,
    sum_sq_diff: f64,
    sum_sq_ref: f64,
    max_ref_abs: f64,
    bitwise: bool,
    nan: usize,
    inf: usize,
    profile: Vec<PromptRows>,
}

impl Default for Accumulator {
    fn default() -> Self {
        Self {
            rows: 0,
            elems: 0,
            cos_min: f64::INFINITY,
            cos_sum: 0.0,
            max_abs: 0.0,
            max_abs_at: None,
            sum_abs: 0.0,
            sum_sq_diff: 0.0,
            sum_sq_ref: 0.0,
            max_ref_abs: 0.0,
            bitwise: true,
            nan: 0,
            inf: 0,
            profile: Vec::new(),
        }
    }
}

/// Cosine similarity of two rows in f64; two zero rows count as identical (1),
/// one zero row as orthogonal (0).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 && bb == 0.0 {
        1.0
    } else if aa == 0.0 || bb == 0.0 {
        0.0
    } else {
        ab / (aa.sqrt() * bb.sqrt())
    }
}

impl Accumulator {
    /// Adds prompt `prompt`'s rows. `a`, `b`: `[T, X]` (any float dtype; compared
    /// as f32). Errors: shapes differ.
    pub fn add(&mut self, prompt: usize, a: &Tensor, b: &Tensor) -> Result<()> {
        if a.dims() != b.dims() {
            return Err(Error::Input(format!(
                "cannot compare tensors of shapes {:?} and {:?}",
                a.dims(),
                b.dims()
            )));
        }
        let x = a.dims().last().copied().unwrap_or(1).max(1);
        let av = a.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let bv = b.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        self.add_rows(prompt, &av, &bv, x);
        Ok(())
    }

    /// Adds row-major rows of width `x` (slices of equal length).
    pub fn add_rows(&mut self, prompt: usize, a: &[f32], b: &[f32], x: usize) {
        if self.profile.last().map(|p| p.prompt) != Some(prompt) {
            self.profile.push(PromptRows {
                prompt,
                ..Default::default()
            });
        }
        for (t, (ra, rb)) in a.chunks(x).zip(b.chunks(x)).enumerate() {
            let c = cosine(ra, rb);
            let c_min = if c.is_nan() { f64::NEG_INFINITY } else { c };
            self.cos_min = self.cos_min.min(c_min);
            let non_finite_before = self.nan + self.inf;
            let (mut row_diff, mut row_ref, mut row_bitwise) = (0f64, 0f64, true);
            self.cos_sum += c;
            self.rows += 1;
            for (f, (&va, &vb)) in ra.iter().zip(rb).enumerate() {
                self.elems += 1;
                if va.to_bits() != vb.to_bits() {
                    row_bitwise = false;
                }
                for v in [va, vb] {
                    if v.is_nan() {
                        self.nan += 1;
                    } else if v.is_infinite() {
                        self.inf += 1;
                    }
                }
                let d = (va as f64 - vb as f64).abs();
                let d = if d.is_nan() { f64::INFINITY } else { d };
                if d > self.max_abs || (self.max_abs_at.is_none() && d >= self.max_abs) {
                    self.max_abs = d;
                    self.max_abs_at = Some(Location {
                        prompt,
                        token: t,
                        feature: f,
                        a: va,
                        b: vb,
                    });
                }
                self.sum_abs += d;
                self.sum_sq_diff += d * d;
                self.sum_sq_ref += (vb as f64) * (vb as f64);
                row_diff += d * d;
                row_ref += (vb as f64) * (vb as f64);
                self.max_ref_abs = self.max_ref_abs.max((vb as f64).abs());
            }
            self.bitwise &= row_bitwise;
            let rows = self.profile.last_mut().expect("pushed above");
            rows.sum_sq_diff += row_diff;
            rows.sum_sq_ref += row_ref;
            rows.rows.push(RowStat {
                cos: c_min as f32,
                rel_l2: rel(row_diff, row_ref) as f32,
                bitwise: row_bitwise,
                non_finite: self.nan + self.inf > non_finite_before,
            });
        }
    }

    /// The metrics (the per-row profile moved into them).
    pub fn finish(self) -> Metrics {
        let rel_l2 = rel(self.sum_sq_diff, self.sum_sq_ref);
        Metrics {
            cos_min: if self.rows == 0 { 1.0 } else { self.cos_min },
            cos_mean: if self.rows == 0 {
                1.0
            } else {
                self.cos_sum / self.rows as f64
            },
            max_abs: self.max_abs,
            max_abs_at: self.max_abs_at,
            mean_abs: if self.elems == 0 {
                0.0
            } else {
                self.sum_abs / self.elems as f64
            },
            rel_l2,
            max_ref_abs: self.max_ref_abs,
            bitwise: self.bitwise,
            nan_count: self.nan,
            inf_count: self.inf,
            rows: self.rows,
            profile: self.profile,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_rows_are_bitwise_and_cosine_one() {
        let mut acc = Accumulator::default();
        acc.add_rows(0, &[1.0, 2.0, 3.0, 4.0], &[1.0, 2.0, 3.0, 4.0], 2);
        let m = acc.finish();
        assert!(m.bitwise);
        assert_eq!(m.max_abs, 0.0);
        assert!((m.cos_min - 1.0).abs() < 1e-15);
        assert_eq!(m.rows, 2);
    }

    #[test]
    fn difference_is_located_and_measured() {
        let mut acc = Accumulator::default();
        // Row 1 differs at feature 0 by 0.5.
        acc.add_rows(3, &[1.0, 0.0, 1.5, 1.0], &[1.0, 0.0, 1.0, 1.0], 2);
        let m = acc.finish();
        assert!(!m.bitwise);
        assert_eq!(m.max_abs, 0.5);
        let at = m.max_abs_at.unwrap();
        assert_eq!((at.prompt, at.token, at.feature), (3, 1, 0));
        // rel_l2 = 0.5 / sqrt(1 + 1 + 1) ; cosine of (1.5,1) vs (1,1).
        assert!((m.rel_l2 - 0.5 / 3f64.sqrt()).abs() < 1e-12);
        let c = (1.5 + 1.0) / ((1.5f64 * 1.5 + 1.0).sqrt() * 2f64.sqrt());
        assert!((m.cos_min - c).abs() < 1e-12);
        assert!((m.mean_abs - 0.125).abs() < 1e-12);
    }

    #[test]
    fn nan_is_counted_and_never_passes_as_close() {
        let mut acc = Accumulator::default();
        acc.add_rows(0, &[f32::NAN, 1.0], &[1.0, 1.0], 2);
        let m = acc.finish();
        assert_eq!(m.nan_count, 1);
        assert!(m.max_abs.is_infinite());
        assert!(!m.bitwise);
    }
}
