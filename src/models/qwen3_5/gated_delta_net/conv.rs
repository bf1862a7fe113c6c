//! The causal depthwise conv + SiLU of `Qwen3_5GatedDeltaNet.forward`
//! (`causal_conv1d_fn`, or `F.conv1d` then `ACT2FN["silu"]`, both in the
//! model dtype) and the split of its output into the delta rule's q, k and
//! v with the key heads expanded to the value heads, in one pass per row
//! over the layer's input where transformers builds the padded input, the
//! conv's output and the three slices as tensors of their own.

use rayon::prelude::*;

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
            || vec![0f32; c],
            |acc, (i, ((qr, kr), vr))| {
                // Padded row i + j is position i + j − hist of this forward.
                let first = reset
                    .filter(|&r| i >= r)
                    .map_or(0, |r| (r + hist).saturating_sub(i))
                    .min(kk);
                acc.fill(0.0);
                for j in first..kk {
                    let (w, src) = (&w_t[j * c..(j + 1) * c], x.row(i + j));
                    for ((a, &w), &s) in acc.iter_mut().zip(w).zip(src) {
                        *a += w * s;
                    }
                }
                for a in acc.iter_mut() {
                    let r = prec.round_f32(*a);
                    *a = prec.round_f32(r / (1.0 + (-r).exp()));
                }
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
