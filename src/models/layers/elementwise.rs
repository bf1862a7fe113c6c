//! Elementwise tails of a layer (the SwiGLU's `silu(g) · u`, the gated
//! norm's `w · n · silu(z)`) in one parallel pass over f32 CPU tensors,
//! where candle's ops make a pass and a fresh tensor per operation, whose
//! pages Linux zeroes first at long prompts (`docs/performance.md`, "Fewer
//! passes over a long prompt's memory"). Each element gets the operations
//! candle's ops give it, in their order, so the values are the same bits.
//! A row's silu takes `expf`'s bits 16 values at a time where the CPU and
//! libm allow (else a libm call per value, as candle's does), then the rest
//! of the tail runs in an AVX-512F build where the CPU has it
//! (`docs/performance.md`, "Elementwise tails in 16 lanes"). Also a
//! parallel join of column blocks ([`cat_columns`]).

use candle_core::{DType, Tensor};
use rayon::prelude::*;

use super::with_f32;
use crate::error::Result;

/// Elements per rayon task (whole rows of at least this many).
const PIECE: usize = 1 << 14;

/// Columns of a row taken at a time: their `exp` values stay in L1 for the
/// pass that reads them.
const BLOCK: usize = 512;

/// candle's f32 `silu` (`candle_core::op::Silu::f32`: `x / (1 + e^{−x})`)
/// of each value of `x` into `out`, in two passes: `e^{−x}` with libm
/// `expf`'s bits ([`crate::kernels::exp_negated`]: 16 values at a time
/// where the CPU and libm allow, else a libm call per value, as candle's op
/// makes it), then `x / (1 + e)`, which vectorises. The same operations in
/// the same order as candle's, so the same bits.
#[inline(always)]
pub fn silu_into(x: &[f32], out: &mut [f32]) {
    crate::kernels::exp_negated(x, out);
    for (o, &x) in out.iter_mut().zip(x) {
        *o = x / (1.0 + *o);
    }
}

/// The operand whose silu an elementwise tail takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiluOf {
    /// The first (the SwiGLU's gate).
    First,
    /// The second (the gated norm's `z`).
    Second,
}

/// `f(a[i], b[i], silu(a[i] or b[i]), column of i)` for every element `i`
/// (row-major, rows of the last dimension) of two f32 CPU tensors of one
/// shape, in parallel, as a new tensor of that shape; `None` when either
/// is not an f32 CPU tensor or the shapes differ (the caller then takes
/// candle's ops). The silu is [`silu_into`]'s, and `f` runs in an AVX-512F
/// build where the CPU has it (`tail_piece`), so that a tail of roundings
/// and products vectorises.
///
/// Errors: a tensor failure.
pub fn zip_map_silu(
    a: &Tensor,
    b: &Tensor,
    of: SiluOf,
    f: impl Fn(f32, f32, f32, usize) -> f32 + Sync,
) -> Result<Option<Tensor>> {
    let fits = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32;
    if !fits(a) || !fits(b) || a.shape() != b.shape() {
        return Ok(None);
    }
    let d = a.dims().last().copied().unwrap_or(1).max(1);
    let piece = PIECE.div_ceil(d) * d;
    let out = with_f32(a, |a| {
        with_f32(b, |b| {
            let mut out = vec![0f32; a.len()];
            out.par_chunks_mut(piece)
                .zip(a.par_chunks(piece).zip(b.par_chunks(piece)))
                .for_each(|(o, (a, b))| tail_piece(o, (a, b), d, of, &f));
            out
        })
    })??;
    Ok(Some(Tensor::from_vec(out, a.shape(), a.device())?))
}

/// One piece of [`zip_map_silu`]: whole rows of `d` values, in the
/// AVX-512F build of [`tail_rows`] where the CPU has it (16 lanes; the
/// crate's baseline build has SSE2's 4), the same operations either way.
fn tail_piece<F: Fn(f32, f32, f32, usize) -> f32>(
    o: &mut [f32],
    ab: (&[f32], &[f32]),
    d: usize,
    of: SiluOf,
    f: &F,
) {
    /// [`tail_rows`] compiled for AVX-512F.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512<F: Fn(f32, f32, f32, usize) -> f32>(
        o: &mut [f32],
        ab: (&[f32], &[f32]),
        d: usize,
        of: SiluOf,
        f: &F,
    ) {
        tail_rows(o, ab, d, of, f);
    }
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::capabilities().avx512f {
        // SAFETY: the CPU has AVX-512F (read from CPUID with the capabilities).
        return unsafe { avx512(o, ab, d, of, f) };
    }
    tail_rows(o, ab, d, of, f);
}

