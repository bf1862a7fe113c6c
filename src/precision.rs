//! The dtype a loading path resolves to and computes in, and how hsparity
//! emulates it the way PyTorch rounds it.
//!
//! hsparity keeps every tensor physically in f32 and rounds it to the model
//! dtype exactly where PyTorch would produce a bf16/f16 tensor: after each
//! matmul (f32 accumulation, one rounding, as CPU bf16 GEMMs do), after each
//! elementwise op on half tensors (PyTorch computes those in f32 and rounds
//! once), and where the reference casts (`.to(input_dtype)`). The f32 islands
//! of `modeling_qwen3_5.py` — RMSNorm, `g`, the delta-rule state, softmax —
//! simply skip the rounding. For f32 every rounding is the identity.
//!
//! A low module: the checkpoint reader, the loading paths, the models and the
//! parity code all speak this one type.

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A floating-point model dtype (`torch.float32`, `torch.bfloat16`,
/// `torch.float16`): what `from_pretrained(dtype="auto")` resolves a loading
/// path to, and what hsparity computes in. Serialised `f32`, `bf16`, `f16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
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

    /// The three dtypes, widest first.
    pub const ALL: [Precision; 3] = [Precision::F32, Precision::Bf16, Precision::F16];

    /// Parses a dtype spelling: `f32`, `float32`, `fp32`, `float`, `bf16`,
    /// `bfloat16`, `f16`, `float16`, `fp16`, `half`, each optionally prefixed
    /// with `torch.`. `None` for anything else.
    pub fn from_name(s: &str) -> Option<Self> {
        match s.strip_prefix("torch.").unwrap_or(s) {
            "f32" | "float32" | "fp32" | "float" => Some(Precision::F32),
            "bf16" | "bfloat16" => Some(Precision::Bf16),
            "f16" | "float16" | "fp16" | "half" => Some(Precision::F16),
            _ => None,
        }
    }

    /// Parses a config spelling (`"bfloat16"`, `"torch.float16"`, …) of
    /// `field`. `Ok(None)` for `"auto"`.
    ///
    /// Errors ([`Error::Config`], naming `field`): any other string.
    pub fn from_config_str(s: &str, field: &str) -> Result<Option<Self>> {
        if s.strip_prefix("torch.").unwrap_or(s) == "auto" {
            return Ok(None);
        }
        Self::from_name(s).map(Some).ok_or_else(|| {
            Error::Config(format!(
                "{field} = {:?}: hsparity supports float32, bfloat16 and float16",
                s.strip_prefix("torch.").unwrap_or(s)
            ))
        })
    }

    /// From a safetensors dtype name (`F32`, `BF16`, `F16`); `None` otherwise.
    pub fn from_safetensors(s: &str) -> Option<Self> {
        match s {
            "F32" => Some(Precision::F32),
            "BF16" => Some(Precision::Bf16),
            "F16" => Some(Precision::F16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            Precision::F32 => 4,
            Precision::Bf16 | Precision::F16 => 2,
        }
    }

    /// Explicit mantissa bits (23, 7, 10): the lower of two dtypes is the
    /// one with fewer.
    pub fn mantissa_bits(self) -> u32 {
        match self {
            Precision::F32 => 23,
            Precision::Bf16 => 7,
            Precision::F16 => 10,
        }
    }

    /// The coarser of `self` and `other` (fewer mantissa bits).
    pub fn lower(self, other: Self) -> Self {
        if other.mantissa_bits() < self.mantissa_bits() {
            other
        } else {
            self
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

    /// The candle dtype holding values of this precision.
    pub fn dtype(self) -> DType {
        match self {
            Precision::F32 => DType::F32,
            Precision::Bf16 => DType::BF16,
            Precision::F16 => DType::F16,
        }
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

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = Error;

    /// Parses the spellings of [`Precision::from_name`].
    ///
    /// Errors ([`Error::Input`]): anything else.
    fn from_str(s: &str) -> Result<Self> {
        Self::from_name(s)
            .ok_or_else(|| Error::Input(format!("unknown dtype {s:?}: expected f32, bf16 or f16")))
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
