//! Elementwise tails of a layer (the SwiGLU's `silu(g) · u`, the gated
//! norm's `w · n · silu(z)`) in one parallel pass over f32 CPU tensors,
//! where candle's ops make a pass and a fresh tensor per operation (a
//! tenth of a 4096-token forward went to faulting in those tensors' pages).
//! Each element gets the operations candle's ops give it, in their order,
//! so the values are the same bits.

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
