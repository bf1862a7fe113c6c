//! The rounding to bf16 and f16 on the bits, and the noise shadow's bf16
//! flips: branch-free per value so that a loop over them vectorises, with an
//! AVX-512F build of each piece's loop where the CPU has it.

use super::Precision;

/// [`Precision::round_slice`] on at most a piece of values: the loop
/// compiled for AVX-512F where the CPU has it (16 lanes; the crate's
/// baseline build has SSE2's 4), the same bit operations either way.
pub(super) fn round_piece(p: Precision, c: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::capabilities().avx512f {
        // SAFETY: the CPU has AVX-512F (read from CPUID with the capabilities).
        return unsafe { round_piece_avx512(p, c) };
    }
    round_piece_lanes(p, c);
}

/// [`round_piece`]'s loop, inlined into each build.
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

/// [`flip_bf16`] on every value of `c`, compiled for AVX-512F where the CPU
/// has it (as [`round_piece`]).
pub(super) fn flip_bf16_piece(c: &mut [f32], zone: f64) {
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
pub(super) fn flip_bf16(x: f32, zone: f64) -> f32 {
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

/// `half::bf16::from_f32(x).to_f32()` (round to nearest, ties to even; a NaN
/// keeps its sign and high payload with the quiet bit set), written without
/// branches so that a loop over it vectorises.
#[inline(always)]
pub(super) fn round_bf16(x: f32) -> f32 {
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
pub(super) fn round_f16(x: f32) -> f32 {
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

#[cfg(test)]
mod tests {
    use candle_core::{DType, Tensor};

    use super::*;
    use crate::precision::ROUND_PIECE;

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
        assert_eq!(bad, None, "a pattern that differs");
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