/// [`tail_piece`]'s loop, inlined into each build: each row's columns a
/// block at a time, their silu first ([`silu_into`]), then `f`.
#[inline(always)]
fn tail_rows<F: Fn(f32, f32, f32, usize) -> f32>(
    o: &mut [f32],
    (a, b): (&[f32], &[f32]),
    d: usize,
    of: SiluOf,
    f: &F,
) {
    let mut s = [0f32; BLOCK];
    for (o, (a, b)) in o.chunks_mut(d).zip(a.chunks(d).zip(b.chunks(d))) {
        for c0 in (0..d).step_by(BLOCK) {
            let c1 = (c0 + BLOCK).min(d);
            let (o, a, b) = (&mut o[c0..c1], &a[c0..c1], &b[c0..c1]);
            let s = &mut s[..c1 - c0];
            silu_into(if of == SiluOf::First { a } else { b }, s);
            let values = o.iter_mut().zip(a).zip(b).zip(s.iter());
            for (j, (((o, &x), &y), &s)) in values.enumerate() {
                *o = f(x, y, s, c0 + j);
            }
        }
    }
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

    /// Values of the dtype from tiny to past `exp`'s overflow, signed zeros,
    /// ±Inf and NaN included.
    fn values(n: usize, p: Precision, seed: u64) -> Vec<f32> {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n)
            .map(|i| match i % 50 {
                0 => 0.0,
                1 => -0.0,
                3 => f32::INFINITY,
                4 => f32::NEG_INFINITY,
                5 => f32::NAN,
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
        // More than one rayon piece and a last piece short of one; rows of
        // more than one column block with a short last one, and rows of
        // fewer columns than a block.
        let shapes = [(37, 1000), (3001, 7)];
        for ((rows, d), p) in shapes
            .into_iter()
            .flat_map(|s| Precision::ALL.map(|p| (s, p)))
        {
            let t = |seed| Tensor::from_vec(values(rows * d, p, seed), (rows, d), &dev).unwrap();
            let (a, b) = (t(1), t(2));
            let w = Tensor::from_vec(values(d, p, 3), d, &dev).unwrap();
            let wv = w.to_vec1::<f32>().unwrap();
            // The SwiGLU: round(round(silu(g)) · u).
            let want = p
                .round(&(p.round(&a.silu().unwrap()).unwrap() * &b).unwrap())
                .unwrap();
            let got = zip_map_silu(&a, &b, SiluOf::First, |_, u, s, _| {
                p.round_f32(p.round_f32(s) * u)
            });
            assert!(bits(&got.unwrap().unwrap()) == bits(&want), "swiglu {p:?}");
            // The baseline build's loop (the AVX-512F one ran above where
            // the CPU has it).
            let (av, bv) = (a.flatten_all().unwrap(), b.flatten_all().unwrap());
            let (av, bv) = (av.to_vec1::<f32>().unwrap(), bv.to_vec1::<f32>().unwrap());
            let mut o = vec![0f32; rows * d];
            let tail = |_, u, s, _| p.round_f32(p.round_f32(s) * u);
            tail_rows(&mut o, (&av, &bv), d, SiluOf::First, &tail);
            let o = Tensor::from_vec(o, (rows, d), &dev).unwrap();
            assert!(bits(&o) == bits(&want), "swiglu, baseline build, {p:?}");
            // The gated norm's tail: round(round(n · w) · silu(z)).
            let nw = p.round(&a.broadcast_mul(&w).unwrap()).unwrap();
            let want = p.round(&(nw * b.silu().unwrap()).unwrap()).unwrap();
            let got = zip_map_silu(&a, &b, SiluOf::Second, |n, _, s, c| {
                p.round_f32(p.round_f32(n * wv[c]) * s)
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
        assert!(zip_map_silu(&a, &b, SiluOf::First, |x, _, _, _| x)
            .unwrap()
            .is_none());
        let h = Tensor::zeros((2, 3), DType::F16, &dev).unwrap();
        assert!(zip_map_silu(&a, &h, SiluOf::First, |x, _, _, _| x)
            .unwrap()
            .is_none());
    }
}
