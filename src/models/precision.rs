//! Emulating a model dtype the way PyTorch rounds it.
//!
//! hsparity keeps every tensor physically in f32 and rounds it to the model
//! dtype exactly where PyTorch would produce a bf16/f16 tensor: after each
//! matmul (f32 accumulation, one rounding, as CPU bf16 GEMMs do), after each
//! elementwise op on half tensors (PyTorch computes those in f32 and rounds
//! once), and where the reference casts (`.to(input_dtype)`). The f32 islands
//! of `modeling_qwen3_5.py` — RMSNorm, `g`, the delta-rule state, softmax —
//! simply skip the rounding. For f32 every rounding is the identity.

use candle_core::{DType, Tensor};
use serde::Serialize;

use crate::error::{Error, Result};

/// The dtype a loading path computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// torch.float32.
    #[default]
    F32,
    /// torch.bfloat16.
    Bf16,
    /// torch.float16.
    F16,
}

impl Precision {
    /// `"f32"`, `"bf16"`, `"f16"`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }

    /// Parses `f32|float32|bf16|bfloat16|f16|float16`. Errors: anything else.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "f32" | "float32" | "fp32" => Ok(Precision::F32),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            "f16" | "float16" | "fp16" | "half" => Ok(Precision::F16),
            other => Err(Error::Input(format!(
                "unknown dtype {other:?}: expected f32, bf16 or f16"
            ))),
        }
    }

    /// `--dtype`: `None` for `auto` (each path's own dtype), else [`Self::parse`].
    ///
    /// Errors: as [`Self::parse`].
    pub fn parse_or_auto(s: &str) -> Result<Option<Self>> {
        match s {
            "auto" => Ok(None),
            d => Self::parse(d).map(Some),
        }
    }

    /// True when rounding to this dtype changes no value stored as `stored`
    /// (a safetensors dtype: `"BF16"`, `"F16"`, …): f32 keeps everything, and
    /// bf16 → f32 → bf16 and f16 → f32 → f16 are the identity.
    pub fn is_exact_for(self, stored: &str) -> bool {
        matches!(
            (self, stored),
            (Precision::F32, _) | (Precision::Bf16, "BF16") | (Precision::F16, "F16")
        )
    }

    /// Rounds every element of `t` (f32) to this dtype, keeping f32 storage.
    pub fn round(self, t: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Precision::F32 => t.clone(),
            Precision::Bf16 => t.to_dtype(DType::BF16)?.to_dtype(DType::F32)?,
            Precision::F16 => t.to_dtype(DType::F16)?.to_dtype(DType::F32)?,
        })
    }

    /// Rounds one value.
    pub fn round_f32(self, x: f32) -> f32 {
        match self {
            Precision::F32 => x,
            Precision::Bf16 => half::bf16::from_f32(x).to_f32(),
            Precision::F16 => half::f16::from_f32(x).to_f32(),
        }
    }

    /// Rounds a buffer in place.
    pub fn round_slice(self, v: &mut [f32]) {
        if self != Precision::F32 {
            v.iter_mut().for_each(|x| *x = self.round_f32(*x));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_half_crate_and_is_identity_for_f32() {
        let x = 1.0f32 + 1.0 / 512.0; // not representable in bf16 (8 bits)
        assert_eq!(Precision::F32.round_f32(x), x);
        assert_eq!(Precision::Bf16.round_f32(x), 1.0);
        assert_eq!(Precision::F16.round_f32(x), x); // f16 has 10 bits
        let t = Tensor::new(&[x, 3.0], &candle_core::Device::Cpu).unwrap();
        let r = Precision::Bf16.round(&t).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(r, vec![1.0, 3.0]);
    }
}
