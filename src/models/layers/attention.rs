//! Softmax attention, eager form (`eager_attention_forward`,
//! `modeling_qwen3_5.py` 717-739): gated as `Qwen3_5Attention` (742-814,
//! `q_proj` rows `[query | gate]` per head, output × sigmoid(gate)), or plain
//! as `Qwen3Attention` (`models/qwen3/modeling_qwen3.py`).

use candle_core::{Device, Tensor};

use super::causal_softmax;
use super::gqa::grouped_matmul;
use super::norm::Norm;
use super::rope::Rotary;
use super::{matrix, Matrix, Rows};
use crate::error::Result;
use crate::loading::WeightSource;
use crate::models::{LayerGeometry, Positions};
use crate::precision::Precision;

/// The scale vLLM quantises K and V with for `--kv-cache-dtype fp8` when the
/// checkpoint carries no KV scales: 1.0 (`vllm/attention/layer.py`,
/// `set_default_quant_scales`, called by `_init_kv_cache_quant`; the
/// quantisation method `vllm/model_executor/layers/quantization/kv_cache.py`
/// `BaseKVCacheMethod.process_weights_after_loading` also falls back to 1.0).
pub const FP8_KV_SCALE: f64 = 1.0;

/// Key/value cache of one full-attention layer: rotated keys and raw values,
/// each `[1, nkv, S, hd]`.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    k: Option<Tensor>,
    v: Option<Tensor>,
    /// Store K and V as fp8 e4m3 ([`KvCache::fp8`]).
    fp8: bool,
}

impl KvCache {
    /// Tokens held.
    pub fn len(&self) -> usize {
        self.k.as_ref().map(|k| k.dim(2).unwrap_or(0)).unwrap_or(0)
    }
    /// An empty cache that stores K and V as fp8 e4m3 with scale
    /// [`FP8_KV_SCALE`], as vLLM's `--kv-cache-dtype fp8` does: every key and
    /// value written (the current tokens' too: vLLM writes the cache, then
    /// attends over it) is `x / scale` rounded to e4m3, to nearest even and
    /// saturating at ±448, then read back as `q · scale`
    /// (`csrc/quantization/w8a8/fp8/nvidia/quant_utils.cuh`,
    /// `scaled_vec_conversion<uint8_t, float>`: `__nv_cvt_float_to_fp8(a /
    /// scale, __NV_SATFINITE, __NV_E4M3)`; the `float8` crate's conversion is
    /// the same algorithm). Queries stay in the model dtype.
    pub fn fp8() -> Self {
        Self {
            fp8: true,
            ..Self::default()
        }
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the first `len` cached tokens (a speculative block's rejected
    /// tail dropped; transformers' `DynamicLayer.crop`).
    ///
    /// Errors: a tensor failure.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len >= self.len() {
            return Ok(());
        }
        for t in [&mut self.k, &mut self.v].into_iter().flatten() {
            *t = t.narrow(2, 0, len)?;
        }
        Ok(())
    }
}

/// `self_attn.*` of one full-attention layer.
#[derive(Debug, Clone)]
pub struct Attention {
    /// Gated (Qwen3.5): `[2·nh·hd, H]`, rows interleaved per head
    /// `[query_h | gate_h]`; plain (Qwen3): `[nh·hd, H]`.
    q_proj: Matrix,
    k_proj: Matrix,
    v_proj: Matrix,
    o_proj: Matrix,
    q_norm: Norm,
    k_norm: Norm,
    /// Output gate (`Qwen3_5Attention`).
    gated: bool,
    geo: LayerGeometry,
}

impl Attention {
    /// The same layer with its products' f32 sums rounded as `rounding`
    /// says (what loading it through the noise shadow gives).
    pub fn with_rounding(self, rounding: crate::precision::ProductRounding) -> Self {
        Self {
            q_proj: self.q_proj.with_rounding(rounding),
            k_proj: self.k_proj.with_rounding(rounding),
            v_proj: self.v_proj.with_rounding(rounding),
            o_proj: self.o_proj.with_rounding(rounding),
            ..self
        }
    }

    /// Loads `{prefix}.{q,k,v,o}_proj.weight`; `norm` loads the
    /// `{prefix}.{q,k}_norm` of the family; `gated`: `q_proj` carries the
    /// output gate (Qwen3.5).
    pub fn load(
        src: &dyn WeightSource,
        prefix: &str,
        geo: LayerGeometry,
        gated: bool,
        norm: impl Fn(&str) -> Result<Norm>,
    ) -> Result<Self> {
        let p = geo.prec;
        Ok(Self {
            q_proj: matrix(src, &format!("{prefix}.q_proj.weight"), p)?,
            k_proj: matrix(src, &format!("{prefix}.k_proj.weight"), p)?,
            v_proj: matrix(src, &format!("{prefix}.v_proj.weight"), p)?,
            o_proj: matrix(src, &format!("{prefix}.o_proj.weight"), p)?,
            q_norm: norm(&format!("{prefix}.q_norm"))?,
            k_norm: norm(&format!("{prefix}.k_norm"))?,
            gated,
            geo,
        })
    }

