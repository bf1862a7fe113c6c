//! Elementwise tails of a layer (the SwiGLU's `silu(g) · u`, the gated
//! norm's `w · n · silu(z)`) in one parallel pass over f32 CPU tensors,
//! where candle's ops make a pass and a fresh tensor per operation, whose
//! pages Linux zeroes first at long prompts (`docs/performance.md`, "Fewer
//! passes over a long prompt's memory"). Each element gets the operations
//! candle's ops give it, in their order, so the values are the same bits;
//! and a parallel join of column blocks ([`cat_columns`]).

use candle_core::{DType, Tensor};
use rayon::prelude::*;

use super::with_f32;
use crate::error::Result;

/// Elements per rayon task.
const PIECE: usize = 1 << 14;

/// candle's f32 `silu` (`candle_core::op::Silu::f32`): `x / (1 + e^{−x})`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `f(a[i], b[i], i)` for every element `i` (row-major) of two f32 CPU
/// tensors of one shape, in parallel, as a new tensor of that shape;
/// `None` when either is not an f32 CPU tensor or the shapes differ (the
/// caller then takes candle's ops).
///
/// Errors: a tensor failure.
pub fn zip_map(
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(f32, f32, usize) -> f32 + Sync,
) -> Result<Option<Tensor>> {
    let fits = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32;
    if !fits(a) || !fits(b) || a.shape() != b.shape() {
        return Ok(None);
    }
    let out = with_f32(a, |a| {
        with_f32(b, |b| {
            let mut out = vec![0f32; a.len()];
            out.par_chunks_mut(PIECE)
                .zip(a.par_chunks(PIECE).zip(b.par_chunks(PIECE)))
                .enumerate()
                .for_each(|(c, (o, (a, b)))| {
                    for (j, ((o, &x), &y)) in o.iter_mut().zip(a).zip(b).enumerate() {
                        *o = f(x, y, c * PIECE + j);
                    }
                });
            out
        })
    })??;
    Ok(Some(Tensor::from_vec(out, a.shape(), a.device())?))
}

/// `Tensor::cat(parts, 1)` of 2-D tensors with the same rows (a row's
/// columns from each part in turn), the rows copied in parallel where
/// every part is a contiguous f32 CPU tensor (an LM head's vocabulary
/// chunks: half a GiB of logits at 4096 tokens, which candle's `cat`
/// copies on one thread); candle's `cat` otherwise.
///
/// Errors: the parts' rows differ, or a tensor failure.
pub fn cat_columns(parts: &[Tensor]) -> Result<Tensor> {
    let rows = parts.first().map(|p| p.dim(0)).transpose()?;
    let fits = |t: &Tensor| {
        t.device().is_cpu()
            && t.dtype() == DType::F32
            && t.rank() == 2
            && t.is_contiguous()
            && t.dim(0).ok() == rows
    };
    let Some(rows) = rows.filter(|_| parts.iter().all(fits)) else {
        return Ok(Tensor::cat(parts, 1)?);
    };
    let guards: Vec<_> = parts.iter().map(|p| p.storage_and_layout()).collect();
    let slices: Option<Vec<(&[f32], usize)>> = guards
        .iter()
        .map(
            |(storage, layout)| match (&**storage, layout.contiguous_offsets()) {
                (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)), Some((a, b))) => {
                    Some((&v[a..b], layout.dims()[1]))
                }
                _ => None,
            },
        )
        .collect();
    let Some(slices) = slices else {
        return Ok(Tensor::cat(parts, 1)?);
    };
    let width: usize = slices.iter().map(|s| s.1).sum();
    let mut out = vec![0f32; rows * width];
    out.par_chunks_mut(width.max(1))
        .enumerate()
        .for_each(|(r, row)| {
            let mut at = 0;
            for &(v, cols) in &slices {
                row[at..at + cols].copy_from_slice(&v[r * cols..(r + 1) * cols]);
                at += cols;
            }
        });
    Ok(Tensor::from_vec(out, (rows, width), parts[0].device())?)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::precision::Precision;

    /// Values of the dtype from tiny to past `exp`'s overflow, signed zeros included.
    fn values(n: usize, p: Precision, seed: u64) -> Vec<f32> {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n)
            .map(|i| match i % 50 {
                0 => 0.0,
                1 => -0.0,
                2 => r.gen_range(-120.0..120.0),
                _ => r.gen_range(-1.0f32..1.0) * 10f32.powi(r.gen_range(-6..2)),
            })
            .map(|x| p.round_f32(x))
            .collect()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn the_fused_tails_give_candles_ops_bits() {
        let dev = Device::Cpu;
        // More than one rayon piece, and a last piece short of one.
        let (rows, d) = (37, 1000);
        for p in [Precision::F32, Precision::Bf16, Precision::F16] {
            let t = |seed| Tensor::from_vec(values(rows * d, p, seed), (rows, d), &dev).unwrap();
            let (a, b) = (t(1), t(2));
            let w = Tensor::from_vec(values(d, p, 3), d, &dev).unwrap();
            let wv = w.to_vec1::<f32>().unwrap();
            // The SwiGLU: round(round(silu(g)) · u).
            let want = p
                .round(&(p.round(&a.silu().unwrap()).unwrap() * &b).unwrap())
                .unwrap();
            let got = zip_map(&a, &b, |g, u, _| p.round_f32(p.round_f32(silu(g)) * u));
            assert!(bits(&got.unwrap().unwrap()) == bits(&want), "swiglu {p:?}");
            // The gated norm's tail: round(round(n · w) · silu(z)).
            let nw = p.round(&a.broadcast_mul(&w).unwrap()).unwrap();
            let want = p.round(&(nw * b.silu().unwrap()).unwrap()).unwrap();
            let got = zip_map(&a, &b, |n, z, i| {
                p.round_f32(p.round_f32(n * wv[i % d]) * silu(z))
            });
            assert!(
                bits(&got.unwrap().unwrap()) == bits(&want),
                "gated norm {p:?}"
            );
        }
    }

    #[test]
    fn columns_concatenate_as_candles_cat() {
        let dev = Device::Cpu;
        let parts: Vec<Tensor> = [3, 1, 5]
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                Tensor::from_vec(values(4 * c, Precision::F32, i as u64), (4, c), &dev).unwrap()
            })
            .collect();
        let want = Tensor::cat(&parts, 1).unwrap();
        let got = cat_columns(&parts).unwrap();
        assert_eq!(got.dims(), want.dims());
        assert!(bits(&got) == bits(&want));
        // A part with other rows is refused as candle's cat refuses it.
        let bad = Tensor::zeros((3, 2), DType::F32, &dev).unwrap();
        assert!(cat_columns(&[parts[0].clone(), bad]).is_err());
    }

    #[test]
    fn other_shapes_and_dtypes_are_left_to_candle() {
        let dev = Device::Cpu;
        let a = Tensor::zeros((2, 3), DType::F32, &dev).unwrap();
        let b = Tensor::zeros((3, 2), DType::F32, &dev).unwrap();
        assert!(zip_map(&a, &b, |x, _, _| x).unwrap().is_none());
        let h = Tensor::zeros((2, 3), DType::F16, &dev).unwrap();
        assert!(zip_map(&a, &h, |x, _, _| x).unwrap().is_none());
    }
}
