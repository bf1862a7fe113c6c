//! NeoX rotary embedding, partial for Qwen3.5 (`Qwen3_5TextRotaryEmbedding`,
//! `modeling_qwen3_5.py` 134-198; `apply_rotary_pos_emb`, 659-702), full for
//! Qwen3 and the DFlash drafter.
//!
//! For text-only input the three interleaved mRoPE rows are equal, so the
//! rotation reduces exactly to 1-D rope with `pos = t`
//! (`Qwen3_5TextRotaryEmbedding.forward` with `position_ids` expanded to 3
//! identical rows, as `Qwen3_5Model.get_rope_index` gives for text).

use candle_core::{Device, Tensor, D};

use crate::error::Result;
use crate::precision::Precision;

/// Inverse frequencies for the rotary slice of each head.
#[derive(Debug, Clone)]
pub struct Rotary {
    /// `1 / theta^(2j / rd)`, `j = 0..rd/2`, f32 as torch computes it.
    inv_freq: Vec<f32>,
    /// Rotary dims per head (`int(head_dim · partial_rotary_factor)`).
    rotary_dim: usize,
}

impl Rotary {
    /// `theta`: `rope_theta`; `rotary_dim`: even number of rotated dims.
    pub fn new(theta: f64, rotary_dim: usize) -> Self {
        let base = theta as f32;
        let inv_freq = (0..rotary_dim / 2)
            .map(|j| 1.0f32 / base.powf((2 * j) as f32 / rotary_dim as f32))
            .collect();
        Self {
            inv_freq,
            rotary_dim,
        }
    }

    /// Rotated dims per head.
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// `(cos, sin)`, each `[T, rd]` f32 (`emb = cat(freqs, freqs)`), for
    /// absolute positions `positions`, on `device` (computed on the host).
    pub fn cos_sin(&self, positions: &[usize], device: &Device) -> Result<(Tensor, Tensor)> {
        let rd = self.rotary_dim;
        let mut cos = Vec::with_capacity(positions.len() * rd);
        let mut sin = Vec::with_capacity(positions.len() * rd);
        for &p in positions {
            for _ in 0..2 {
                for &f in &self.inv_freq {
                    let a = p as f32 * f;
                    cos.push(a.cos());
                    sin.push(a.sin());
                }
            }
        }
        let shape = (positions.len(), rd);
        Ok((
            Tensor::from_vec(cos, shape, device)?,
            Tensor::from_vec(sin, shape, device)?,
        ))
    }

    /// `q·cos + rotate_half(q)·sin` on the first `rd` dims of every head (NeoX
    /// half split), the rest passed through. cos/sin are cast to the compute
    /// dtype first and each product and the sum are rounded, as the reference
    /// computes them in the model dtype.
    /// `x`: `[1, heads, T, head_dim]`; `cos`, `sin`: `[T, rd]` → same shape as `x`.
    pub fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor, prec: Precision) -> Result<Tensor> {
        let hd = x.dim(3)?;
        let rd = self.rotary_dim;
        let half = rd / 2;
        let rot = x.narrow(3, 0, rd)?;
        let x1 = rot.narrow(3, 0, half)?;
        let x2 = rot.narrow(3, half, half)?;
        let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
        let (cos, sin) = (prec.round(cos)?, prec.round(sin)?);
        let a = prec.round(&rot.broadcast_mul(&cos)?)?;
        let b = prec.round(&rotated.broadcast_mul(&sin)?)?;
        let out = prec.round(&(a + b)?)?;
        if rd == hd {
            return Ok(out);
        }
        let pass = x.narrow(3, rd, hd - rd)?;
        Ok(Tensor::cat(&[&out, &pass], 3)?)
    }
}
