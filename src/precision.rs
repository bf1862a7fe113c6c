//! The dtype a loading path resolves to and computes in, and how hsparity
//! emulates it the way PyTorch rounds it.
//!
//! hsparity keeps every tensor physically in f32 and rounds it to the model
//! dtype exactly where PyTorch would produce a bf16/f16 tensor: after each
//! matmul (f32 accumulation, one rounding, as CPU bf16 GEMMs do), after each
//! elementwise op on half tensors (PyTorch computes those in f32 and rounds
//! once), and where the reference casts (`.to(input_dtype)`). The f32 islands
//! of `modeling_qwen3_5.py` — RMSNorm, `g`, the delta-rule state, softmax —
//! simply skip the rounding. For f32 every rounding is the identity.
//!
//! A low module: the checkpoint reader, the loading paths, the models and the
//! parity code all speak this one type.

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

mod bits;

use bits::{flip_bf16_piece, round_bf16, round_f16, round_piece};

/// A floating-point model dtype (`torch.float32`, `torch.bfloat16`,
/// `torch.float16`): what `from_pretrained(dtype="auto")` resolves a loading
/// path to, and what hsparity computes in. Serialised `f32`, `bf16`, `f16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// torch.float32.
    #[default]
    F32,
    /// torch.bfloat16.
    Bf16,
    /// torch.float16.
    F16,
}

impl Precision {
    /// `"f32"`, `"bf16"`, `"f16"`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }

    /// torch's name: `"float32"`, `"bfloat16"`, `"float16"`.
    pub fn torch_name(self) -> &'static str {
        match self {
            Precision::F32 => "float32",
            Precision::Bf16 => "bfloat16",
            Precision::F16 => "float16",
        }
    }

    /// The three dtypes, widest first.
    pub const ALL: [Precision; 3] = [Precision::F32, Precision::Bf16, Precision::F16];

    /// Parses a dtype spelling: `f32`, `float32`, `fp32`, `float`, `bf16`,
    /// `bfloat16`, `f16`, `float16`, `fp16`, `half`, each optionally prefixed
    /// with `torch.`. `None` for anything else.
    pub fn from_name(s: &str) -> Option<Self> {
        match s.strip_prefix("torch.").unwrap_or(s) {
            "f32" | "float32" | "fp32" | "float" => Some(Precision::F32),
            "bf16" | "bfloat16" => Some(Precision::Bf16),
            "f16" | "float16" | "fp16" | "half" => Some(Precision::F16),
            _ => None,
        }
    }

    /// Parses a config spelling (`"bfloat16"`, `"torch.float16"`, …) of
    /// `field`. `Ok(None)` for `"auto"`.
    ///
    /// Errors ([`Error::Config`], naming `field`): any other string.
    pub fn from_config_str(s: &str, field: &str) -> Result<Option<Self>> {
        if s.strip_prefix("torch.").unwrap_or(s) == "auto" {
            return Ok(None);
        }
        Self::from_name(s).map(Some).ok_or_else(|| {
            Error::Config(format!(
                "{field} = {:?}: hsparity supports float32, bfloat16 and float16",
                s.strip_prefix("torch.").unwrap_or(s)
            ))
        })
    }

    /// From a safetensors dtype name (`F32`, `BF16`, `F16`); `None` otherwise.
    pub fn from_safetensors(s: &str) -> Option<Self> {
        match s {
            "F32" => Some(Precision::F32),
            "BF16" => Some(Precision::Bf16),
            "F16" => Some(Precision::F16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            Precision::F32 => 4,
            Precision::Bf16 | Precision::F16 => 2,
        }
    }

    /// Explicit mantissa bits (23, 7, 10): the lower of two dtypes is the
    /// one with fewer.
    pub fn mantissa_bits(self) -> u32 {
        match self {
            Precision::F32 => 23,
            Precision::Bf16 => 7,
            Precision::F16 => 10,
        }
    }

    /// The coarser of `self` and `other` (fewer mantissa bits).
    pub fn lower(self, other: Self) -> Self {
        if other.mantissa_bits() < self.mantissa_bits() {
            other
        } else {
            self
        }
    }

    /// True when rounding to this dtype changes no value stored as `stored`
    /// (a safetensors dtype: `"BF16"`, `"F16"`, …): f32 keeps everything, and
    /// bf16 → f32 → bf16 and f16 → f32 → f16 are the identity.
    pub fn is_exact_for(self, stored: &str) -> bool {
        matches!(
            (self, stored),
            (Precision::F32, _) | (Precision::Bf16, "BF16") | (Precision::F16, "F16")
        )
    }

    /// The candle dtype holding values of this precision.
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::Bf16 => DType::BF16,
            Precision::F16 => DType::F16,
        }
    }

    /// Rounds every element of `t` (f32) to this dtype, keeping f32 storage:
    /// bitwise `t.to_dtype(bf16|f16).to_dtype(f32)`, in one pass over `t`
    /// into one new buffer (no half-precision intermediate).
    pub fn round(self, t: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Precision::F32 => t.clone(),
            _ if t.dtype() != DType::F32 || !t.is_contiguous() => {
                t.to_dtype(self.dtype())?.to_dtype(DType::F32)?
            }
            _ => t.apply_op1_no_bwd(&RoundOp(self))?,
        })
    }

    /// Rounds one value (inlined, so that a loop over values whose
    /// precision it knows can vectorise).
    #[inline]
    pub fn round_f32(self, x: f32) -> f32 {
        match self {
            Precision::F32 => x,
            Precision::Bf16 => round_bf16(x),
            Precision::F16 => round_f16(x),
        }
    }

    /// Rounds a buffer in place (bitwise [`Self::round_f32`] of every element).
    pub fn round_slice(self, v: &mut [f32]) {
        use rayon::prelude::*;
        if self == Precision::F32 {
            return;
        }
        // Elementwise: pieces in parallel once there are several.
        if v.len() > 4 * ROUND_PIECE {
            v.par_chunks_mut(ROUND_PIECE)
                .for_each(|c| round_piece(self, c));
        } else {
            v.chunks_mut(ROUND_PIECE).for_each(|c| round_piece(self, c));
        }
    }
}

