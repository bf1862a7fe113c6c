//! RMS norms of Qwen3.5 (`transformers/models/qwen3_5/modeling_qwen3_5.py`).

use candle_core::{DType, Tensor, D};

use crate::error::Result;
use crate::models::WeightSource;

/// `x · rsqrt(mean(x², -1) + eps)` over the last dim, computed in f32.
/// Shape: any `[.., D]` → same shape, f32.
pub fn rms_normalize(x: &Tensor, eps: f64) -> Result<Tensor> {
    let x = x.to_dtype(DType::F32)?;
    let inv = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    Ok(x.broadcast_mul(&inv)?)
}

/// Zero-centred RMSNorm `Qwen3_5RMSNorm` (lines 833-851): `norm(x) · (1 + w)`,
/// the multiply in f32 before any cast. Used for `input_layernorm`,
/// `post_attention_layernorm`, `q_norm`, `k_norm` and the final `norm`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// `1 + w`, `[D]`, f32.
    scale: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Loads `{prefix}.weight` (`[D]`). Errors: tensor missing or unreadable.
    pub fn load(src: &dyn WeightSource, prefix: &str, eps: f64) -> Result<Self> {
        let w = src.tensor(&format!("{prefix}.weight"))?;
        Ok(Self {
            scale: (w + 1.0)?,
            eps,
        })
    }

    /// `[.., D]` → `[.., D]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(rms_normalize(x, self.eps)?.broadcast_mul(&self.scale)?)
    }
}

/// Gated RMSNorm `Qwen3_5RMSNormGated` (lines 201-219): `w · norm(x) · silu(z)`
/// with a **plain** weight (ones-initialised, not zero-centred), applied per
/// value head on the `dv` vector.
#[derive(Debug, Clone)]
pub struct RmsNormGated {
    /// `w`, `[dv]`, f32.
    weight: Tensor,
    eps: f64,
}

impl RmsNormGated {
    /// Loads `{prefix}.weight` (`[dv]`).
    pub fn load(src: &dyn WeightSource, prefix: &str, eps: f64) -> Result<Self> {
        Ok(Self {
            weight: src.tensor(&format!("{prefix}.weight"))?,
            eps,
        })
    }

    /// `x`, `z`: `[.., dv]` → `[.., dv]`.
    pub fn forward(&self, x: &Tensor, z: &Tensor) -> Result<Tensor> {
        let n = rms_normalize(x, self.eps)?.broadcast_mul(&self.weight)?;
        Ok((n * z.to_dtype(DType::F32)?.silu()?)?)
    }
}
