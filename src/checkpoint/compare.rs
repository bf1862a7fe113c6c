//! Two checkpoints' tensors compared: headers first (names, dtypes, shapes),
//! then each common tensor streamed in row chunks and classified — equal,
//! equal after rounding to the lower dtype, off by a constant (the
//! zero-centred norm case: Qwen3.5's RMSNorm multiplies by `1 + w`,
//! transformers `modeling_qwen3_5.py`, `Qwen3_5RMSNorm.forward`, so a
//! conversion that writes `1 + w` shifts every such weight by exactly 1),
//! scaled by a constant, transposed, rows permuted (a q/gate interleave, an
//! expert order), or different — and tensors present on one side only.
//!
//! Constants are judged against the stored dtype's rounding: `b − a` (or
//! `b / a`) may spread by the rounding of the larger operand and still count
//! as one constant.

use std::collections::HashMap;

use serde::Serialize;

use super::headers::TensorHeader;
use super::weights::Weights;
use crate::error::Result;
use crate::precision::Precision;

/// How tensor `b` relates to tensor `a` of the same name.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Relation {
    /// Bitwise equal values (dtype and shape equal too).
    Equal,
    /// Different dtypes, equal once both are rounded to the lower one.
    DtypeRounded {
        /// The dtype both round to.
        to: String,
    },
    /// `b = a + offset` for every element, within the stored rounding.
    Offset {
        /// The constant.
        offset: f64,
    },
    /// `b = a · scale` for every element, within the stored rounding.
    Scaled {
        /// The constant.
        scale: f64,
    },
    /// `b` is `a` transposed (2-D, shapes swapped).
    Transposed,
    /// The same rows in another order (2-D).
    RowsPermuted {
        /// Rows not at their place.
        rows_moved: usize,
    },
    /// Shapes that are neither equal nor swapped.
    ShapeDiffers,
    /// Different values.
    Differs {
        /// `‖b − a‖ / ‖a‖`.
        rel_l2: f64,
        /// Largest |b − a|.
        max_abs: f64,
    },
    /// Integer tensors that differ (compared bytewise).
    BytesDiffer,
}

impl Relation {
    /// `equal`, `off by +1`, `scaled ×0.5`, `rows permuted (12 moved)`, ….
    pub fn label(&self) -> String {
        match self {
            Relation::Equal => "equal".into(),
            Relation::DtypeRounded { to } => format!("equal after rounding to {to}"),
            Relation::Offset { offset } => format!("off by {offset:+}"),
            Relation::Scaled { scale } => format!("scaled ×{scale}"),
            Relation::Transposed => "transposed".into(),
            Relation::RowsPermuted { rows_moved } => format!("rows permuted ({rows_moved} moved)"),
            Relation::ShapeDiffers => "shape differs".into(),
            Relation::Differs { rel_l2, .. } => format!("differs (rel L2 {rel_l2:.2e})"),
            Relation::BytesDiffer => "bytes differ".into(),
        }
    }
}

/// One tensor of both checkpoints.
#[derive(Debug, Clone, Serialize)]
pub struct TensorComparison {
    /// The key.
    pub name: String,
    /// `a`'s dtype and shape.
    pub dtype_a: String,
    /// `b`'s dtype.
    pub dtype_b: String,
    /// `a`'s shape.
    pub shape_a: Vec<usize>,
    /// `b`'s shape.
    pub shape_b: Vec<usize>,
    /// How `b` relates to `a`.
    pub relation: Relation,
}

/// Both checkpoints' tensors compared.
#[derive(Debug, Clone, Serialize)]
pub struct WeightsComparison {
    /// Every common tensor that is not bitwise equal, in `a`'s order.
    pub differing: Vec<TensorComparison>,
    /// Common tensors bitwise equal.
    pub equal: usize,
    /// Keys only `a` holds.
    pub only_in_a: Vec<String>,
    /// Keys only `b` holds.
    pub only_in_b: Vec<String>,
}

/// Relative rounding of a stored dtype (half an ulp at 1).
fn eps(dtype: &str) -> f64 {
    match (Precision::from_safetensors(dtype), dtype) {
        (Some(p), _) => 2f64.powi(-(p.mantissa_bits() as i32 + 1)),
        (None, "F64") => 2f64.powi(-53),
        (None, _) => 2f64.powi(-24),
    }
}

/// Transposition is checked by loading both tensors whole: up to this many
/// elements (256 MiB of f32 each); a larger swapped pair is `ShapeDiffers`.
const MAX_TRANSPOSE_CHECK: u64 = 1 << 26;

