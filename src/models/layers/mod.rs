//! Layers the decoder families share (candle, f32 storage, the model dtype
//! emulated by [`Precision`] rounding): linear maps, RMS norms, rotary
//! embedding, softmax attention (gated for Qwen3.5, plain for Qwen3), and
//! the SwiGLU MLP. Each follows `transformers/models/qwen3_5/modeling_qwen3_5.py`
//! (5.23.0) or `models/qwen3/modeling_qwen3.py` where those differ.

pub mod attention;
pub mod mlp;
pub mod norm;
pub mod rope;

use candle_core::Tensor;

use crate::error::Result;
use crate::loading::WeightSource;
use crate::precision::Precision;

/// `x · Wᵀ` for `x`: `[T, in]`, `w`: `[out, in]` → `[T, out]` (nn.Linear, no
/// bias), accumulated in f32 and rounded once to `prec` as a CPU half GEMM does.
pub fn linear(x: &Tensor, w: &Tensor, prec: Precision) -> Result<Tensor> {
    prec.round(&x.matmul(&w.t()?)?)
}

/// Loads `name` rounded to the compute dtype (a parameter of a model loaded in `prec`).
pub fn param(src: &dyn WeightSource, name: &str, prec: Precision) -> Result<Tensor> {
    src.tensor_in(name, prec)
}