    /// `x`: `[T, H]` (already `input_layernorm`-ed); `pos`: rope tables for
    /// the absolute positions of these T tokens; `cache`: earlier tokens' keys
    /// and values, extended in place when given. Causal mask over
    /// cache + current tokens. Returns `[T, H]`.
    pub fn forward(
        &self,
        x: &Tensor,
        rotary: &Rotary,
        pos: &Positions,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor> {
        let p = self.project(x, Rows::Tokens)?;
        let cache = cache.map_or(CacheUse::Fresh, CacheUse::Continue);
        let out = self.attend(&p.q, &p.k, &p.v, rotary, pos, cache)?;
        self.output(out, p.gate, Rows::Tokens)
    }

    /// [`Self::forward`] of a fresh sequence (no cache), also leaving in
    /// `snap` the cache a prefill of its first `at` tokens (`1 ≤ at ≤ T`)
    /// fills: their rotated keys and values. Each is a function of its own
    /// row, so they are that prefill's, bit for bit, whenever its
    /// projections sum as this forward's do.
    ///
    /// Errors: `at` is 0 or past `T`, an fp8 `snap` (an fp8 cache changes
    /// the prefill's own attention, so no forward without one holds it), or
    /// a tensor failure.
    pub fn forward_snapshot(
        &self,
        x: &Tensor,
        rotary: &Rotary,
        pos: &Positions,
        at: usize,
        snap: &mut KvCache,
    ) -> Result<Tensor> {
        let t = x.dim(0)?;
        if at == 0 || at > t || snap.fp8 {
            return Err(candle_core::Error::Msg(format!(
                "KV snapshot after token {at} of a {t}-token sequence{}",
                if snap.fp8 { " into an fp8 cache" } else { "" }
            ))
            .into());
        }
        let p = self.project(x, Rows::Tokens)?;
        let cache = CacheUse::Snapshot { at, into: snap };
        let out = self.attend(&p.q, &p.k, &p.v, rotary, pos, cache)?;
        self.output(out, p.gate, Rows::Tokens)
    }

    /// `S` single-token decode steps from `cache` at once: `x` `[S, H]` (one
    /// step per row, at positions `pos[i]`) → `[S, H]`, bitwise `S` calls of
    /// [`Self::forward`] on one row each. The projections take each row
    /// alone ([`Rows::Steps`]; see [`super::Matrix::linear_each_row`]); each
    /// step then attends over the cache as its own call would.
    ///
    /// Errors: `pos` does not hold one entry per row, or a tensor failure.
    pub fn forward_steps(
        &self,
        x: &Tensor,
        rotary: &Rotary,
        pos: &[Positions],
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let s = x.dim(0)?;
        if pos.len() != s {
            return Err(candle_core::Error::Msg(format!(
                "attention steps: {} positions for {s} rows",
                pos.len()
            ))
            .into());
        }
        let p = self.project(x, Rows::Steps)?;
        let outs = (0..s)
            .map(|i| {
                let row = |t: &Tensor| t.narrow(0, i, 1);
                self.attend(
                    &row(&p.q)?,
                    &row(&p.k)?,
                    &row(&p.v)?,
                    rotary,
                    &pos[i],
                    CacheUse::Continue(cache),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        self.output(Tensor::cat(&outs, 0)?, p.gate, Rows::Steps)
    }

    /// The projections of `x` `[T, H]`: normed queries `[T, nh, hd]`, the
    /// output gate `[T, nh·hd]` (gated attention), normed keys and values
    /// `[T, nkv, hd]`.
    fn project(&self, x: &Tensor, rows: Rows) -> Result<Projected> {
        let g = &self.geo;
        let prec = g.prec;
        let t = x.dim(0)?;
        let (nh, nkv, hd) = (g.num_heads, g.num_kv_heads, g.head_dim);
        // Qwen3.5: q_proj rows are [query_h | gate_h] per head; Qwen3: query only.
        let (q, gate) = if self.gated {
            let qg = self.q_proj.apply(x, prec, rows)?.reshape((t, nh, 2 * hd))?;
            (
                qg.narrow(2, 0, hd)?,
                Some(qg.narrow(2, hd, hd)?.reshape((t, nh * hd))?),
            )
        } else {
            (
                self.q_proj.apply(x, prec, rows)?.reshape((t, nh, hd))?,
                None,
            )
        };
        Ok(Projected {
            q: self.q_norm.forward(&q.contiguous()?)?,
            gate,
            k: self
                .k_norm
                .forward(&self.k_proj.apply(x, prec, rows)?.reshape((t, nkv, hd))?)?,
            v: self.v_proj.apply(x, prec, rows)?.reshape((t, nkv, hd))?,
        })
    }

    /// Rotary embedding, the cache and eager attention for `T` tokens'
    /// projections → `[T, nh·hd]`.
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        rotary: &Rotary,
        pos: &Positions,
        cache: CacheUse,
    ) -> Result<Tensor> {
        let g = &self.geo;
        let prec = g.prec;
        let t = q.dim(0)?;
        let (nh, hd) = (g.num_heads, g.head_dim);
        // [1, heads, T, hd]
        let q = q.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
        let k = k.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
        let v = v.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
        let q = rotary.apply(&q, &pos.cos, &pos.sin, prec)?;
        let mut k = rotary.apply(&k, &pos.cos, &pos.sin, prec)?;
        let mut v = v;
        let past = match cache {
            CacheUse::Continue(c) => {
                if c.fp8 {
                    k = fp8_round_trip(&k)?;
                    v = fp8_round_trip(&v)?;
                }
                let past = c.len();
                if let (Some(pk), Some(pv)) = (&c.k, &c.v) {
                    k = Tensor::cat(&[pk, &k], 2)?;
                    v = Tensor::cat(&[pv, &v], 2)?;
                }
                c.k = Some(k.clone());
                c.v = Some(v.clone());
                past
            }
            CacheUse::Snapshot { at, into } => {
                into.k = Some(k.narrow(2, 0, at)?.contiguous()?);
                into.v = Some(v.narrow(2, 0, at)?.contiguous()?);
                0
            }
            CacheUse::Fresh => 0,
        };
        // eager_attention_forward: (q·kᵀ)·scale and the mask in the model
        // dtype, softmax in f32 cast back, probs·v in the model dtype; the
        // key/value heads as repeat_kv repeats them (`gqa`).
        let out = eager_attention(&q, &k, &v, past, prec)?;
        Ok(out.squeeze(0)?.transpose(0, 1)?.reshape((t, nh * hd))?)
    }

    /// The output gate (gated attention) and `o_proj` of the attended `[T, nh·hd]`.
    fn output(&self, out: Tensor, gate: Option<Tensor>, rows: Rows) -> Result<Tensor> {
        let prec = self.geo.prec;
        let out = match gate {
            Some(gate) => {
                let gate = prec.round(&candle_nn::ops::sigmoid(&gate)?)?;
                prec.round(&(out * gate)?)?
            }
            None => out,
        };
        self.o_proj.apply(&out, prec, rows)
    }
}

/// How a forward uses a KV cache ([`Attention::attend`]).
enum CacheUse<'c> {
    /// None: a fresh prefill.
    Fresh,
    /// Attend over it too, and extend it.
    Continue(&'c mut KvCache),
    /// A fresh prefill that fills `into` with its first `at` tokens' keys
    /// and values ([`Attention::forward_snapshot`]).
    Snapshot { at: usize, into: &'c mut KvCache },
}

/// One forward's projections ([`Attention::project`]).
struct Projected {
    q: Tensor,
    gate: Option<Tensor>,
    k: Tensor,
    v: Tensor,
}

/// `x` stored as fp8 e4m3 with [`FP8_KV_SCALE`] and read back (see [`KvCache::fp8`]).
///
/// Errors: a tensor failure.
pub fn fp8_round_trip(x: &Tensor) -> Result<Tensor> {
    use candle_core::DType;
    let q = (x / FP8_KV_SCALE)?.to_dtype(DType::F8E4M3)?;
    Ok((q.to_dtype(DType::F32)? * FP8_KV_SCALE)?)
}

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
fn eager_attention(
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
pub(super) mod tests {
    use super::*;
    use crate::models::layers::gqa::repeat_kv;

    /// Deterministic values in about [-2, 2], rounded to `prec` (also the
    /// inputs of `gqa`'s tests).
    pub(in crate::models::layers) fn values(
        dims: (usize, usize, usize, usize),
        seed: u64,
        prec: Precision,
    ) -> Tensor {
        let n = dims.0 * dims.1 * dims.2 * dims.3;
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
            })
            .collect();
        let t = Tensor::from_vec(v, dims, &Device::Cpu).unwrap();
        prec.round(&t).unwrap()
    }

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

    pub(in crate::models::layers) fn bits(t: &Tensor) -> Vec<u32> {
        let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        v.iter().map(|x| x.to_bits()).collect()
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
