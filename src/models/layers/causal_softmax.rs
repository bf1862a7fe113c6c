//! The causal mask and the softmax of eager attention in one pass
//! (`eager_attention_forward`: `scores + causal_mask`, then
//! `softmax(dim=-1, dtype=float32)`), with each row's result a function of
//! its visible scores alone. candle's `softmax_last_dim` sums a row's
//! exponentials in vector lanes laid over the whole row, so a query's
//! probabilities change in their last bits with the number of keys after it
//! (zeros under the mask): a 120-token forward's rows were not the first 120
//! rows of the 128-token forward of the same prompt. Here a row's sum runs
//! over its visible keys only, in lanes fixed by the key index; with
//! probs·v summed in fixed chunks of keys (`attention::eager::probs_times_v`), a
//! prefix of a prompt gives the bits of the longer prompt's first rows
//! (`capture::decode` reuses the capture's states on that ground).
//!
//! The order is not torch's (its vectorised reduction has its own lanes):
//! in f32 the results agree with transformers to round-off, as any order
//! does.

use candle_core::{CpuStorage, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::error::Result;

/// Lanes of a row's sum: exponential `j` goes to lane `j % LANES`, and the
/// lanes are added pairwise at the end (`reduce`).
const LANES: usize = 16;

/// `softmax(scores + mask)` over the last dimension of f32 `scores`
/// `[.., len, s]`, whose rows are queries `i0..i0+len` of a forward over
/// `s = past + T` keys: query `i` sees keys `0..=past + i`, the rest get
/// probability 0 (`-inf` under transformers' additive mask). A row's values
/// depend on its visible scores only.
///
/// Errors: scores not f32 on the CPU (callers check [`applies`]), or a
/// tensor failure.
pub fn causal_softmax(scores: &Tensor, i0: usize, past: usize) -> Result<Tensor> {
    Ok(scores.apply_op1_no_bwd(&CausalSoftmax { i0, past })?)
}

/// True when [`causal_softmax`] takes scores of `x`'s device and dtype (f32
/// on the CPU).
pub fn applies(x: &Tensor) -> bool {
    x.device().is_cpu() && x.dtype() == candle_core::DType::F32
}

struct CausalSoftmax {
    i0: usize,
    past: usize,
}

impl candle_core::CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(all) = storage else {
            candle_core::bail!("causal softmax: scores are not f32");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("causal softmax: scores are not contiguous");
        };
        let dims = layout.shape().dims();
        let (len, s) = match dims {
            [.., len, s] => (*len, *s),
            _ => candle_core::bail!("causal softmax: scores of rank {}", dims.len()),
        };
        let src = &all[start..end];
        let mut dst = vec![0f32; src.len()];
        if s > 0 && len > 0 {
            dst.par_chunks_mut(s)
                .zip(src.par_chunks(s))
                .enumerate()
                .for_each(|(r, (out, row))| {
                    let visible = (self.past + self.i0 + r % len + 1).min(s);
                    softmax_row(&row[..visible], &mut out[..visible]);
                });
        }
        Ok((CpuStorage::F32(dst), layout.shape().clone()))
    }
}

/// `out = softmax(row)`: `exp(x − max)` over the sum of them, the sum in
/// [`LANES`] lanes fixed by the index.
fn softmax_row(row: &[f32], out: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut lanes = [0f32; LANES];
    for (x, e) in row.chunks(LANES).zip(out.chunks_mut(LANES)) {
        for ((x, e), lane) in x.iter().zip(e.iter_mut()).zip(lanes.iter_mut()) {
            *e = (x - max).exp();
            *lane += *e;
        }
    }
    let sum = reduce(lanes);
    for e in out.iter_mut() {
        *e /= sum;
    }
}

/// The lanes added pairwise: 16 → 8 → 4 → 2 → 1.
fn reduce(mut lanes: [f32; LANES]) -> f32 {
    let mut n = LANES;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            lanes[i] += lanes[i + n];
        }
    }
    lanes[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn scores(len: usize, s: usize, seed: u32) -> Vec<f32> {
        let mut x = seed | 1;
        (0..len * s)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 8) as f32 / (1u32 << 24) as f32 * 16.0 - 8.0
            })
            .collect()
    }

    fn run(v: &[f32], dims: (usize, usize, usize), i0: usize, past: usize) -> Vec<f32> {
        let t = Tensor::from_vec(v.to_vec(), dims, &Device::Cpu).unwrap();
        causal_softmax(&t, i0, past)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    /// Against the definition in f64: masked entries exactly 0, the rest
    /// within a few ulps, every row summing to 1.
    #[test]
    fn matches_the_definition_with_the_mask() {
        let (heads, len, past, i0) = (2, 37, 5, 3);
        let s = past + i0 + len + 4;
        let v = scores(heads * len, s, 7);
        let got = run(&v, (heads, len, s), i0, past);
        for (r, (row, out)) in v.chunks(s).zip(got.chunks(s)).enumerate() {
            let visible = past + i0 + r % len + 1;
            let max = row[..visible]
                .iter()
                .fold(f64::MIN, |m, &x| m.max(x as f64));
            let sum: f64 = row[..visible].iter().map(|&x| (x as f64 - max).exp()).sum();
            for (j, (&x, &p)) in row.iter().zip(out).enumerate() {
                if j >= visible {
                    assert_eq!(p.to_bits(), 0, "row {r} key {j}");
                } else {
                    let want = (x as f64 - max).exp() / sum;
                    assert!(
                        (p as f64 - want).abs() <= 4e-7 * want.max(1e-30),
                        "row {r} key {j}"
                    );
                }
            }
        }
    }

    /// A row's bits do not depend on the scores past its visible keys nor on
    /// how many there are: the first rows of a shorter forward are the bits
    /// of the longer one's (the property `capture::decode` relies on).
    #[test]
    fn a_prefix_gives_the_bits_of_the_longer_rows() {
        for (short, long) in [(120, 128), (300, 4096), (17, 33), (1, 70)] {
            let v = scores(long, long, 11);
            let full = run(&v, (1, long, long), 0, 0);
            let prefix: Vec<f32> = v
                .chunks(long)
                .take(short)
                .flat_map(|r| r[..short].to_vec())
                .collect();
            let got = run(&prefix, (1, short, short), 0, 0);
            for r in 0..short {
                let a: Vec<u32> = got[r * short..(r + 1) * short]
                    .iter()
                    .map(|x| x.to_bits())
                    .collect();
                let b: Vec<u32> = full[r * long..r * long + short]
                    .iter()
                    .map(|x| x.to_bits())
                    .collect();
                assert_eq!(a, b, "{short} of {long}, row {r}");
            }
        }
    }
}
