//! Many single-row products `x_r · Wᵀ` at once, each bit for bit what
//! candle gives for that row alone: the products of a cached decode's
//! single-token steps, made in one pass over the weight (read once for all
//! the steps instead of once per step) and on every core.
//!
//! Why the bits agree. candle's CPU matmul calls gemm 0.19's `gemm`, which
//! transposes a row-major destination (`do_transpose`), so a `[1, k]` row
//! times `Wᵀ` reaches gemm-common 0.19's `gemm_basic_generic` as `n` rows of
//! `W` by one column. With `n > 256` and `k > 2` it takes
//! `gemv::mixed_gemv_rowmajor` with the AVX2 SIMD type (`V3`, 8 lanes), which
//! for each output row sums `W[j]·x` as: eight 8-lane accumulators from +0
//! taking `fma(w, x, acc)` over each 64-value block of `k` (accumulator `a`,
//! lane `l` reading element `64b + 8a + l`); then `((a0+a1)+(a2+a3)) +
//! ((a4+a5)+(a6+a7))` lane-wise; then `fma` over the remaining whole 8-value
//! groups into that vector; then its lanes added in order 0..7; then a scalar
//! `fma` per remaining element; the result stored times `beta = 1`. Here an
//! AVX-512 register holds two of those accumulators (16 consecutive values),
//! so the same operations happen in the same order on the same values. Other
//! shapes (`n <= 256`: the horizontal kernel; `k <= 2`: `gevv`) and CPUs
//! without AVX-512F run candle's product row by row instead; so does
//! setting `HSPARITY_NO_AVX512_GEMM` (to any value). The order assumed is
//! gemm 0.19 built without its `x86-v4` feature (the AVX2 kernels, as
//! candle 0.11 builds it); the kernel tests compare with candle's own
//! product, so a build that changed it would fail there.
//!
//! bf16 weights are read as their pairs ([`crate::kernels::Pairs`]),
//! widened in registers: exact, so the values are those of the f32 copy;
//! for an f16 model each widened value is then rounded to f16
//! (`vcvtps2ph`, to nearest even), as the f16 copy holds it.

use crate::kernels::Weight;

/// Output columns per rayon task.
const COLUMNS: usize = 32;

/// Rows of `x` per pass over a weight row (4 × 4 accumulators in registers).
const ROWS: usize = 4;

/// The products, column blocks in parallel: `[s, n]`.
///
/// # Safety
/// AVX-512F, AVX2 and FMA; `x` holds whole rows of `k` values and `w` is
/// `[n, k]`.
pub(super) unsafe fn rows_times(x: &[f32], w: Weight<'_>, n: usize, k: usize) -> Vec<f32> {
    let s = x.len() / k.max(1);
    if s == 0 {
        return Vec::new();
    }
    use rayon::prelude::*;
    // [n][s] first: each task owns whole columns.
    let mut t = vec![0f32; n * s];
    t.par_chunks_mut(COLUMNS * s)
        .enumerate()
        .for_each(|(c, cols)| {
            for (jj, col) in cols.chunks_mut(s).enumerate() {
                let j = c * COLUMNS + jj;
                for r0 in (0..s).step_by(ROWS) {
                    let rows = &x[r0 * k..];
                    let out = &mut col[r0..(r0 + ROWS).min(s)];
                    // SAFETY: the CPU has the features (the caller's
                    // contract); row j and the `out.len()` rows of x from r0
                    // lie inside w and x.
                    unsafe {
                        match out.len() {
                            1 => dots::<1>(w, j, rows, k, out),
                            2 => dots::<2>(w, j, rows, k, out),
                            3 => dots::<3>(w, j, rows, k, out),
                            _ => dots::<4>(w, j, rows, k, out),
                        }
                    }
                }
            }
        });
    let mut y = vec![0f32; s * n];
    for (j, col) in t.chunks(s).enumerate() {
        for (r, &v) in col.iter().enumerate() {
            y[r * n + j] = v;
        }
    }
    y
}

/// `vcvtps2ph`'s rounding immediate: to nearest, ties to even (as half's
/// conversion of a loaded weight rounds).
const ROUND_NEAREST: i32 = std::arch::x86_64::_MM_FROUND_TO_NEAREST_INT;

