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
                .for_each(|c| self.round_piece(c));
        } else {
            v.chunks_mut(ROUND_PIECE).for_each(|c| self.round_piece(c));
        }
    }

    /// [`Self::round_slice`] on at most [`ROUND_PIECE`] values: the loop
    /// compiled for AVX-512F where the CPU has it (16 lanes; the crate's
    /// baseline build has SSE2's 4), the same bit operations either way.
    fn round_piece(self, c: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::capabilities().avx512f {
            // SAFETY: the CPU has AVX-512F (read from CPUID with the capabilities).
            return unsafe { round_piece_avx512(self, c) };
        }
        round_piece_lanes(self, c);
    }
}

/// [`Precision::round_piece`]'s loop, inlined into each build.
#[inline(always)]
fn round_piece_lanes(p: Precision, c: &mut [f32]) {
    match p {
        Precision::F32 => {}
        Precision::Bf16 => c.iter_mut().for_each(|x| *x = round_bf16(*x)),
        Precision::F16 => c.iter_mut().for_each(|x| *x = round_f16(*x)),
    }
}

/// [`round_piece_lanes`] compiled for AVX-512F.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn round_piece_avx512(p: Precision, c: &mut [f32]) {
    round_piece_lanes(p, c);
}

impl Precision {
    /// `src` rounded to this dtype into `dst` (same length).
    fn round_into(self, src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
        self.round_slice(dst);
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

/// [`flip_bf16`] on every value of `c`, compiled for AVX-512F where the CPU
/// has it (as [`Precision::round_piece`]).
fn flip_bf16_piece(c: &mut [f32], zone: f64) {
    #[inline(always)]
    fn lanes(c: &mut [f32], zone: f64) {
        c.iter_mut().for_each(|x| *x = flip_bf16(*x, zone));
    }
    /// `lanes` compiled for AVX-512F.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn lanes_avx512(c: &mut [f32], zone: f64) {
        lanes(c, zone);
    }
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::capabilities().avx512f {
        // SAFETY: the CPU has AVX-512F (read from CPUID with the capabilities).
        return unsafe { lanes_avx512(c, zone) };
    }
    lanes(c, zone);
}

/// [`Precision::round_flipping`] for bf16 on the bits: a finite `x`'s
/// distance from the bf16 rounding midpoint is its low 16 bits' from
/// `0x8000`, in units of its own last place; within `zone` of it the other
/// neighbour is taken (truncation when nearest rounds away from zero, the
/// next bf16 value when it truncates).
#[inline(always)]
fn flip_bf16(x: f32, zone: f64) -> f32 {
    let b = x.to_bits();
    let r = round_bf16(x);
    let low = b & 0xFFFF;
    if b & 0x7FFF_FFFF >= 0x7F80_0000
        || !r.is_finite()
        || r == x
        || r == 0.0
        || f64::from(low.abs_diff(0x8000)) > zone
    {
        return r;
    }
    let truncated = b & 0xFFFF_0000;
    let other = if r.to_bits() == truncated {
        f32::from_bits(truncated + 0x1_0000)
    } else {
        f32::from_bits(truncated)
    };
    if other.is_finite() {
        other
    } else {
        r
    }
}

/// Elements per piece of [`Precision::round_slice`]'s and [`RoundOp`]'s
/// parallel split.
const ROUND_PIECE: usize = 4096;

/// `half::bf16::from_f32(x).to_f32()` (round to nearest, ties to even; a NaN
/// keeps its sign and high payload with the quiet bit set), written without
/// branches so that a loop over it vectorises.
#[inline(always)]
fn round_bf16(x: f32) -> f32 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000;
    let nan = (b | 0x0040_0000) & 0xFFFF_0000;
    f32::from_bits(if b & 0x7FFF_FFFF > 0x7F80_0000 {
        nan
    } else {
        rounded
    })
}