/// Rows per streamed chunk so that a chunk holds about 4 M elements.
fn chunk_rows(shape: &[usize]) -> usize {
    let per_row: usize = shape.iter().skip(1).product::<usize>().max(1);
    (4 << 20) / per_row.max(1)
}

/// Running statistics of `b − a` and `b / a` over the streamed chunks.
#[derive(Default)]
struct Stats {
    bitwise: bool,
    d_min: f64,
    d_max: f64,
    r_min: f64,
    r_max: f64,
    ratio_seen: bool,
    zero_mismatch: bool,
    max_mag: f64,
    sq_diff: f64,
    sq_ref: f64,
    max_abs: f64,
    rows_a: Vec<u64>,
    rows_b: Vec<u64>,
}

impl Stats {
    fn new() -> Self {
        Self {
            bitwise: true,
            d_min: f64::INFINITY,
            d_max: f64::NEG_INFINITY,
            r_min: f64::INFINITY,
            r_max: f64::NEG_INFINITY,
            ..Default::default()
        }
    }

    fn add(&mut self, a: &[f32], b: &[f32], row_len: usize) {
        for (ra, rb) in a.chunks(row_len).zip(b.chunks(row_len)) {
            self.rows_a.push(fingerprint(ra));
            self.rows_b.push(fingerprint(rb));
        }
        for (&x, &y) in a.iter().zip(b) {
            if x.to_bits() != y.to_bits() {
                self.bitwise = false;
            }
            let (x, y) = (x as f64, y as f64);
            let d = y - x;
            self.d_min = self.d_min.min(d);
            self.d_max = self.d_max.max(d);
            if x != 0.0 {
                let r = y / x;
                self.r_min = self.r_min.min(r);
                self.r_max = self.r_max.max(r);
                self.ratio_seen = true;
            } else if y != 0.0 {
                self.zero_mismatch = true;
            }
            self.max_mag = self.max_mag.max(x.abs()).max(y.abs());
            self.sq_diff += d * d;
            self.sq_ref += x * x;
            self.max_abs = self.max_abs.max(d.abs());
        }
    }

    /// The relation the statistics show (`eps`: the stored dtype's rounding).
    fn relation(&self, eps: f64) -> Relation {
        if self.bitwise {
            return Relation::Equal;
        }
        let spread = 4.0 * eps * self.max_mag.max(1e-30);
        let offset = (self.d_min + self.d_max) / 2.0;
        if self.d_max - self.d_min <= spread && offset.abs() > spread {
            return Relation::Offset {
                offset: round_sig(offset),
            };
        }
        let scale = (self.r_min + self.r_max) / 2.0;
        if self.ratio_seen
            && !self.zero_mismatch
            && scale.abs() > 4.0 * eps
            && self.r_max - self.r_min <= 4.0 * eps * scale.abs()
            && (scale - 1.0).abs() > 4.0 * eps
        {
            return Relation::Scaled {
                scale: round_sig(scale),
            };
        }
        let mut sa = self.rows_a.clone();
        let mut sb = self.rows_b.clone();
        sa.sort_unstable();
        sb.sort_unstable();
        if self.rows_a.len() > 1 && sa == sb {
            let moved = self
                .rows_a
                .iter()
                .zip(&self.rows_b)
                .filter(|(x, y)| x != y)
                .count();
            return Relation::RowsPermuted { rows_moved: moved };
        }
        Relation::Differs {
            rel_l2: if self.sq_ref > 0.0 {
                (self.sq_diff / self.sq_ref).sqrt()
            } else {
                f64::INFINITY
            },
            max_abs: self.max_abs,
        }
    }
}

/// A constant to 6 significant digits (`1.0000002` reads `1`).
fn round_sig(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let p = 10f64.powi(5 - x.abs().log10().floor() as i32);
    (x * p).round() / p
}

