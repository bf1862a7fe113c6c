//! Grouped-query attention's products without repeating the key/value heads:
//! `repeat_kv` (transformers' `modeling_qwen3_5.py`, `modeling_qwen3.py`)
//! copies every key/value head once per query head it serves; where candle's
//! CPU matmul sums a stack of a group's query rows as it sums each head's
//! rows alone, the group's heads go in one product over the shared head
//! instead, with the same bits.

use candle_core::{DType, Tensor};

use crate::error::Result;
use crate::kernels::routes::{route, Route};

/// `repeat_kv` (`modeling_qwen3_5.py`, `modeling_qwen3.py`):
/// `[1, nkv, S, hd]` → `[1, nkv·n_rep, S, hd]`, kv head j serving q heads
/// j·n_rep .. (j+1)·n_rep−1.
///
/// Errors: `x` is not 4-D; a tensor failure.
pub fn repeat_kv(x: &Tensor, n_rep: usize) -> Result<Tensor> {
    if n_rep == 1 {
        return Ok(x.clone());
    }
    let (one, nkv, s, hd) = x.dims4()?;
    Ok(x.unsqueeze(2)?
        .broadcast_as((one, nkv, n_rep, s, hd))?
        .reshape((one, nkv * n_rep, s, hd))?)
}

/// True when candle's CPU matmul sums every output of an `[m·r, k] · [k, n]`
/// product as it sums the same output of `[m, k] · [k, n]`: both on its
/// blocked route with one k-block size, where each output is one
/// accumulator per k-block taking its products in increasing k, whatever
/// the rows beside it ([`crate::kernels::routes`]).
fn stacks_exactly(m: usize, r: usize, n: usize, k: usize) -> bool {
    match (route(m, n, k), route(m * r, n, k)) {
        (Route::Blocked { kc: a, .. }, Route::Blocked { kc: b, .. }) => a == b,
        _ => false,
    }
}

/// `x [1, nh, m, k] · y [1, nkv, k, n]` → `[1, nh, m, n]`, query head h
/// reading head `h / (nh / nkv)` of `y` (`repeat_kv`'s layout): the bits
/// of `x.matmul(repeat_kv(y))`. On the CPU in f32 (the kernel whose routes
/// `kernels::routes` describes), when the stacked product sums as the
/// per-head one (`stacks_exactly`), each group's `nh / nkv` heads are one
/// product of their stacked rows against the shared head (both operands
/// contiguous); otherwise (a single row, candle's small-size routes,
/// another dtype or device) `y` is repeated.
///
/// Errors: `x` or `y` not 4-D, `nh` not a multiple of `nkv`; a tensor failure.
pub fn grouped_matmul(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let (one, nh, m, k) = x.dims4()?;
    let (_, nkv, _, n) = y.dims4()?;
    if nkv == 0 || !nh.is_multiple_of(nkv) {
        return Err(candle_core::Error::Msg(format!(
            "grouped product of {nh} query heads over {nkv} key/value heads"
        ))
        .into());
    }
    let r = nh / nkv;
    if r == 1 {
        return Ok(x.matmul(y)?);
    }
    let f32s = x.dtype() == DType::F32 && y.dtype() == DType::F32;
    if x.device().is_cpu() && f32s && stacks_exactly(m, r, n, k) {
        let stacked = x.contiguous()?.reshape((one, nkv, r * m, k))?;
        return Ok(stacked.matmul(&y.contiguous()?)?.reshape((one, nh, m, n))?);
    }
    Ok(x.matmul(&repeat_kv(y, r)?.contiguous()?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::layers::attention::tests::{bits, values};
    use crate::precision::Precision;

    /// The grouped product gives `repeat_kv`'s bits on the shapes attention
    /// makes: a decode row (single-row route: repeated), a drafter block
    /// against a long context, a prompt's query block, keys fewer than 64
    /// (the small-size rule), eight, four and two query heads per key/value
    /// head, f32 and bf16; and shapes where stacking would change candle's
    /// sums (the horizontal kernel for 10 × 20 outputs, a k-block of 512
    /// against 688), which must not stack. The stacked product is taken
    /// where it is exact.
    #[test]
    fn grouped_products_give_the_repeated_heads_bits() {
        let mut stacked = 0;
        for (m, k, n) in [
            (1, 128, 300),
            (16, 128, 2064),
            (16, 2064, 128),
            (256, 64, 700),
            (5, 16, 9),
            (40, 32, 60),
            (3, 256, 128),
            (10, 64, 20),
            (16, 2064, 60),
        ] {
            for (nh, nkv) in [(8, 2), (4, 2), (8, 1)] {
                for prec in [Precision::F32, Precision::Bf16] {
                    let x = values((1, nh, m, k), 1, prec);
                    let y = values((1, nkv, k, n), 2, prec);
                    let want = x.matmul(&repeat_kv(&y, nh / nkv).unwrap()).unwrap();
                    let got = grouped_matmul(&x, &y).unwrap();
                    assert_eq!(got.dims(), want.dims());
                    assert!(
                        bits(&got) == bits(&want),
                        "m {m} k {k} n {n}, {nh}/{nkv} heads, {prec:?}"
                    );
                    stacked += usize::from(stacks_exactly(m, nh / nkv, n, k));
                }
            }
        }
        assert!(stacked >= 8, "the stacked product ran on {stacked} shapes");
        let bad = grouped_matmul(
            &values((1, 3, 4, 8), 1, Precision::F32),
            &values((1, 2, 8, 4), 2, Precision::F32),
        );
        assert!(bad.is_err());
    }
}
