//! The causal depthwise conv + SiLU of `Qwen3_5GatedDeltaNet.forward`
//! (`causal_conv1d_fn`, or `F.conv1d` then `ACT2FN["silu"]`, both in the
//! model dtype) and the split of its output into the delta rule's q, k and
//! v with the key heads expanded to the value heads, in one pass per row
//! over the layer's input where transformers builds the padded input, the
//! conv's output and the three slices as tensors of their own. A row's
//! sums, roundings and silu run in an AVX-512F build where the CPU has it
//! ([`conv_row`]), with the same operations in the same order.

use rayon::prelude::*;

use crate::models::layers::elementwise::silu_into;
use crate::precision::Precision;

/// A forward's conv input as transformers pads it: the `K-1` columns of
/// history before the forward (`hist`), then the forward's `T` rows of
/// `mixed_qkv` (`new`), `c` channels each, read in place.
pub(super) struct Padded<'a> {
    /// `[K-1, C]`, oldest first.
    pub hist: &'a [f32],
    /// `[T, C]`.
    pub new: &'a [f32],
    /// Channels C.
    pub c: usize,
}

impl Padded<'_> {
    /// Row `r` of the padded input (`K-1+T` rows).
    fn row(&self, r: usize) -> &[f32] {
        let (c, h) = (self.c, self.hist.len() / self.c.max(1));
        match r.checked_sub(h) {
            None => &self.hist[r * c..(r + 1) * c],
            Some(r) => &self.new[r * c..(r + 1) * c],
        }
    }

    /// Rows `rows` of the padded input, one after the other.
    pub fn rows(&self, rows: std::ops::Range<usize>) -> Vec<f32> {
        let mut out = Vec::with_capacity(rows.len() * self.c);
        for r in rows {
            out.extend_from_slice(self.row(r));
        }
        out
    }
}

/// Heads and head dims: `(nk, nv, dk, dv)`.
pub(super) type Heads = (usize, usize, usize, usize);

/// The delta rule's `q`, `k` (`[T, nv, dk]`, value head `h` reading key
/// head `h / (nv/nk)`) and `v` (`[T, nv, dv]`) from the conv of `x`.
/// `w_t`: the conv weight `[K, C]` (the checkpoint's `[C, 1, K]`
/// transposed). Each output is `Σ_j w[c, j]·x[t−K+1+j, c]` in increasing
/// `j` from +0, rounded to the dtype, then SiLU rounded again; rows from a
/// reset `r` on see no column before it.
pub(super) fn conv_split(
    x: &Padded,
    w_t: &[f32],
    reset: Option<usize>,
    prec: Precision,
    (nk, nv, dk, dv): Heads,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let c = x.c;
    let kk = w_t.len() / c.max(1);
    let hist = kk.saturating_sub(1);
    let t = x.new.len() / c.max(1);
    let (kd, rep) = (nk * dk, (nv / nk.max(1)).max(1));
    let (mut q, mut k, mut v) = (
        vec![0f32; t * nv * dk],
        vec![0f32; t * nv * dk],
        vec![0f32; t * nv * dv],
    );
    q.par_chunks_mut((nv * dk).max(1))
        .zip(k.par_chunks_mut((nv * dk).max(1)))
        .zip(v.par_chunks_mut((nv * dv).max(1)))
        .enumerate()
        .for_each_init(
            || (vec![0f32; c], vec![0f32; c]),
            |(acc, silu), (i, ((qr, kr), vr))| {
                // Padded row i + j is position i + j − hist of this forward.
                let first = reset
                    .filter(|&r| i >= r)
                    .map_or(0, |r| (r + hist).saturating_sub(i))
                    .min(kk);
                conv_row(x, w_t, i, first, (acc, silu), prec);
                for h in 0..nv {
                    let kh = h / rep;
                    qr[h * dk..(h + 1) * dk].copy_from_slice(&acc[kh * dk..(kh + 1) * dk]);
                    kr[h * dk..(h + 1) * dk]
                        .copy_from_slice(&acc[kd + kh * dk..kd + (kh + 1) * dk]);
                }
                vr.copy_from_slice(&acc[2 * kd..2 * kd + nv * dv]);
            },
        );
    (q, k, v)
}

/// Row `i` of the conv's output, `round(silu(round(Σ_j w_j · x_{i+j})))`
/// over the padded rows from `first` on, into `acc` (`silu` is scratch of
/// the same length), in the AVX-512F build of [`conv_row_lanes`] where the
/// CPU has it (16 lanes; the crate's baseline build has SSE2's 4), the same
/// operations either way.
fn conv_row(
    x: &Padded<'_>,
    w_t: &[f32],
    i: usize,
    first: usize,
    out: (&mut [f32], &mut [f32]),
    prec: Precision,
) {
    /// [`conv_row_lanes`] compiled for AVX-512F.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(
        x: &Padded<'_>,
        w_t: &[f32],
        i: usize,
        first: usize,
        out: (&mut [f32], &mut [f32]),
        prec: Precision,
    ) {
        conv_row_lanes(x, w_t, i, first, out, prec);
    }
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::capabilities().avx512f {
        // SAFETY: the CPU has AVX-512F (read from CPUID with the capabilities).
        return unsafe { avx512(x, w_t, i, first, out, prec) };
    }
    conv_row_lanes(x, w_t, i, first, out, prec);
}

