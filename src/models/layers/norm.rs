//! RMS norms: zero-centred (`Qwen3_5RMSNorm`), gated (`Qwen3_5RMSNormGated`)
//! and plain (`Qwen3RMSNorm`, also the DFlash drafter's).

use candle_core::{DType, Tensor, D};

use super::elementwise::{zip_map_silu, SiluOf};
use super::param;
use crate::error::Result;
use crate::loading::WeightSource;
use crate::precision::Precision;

/// `x · rsqrt(mean(x², -1) + eps)` over the last dim, computed in f32.
/// Shape: any `[.., D]` → same shape, f32.
pub fn rms_normalize(x: &Tensor, eps: f64) -> Result<Tensor> {
    let x = x.to_dtype(DType::F32)?;
    let inv = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    Ok(x.broadcast_mul(&inv)?)
}

/// Zero-centred RMSNorm `Qwen3_5RMSNorm` (lines 833-851): `norm(x) · (1 + w)`,
/// all in f32 (`1.0 + w.float()` of the dtype-rounded parameter), then one cast
/// to the compute dtype (`type_as(x)`). Used for `input_layernorm`,
/// `post_attention_layernorm`, `q_norm`, `k_norm` and the final `norm`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// `1 + w`, `[D]`, f32.
    scale: Tensor,
    eps: f64,
    prec: Precision,
}

impl RmsNorm {
    /// Loads `{prefix}.weight` (`[D]`). Errors: tensor missing or unreadable.
    pub fn load(src: &dyn WeightSource, prefix: &str, eps: f64, prec: Precision) -> Result<Self> {
        let w = param(src, &format!("{prefix}.weight"), prec)?;
        Ok(Self {
            scale: (w + 1.0)?,
            eps,
            prec,
        })
    }

    /// `[.., D]` → `[.., D]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.prec
            .round(&rms_normalize(x, self.eps)?.broadcast_mul(&self.scale)?)
    }
}

/// Gated RMSNorm `Qwen3_5RMSNormGated` (lines 201-219): `w · norm(x) · silu(z)`
/// with a **plain** weight (ones-initialised, not zero-centred), applied per
/// value head on the `dv` vector. Casts as the reference: `norm(x)` in f32 cast
/// to the compute dtype, `w ·` in that dtype, `· silu(z.float())` in f32, cast back.
#[derive(Debug, Clone)]
pub struct RmsNormGated {
    /// `w`, `[dv]`, rounded to the compute dtype.
    weight: Tensor,
    /// Its values.
    w: Vec<f32>,
    eps: f64,
    prec: Precision,
}

impl RmsNormGated {
    /// Loads `{prefix}.weight` (`[dv]`).
    pub fn load(src: &dyn WeightSource, prefix: &str, eps: f64, prec: Precision) -> Result<Self> {
        let weight = param(src, &format!("{prefix}.weight"), prec)?;
        Ok(Self {
            w: weight.flatten_all()?.to_vec1::<f32>()?,
            weight,
            eps,
            prec,
        })
    }

    /// `x`, `z`: `[.., dv]` → `[.., dv]`.
    pub fn forward(&self, x: &Tensor, z: &Tensor) -> Result<Tensor> {
        let p = self.prec;
        let n = p.round(&rms_normalize(x, self.eps)?)?;
        // round(round(n · w) · silu(z)), as candle's broadcast_mul, round,
        // silu, mul, round.
        let (w, d) = (&self.w, self.w.len());
        let fused = if d > 0 && n.dim(D::Minus1)? == d {
            zip_map_silu(&n, z, SiluOf::Second, |n, _, s, c| {
                p.round_f32(p.round_f32(n * w[c]) * s)
            })?
        } else {
            None
        };
        match fused {
            Some(y) => Ok(y),
            None => {
                let n = p.round(&n.broadcast_mul(&self.weight)?)?;
                p.round(&(n * z.to_dtype(DType::F32)?.silu()?)?)
            }
        }
    }
}

/// Plain RMSNorm (`Qwen3RMSNorm`, `transformers/models/qwen3/modeling_qwen3.py`):
/// `w · norm(x)` with the normalisation in f32 cast to the compute dtype
/// before the weight multiply (Llama style, unlike [`RmsNorm`]). Used by
/// Qwen3 dense models and the DFlash drafter.
#[derive(Debug, Clone)]
pub struct PlainRmsNorm {
    /// `w`, `[D]`, rounded to the compute dtype.
    weight: Tensor,
    eps: f64,
    prec: Precision,
}

impl PlainRmsNorm {
    /// Loads `{prefix}.weight` (`[D]`). Errors: tensor missing or unreadable.
    pub fn load(src: &dyn WeightSource, prefix: &str, eps: f64, prec: Precision) -> Result<Self> {
        Ok(Self {
            weight: param(src, &format!("{prefix}.weight"), prec)?,
            eps,
            prec,
        })
    }

    /// `[.., D]` → `[.., D]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let n = self.prec.round(&rms_normalize(x, self.eps)?)?;
        self.prec.round(&n.broadcast_mul(&self.weight)?)
    }
}

/// A decoder norm: zero-centred for Qwen3.5, plain for Qwen3 (the family's
/// model file chooses).
#[derive(Debug, Clone)]
pub enum Norm {
    /// `Qwen3_5RMSNorm`: `norm(x)·(1+w)`.
    ZeroCentred(RmsNorm),
    /// `Qwen3RMSNorm`: `w·norm(x)`.
    Plain(PlainRmsNorm),
}

impl Norm {
    /// `[.., D]` → `[.., D]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Norm::ZeroCentred(n) => n.forward(x),
            Norm::Plain(n) => n.forward(x),
        }
    }
}