/// A row's identity: FNV-1a over its f32 bit patterns.
fn fingerprint(row: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for v in row {
        for byte in v.to_bits().to_le_bytes() {
            h ^= byte as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// The lower-precision dtype of two (the one both round to).
fn lower(a: &str, b: &str) -> Option<Precision> {
    Some(Precision::from_safetensors(a)?.lower(Precision::from_safetensors(b)?))
}

/// One common tensor of `wa` and `wb`.
fn compare_tensor(
    (wa, wb): (&Weights, &Weights),
    (ta, tb): (&TensorHeader, &TensorHeader),
) -> Result<Relation> {
    if !ta.is_floating() || !tb.is_floating() {
        let same = ta.dtype == tb.dtype
            && ta.shape == tb.shape
            && wa.bytes(&ta.name)? == wb.bytes(&tb.name)?;
        return Ok(if same {
            Relation::Equal
        } else {
            Relation::BytesDiffer
        });
    }
    if ta.shape != tb.shape {
        let swapped = ta.shape.len() == 2
            && ta.shape[0] == tb.shape[1]
            && ta.shape[1] == tb.shape[0]
            && ta.numel() <= MAX_TRANSPOSE_CHECK;
        if swapped {
            let a = wa.load_f32_rounded(&ta.name, Precision::F32)?;
            let b = wb.load_f32_rounded(&tb.name, Precision::F32)?;
            let at = a.t()?.contiguous()?;
            let same = at.flatten_all()?.to_vec1::<f32>()? == b.flatten_all()?.to_vec1::<f32>()?;
            if same {
                return Ok(Relation::Transposed);
            }
        }
        return Ok(Relation::ShapeDiffers);
    }
    let rows = ta.shape.first().copied().unwrap_or(1).max(1);
    let row_len: usize = ta.shape.iter().skip(1).product::<usize>().max(1);
    let step = chunk_rows(&ta.shape).max(1);
    let rounded = if ta.dtype != tb.dtype {
        lower(&ta.dtype, &tb.dtype)
    } else {
        None
    };
    let (mut stats, mut cast) = (Stats::new(), Stats::new());
    let mut start = 0;
    while start < rows {
        let len = step.min(rows - start);
        let (a, b) = if ta.shape.is_empty() {
            (
                wa.load_f32_rounded(&ta.name, Precision::F32)?,
                wb.load_f32_rounded(&tb.name, Precision::F32)?,
            )
        } else {
            (
                wa.load_row_range(&ta.name, start, len, None)?,
                wb.load_row_range(&tb.name, start, len, None)?,
            )
        };
        let mut av = a.flatten_all()?.to_vec1::<f32>()?;
        let mut bv = b.flatten_all()?.to_vec1::<f32>()?;
        stats.add(&av, &bv, row_len);
        if let Some(p) = rounded {
            p.round_slice(&mut av);
            p.round_slice(&mut bv);
            cast.add(&av, &bv, row_len);
        }
        start += len;
    }
    if let Some(p) = rounded {
        if cast.bitwise {
            return Ok(Relation::DtypeRounded { to: p.to_string() });
        }
    }
    let e = eps(&ta.dtype).max(eps(&tb.dtype));
    Ok(stats.relation(e))
}

/// Compares every tensor of checkpoint `wa` with `wb`'s of the same name.
///
/// Errors: unreadable tensors ([`crate::error::Error::Checkpoint`]).
pub fn compare(wa: &Weights, wb: &Weights) -> Result<WeightsComparison> {
    let (a, b) = (wa.index(), wb.index());
    let in_b: HashMap<&str, &TensorHeader> =
        b.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut out = WeightsComparison {
        differing: Vec::new(),
        equal: 0,
        only_in_a: Vec::new(),
        only_in_b: b
            .tensors
            .iter()
            .filter(|t| !a.contains(&t.name))
            .map(|t| t.name.clone())
            .collect(),
    };
    for ta in &a.tensors {
        let Some(tb) = in_b.get(ta.name.as_str()) else {
            out.only_in_a.push(ta.name.clone());
            continue;
        };
        let relation = compare_tensor((wa, wb), (ta, tb))?;
        if relation == Relation::Equal && ta.dtype == tb.dtype {
            out.equal += 1;
            continue;
        }
        out.differing.push(TensorComparison {
            name: ta.name.clone(),
            dtype_a: ta.dtype.clone(),
            dtype_b: tb.dtype.clone(),
            shape_a: ta.shape.clone(),
            shape_b: tb.shape.clone(),
            relation,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation(a: &[f32], b: &[f32], row: usize, dtype: &str) -> Relation {
        let mut s = Stats::new();
        s.add(a, b, row);
        s.relation(eps(dtype))
    }

    #[test]
    fn a_constant_offset_is_found_within_the_stored_rounding() {
        let a = [0.01f32, -0.02, 0.03, 0.0];
        let b: Vec<f32> = a.iter().map(|x| x + 1.0).collect();
        assert_eq!(relation(&a, &b, 2, "F32"), Relation::Offset { offset: 1.0 });
    }

    #[test]
    fn scaling_permutation_and_difference_are_told_apart() {
        let a = [1.0f32, 2.0, 3.0, 4.0];
        assert_eq!(
            relation(&a, &[0.5, 1.0, 1.5, 2.0], 2, "F32"),
            Relation::Scaled { scale: 0.5 }
        );
        assert_eq!(
            relation(&a, &[3.0, 4.0, 1.0, 2.0], 2, "F32"),
            Relation::RowsPermuted { rows_moved: 2 }
        );
        assert!(matches!(
            relation(&a, &[1.0, 2.0, 3.0, 4.5], 2, "F32"),
            Relation::Differs { .. }
        ));
        assert_eq!(relation(&a, &a, 2, "F32"), Relation::Equal);
    }
}

/// Tensors that relate to their counterpart the same way, with what that means.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// The shared relation's label (`off by +1`, `rows permuted`, `only in b`).
    pub relation: String,
    /// The tensors, in `a`'s order.
    pub names: Vec<String>,
    /// What it means, in one sentence.
    pub sentence: String,
    /// Whether it fails the comparison (equal-after-rounding does not).
    pub fails: bool,
}

impl WeightsComparison {
    /// The differing tensors grouped by relation, with their meaning: offsets
    /// and scales by constant, then layouts, dtype rounding, other
    /// differences, and keys one side lacks.
    pub fn findings(&self) -> Vec<Finding> {
        let mut groups: Vec<(String, Vec<&TensorComparison>)> = Vec::new();
        for t in &self.differing {
            let key = match &t.relation {
                Relation::Differs { .. } => "differs".to_string(),
                Relation::RowsPermuted { .. } => "rows permuted".to_string(),
                r => r.label(),
            };
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(t),
                None => groups.push((key, vec![t])),
            }
        }
        let mut out: Vec<Finding> = groups
            .into_iter()
            .map(|(key, ts)| finding(key, &ts))
            .collect();
        for (side, names) in [("a", &self.only_in_a), ("b", &self.only_in_b)] {
            if !names.is_empty() {
                let other = if side == "a" { "b" } else { "a" };
                out.push(Finding {
                    relation: format!("only in {side}"),
                    names: names.clone(),
                    sentence: format!(
                        "{} tensor{} only {side} holds: missing from {other} (a loading path reading {other} \
                         initialises them randomly, or its key names differ: `hsparity inventory` shows what each \
                         Auto class makes of them)",
                        names.len(),
                        if names.len() == 1 { "" } else { "s" }
                    ),
                    fails: true,
                });
            }
        }
        out
    }
}

/// One group's finding.
fn finding(key: String, ts: &[&TensorComparison]) -> Finding {
    let names: Vec<String> = ts.iter().map(|t| t.name.clone()).collect();
    let n = names.len();
    let all_norms = names.iter().all(|n| n.contains("norm"));
    let plural = if n == 1 { "" } else { "s" };
    let sentence = match &ts[0].relation {
        Relation::Offset { offset } if all_norms && (offset.abs() - 1.0).abs() < 1e-6 => format!(
            "{n} norm weight{plural} off by exactly {offset:+}: the zero-centred norm convention — Qwen3.5's \
             RMSNorm computes x·(1 + w) (transformers modeling_qwen3_5.py, Qwen3_5RMSNorm), so a conversion that \
             stored 1 + w for such a model (or w for a plain x·w one) shifts each by 1 and every layer's output \
             changes from the first norm on; fix the conversion ({} 1 from these tensors)",
            if *offset > 0.0 { "subtract" } else { "add" }
        ),
        Relation::Offset { offset } => format!("{n} tensor{plural} off by the constant {offset:+}"),
        Relation::Scaled { scale } => format!(
            "{n} tensor{plural} scaled by the constant ×{scale} (a folded scale, a norm or rope factor applied at \
             conversion)"
        ),
        Relation::Transposed => format!(
            "{n} tensor{plural} stored transposed ([in, out] instead of [out, in]: a conversion from a framework \
             that stores x·W)"
        ),
        Relation::RowsPermuted { .. } => format!(
            "{n} tensor{plural} holding the same rows in another order (a q/gate interleave, a head or expert \
             order changed by the conversion)"
        ),
        Relation::DtypeRounded { to } => format!(
            "{n} tensor{plural} stored in another dtype, equal once rounded to {to} (a dtype conversion; the \
             paths compute in the dtype they load)"
        ),
        Relation::ShapeDiffers => format!("{n} tensor{plural} of another shape"),
        Relation::Differs { .. } => format!("{n} tensor{plural} with other values"),
        Relation::BytesDiffer => format!("{n} integer tensor{plural} with other values"),
        Relation::Equal => format!("{n} tensor{plural} equal"),
    };
    Finding {
        relation: key,
        fails: !matches!(
            ts[0].relation,
            Relation::DtypeRounded { .. } | Relation::Equal
        ),
        names,
        sentence,
    }
}