impl Precision {
    /// `src` rounded to this dtype, in a new vector written once (not
    /// zeroed first): each piece copied and rounded while in cache, pieces
    /// in parallel once there are several.
    fn rounded(self, src: &[f32]) -> Vec<f32> {
        use rayon::prelude::*;
        use std::mem::MaybeUninit;
        let fill = |o: &mut [MaybeUninit<f32>], s: &[f32]| {
            assert_eq!(o.len(), s.len(), "a piece and its source");
            // SAFETY: `o` holds `s.len()` values of f32's layout and does not
            // overlap `s`.
            unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), o.as_mut_ptr().cast(), s.len()) };
            // SAFETY: every value of `o` was written just above.
            self.round_slice(unsafe { crate::memory::assume_init(o) });
        };
        let mut out = Vec::with_capacity(src.len());
        let spare = &mut out.spare_capacity_mut()[..src.len()];
        if src.len() >= 16 * ROUND_PIECE {
            spare
                .par_chunks_mut(16 * ROUND_PIECE)
                .zip(src.par_chunks(16 * ROUND_PIECE))
                .for_each(|(o, s)| fill(o, s));
        } else {
            fill(spare, src);
        }
        // SAFETY: `fill` wrote each of the first `src.len()` values.
        unsafe { out.set_len(src.len()) };
        out
    }
}

/// How the f32 sums of a linear map's products become the compute dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProductRounding {
    /// To nearest, ties to even: what every kernel and torch's CPU half
    /// GEMMs do with their own f32 sums.
    #[default]
    Nearest,
    /// The noise floor's shadow (`docs/noise-floor.md`): to nearest, except
    /// a sum within [`MIDPOINT_ZONE`]`·√k` f32 units in the last place of a
    /// rounding midpoint of the dtype goes to the other neighbour, as it
    /// would had another summation order of its `k` products (torch's
    /// oneDNN or MKL blocking, an engine's kernel) landed it the other side.
    NearMidpointsFlipped,
}

