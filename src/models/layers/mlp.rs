//! SwiGLU MLP `Qwen3_5MLP` (`modeling_qwen3_5.py` 817-830; `Qwen3MLP` is the
//! same): `down(silu(gate(x)) · up(x))`, no biases.

use candle_core::Tensor;

use super::{linear, param};
use crate::error::Result;
use crate::loading::WeightSource;
use crate::precision::Precision;

/// `mlp.{gate,up,down}_proj` of one layer.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate_proj: Tensor,
    up_proj: Tensor,
    down_proj: Tensor,
    prec: Precision,
}

impl Mlp {
    /// Loads `{prefix}.{gate,up,down}_proj.weight` (`[I, H]`, `[I, H]`, `[H, I]`).
    pub fn load(src: &dyn WeightSource, prefix: &str, prec: Precision) -> Result<Self> {
        Ok(Self {
            gate_proj: param(src, &format!("{prefix}.gate_proj.weight"), prec)?,
            up_proj: param(src, &format!("{prefix}.up_proj.weight"), prec)?,
            down_proj: param(src, &format!("{prefix}.down_proj.weight"), prec)?,
            prec,
        })
    }

    /// From loaded (already shape-checked) `gate_proj`, `up_proj`, `down_proj`
    /// weights in `prec` (the DFlash drafter's layers).
    pub fn new(gate_proj: Tensor, up_proj: Tensor, down_proj: Tensor, prec: Precision) -> Self {
        Self {
            gate_proj,
            up_proj,
            down_proj,
            prec,
        }
    }

    /// True when `T` rows pass through this MLP exactly as they would stacked
    /// with other rows (every one of its matrix products, see
    /// [`super::rows_batchable`]; on the CPU, whose kernels that describes).
    pub fn rows_batchable(&self, t: usize) -> bool {
        self.down_proj.device().is_cpu()
            && [&self.gate_proj, &self.up_proj, &self.down_proj]
                .iter()
                .all(|w| matches!(w.dims(), &[n, k] if super::rows_batchable(t, k, n)))
    }

    /// `[T, H]` → `[T, H]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let p = self.prec;
        let g = p.round(&linear(x, &self.gate_proj, p)?.silu()?)?;
        let u = linear(x, &self.up_proj, p)?;
        linear(&p.round(&(g * u)?)?, &self.down_proj, p)
    }
}
