//! Which kernel candle's CPU matmul runs for `x [m, k] · w [n, k]ᵀ`, and so
//! in which order it sums each output: the one place hsparity encodes
//! gemm-common 0.19's route choice, for [`super::plan`] (every kernel
//! reproduces one of those orders), for the stacking of independent
//! sequences (`models::layers::rows_batchable`) and of a key/value group's
//! query heads (`models::layers::gqa`).
//!
//! candle calls gemm 0.19's `gemm`, which transposes a row-major destination
//! (`do_transpose`), so gemm-common's `gemm_basic_generic` sees `n` rows of
//! `W` by `m` columns of `x`. Its checks, in its order, on contiguous
//! operands: `m·n <= 256` takes the horizontal kernel; then `k <= 2` `gevv`;
//! then a single row or column (`m = 1` or `n = 1`) `gemv`; everything else
//! the blocked kernel, whose k-block size is `min(k, 512)` when `m, n <= 64`
//! and `cache::kernel_params` (of `k` alone, for the AVX2 FMA kernel's 16 × 6
//! register tile) otherwise. That assumes gemm built without its `x86-v4`
//! feature, as candle 0.11 builds it; the kernels' tests compare with
//! candle's own products, so a build that changed it would fail them.

/// candle's f32 kernel on x86-64 with FMA: register tile rows (2 × 8 lanes).
const F32_MR: usize = 16;
/// Its register tile columns.
const F32_NR: usize = 6;

/// A route of candle's CPU matmul ([`route`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `m·n <= 256`: the horizontal kernel (and empty products).
    Horizontal,
    /// `k <= 2`.
    Gevv,
    /// One row or one column.
    Gemv,
    /// The blocked kernel, each output summed in k-blocks of `kc`; `small`:
    /// the block size of `m, n <= 64`.
    Blocked {
        /// k-block size.
        kc: usize,
        /// Chosen by the small-size rule.
        small: bool,
    },
}

/// The route candle's CPU matmul takes for `x [m, k] · w [n, k]ᵀ`.
pub fn route(m: usize, n: usize, k: usize) -> Route {
    if m * n <= 256 {
        return Route::Horizontal;
    }
    if k <= 2 {
        return Route::Gevv;
    }
    if m <= 1 || n <= 1 {
        return Route::Gemv;
    }
    let small = m <= 64 && n <= 64;
    let kc = if small {
        k.min(512)
    } else {
        gemm_common::cache::kernel_params(m, n, k, F32_MR, F32_NR, 4).kc
    };
    Route::Blocked { kc, small }
}

/// The k-block of [`Route::Blocked`]; `None` on the other routes.
pub fn blocked_kc(m: usize, n: usize, k: usize) -> Option<usize> {
    match route(m, n, k) {
        Route::Blocked { kc, .. } => Some(kc),
        _ => None,
    }
}
