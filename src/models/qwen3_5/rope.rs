//! Partial NeoX rotary embedding (`Qwen3_5TextRotaryEmbedding`, lines 134-198;
//! `apply_rotary_pos_emb`, lines 659-702).
//!
//! For text-only input the three interleaved mRoPE rows are equal, so the
//! rotation reduces exactly to 1-D rope with `pos = t` (qwen3_5 brief §4.5).

use candle_core::{Device, Tensor};

use crate::error::Result;

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

    /// `(cos, sin)`, each `[T, rd/2]` f32, for absolute positions `positions`.
    pub fn cos_sin(&self, positions: &[usize]) -> Result<(Tensor, Tensor)> {
        let half = self.rotary_dim / 2;
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let shape = (positions.len(), half);
        Ok((
            Tensor::from_vec(cos, shape, &Device::Cpu)?,
            Tensor::from_vec(sin, shape, &Device::Cpu)?,
        ))
    }

    /// Rotates the first `rd` dims of every head, NeoX half-split
    /// (`rotate_half`), passing the rest through.
    /// `x`: `[1, heads, T, head_dim]` → same shape.
    pub fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let hd = x.dim(3)?;
        let rot = x.narrow(3, 0, self.rotary_dim)?.contiguous()?;
        let rot = candle_nn::rotary_emb::rope(&rot, cos, sin)?;
        if self.rotary_dim == hd {
            return Ok(rot);
        }
        let pass = x.narrow(3, self.rotary_dim, hd - self.rotary_dim)?;
        Ok(Tensor::cat(&[&rot, &pass], 3)?)
    }
}
