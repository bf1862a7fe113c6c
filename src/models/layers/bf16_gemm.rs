//! `x · Wᵀ` on bf16 operands with the CPU's bf16 dot-product instruction
//! (AVX512-BF16 `vdpbf16ps`), computing the same f32 sums as candle's f32
//! GEMM on the widened values, bit for bit, while reading the weights as
//! stored (bf16, half the bytes, no f32 copy per layer).
//!
//! Why the bits agree. A model computing in bf16 feeds [`super::linear`]
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
//! once at start-up, [`available`]), so with the two halves of every pair swapped and
//! one lane per output row it makes the same additions in the same order.
//! The shapes candle sends elsewhere (a single row or column, `m·n <= 256`,
//! `k <= 2`, an odd `kc`) are not taken here ([`exact_for`]); the caller
//! uses the f32 GEMM for them.
//!
//! One difference remains: the instruction treats subnormal inputs and
//! results as zero, where the FMA keeps them: an input below 1.2e-38 in
//! magnitude (a bf16 subnormal, which no checkpoint weight or normalised
//! activation is in practice), or a partial sum landing there, would part
//! the two paths; NaN payloads may differ too.
//!
//! Portable fallback: without the instruction (or off x86-64) [`available`]
//! is false, weights stay f32 and `linear` uses candle's GEMM, with the same
//! results. `HSPARITY_NO_BF16_DOT=1` forces that path.

use candle_core::{Device, Tensor};

use crate::error::Result;

use super::routes::blocked_kc;
use super::tiles::{self, Tile};
use super::with_f32;

/// True when this CPU has AVX512-BF16 (with AVX512F) and FMA, its
/// `vdpbf16ps` adds as this kernel assumes ([`adds_as_assumed`]), and
/// `HSPARITY_NO_BF16_DOT` is not set; checked once.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            std::env::var_os("HSPARITY_NO_BF16_DOT").is_none()
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bf16")
                // SAFETY: the features it needs were just detected.
                && unsafe { adds_as_assumed() }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Probes the instruction on values where the order and the rounding of its
/// two additions show: with an accumulator of 1 and the products −1 and
/// 2⁻²⁴, odd element first gives 0 (1 + 2⁻²⁴ rounds to 1), even first
/// 2⁻²⁴; two products of 2⁻²⁴ leave 1 when each addition rounds (a fused
/// pair sum would give 1 + 2⁻²³). Any other behaviour disables the kernel.
///
/// # Safety
/// The CPU has AVX512F and AVX512-BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn adds_as_assumed() -> bool {
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

/// The k-block size candle's f32 GEMM sums `x [m, k] · w [n, k]ᵀ` in, when
/// that product takes its blocked kernel and the block is a whole number of
/// pairs: then [`matmul_nt`] gives its bits. `None`: use the f32 GEMM.
pub fn exact_for(m: usize, n: usize, k: usize) -> Option<usize> {
    blocked_kc(m, n, k).filter(|&kc| kc % 2 == 0 || kc >= k)
}

/// A bf16 weight `[N, K]` as the kernel reads it: per row, its pairs
/// `w[2p] << 16 | w[2p + 1]` (the last one `w[K−1] << 16` when K is odd),
/// made once per weight.
#[derive(Debug, Clone)]
pub struct Pairs {
    n: usize,
    k: usize,
    words: Vec<u32>,
}

impl Pairs {
    /// The pairs of a weight `[N, K]` holding bf16 values in f32 (a
    /// parameter rounded to bf16), rows in parallel.
    ///
    /// Errors: not a 2-D f32 CPU tensor, or a value that is not bf16.
    pub fn of(w: &Tensor) -> Result<Self> {
        use rayon::prelude::*;
        let (n, k) = w.dims2()?;
        let pairs = k.div_ceil(2);
        let mut words = vec![0u32; n * pairs];
        let ok = with_f32(w, |v| {
            words
                .par_chunks_mut(pairs.max(1))
                .zip(v.par_chunks(k.max(1)))
                .all(|(out, row)| {
                    row.chunks(2)
                        .zip(out.iter_mut())
                        .all(|(two, o)| pair_of(two).map(|p| *o = p).is_some())
                })
        })?;
        if !ok {
            return Err(candle_core::Error::Msg(
                "bf16 dot-product matmul: a weight value is not a bf16 value".into(),
            )
            .into());
        }
        Ok(Self { n, k, words })
    }

    /// Pairs as a checkpoint's bf16 bytes give them (`WeightSource::bf16_pairs`).
    ///
    /// Errors: `words` does not hold `dims`.
    pub fn from_words([n, k]: [usize; 2], words: Vec<u32>) -> Result<Self> {
        if words.len() != n * k.div_ceil(2) {
            return Err(candle_core::Error::Msg(format!(
                "bf16 pairs: {} words do not hold [{n}, {k}]",
                words.len()
            ))
            .into());
        }
        Ok(Self { n, k, words })
    }

    /// `[N, K]`.
    pub fn dims(&self) -> [usize; 2] {
        [self.n, self.k]
    }

