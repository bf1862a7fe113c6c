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

/// True when [`linear`] on an `[m, k]` input with an `[n, k]` weight computes
/// every output row exactly as it would with more rows stacked under it, so
/// independent sequences can share one product (and one packing of the
/// weight). candle's CPU matmul calls gemm-common 0.19's `gemm_basic_generic`,
/// whose blocked kernel sums each output in k-blocks that depend on `k` alone
/// (`cache::kernel_params`); it takes other routes, with other summation
/// orders, for `k <= 2` (`gevv`), a single row (`gemv`), `m * n <= 256` (the
/// horizontal kernel) and `m, n <= 64` (its small-size block size). A taller
/// stack of such rows takes the blocked kernel too.
pub fn rows_batchable(m: usize, k: usize, n: usize) -> bool {
    m >= 2 && k > 2 && m * n > 256 && (m > 64 || n > 64)
}

/// Loads `name` rounded to the compute dtype (a parameter of a model loaded in `prec`).
pub fn param(src: &dyn WeightSource, name: &str, prec: Precision) -> Result<Tensor> {
    src.tensor_in(name, prec)
}
