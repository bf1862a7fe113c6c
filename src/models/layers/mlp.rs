//! SwiGLU MLP `Qwen3_5MLP` (`modeling_qwen3_5.py` 817-830; `Qwen3MLP` is the
//! same): `down(silu(gate(x)) · up(x))`, no biases.

use candle_core::Tensor;

use super::elementwise::{zip_map_silu, SiluOf};
use super::{matrix, Matrix, Rows};
use crate::error::Result;
use crate::loading::WeightSource;
use crate::precision::Precision;

/// `mlp.{gate,up,down}_proj` of one layer.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate_proj: Matrix,
    up_proj: Matrix,
    down_proj: Matrix,
    prec: Precision,
}

impl Mlp {
    /// Loads `{prefix}.{gate,up,down}_proj.weight` (`[I, H]`, `[I, H]`, `[H, I]`).
    pub fn load(src: &dyn WeightSource, prefix: &str, prec: Precision) -> Result<Self> {
        Ok(Self {
            gate_proj: matrix(src, &format!("{prefix}.gate_proj.weight"), prec)?,
            up_proj: matrix(src, &format!("{prefix}.up_proj.weight"), prec)?,
            down_proj: matrix(src, &format!("{prefix}.down_proj.weight"), prec)?,
            prec,
        })
    }

    /// From loaded (already shape-checked) `gate_proj`, `up_proj`, `down_proj`
    /// weights in `prec` (the DFlash drafter's layers).
    pub fn new(
        gate_proj: Tensor,
        up_proj: Tensor,
        down_proj: Tensor,
        prec: Precision,
    ) -> Result<Self> {
        Ok(Self {
            gate_proj: Matrix::new(gate_proj)?,
            up_proj: Matrix::new(up_proj)?,
            down_proj: Matrix::new(down_proj)?,
            prec,
        })
    }

    /// From prepared `gate_proj`, `up_proj`, `down_proj` matrices in `prec`
    /// (a DFlash drafter's layers, made once at load).
    pub fn of_matrices(
        gate_proj: Matrix,
        up_proj: Matrix,
        down_proj: Matrix,
        prec: Precision,
    ) -> Self {
        Self {
            gate_proj,
            up_proj,
            down_proj,
            prec,
        }
    }

    /// The same MLP with its products' f32 sums rounded as `rounding` says
    /// (the noise floor's shadow).
    pub fn with_rounding(self, rounding: crate::precision::ProductRounding) -> Self {
        Self {
            gate_proj: self.gate_proj.with_rounding(rounding),
            up_proj: self.up_proj.with_rounding(rounding),
            down_proj: self.down_proj.with_rounding(rounding),
            prec: self.prec,
        }
    }

    /// True when `T` rows pass through this MLP exactly as they would stacked
    /// with other rows (every one of its matrix products, see
    /// [`super::rows_batchable`]; on the CPU, whose kernels that describes).
    pub fn rows_batchable(&self, t: usize) -> bool {
        [&self.gate_proj, &self.up_proj, &self.down_proj]
            .iter()
            .all(|w| w.rows_batchable(t))
    }

    /// `[T, H]` → `[T, H]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_rows(x, Rows::Tokens)
    }

    /// [`Self::forward`] on rows that are `rows`.
    pub fn forward_rows(&self, x: &Tensor, rows: Rows) -> Result<Tensor> {
        let p = self.prec;
        let g = self.gate_proj.apply(x, p, rows)?;
        let u = self.up_proj.apply(x, p, rows)?;
        // round(round(silu(g)) · u), as candle's silu, round, mul, round.
        let tail = |_, u, s, _| p.round_f32(p.round_f32(s) * u);
        let h = match zip_map_silu(&g, &u, SiluOf::First, tail)? {
            Some(h) => h,
            None => p.round(&(p.round(&g.silu()?)? * u)?)?,
        };
        self.down_proj.apply(&h, p, rows)
    }
}
