//! `x · Wᵀ` on bf16 operands with the CPU's bf16 dot-product instruction
//! (AVX512-BF16 `vdpbf16ps`), computing the same f32 sums as candle's f32
//! GEMM on the widened values, bit for bit, while reading the weights as
//! stored (bf16, half the bytes, no f32 copy per layer).
//!
//! Why the bits agree. A model computing in bf16 feeds `models::layers::linear`
//! bf16 values (every op's output is rounded, [`crate::precision`]) and bf16
//! weights, and a product of two bf16 values is exact in f32. candle's CPU
//! matmul (gemm-common 0.19, `gemm_basic_generic`, the AVX2 FMA kernel
//! `fma::f32`, 16 × 6 register tile) sums each output in k-blocks of `kc`
//! values (`cache::kernel_params`; `min(k, 512)` for `m, n <= 64`): within a
//! block one accumulator starting at +0 takes `fma(x, w, acc)` in increasing
//! k, i.e. one rounded addition of an exact product per k; the block sums
//! are added to the output in order. `vdpbf16ps` adds the two exact
//! products of a 32-bit pair to an f32 lane as two rounded additions, the
//! odd element first (Intel's instruction reference for VDPBF16PS; probed
//! once at start-up, [`adds_as_assumed`]), so with the two halves of every pair swapped and
//! one lane per output row it makes the same additions in the same order.
//! The shapes candle sends elsewhere (a single row or column, `m·n <= 256`,
//! `k <= 2`, an odd `kc`) are not planned here ([`crate::kernels::plan`]);
//! the caller uses the f32 route for them.
//!
//! One difference remains: the instruction treats subnormal inputs and
//! results as zero, where the FMA keeps them: an input below 1.2e-38 in
//! magnitude (a bf16 subnormal, which no checkpoint weight or normalised
//! activation is in practice), or a partial sum landing there, would part
//! the two paths; NaN payloads may differ too.
//!
//! Portable fallback: without the instruction (or off x86-64) no plan names
//! this kernel, weights stay f32 and `linear` uses the f32 route, with the
//! same results. `HSPARITY_NO_BF16_DOT=1` forces that path.

use super::tiles::{self, Tile};
use crate::kernels::Pairs;

/// Probes the instruction on values where the order and the rounding of its
/// two additions show: with an accumulator of 1 and the products −1 and
/// 2⁻²⁴, odd element first gives 0 (1 + 2⁻²⁴ rounds to 1), even first
/// 2⁻²⁴; two products of 2⁻²⁴ leave 1 when each addition rounds (a fused
/// pair sum would give 1 + 2⁻²³). Any other behaviour disables the kernel.
///
/// # Safety
/// The CPU has AVX512F and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn adds_as_assumed() -> bool {
    use std::arch::x86_64::*;
    let bf = |v: f32| u32::from(half::bf16::from_f32(v).to_bits());
    // One lane: a = (lo, hi) of x, b = 1.0 in both halves.
    let dp = |lo: f32, hi: f32| -> f32 {
        let a = _mm512_set1_epi32((bf(lo) | bf(hi) << 16) as i32);
        let b = _mm512_set1_epi32((bf(1.0) | bf(1.0) << 16) as i32);
        let r = _mm512_dpbf16_ps(
            _mm512_set1_ps(1.0),
            std::mem::transmute::<__m512i, __m512bh>(a),
            std::mem::transmute::<__m512i, __m512bh>(b),
        );
        _mm_cvtss_f32(_mm512_castps512_ps128(r))
    };
    let tiny = 2f32.powi(-24);
    dp(-1.0, tiny) == 0.0 && dp(tiny, -1.0) == tiny && dp(tiny, tiny) == 1.0
}

/// Steps of the rate timings: each of 12 independent accumulators takes
/// this many multiply-adds (24,000 FMAs, about 5 µs at two a cycle).
const RATE_STEPS: usize = 2000;

/// [`RATE_STEPS`] FMAs on each of 12 independent accumulators, the
/// operands in registers.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn fma_chains(a: std::arch::x86_64::__m512, b: std::arch::x86_64::__m512) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_ps(); 12];
    for _ in 0..RATE_STEPS {
        for r in acc.iter_mut() {
            *r = _mm512_fmadd_ps(*r, a, b);
        }
    }
    _mm512_reduce_add_ps(
        acc.iter()
            .fold(_mm512_setzero_ps(), |s, r| _mm512_add_ps(s, *r)),
    )
}

/// The seconds of one [`fma_chains`] call on normal values (no subnormal
/// assists).
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn time_fmas() -> f64 {
    use std::arch::x86_64::*;
    use std::hint::black_box;
    let (a, b) = (_mm512_set1_ps(0.999), _mm512_set1_ps(1e-3));
    let t = std::time::Instant::now();
    // SAFETY: this function's feature, which the loop needs.
    black_box(unsafe { fma_chains(black_box(a), black_box(b)) });
    t.elapsed().as_secs_f64()
}