/// The half-width, in f32 units in the last place per `√k`, of the zone
/// around a rounding midpoint where [`ProductRounding::NearMidpointsFlipped`]
/// rounds the other way. Two f32 summation orders of `k` products differ by
/// about `√k` such units; the constant is calibrated on the corpus of
/// `tools/noise_corpus.py` (`docs/noise-floor.md`).
pub const MIDPOINT_ZONE: f64 = 1.0;

impl Precision {
    /// `t` (f32 sums of `k` products each) rounded to this dtype as
    /// `rounding` says.
    ///
    /// Errors: a tensor failure.
    pub fn round_products(self, t: &Tensor, k: usize, rounding: ProductRounding) -> Result<Tensor> {
        if rounding == ProductRounding::Nearest || self == Precision::F32 {
            return self.round(t);
        }
        use rayon::prelude::*;
        let zone = MIDPOINT_ZONE * (k.max(1) as f64).sqrt();
        let (shape, device) = (t.shape().clone(), t.device().clone());
        let mut v = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        v.par_chunks_mut(ROUND_PIECE).for_each(|c| match self {
            Precision::Bf16 => flip_bf16_piece(c, zone),
            _ => c
                .iter_mut()
                .for_each(|x| *x = self.round_flipping(*x, zone)),
        });
        Ok(Tensor::from_vec(v, shape, &device)?)
    }

    /// `x` rounded to nearest, or to the other neighbour when `x` lies within
    /// `zone` f32 units in the last place of their midpoint.
    pub fn round_flipping(self, x: f32, zone: f64) -> f32 {
        let r = self.round_f32(x);
        if !x.is_finite() || !r.is_finite() || r == 0.0 || r == x {
            return r;
        }
        let toward_x = |r: f32| -> f32 {
            let up = x > r;
            match self {
                Precision::F32 => r,
                Precision::Bf16 => {
                    let b = half::bf16::from_f32(r).to_bits();
                    let b = if up == (r > 0.0) { b + 1 } else { b - 1 };
                    half::bf16::from_bits(b).to_f32()
                }
                Precision::F16 => {
                    let b = half::f16::from_f32(r).to_bits();
                    let b = if up == (r > 0.0) { b + 1 } else { b - 1 };
                    half::f16::from_bits(b).to_f32()
                }
            }
        };
        let other = toward_x(r);
        if !other.is_finite() {
            return r;
        }
        let mid = (f64::from(r) + f64::from(other)) / 2.0;
        let ulp = f64::from(f32::from_bits(x.abs().to_bits() + 1) - x.abs());
        if (f64::from(x) - mid).abs() <= zone * ulp {
            other
        } else {
            r
        }
    }
}

/// Elements per piece of [`Precision::round_slice`]'s and [`RoundOp`]'s
/// parallel split.
const ROUND_PIECE: usize = 4096;

/// [`Precision::round`] of a contiguous f32 tensor as one candle op: reads the input
/// once, writes one f32 buffer; large tensors in parallel pieces
/// on rayon's threads.
struct RoundOp(Precision);

impl candle_core::CustomOp1 for RoundOp {
    fn name(&self) -> &'static str {
        "precision-round"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let candle_core::CpuStorage::F32(v) = storage else {
            candle_core::bail!("precision-round expects f32 storage");
        };
        let Some((a, b)) = layout.contiguous_offsets() else {
            candle_core::bail!("precision-round expects a contiguous tensor");
        };
        let out = self.0.rounded(&v[a..b]);
        Ok((candle_core::CpuStorage::F32(out), layout.shape().clone()))
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = Error;

