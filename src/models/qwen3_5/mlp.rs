//! SwiGLU MLP `Qwen3_5MLP` (lines 817-830): `down(silu(gate(x)) · up(x))`, no biases.

use candle_core::Tensor;

use super::linear;
use crate::error::Result;
use crate::models::WeightSource;

/// `mlp.{gate,up,down}_proj` of one layer.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate_proj: Tensor,
    up_proj: Tensor,
    down_proj: Tensor,
}

impl Mlp {
    /// Loads `{prefix}.{gate,up,down}_proj.weight` (`[I, H]`, `[I, H]`, `[H, I]`).
    pub fn load(src: &dyn WeightSource, prefix: &str) -> Result<Self> {
        Ok(Self {
            gate_proj: src.tensor(&format!("{prefix}.gate_proj.weight"))?,
            up_proj: src.tensor(&format!("{prefix}.up_proj.weight"))?,
            down_proj: src.tensor(&format!("{prefix}.down_proj.weight"))?,
        })
    }

    /// `[T, H]` → `[T, H]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = linear(x, &self.gate_proj)?.silu()?;
        let u = linear(x, &self.up_proj)?;
        linear(&(g * u)?, &self.down_proj)
    }
}