    /// The words, row after row (`K.div_ceil(2)` per row).
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// The weight widened back to f32 `[N, K]` (exact), rows in parallel.
    ///
    /// Errors: a tensor failure.
    pub fn widen(&self) -> Result<Tensor> {
        use rayon::prelude::*;
        let (k, pairs) = (self.k, self.k.div_ceil(2));
        let mut v = vec![0f32; self.n * k];
        v.par_chunks_mut(k.max(1))
            .zip(self.words.par_chunks(pairs.max(1)))
            .for_each(|(out, row)| {
                for (i, &w) in row.iter().enumerate() {
                    out[2 * i] = f32::from_bits(w & 0xffff_0000);
                    if 2 * i + 1 < k {
                        out[2 * i + 1] = f32::from_bits(w << 16);
                    }
                }
            });
        Ok(Tensor::from_vec(v, (self.n, k), &Device::Cpu)?)
    }
}

/// `x · wᵀ` for `x`: `[M, K]` (f32 holding bf16 values) and `w` the pairs
/// of a bf16 `[N, K]` weight → `[M, N]` f32, not rounded: bitwise
/// `x.matmul(&w_f32.t())` with `w_f32` the widened weight, for the shapes
/// of [`exact_for`]. Needs [`available`]. `None` when an input value is not
/// a bf16 value (the caller takes the f32 GEMM).
///
/// Errors: shapes that do not fit or are not exact here, or a CPU without
/// the instruction.
pub fn matmul_nt(x: &Tensor, w: &Pairs) -> Result<Option<Tensor>> {
    let (m, k) = x.dims2()?;
    let (n, kw) = (w.n, w.k);
    let refuse = |why: &str| -> crate::error::Error {
        candle_core::Error::Msg(format!(
            "bf16 dot-product matmul of x [{m}, {k}] and w [{n}, {kw}]: {why}"
        ))
        .into()
    };
    if k != kw {
        return Err(refuse("shapes do not fit"));
    }
    let Some(kc) = exact_for(m, n, k).filter(|_| available()) else {
        return Err(refuse("not computed exactly by this kernel here"));
    };
    let Some(a) = with_f32(x, |v| pack_rows(v, m, k))? else {
        return Ok(None);
    };
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `available()` (checked above); every tile lies inside a, the
    // pairs and the output, and `kernel` stores each element of its tile in
    // the first k-block before reading it.
    let c = unsafe {
        tiles::product((m, n, k), kc, |t, c| {
            tiles::by_shape!(kernel, &a, &w.words, c, t)
        })
    };
    #[cfg(not(target_arch = "x86_64"))]
    let c = vec![0f32; m * n];
    Ok(Some(Tensor::from_vec(c, (m, n), x.device())?))
}

/// One or two f32 values holding bf16 values as a swapped pair: the first
/// in the high half, the second (0 when absent) in the low half. `None`
/// when a value is not a bf16 value (its low 16 bits are not zero).
fn pair_of(two: &[f32]) -> Option<u32> {
    let bf = |v: f32| {
        let b = v.to_bits();
        (b & 0xffff == 0).then_some(b >> 16)
    };
    let lo = match two.get(1) {
        Some(&v) => bf(v)?,
        None => 0,
    };
    Some(bf(*two.first()?)? << 16 | lo)
}

/// `x [m, k]` (f32) as swapped bf16 pairs, 16 rows per group:
/// `[group][pair][lane]` = `x[2p] << 16 | x[2p + 1]` of row `16·group +
/// lane` (0 past the last row or column). `None` when a value is not bf16.
fn pack_rows(x: &[f32], m: usize, k: usize) -> Option<Vec<u32>> {
    use rayon::prelude::*;
    let (groups, pairs) = (m.div_ceil(16), k.div_ceil(2));
    let mut out = vec![0u32; groups * pairs * 16];
    let ok = out
        .par_chunks_mut((pairs * 16).max(1))
        .enumerate()
        .all(|(g, group)| {
            (g * 16..(g * 16 + 16).min(m)).all(|r| {
                let (row, lane) = (&x[r * k..(r + 1) * k], r % 16);
                row.chunks(2)
                    .enumerate()
                    .all(|(p, two)| pair_of(two).map(|w| group[p * 16 + lane] = w).is_some())
            })
        });
    ok.then_some(out)
}

/// `V·16` rows × `C` columns: for each k-block, accumulators from +0 over
/// its pairs (one `vdpbf16ps` per pair: the even element's product, then the
/// odd one's), then added to the output (the first block stored).
///
/// # Safety
/// The CPU has AVX512F and AVX512-BF16; `a` holds the packed rows of an
/// `[m, k]` input, `b` the pairs of an `[n, k]` weight, `c` an `[m, n]`
/// output, and the tile lies inside them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel<const V: usize, const C: usize>(a: &[u32], b: &[u32], c: *mut f32, t: Tile) {
    use std::arch::x86_64::*;
    let pairs = t.k.div_ceil(2);
    let ap: [*const u32; V] = std::array::from_fn(|v| a.as_ptr().add((t.g + v) * pairs * 16));
    let bp: [*const u32; C] = std::array::from_fn(|j| b.as_ptr().add((t.n0 + j) * pairs));
    let mut block = 0;
    while block < t.k {
        let end = (block + t.kc).min(t.k);
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