    /// Parses the spellings of [`Precision::from_name`].
    ///
    /// Errors ([`Error::Input`]): anything else.
    fn from_str(s: &str) -> Result<Self> {
        Self::from_name(s)
            .ok_or_else(|| Error::Input(format!("unknown dtype {s:?}: expected f32, bf16 or f16")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_half_crate_and_is_identity_for_f32() {
        let x = 1.0f32 + 1.0 / 512.0; // not representable in bf16 (8 bits)
        assert_eq!(Precision::F32.round_f32(x), x);
        assert_eq!(Precision::Bf16.round_f32(x), 1.0);
        assert_eq!(Precision::F16.round_f32(x), x); // f16 has 10 bits
        let t = Tensor::new(&[x, 3.0], &candle_core::Device::Cpu).unwrap();
        let r = Precision::Bf16.round(&t).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(r, vec![1.0, 3.0]);
    }

    /// A tensor's rounding gives each value's own, on a view that starts
    /// inside its storage and on lengths that take the parallel pieces with
    /// a partial last one, or a single piece.
    #[test]
    fn tensor_rounding_is_each_values() {
        let n = 16 * ROUND_PIECE * 3 + 1000;
        use rand::{Rng, SeedableRng};
        let mut r = rand::rngs::StdRng::seed_from_u64(41);
        // Every bit pattern alike: NaNs, infinities and subnormals included.
        let v: Vec<f32> = (0..n + 7).map(|_| f32::from_bits(r.gen())).collect();
        let t = Tensor::new(v.as_slice(), &candle_core::Device::Cpu).unwrap();
        for len in [n, 16 * ROUND_PIECE, 100, 0] {
            let view = t.narrow(0, 7, len).unwrap();
            for p in [Precision::Bf16, Precision::F16] {
                let got = p.round(&view).unwrap().to_vec1::<f32>().unwrap();
                assert_eq!(got.len(), len);
                for (i, (g, x)) in got.iter().zip(&v[7..]).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        p.round_f32(*x).to_bits(),
                        "{p} at {i} of {len}"
                    );
                }
            }
        }
    }

    /// The shadow's rounding: to nearest away from midpoints; the other
    /// neighbour within `zone` f32 ulps of one, on both sides, for both
    /// signs and both half dtypes; exact values and non-finite ones kept.
    #[test]
    fn flipping_near_midpoints_takes_the_other_neighbour() {
        for p in [Precision::Bf16, Precision::F16] {
            let (lo, hi) = (
                1.0f32,
                f32::from_bits(1f32.to_bits() + (1 << (23 - p.mantissa_bits()))),
            );
            assert_eq!(p.round_f32(hi), hi, "{p}: {hi} is the next {p} value");
            let mid = (lo + hi) / 2.0;
            let step = |x: f32, n: i32| f32::from_bits((x.to_bits() as i32 + n) as u32);
            for sign in [1.0f32, -1.0] {
                let (below, above) = (sign * step(mid, -3), sign * step(mid, 3));
                assert_eq!(p.round_f32(below), sign * lo, "{p}");
                assert_eq!(
                    p.round_flipping(below, 4.0),
                    sign * hi,
                    "{p}: 3 ulps below the midpoint"
                );
                assert_eq!(p.round_f32(above), sign * hi, "{p}");
                assert_eq!(
                    p.round_flipping(above, 4.0),
                    sign * lo,
                    "{p}: 3 ulps above the midpoint"
                );
                assert_eq!(
                    p.round_flipping(below, 2.0),
                    sign * lo,
                    "{p}: outside a zone of 2"
                );
                let far = sign * step(mid, -5000);
                assert_eq!(p.round_flipping(far, 4.0), p.round_f32(far), "{p}");
            }
            for x in [lo, hi, 0.0, f32::INFINITY, f32::NAN] {
                let (a, b) = (p.round_flipping(x, 1e9), p.round_f32(x));
                assert!(a.to_bits() == b.to_bits(), "{p}: {x} kept");
            }
            assert_eq!(Precision::F32.round_flipping(mid, 1e9), mid);
        }
        let t = Tensor::new(
            &[1.0f32 + 1.0 / 256.0 - f32::EPSILON],
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let flipped = Precision::Bf16
            .round_products(&t, 16, ProductRounding::NearMidpointsFlipped)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(
            flipped,
            [1.0 + 1.0 / 128.0],
            "within √16 ulps of 1 + 2⁻⁸: the other neighbour"
        );
        let nearest = Precision::Bf16
            .round_products(&t, 16, ProductRounding::Nearest)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(nearest, [1.0]);
    }
}