/// One thread's f32 multiply-add rate with the operands in registers, in
/// GFLOP/s (two per lane): the most an f32 kernel can make per thread on
/// this core. The best of 7 timings (an interruption only lengthens one).
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn fma_rate() -> f64 {
    // SAFETY: this function's feature, which the timing needs.
    let best = (0..7)
        .map(|_| unsafe { time_fmas() })
        .fold(f64::INFINITY, f64::min);
    (RATE_STEPS * 12 * 16 * 2) as f64 / best / 1e9
}

/// How many multiply-adds per second `vdpbf16ps` makes against AVX-512
/// FMAs on this core: the better of 7 alternated timings of 24,000 of each
/// on 12 independent accumulators (about 0.2 ms in all; an interruption
/// only lengthens a timing, so the minima hold). Each `vdpbf16ps` makes two
/// multiply-adds per lane, an FMA one. 0.49–0.55 on the Emerald Rapids Xeon
/// without AMX of docs/performance.md (one `vdpbf16ps` per two cycles
/// against two FMAs a cycle); about 2 where the instruction issues as often
/// as an FMA, as AMD Zen 4 and Zen 5 do by their instruction tables (not
/// measured).
///
/// # Safety
/// The CPU has AVX512F and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn dot_rate() -> f64 {
    use std::arch::x86_64::*;
    use std::hint::black_box;
    use std::time::Instant;
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn dots(a: __m512bh, b: __m512bh) -> __m512 {
        let mut acc = [_mm512_setzero_ps(); 12];
        for _ in 0..RATE_STEPS {
            for r in acc.iter_mut() {
                *r = _mm512_dpbf16_ps(*r, a, b);
            }
        }
        acc.iter()
            .fold(_mm512_setzero_ps(), |s, r| _mm512_add_ps(s, *r))
    }
    // Normal values (no subnormal assists): bf16 pairs of 2⁻⁸ and 1.
    let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(0x3B80_3B80));
    let b: __m512bh = std::mem::transmute(_mm512_set1_epi32(0x3F80_3F80));
    let (mut dot, mut fma) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..7 {
        let t = Instant::now();
        // SAFETY: this function's features, which the loop needs.
        black_box(unsafe { dots(black_box(a), black_box(b)) });
        dot = dot.min(t.elapsed().as_secs_f64());
        // SAFETY: as above (AVX-512F).
        fma = fma.min(unsafe { time_fmas() });
    }
    // Multiply-adds per second, dot over FMA: 2·n/dot against n/fma.
    2.0 * fma / dot
}

/// `x [m, k]` (f32 holding bf16 values) `· w [n, k]ᵀ` (its pairs) → `[m, n]`
/// f32, not rounded, in k-blocks of `kc`: bitwise candle's blocked route on
/// the widened weight. `None` when an input value is not a bf16 value.
///
/// # Safety
/// AVX512F and AVX512-BF16 (adding as [`adds_as_assumed`] checks); `x`
/// holds `m·k` values and `w` is `[n, k]`; `kc` is even or at least `k`.
pub(super) unsafe fn matmul_nt(
    x: &[f32],
    w: &Pairs,
    (m, n, k): (usize, usize, usize),
    kc: usize,
) -> Option<Vec<f32>> {
    let a = tiles::pack_pairs(x, (m, k), m.div_ceil(16), k.div_ceil(2))?;
    // SAFETY: every tile lies inside a, the pairs and the output, and
    // `kernel` stores each element of its tile in the first k-block before
    // reading it.
    Some(unsafe {
        // Its loop order as measured best (k-block passes cost it 2–4 %).
        tiles::product((m, n, k), kc, false, |t, c| {
            tiles::by_shape!(kernel, &a, w.words(), c, t)
        })
    })
}

/// `V·16` rows × `C` columns: for each k-block, accumulators from +0 over
/// its pairs (one `vdpbf16ps` per pair: the even element's product, then the
/// odd one's), then added to the output (the first block stored).
///
/// # Safety
/// The CPU has AVX512F and AVX512-BF16; `a` holds the packed rows of an
/// `[m, k]` input, `b` the pairs of an `[n, k]` weight, `c` an `[m, n]`
/// output, and the tile lies inside them.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel<const V: usize, const C: usize>(a: &[u32], b: &[u32], c: *mut f32, t: Tile) {
    use std::arch::x86_64::*;
    let pairs = t.k.div_ceil(2);
    let ap: [*const u32; V] = std::array::from_fn(|v| a.as_ptr().add((t.g + v) * pairs * 16));
    let bp: [*const u32; C] = std::array::from_fn(|j| b.as_ptr().add((t.n0 + j) * pairs));
    let mut block = t.k0;
    while block < t.k1 {
        let end = (block + t.kc).min(t.k1);
        let mut acc = [[_mm512_setzero_ps(); C]; V];
        for p in block / 2..end.div_ceil(2) {
            let va: [__m512bh; V] = std::array::from_fn(|v| {
                std::mem::transmute(_mm512_loadu_si512(ap[v].add(p * 16) as *const _))
            });
            for j in 0..C {
                let vb: __m512bh = std::mem::transmute(_mm512_set1_epi32(*bp[j].add(p) as i32));
                for v in 0..V {
                    acc[v][j] = _mm512_dpbf16_ps(acc[v][j], va[v], vb);
                }
            }
        }
        tiles::store(&acc, c, t, block == 0);
        block = end;
    }
}