/// `half::f16::from_f32(x).to_f32()` (round to nearest, ties to even; past
/// 65504 to ±∞; a NaN keeps its sign and high payload with the quiet bit
/// set), without branches and without the half crate's per-value call, so
/// that a loop over it vectorises. Values of f16's normal range round at
/// mantissa bit 13 on the bits, as [`round_bf16`] at bit 16. Below 2⁻¹⁴,
/// where f16's step is 2⁻²⁴, `(|x| + 0.5) − 0.5` rounds: the sum lies in
/// [0.5, 1), whose f32 step is 2⁻²⁴, so f32's own round-to-nearest-even
/// rounds `|x|` to a multiple of it and the subtraction is exact. (An add
/// with a subnormal operand takes no assist.)
#[inline(always)]
fn round_f16(x: f32) -> f32 {
    /// 2⁻¹⁴, f16's smallest normal value.
    const MIN_NORMAL: u32 = 0x3880_0000;
    /// 2¹⁶: a value rounding to it or past it is past f16's largest.
    const OVERFLOW: u32 = 0x4780_0000;
    const INF: u32 = 0x7F80_0000;
    let b = x.to_bits();
    let (a, sign) = (b & 0x7FFF_FFFF, b & 0x8000_0000);
    let rounded = a.wrapping_add(0xFFF + ((a >> 13) & 1)) & 0xFFFF_E000;
    let normal = if rounded >= OVERFLOW { INF } else { rounded };
    let small = ((f32::from_bits(a) + 0.5) - 0.5).to_bits();
    let nan = (b & 0xFFFF_E000) | 0x0040_0000;
    f32::from_bits(if a > INF {
        nan
    } else if a >= MIN_NORMAL {
        sign | normal
    } else {
        sign | small
    })
}

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
        use rayon::prelude::*;
        let candle_core::CpuStorage::F32(v) = storage else {
            candle_core::bail!("precision-round expects f32 storage");
        };
        let Some((a, b)) = layout.contiguous_offsets() else {
            candle_core::bail!("precision-round expects a contiguous tensor");
        };
        let src = &v[a..b];
        let mut out = vec![0f32; src.len()];
        if src.len() >= 16 * ROUND_PIECE {
            out.par_chunks_mut(16 * ROUND_PIECE)
                .zip(src.par_chunks(16 * ROUND_PIECE))
                .for_each(|(o, s)| self.0.round_into(s, o));
        } else {
            self.0.round_into(src, &mut out);
        }
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

    /// The bits-level bf16 flip is the reference's (`round_flipping`) on
    /// every pattern of [`patterns`], at zones 0.5, 4 and 100.
    #[test]
    fn bf16_flip_on_the_bits_is_the_reference() {
        for zone in [0.5, 4.0, 100.0] {
            let bits = patterns(99991);
            let mut pieces: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
            pieces
                .chunks_mut(ROUND_PIECE)
                .for_each(|c| flip_bf16_piece(c, zone));
            for (b, piece) in bits.iter().zip(&pieces) {
                let one = flip_bf16(f32::from_bits(*b), zone);
                assert_eq!(
                    piece.to_bits(),
                    one.to_bits(),
                    "{b:#010x}: the piece's build"
                );
            }
            for b in bits {
                let x = f32::from_bits(b);
                let (fast, slow) = (flip_bf16(x, zone), Precision::Bf16.round_flipping(x, zone));
                assert!(
                    fast.to_bits() == slow.to_bits() || (fast.is_nan() && slow.is_nan()),
                    "{b:#010x} at zone {zone}: {fast} vs {slow}"
                );
            }
        }
    }

    /// f32 bit patterns covering every rounding case: a stride through all
    /// 2^32 patterns, plus every low-17-bit pattern around the bf16 rounding
    /// bit and every f16 rounding position, at the exponents of zero,
    /// subnormals, 1, the f16 range edges, the largest finite values, Inf and NaN.
    fn patterns(stride: u64) -> Vec<u32> {
        let mut v: Vec<u32> = (0..1u64 << 32)
            .step_by(stride as usize)
            .map(|b| b as u32)
            .collect();
        for e in [0u32, 1, 0x67, 0x70, 0x71, 0x7F, 0x8E, 0x8F, 0xFE, 0xFF] {
            for sign in [0u32, 1 << 31] {
                let base = sign | e << 23;
                v.extend((0..1u32 << 17).map(|m| base | m));
                v.extend((0..1u32 << 17).map(|m| base | 0x7F_FFFF & !((1 << 17) - 1) | m));
                v.extend((0..1u32 << 14).map(|m| base | (m << 9) | 0x1FF));
            }
        }
        v
    }

    /// f16 rounding on every one of the 2³² f32 bit patterns is the half
    /// crate's round trip (`from_f32`, `to_f32`), NaNs' bits included.
    #[test]
    fn f16_rounding_is_the_half_crates_on_every_f32() {
        use half::slice::HalfFloatSliceExt;
        use rayon::prelude::*;
        let bad = (0..1u32 << 16)
            .into_par_iter()
            .map(|hi| {
                let xs: Vec<f32> = (0..1u32 << 16)
                    .map(|lo| f32::from_bits(hi << 16 | lo))
                    .collect();
                let mut h = vec![half::f16::ZERO; xs.len()];
                h.convert_from_f32_slice(&xs);
                let mut want = vec![0f32; xs.len()];
                h.convert_to_f32_slice(&mut want);
                let mut got = xs.clone();
                Precision::F16.round_slice(&mut got);
                got.iter()
                    .zip(&want)
                    .position(|(g, w)| g.to_bits() != w.to_bits())
                    .map(|i| format!("{:#010x}", xs[i].to_bits()))
            })
            .find_any(|first| first.is_some())
            .flatten();
        assert_eq!(bad, None, "the first differing pattern");
        // And the one-value form, on values of each case.
        for x in [
            1e-8f32,
            -3e-6,
            6.1e-5,
            65519.0,
            65520.0,
            -7e5,
            f32::NAN,
            -0.0,
        ] {
            let want = half::f16::from_f32(x).to_f32();
            assert_eq!(
                Precision::F16.round_f32(x).to_bits(),
                want.to_bits(),
                "{x:e}"
            );
        }
    }

    /// `round_f32` and the one-pass kernels of `round_slice` and `round` give bitwise what the
    /// half crate (and so candle's `to_dtype` round trip) gives, NaNs included.
    #[test]
    fn fast_rounding_is_bitwise_the_half_crates() {
        let bits = patterns(9973);
        let xs: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        for p in [Precision::Bf16, Precision::F16] {
            let mut got = xs.clone();
            p.round_slice(&mut got);
            // The baseline build too, where the CPU runs the AVX-512F one.
            let mut lanes = xs.clone();
            lanes
                .chunks_mut(ROUND_PIECE)
                .for_each(|c| round_piece_lanes(p, c));
            assert!(
                got.iter()
                    .zip(&lanes)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{p}"
            );
            for (x, g) in xs.iter().zip(&got) {
                let want = match p {
                    Precision::Bf16 => half::bf16::from_f32(*x).to_f32(),
                    _ => half::f16::from_f32(*x).to_f32(),
                };
                let b = x.to_bits();
                assert_eq!(g.to_bits(), want.to_bits(), "{p} of {b:#010x}");
                assert_eq!(
                    p.round_f32(*x).to_bits(),
                    want.to_bits(),
                    "{p} of {b:#010x}"
                );
            }
            let t = Tensor::new(xs.as_slice(), &candle_core::Device::Cpu).unwrap();
            let via_candle = t.to_dtype(p.dtype()).unwrap().to_dtype(DType::F32).unwrap();
            let (a, b) = (
                p.round(&t).unwrap().to_vec1::<f32>().unwrap(),
                via_candle.to_vec1::<f32>().unwrap(),
            );
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{p}"
            );
        }
    }
}