/// [`conv_row`]'s loops, inlined into each build: candle's sum of products
/// in increasing tap order (a multiply, then an add), the rounding, the
/// silu as candle's ([`silu_into`]) and the rounding again.
#[inline(always)]
fn conv_row_lanes(
    x: &Padded<'_>,
    w_t: &[f32],
    i: usize,
    first: usize,
    (acc, silu): (&mut [f32], &mut [f32]),
    prec: Precision,
) {
    let (c, kk) = (x.c, w_t.len() / x.c.max(1));
    acc.fill(0.0);
    for j in first..kk {
        let (w, src) = (&w_t[j * c..(j + 1) * c], x.row(i + j));
        for ((a, &w), &s) in acc.iter_mut().zip(w).zip(src) {
            *a += w * s;
        }
    }
    prec.round_slice(acc);
    silu_into(acc, silu);
    acc.copy_from_slice(silu);
    prec.round_slice(acc);
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    /// transformers' order, as hsparity computed it before the fused pass:
    /// the padded input copied out, each channel's taps summed from +0 in
    /// increasing `j`, rounded, SiLU rounded, then q, k, v cut per row.
    fn reference(
        x: &Padded,
        w_t: &[f32],
        reset: Option<usize>,
        p: Precision,
        h: Heads,
    ) -> [Vec<f32>; 3] {
        let (c, (nk, nv, dk, dv)) = (x.c, h);
        let kk = w_t.len() / c;
        let t = x.new.len() / c;
        let padded = x.rows(0..t + kk - 1);
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..t {
            let first = reset
                .filter(|&r| i >= r)
                .map_or(0, |r| (r + kk - 1).saturating_sub(i));
            let row: Vec<f32> = (0..c)
                .map(|ch| {
                    let mut acc = 0f32;
                    for j in first.min(kk)..kk {
                        acc += w_t[j * c + ch] * padded[(i + j) * c + ch];
                    }
                    let acc = p.round_f32(acc);
                    p.round_f32(acc / (1.0 + (-acc).exp()))
                })
                .collect();
            for hv in 0..nv {
                let kh = hv / (nv / nk);
                q.extend_from_slice(&row[kh * dk..(kh + 1) * dk]);
                k.extend_from_slice(&row[nk * dk + kh * dk..nk * dk + (kh + 1) * dk]);
            }
            v.extend_from_slice(&row[2 * nk * dk..2 * nk * dk + nv * dv]);
        }
        [q, k, v]
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn both_builds_of_a_row_give_the_same_bits() {
        // The AVX-512F build (where the CPU has it) and the baseline's,
        // against each other and the reference, on channels that fill
        // 16-lane vectors and channels that leave a tail.
        let mut r = rand::rngs::StdRng::seed_from_u64(11);
        for heads in [(2, 4, 8, 12), (1, 1, 3, 5)] {
            let (nk, nv, dk, dv) = heads;
            let (c, kk, t) = (2 * nk * dk + nv * dv, 4, 9);
            let w_t: Vec<f32> = (0..kk * c).map(|_| r.gen_range(-3.0..3.0)).collect();
            let hist: Vec<f32> = (0..(kk - 1) * c).map(|_| r.gen_range(-8.0..8.0)).collect();
            let new: Vec<f32> = (0..t * c).map(|_| r.gen_range(-8.0..8.0)).collect();
            let x = Padded {
                hist: &hist,
                new: &new,
                c,
            };
            for p in Precision::ALL {
                let (mut a, mut b, mut s) = (vec![0f32; c], vec![0f32; c], vec![0f32; c]);
                for (i, first) in [(0, 0), (4, 0), (8, 2), (8, kk)] {
                    conv_row(&x, &w_t, i, first, (&mut a, &mut s), p);
                    conv_row_lanes(&x, &w_t, i, first, (&mut b, &mut s), p);
                    assert!(bits(&a) == bits(&b), "{heads:?} {p:?} row {i} from {first}");
                }
            }
            let (q, _, v) = conv_split(&x, &w_t, None, Precision::F16, heads);
            let want = reference(&x, &w_t, None, Precision::F16, heads);
            assert!(bits(&q) == bits(&want[0]) && bits(&v) == bits(&want[2]));
        }
    }

    #[test]
    fn the_fused_conv_gives_the_per_channel_sums_bits() {
        let heads = (2, 4, 8, 12);
        let c = 2 * 2 * 8 + 4 * 12;
        let mut r = rand::rngs::StdRng::seed_from_u64(7);
        let kk = 4;
        // Large enough products that the sum's order and the roundings show.
        let w_t: Vec<f32> = (0..kk * c).map(|_| r.gen_range(-3.0..3.0)).collect();
        let hist: Vec<f32> = (0..(kk - 1) * c).map(|_| r.gen_range(-8.0..8.0)).collect();
        for t in [0, 1, 2, 3, 5, 70] {
            let new: Vec<f32> = (0..t * c).map(|_| r.gen_range(-8.0..8.0)).collect();
            let x = Padded {
                hist: &hist,
                new: &new,
                c,
            };
            for p in [Precision::F32, Precision::Bf16, Precision::F16] {
                for reset in [
                    None,
                    Some(0),
                    Some(1),
                    Some(t / 2),
                    Some(t.saturating_sub(1)),
                ] {
                    let (q, k, v) = conv_split(&x, &w_t, reset, p, heads);
                    let want = reference(&x, &w_t, reset, p, heads);
                    for (name, got, want) in [
                        ("q", &q, &want[0]),
                        ("k", &k, &want[1]),
                        ("v", &v, &want[2]),
                    ] {
                        assert!(
                            bits(got) == bits(want),
                            "{name}: t={t} {p:?} reset={reset:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn padded_rows_run_from_the_history_into_the_forward() {
        let (hist, new) = ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
        let x = Padded {
            hist: &hist,
            new: &new,
            c: 2,
        };
        assert_eq!(
            x.rows(0..5),
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
        );
        assert_eq!(x.rows(1..3), [3.0, 4.0, 5.0, 6.0]);
        assert_eq!(x.rows(3..5), [7.0, 8.0, 9.0, 10.0]);
    }
}
