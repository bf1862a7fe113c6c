//! Eager softmax attention (`eager_attention_forward`,
//! `modeling_qwen3_5.py` 717-739) in blocks of query rows and chunks of keys,
//! each row the bits of one product over all rows.

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::models::layers::causal_softmax;
use crate::models::layers::gqa::grouped_matmul;
use crate::precision::Precision;

/// `eager_attention_forward` (transformers): `q [1, nh, T, hd]` against
/// `k`, `v [1, nkv, past+T, hd]` (query head h reading key/value head
/// `h / (nh / nkv)`, as after `repeat_kv`, without the copies:
/// [`grouped_matmul`]) → `[1, nh, T, hd]`:
/// (q·kᵀ)·scale and the causal mask in the model dtype, softmax in f32 cast
/// back, probs·v in the model dtype. A long prompt's queries go in blocks
/// of rows ([`query_blocks`]), each its own products and softmax, so the
/// scores never exist for all rows at once; the rows are the same bits.
///
/// On the CPU a block takes the keys its rows see and no more, and sums
/// probs·v in chunks of [`KEY_CHUNK`] keys ([`probs_times_v`]): with the
/// causal softmax, a row's bits then depend on its visible keys alone, so a
/// prompt's first rows are those of its prefix's forward at any length
/// (one product over all keys would sum each row in k-blocks whose size
/// candle's GEMM picks from the key count).
pub(super) fn eager_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    past: usize,
    prec: Precision,
) -> Result<Tensor> {
    let (t, hd) = (q.dim(2)?, q.dim(3)?);
    let scale = (hd as f64).powf(-0.5);
    // (q·kᵀ)·scale of a block's queries, rounded as the reference rounds.
    let scores = |q: &Tensor, kt: &Tensor| -> Result<Tensor> {
        prec.round(&(prec.round(&grouped_matmul(q, kt)?)? * scale)?)
    };
    let rows = |i0: usize, len: usize| q.narrow(2, i0, len)?.contiguous();
    let out = if causal_softmax::applies(q) {
        query_blocks(t)
            .map(|(i0, len)| {
                // Keys 0..vis: the last one the block's last row sees.
                let kt = k.narrow(2, 0, past + i0 + len)?.t()?.contiguous()?;
                let s = scores(&rows(i0, len)?, &kt)?;
                let probs = prec.round(&causal_softmax::causal_softmax(&s, i0, past)?)?;
                prec.round(&probs_times_v(&probs, v)?)
            })
            .collect::<Result<Vec<_>>>()?
    } else {
        let kt = k.t()?.contiguous()?;
        query_blocks(t)
            .map(|(i0, len)| {
                let s = scores(&rows(i0, len)?, &kt)?;
                let mask = causal_mask(i0, len, past + t, past, q.device())?;
                let probs = candle_nn::ops::softmax_last_dim(&s.broadcast_add(&mask)?)?;
                prec.round(&grouped_matmul(&prec.round(&probs)?, v)?)
            })
            .collect::<Result<Vec<_>>>()?
    };
    Ok(Tensor::cat(&out, 2)?)
}

/// Keys per product of [`probs_times_v`]: at most one k-block of candle's
/// GEMM on any CPU it sizes blocks for (its blocks take at least 256 keys
/// when the L1 holds 32 KiB; tested in `key_chunks_are_one_k_block`).
const KEY_CHUNK: usize = 256;

/// `probs [.., len, vis] · v[.., :vis, :]` (`v` `[.., S ≥ vis, hd]`): one
/// product per chunk of [`KEY_CHUNK`] keys, from key 0, the partial sums
/// added in key order in f32. A row sums its keys in order within a chunk
/// (one k-block), and the keys past its last visible one add zeros, so its
/// bits do not depend on `vis`.
fn probs_times_v(probs: &Tensor, v: &Tensor) -> Result<Tensor> {
    let vis = probs.dim(probs.rank() - 1)?;
    let mut acc: Option<Tensor> = None;
    for c0 in (0..vis).step_by(KEY_CHUNK) {
        let n = KEY_CHUNK.min(vis - c0);
        let p = probs.narrow(probs.rank() - 1, c0, n)?.contiguous()?;
        let part = grouped_matmul(&p, &v.narrow(2, c0, n)?.contiguous()?)?;
        acc = Some(match acc {
            Some(a) => (a + part)?,
            None => part,
        });
    }
    acc.ok_or_else(|| candle_core::Error::Msg("attention over no keys".into()).into())
}

/// Query rows per attention block: a prompt of more than twice this many
/// tokens has its scores computed block by block.
const QUERY_BLOCK: usize = 256;

/// `(first row, rows)` of each query block of a `t`-token forward: one
/// block up to `2 · QUERY_BLOCK` rows, else blocks of `QUERY_BLOCK` with the
/// last taking the remainder. Every block of a split has more than 64 rows,
/// so candle's GEMM sums each row's products in the k-blocks it uses for
/// all `t` rows (its blocked route outside the small-size rule,
/// `kernels::routes`): the rows are bit for bit those of one product.
fn query_blocks(t: usize) -> impl Iterator<Item = (usize, usize)> {
    let n = if t > 2 * QUERY_BLOCK {
        t / QUERY_BLOCK
    } else {
        1
    };
    (0..n).map(move |b| {
        let i0 = b * QUERY_BLOCK;
        let len = if b + 1 == n { t - i0 } else { QUERY_BLOCK };
        (i0, len)
    })
}

