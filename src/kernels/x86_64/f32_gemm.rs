//! `x · Wᵀ` on f32 operands with AVX-512 FMA, computing candle's f32 GEMM
//! bits: the same sums in the same order on 16-lane vectors where candle's
//! kernel (gemm-common 0.19, AVX2 `fma::f32`, 16 × 6 register tile) uses
//! 8-lane ones, twice the multiply-adds per instruction on a CPU that
//! executes 512-bit FMAs at full width, and no per-call packing of an f32
//! weight (read in place, one row per output column). A weight held as
//! bf16 pairs is widened (and rounded to f16 for an f16 model) into a
//! per-thread panel, a column tile or a run of them at a time (once per
//! product: [`super::tiles::product_by_columns`]), which the same register
//! tiles read: the values of the f32 copy, so the same sums.
//!
//! Why the bits agree. candle's blocked kernel sums each output in k-blocks
//! of `kc` values ([`crate::kernels::Route::Blocked`]): within a block one
//! accumulator starting at +0 takes `fma(x, w, acc)` in increasing k, and
//! the block sums are added to the output in order. Here one lane per
//! output row takes the same FMAs in the same order, and the block sums are
//! added the same way ([`super::tiles::store`]). A fused multiply-add is
//! one IEEE rounding whatever the vector width, so every intermediate value
//! is the same, subnormals included. The other routes candle takes (a
//! single row or column, `m·n <= 256`, `k <= 2`) are not taken here.
//!
//! Without AVX-512F (or off x86-64) no plan names this kernel and
//! `models::layers::Matrix::linear` uses candle's GEMM, with the same
//! results. Setting `HSPARITY_NO_AVX512_GEMM` (to any value) forces that
//! path. The kernel parameters assumed are those of gemm 0.19 built
//! without its `x86-v4` feature (as candle 0.11 builds it); the kernel
//! tests compare with candle's own product, so a build that changed them
//! would fail there.

use std::mem::MaybeUninit;

use super::gemv::{load16, weight_at};
use super::tiles::{self, Tile};
use crate::kernels::Weight;

/// `x [m, k] · w [n, k]ᵀ` → `[m, n]` in k-blocks of `kc`: bitwise candle's
/// blocked route on `w`'s f32 values. An f32 weight is read in place; bf16
/// pairs (read as they are, or as their f16 roundings) are widened into a
/// per-thread panel before the register tiles of those columns run.
///
/// # Safety
/// AVX-512F; `x` holds `m·k` values and `w` is `[n, k]`.
pub(super) unsafe fn matmul_nt(
    x: &[f32],
    w: Weight<'_>,
    (m, n, k): (usize, usize, usize),
    kc: usize,
) -> Vec<f32> {
    let a = pack_rows(x, m, k);
    let dims = (m, n, k);
    // SAFETY: every tile lies inside a, the weight (or the panel of its
    // run of columns, k values each; the tile's slice of it is checked) and
    // the output, and `kernel` stores each element of its tile in the first
    // k-block before reading it.
    unsafe {
        match w {
            Weight::F32(w) => tiles::product(dims, kc, true, |t, c| {
                tiles::by_shape!(kernel, &a, w.as_ptr().add(t.n0 * k), c, t)
            }),
            _ => tiles::product_by_columns(
                dims,
                kc,
                |p: &mut Panel, n0, nc| {
                    p.n0 = n0;
                    widen_columns(w, k, n0..n0 + nc, &mut p.values)
                },
                |p, t, c| {
                    let b = p.values[(t.n0 - p.n0) * k..][..t.nc * k].as_ptr();
                    tiles::by_shape!(kernel, &a, b, c, t)
                },
            ),
        }
    }
}

/// A thread's widened weight columns: those from `n0` on, `k` values each.
#[derive(Default)]
struct Panel {
    n0: usize,
    values: Vec<f32>,
}

/// Rows `rows` of weight `w` (`k` values each) as f32 into `panel`, one
/// after the other, as the single-row kernel reads them ([`load16`],
/// [`weight_at`]): bf16 pairs widened, and rounded to f16 when read so.
///
/// # Safety
/// AVX-512F; `rows` lie inside the weight.
#[target_feature(enable = "avx512f")]
unsafe fn widen_columns(
    w: Weight<'_>,
    k: usize,
    rows: std::ops::Range<usize>,
    panel: &mut Vec<f32>,
) {
    panel.clear();
    panel.reserve(rows.len() * k);
    for j in rows {
        let out = panel.spare_capacity_mut().as_mut_ptr() as *mut f32;
        let mut e = 0;
        while e + 16 <= k {
            std::arch::x86_64::_mm512_storeu_ps(out.add(e), load16(w, j, k, e));
            e += 16;
        }
        for i in e..k {
            *out.add(i) = weight_at(w, j, k, i);
        }
        // SAFETY: the row's k values were written above.
        panel.set_len(panel.len() + k);
    }
}