/// Element `e` of weight row `j` (also the f32 kernel's panels' tail).
#[inline(always)]
pub(super) fn weight_at(w: Weight<'_>, j: usize, k: usize, e: usize) -> f32 {
    match w {
        Weight::F32(v) => v[j * k + e],
        Weight::Bf16(p) => p.at(j, e),
        Weight::Bf16InF16(p) => half::f16::from_f32(p.at(j, e)).to_f32(),
    }
}

/// 16 consecutive values of weight row `j` from element `e` (even); also
/// what the f32 kernel's panels are widened with.
///
/// # Safety
/// AVX-512F; the values lie inside the row.
#[inline(always)]
pub(super) unsafe fn load16(
    w: Weight<'_>,
    j: usize,
    k: usize,
    e: usize,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    match w {
        Weight::F32(v) => _mm512_loadu_ps(v.as_ptr().add(j * k + e)),
        Weight::Bf16(p) | Weight::Bf16InF16(p) => {
            // 8 words = 16 halves in memory order (odd, even) per pair.
            let words = p.words().as_ptr().add(j * k.div_ceil(2) + e / 2);
            let halves = _mm256_loadu_si256(words as *const __m256i);
            let v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
            let v = _mm512_permute_ps(v, 0xB1);
            if matches!(w, Weight::Bf16InF16(_)) {
                _mm512_cvtph_ps(_mm512_cvtps_ph::<ROUND_NEAREST>(v))
            } else {
                v
            }
        }
    }
}

/// 8 consecutive values of weight row `j` from element `e` (even).
///
/// # Safety
/// AVX2; the values lie inside the row.
#[inline(always)]
unsafe fn load8(w: Weight<'_>, j: usize, k: usize, e: usize) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    match w {
        Weight::F32(v) => _mm256_loadu_ps(v.as_ptr().add(j * k + e)),
        Weight::Bf16(p) | Weight::Bf16InF16(p) => {
            let words = p.words().as_ptr().add(j * k.div_ceil(2) + e / 2);
            let halves = _mm_loadu_si128(words as *const __m128i);
            let v = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
            let v = _mm256_permute_ps(v, 0xB1);
            if matches!(w, Weight::Bf16InF16(_)) {
                _mm256_cvtph_ps(_mm256_cvtps_ph::<ROUND_NEAREST>(v))
            } else {
                v
            }
        }
    }
}

/// `out[r] = W[j] · x_r` for the `R` rows of `x` (`k` values each) in
/// `mixed_gemv_rowmajor`'s order (module docs).
///
/// # Safety
/// AVX-512F, AVX2 and FMA; row `j` of `w` and `R` rows of `x` exist.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn dots<const R: usize>(w: Weight<'_>, j: usize, x: &[f32], k: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let (k64, k8) = (k / 64 * 64, k / 8 * 8);
    let xp = x.as_ptr();
    let mut acc = [[_mm512_setzero_ps(); 4]; R];
    let mut d = 0;
    while d < k64 {
        for c in 0..4 {
            let wv = load16(w, j, k, d + 16 * c);
            for (r, a) in acc.iter_mut().enumerate() {
                a[c] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xp.add(r * k + d + 16 * c)), a[c]);
            }
        }
        d += 64;
    }
    for (r, a) in acc.iter().enumerate() {
        // Accumulators 2c and 2c+1 are the halves of register c.
        let pair = |v: __m512| {
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
            _mm256_add_ps(_mm512_castps512_ps256(v), hi)
        };
        let (s0, s1, s2, s3) = (pair(a[0]), pair(a[1]), pair(a[2]), pair(a[3]));
        let mut v = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
        let mut e = k64;
        while e < k8 {
            v = _mm256_fmadd_ps(load8(w, j, k, e), _mm256_loadu_ps(xp.add(r * k + e)), v);
            e += 8;
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), v);
        let mut sum = lanes[0];
        for &l in &lanes[1..] {
            sum += l;
        }
        for e in k8..k {
            sum = weight_at(w, j, k, e).mul_add(x[r * k + e], sum);
        }
        out[r] = sum;
    }
}