/// Rows `i0..i0+len` of the additive causal mask `[T, s]` (`s = past + T`):
/// 0 where key position ≤ query position (`past + i`), −∞ elsewhere.
fn causal_mask(i0: usize, len: usize, s: usize, past: usize, device: &Device) -> Result<Tensor> {
    let mut m = vec![0f32; len * s];
    for (r, row) in m.chunks_mut(s.max(1)).enumerate() {
        for x in row.iter_mut().skip(past + i0 + r + 1) {
            *x = f32::NEG_INFINITY;
        }
    }
    Ok(Tensor::from_vec(m, (len, s), device)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::layers::attention::tests::{bits, values};
    use crate::models::layers::gqa::repeat_kv;

    /// The scores of every row at once, over all keys, as before the
    /// blocks: the reference.
    fn one_block(q: &Tensor, k: &Tensor, v: &Tensor, past: usize, prec: Precision) -> Tensor {
        let hd = q.dim(3).unwrap();
        let scores = prec.round(&q.matmul(&k.t().unwrap().contiguous().unwrap()).unwrap());
        let scores = prec.round(&(scores.unwrap() * (hd as f64).powf(-0.5)).unwrap());
        let probs = causal_softmax::causal_softmax(&scores.unwrap(), 0, past).unwrap();
        let probs = prec.round(&probs).unwrap();
        prec.round(&probs_times_v(&probs, v).unwrap()).unwrap()
    }

    /// Each key chunk of probs·v is one k-block of candle's GEMM, whatever
    /// the query rows and head size (so a row sums its keys in order).
    #[test]
    fn key_chunks_are_one_k_block() {
        for m in [2, 16, 64, 65, 256, 511] {
            for hd in [16, 64, 128, 256] {
                for k in [KEY_CHUNK, KEY_CHUNK - 1, 17] {
                    let kc = crate::kernels::routes::blocked_kc(m, hd, k);
                    assert!(kc.is_none_or(|kc| kc == k), "m {m} hd {hd} k {k}: {kc:?}");
                }
            }
        }
    }

    /// A prompt's first rows are the bits of its prefix's forward, past
    /// the lengths where candle's GEMM would split one product over all keys
    /// into k-blocks sized by the key count (1092 and 1100 keys, 4088 and
    /// 4096), f32 and bf16.
    #[test]
    fn a_prefix_gives_the_bits_of_the_longer_rows() {
        for (short, long, hd) in [
            (120, 128, 64),
            (1092, 1100, 64),
            (4088, 4096, 16),
            (300, 4096, 16),
        ] {
            for prec in [Precision::F32, Precision::Bf16] {
                let (q, k, v) = (
                    values((1, 1, long, hd), 1, prec),
                    values((1, 1, long, hd), 2, prec),
                    values((1, 1, long, hd), 3, prec),
                );
                let first = |x: &Tensor, n: usize| x.narrow(2, 0, n).unwrap().contiguous().unwrap();
                let whole = eager_attention(&q, &k, &v, 0, prec).unwrap();
                let prefix = eager_attention(
                    &first(&q, short),
                    &first(&k, short),
                    &first(&v, short),
                    0,
                    prec,
                )
                .unwrap();
                assert!(
                    bits(&prefix) == bits(&first(&whole, short)),
                    "{short} of {long}, hd {hd}, {prec:?}"
                );
            }
        }
    }

    /// Blocks of query rows give the bits of one product over all rows:
    /// two blocks and a remainder, several, a past (a cache), a single
    /// decode row, head sizes under and over 64 (candle's small-size rule),
    /// one, two and four query heads per key/value head against repeated
    /// heads, f32 and bf16.
    #[test]
    fn query_blocks_give_the_bits_of_one_block() {
        assert_eq!(query_blocks(512).collect::<Vec<_>>(), vec![(0, 512)]);
        assert_eq!(
            query_blocks(700).collect::<Vec<_>>(),
            vec![(0, 256), (256, 444)]
        );
        let cases = [
            (700, 0, 16),
            (1100, 0, 128),
            (600, 37, 64),
            (513, 0, 8),
            (1, 37, 64),
        ];
        // Four query heads over four, two or one key/value heads: the
        // reference repeats them (`repeat_kv`), the blocks group them.
        for ((t, past, hd), nkv) in cases.into_iter().flat_map(|c| [4, 2, 1].map(|n| (c, n))) {
            for prec in [Precision::F32, Precision::Bf16] {
                let q = values((1, 4, t, hd), 1, prec);
                let k = values((1, nkv, past + t, hd), 2, prec);
                let v = values((1, nkv, past + t, hd), 3, prec);
                let got = eager_attention(&q, &k, &v, past, prec).unwrap();
                let (kr, vr) = (
                    repeat_kv(&k, 4 / nkv).unwrap(),
                    repeat_kv(&v, 4 / nkv).unwrap(),
                );
                assert!(
                    bits(&got) == bits(&one_block(&q, &kr, &vr, past, prec)),
                    "t {t}, past {past}, hd {hd}, {nkv} kv heads, {prec:?}"
                );
            }
        }
    }
}