/// `x [m, k]` 16 rows per group: `[group][k][lane]` = `x[16·group + lane][k]`
/// (0 past the last row), groups in parallel, written once: each 16 × 16
/// block of a group's rows transposed in registers ([`tiles::transpose16`])
/// into memory not zeroed first.
///
/// # Safety
/// AVX-512F; `x` holds `m·k` values.
#[target_feature(enable = "avx512f")]
unsafe fn pack_rows(x: &[f32], m: usize, k: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let len = m.div_ceil(16) * k * 16;
    let mut out = Vec::with_capacity(len);
    out.spare_capacity_mut()[..len]
        .par_chunks_mut((k * 16).max(1))
        .enumerate()
        // SAFETY: AVX-512F; the group lies inside x's rows.
        .for_each(|(g, group)| unsafe { pack_group(x, (m, k), g, group) });
    // SAFETY: every group wrote each of its k·16 values.
    unsafe { out.set_len(len) };
    out
}

/// Group `g` of [`pack_rows`] into `out` (`k·16` values), every value written.
///
/// # Safety
/// AVX-512F; `x` holds `m·k` values and `16·g < m`.
#[target_feature(enable = "avx512f")]
unsafe fn pack_group(x: &[f32], (m, k): (usize, usize), g: usize, out: &mut [MaybeUninit<f32>]) {
    use std::arch::x86_64::*;
    assert_eq!(out.len(), k * 16, "a group's packed values");
    let rows = (m - 16 * g).min(16);
    let row = |l: usize| &x[(16 * g + l) * k..(16 * g + l + 1) * k];
    let o = out.as_mut_ptr() as *mut f32;
    let mut e = 0;
    while e + 16 <= k {
        let r: [__m512; 16] = std::array::from_fn(|l| {
            // SAFETY: row l holds k values, so e..e + 16 of them.
            if l < rows {
                _mm512_loadu_ps(row(l)[e..e + 16].as_ptr())
            } else {
                _mm512_setzero_ps()
            }
        });
        for (j, v) in tiles::transpose16(r).into_iter().enumerate() {
            // SAFETY: values (e + j)·16 .. + 16 lie inside the group's k·16.
            _mm512_storeu_ps(o.add((e + j) * 16), v);
        }
        e += 16;
    }
    for kk in e..k {
        for (l, v) in out[kk * 16..(kk + 1) * 16].iter_mut().enumerate() {
            v.write(if l < rows { row(l)[kk] } else { 0.0 });
        }
    }
}

/// `V·16` rows × `C` columns: for each k-block, accumulators from +0 take
/// `fma(x, w, acc)` in increasing k, then go to the output (the first
/// block stored, the later ones added).
///
/// # Safety
/// AVX-512F; `a` holds the packed rows of an `[m, k]` input, `b` the
/// tile's `C` weight columns (`k` values each, one after the other), `c` an
/// `[m, n]` output, and the tile lies inside them.
#[target_feature(enable = "avx512f")]
unsafe fn kernel<const V: usize, const C: usize>(a: &[f32], b: *const f32, c: *mut f32, t: Tile) {
    use std::arch::x86_64::*;
    let ap: [*const f32; V] = std::array::from_fn(|v| a.as_ptr().add((t.g + v) * t.k * 16));
    let bp: [*const f32; C] = std::array::from_fn(|j| b.add(j * t.k));
    let mut block = t.k0;
    while block < t.k1 {
        let end = (block + t.kc).min(t.k1);
        let mut acc = [[_mm512_setzero_ps(); C]; V];
        for kk in block..end {
            let va: [__m512; V] = std::array::from_fn(|v| _mm512_loadu_ps(ap[v].add(kk * 16)));
            for j in 0..C {
                let vb = _mm512_set1_ps(*bp[j].add(kk));
                for v in 0..V {
                    acc[v][j] = _mm512_fmadd_ps(va[v], vb, acc[v][j]);
                }
            }
        }
        tiles::store(&acc, c, t, block == 0);
        block = end;
    }
}

#[cfg(test)]
mod tests {
    /// The packed layout, value by value, at row and k counts that fill
    /// groups and 16 × 16 blocks and counts that leave tails of both.
    #[test]
    fn packed_rows_hold_each_row_in_its_lane() {
        if !crate::kernels::capabilities().avx512f {
            eprintln!("SKIPPED: this CPU has no AVX-512F, which pack_rows needs");
            return;
        }
        for (m, k) in [(1, 1), (16, 16), (17, 33), (40, 15), (3, 64), (64, 100)] {
            let x: Vec<f32> = (0..m * k).map(|i| i as f32 + 0.5).collect();
            // SAFETY: the CPU has AVX-512F; x holds m·k values.
            let p = unsafe { super::pack_rows(&x, m, k) };
            assert_eq!(p.len(), m.div_ceil(16) * k * 16);
            for (i, &v) in p.iter().enumerate() {
                let (g, kk, lane) = (i / (k * 16), i / 16 % k, i % 16);
                let r = 16 * g + lane;
                let want = if r < m { x[r * k + kk] } else { 0.0 };
                assert_eq!(v.to_bits(), want.to_bits(), "m {m} k {k} at {i}");
            }
        }
    }
}
