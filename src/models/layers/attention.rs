//! Softmax attention, eager form (`eager_attention_forward`,
//! `modeling_qwen3_5.py` 717-739): gated as `Qwen3_5Attention` (742-814,
//! `q_proj` rows `[query | gate]` per head, output × sigmoid(gate)), or plain
//! as `Qwen3Attention` (`models/qwen3/modeling_qwen3.py`).

use candle_core::Tensor;

use super::norm::Norm;
use super::rope::Rotary;
use super::{apply_each, matrix, Matrix, Rows, StateUse};
use crate::error::Result;
use crate::loading::WeightSource;
use crate::models::{LayerGeometry, Positions};

mod eager;
use eager::eager_attention;

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
        let cache = cache.map_or(StateUse::Fresh, StateUse::Continue);
        Ok(self.forward_each(rotary, vec![(x, pos, cache)])?.remove(0))
    }

    /// [`Self::forward`] of a fresh sequence (no cache), also leaving in
    /// `snap` the cache a prefill of its first `at` tokens (`1 ≤ at ≤ T`)
    /// fills ([`Self::forward_each`] with [`StateUse::Snapshot`]).
    ///
    /// Errors: as [`Self::forward_each`].
    pub fn forward_snapshot(
        &self,
        x: &Tensor,
        rotary: &Rotary,
        pos: &Positions,
        at: usize,
        snap: &mut KvCache,
    ) -> Result<Tensor> {
        let cache = StateUse::Snapshot { at, into: snap };
        Ok(self.forward_each(rotary, vec![(x, pos, cache)])?.remove(0))
    }

    /// [`Self::forward`] (or [`Self::forward_snapshot`]) of independent
    /// sequences (`[T_j, H]` each) with their positions and caches,
    /// each output the bits of its own call: the projections over the
    /// stacked rows where that is bitwise ([`apply_each`]), so each weight
    /// is read and widened once for all of them; the attention per sequence.
    ///
    /// A snapshot ([`StateUse::Snapshot`]) leaves in `into` the rotated
    /// keys and values of the first `at` tokens. Each is a function of its
    /// own row, so they are a prefill of those tokens', bit for bit,
    /// whenever its projections sum as this forward's do.
    ///
    /// Errors: a snapshot's `at` is 0 or past its `T`, or its cache is fp8
    /// (an fp8 cache changes the prefill's own attention, so no forward
    /// without one holds it); a tensor failure.
    pub fn forward_each(
        &self,
        rotary: &Rotary,
        seqs: Vec<(&Tensor, &Positions, StateUse<'_, KvCache>)>,
    ) -> Result<Vec<Tensor>> {
        let xs: Vec<&Tensor> = seqs.iter().map(|s| s.0).collect();
        let outs = self
            .project(&xs, Rows::Tokens)?
            .into_iter()
            .zip(seqs)
            .map(|(p, (_, pos, cache))| {
                if let StateUse::Snapshot { at, into } = &cache {
                    let t = p.q.dim(0)?;
                    if *at == 0 || *at > t || into.fp8 {
                        return Err(candle_core::Error::Msg(format!(
                            "KV snapshot after token {at} of a {t}-token sequence{}",
                            if into.fp8 { " into an fp8 cache" } else { "" }
                        ))
                        .into());
                    }
                }
                let out = self.attend(&p.q, &p.k, &p.v, rotary, pos, cache)?;
                self.gate(out, p.gate)
            })
            .collect::<Result<Vec<_>>>()?;
        let outs: Vec<&Tensor> = outs.iter().collect();
        apply_each(&self.o_proj, &outs, self.geo.prec, Rows::Tokens)
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
        let p = self.project(&[x], Rows::Steps)?.remove(0);
        let outs = (0..s)
            .map(|i| {
                let row = |t: &Tensor| t.narrow(0, i, 1);
                self.attend(
                    &row(&p.q)?,
                    &row(&p.k)?,
                    &row(&p.v)?,
                    rotary,
                    &pos[i],
                    StateUse::Continue(cache),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let out = self.gate(Tensor::cat(&outs, 0)?, p.gate)?;
        self.o_proj.apply(&out, self.geo.prec, Rows::Steps)
    }

    /// The projections of each of `xs` (`[T_j, H]`, independent sequences;
    /// each weight read once for all of them where that is bitwise,
    /// [`apply_each`]): normed queries `[T, nh, hd]`, the output gate
    /// `[T, nh·hd]` (gated attention), normed keys and values `[T, nkv, hd]`.
    fn project(&self, xs: &[&Tensor], rows: Rows) -> Result<Vec<Projected>> {
        let g = &self.geo;
        let (nh, nkv, hd) = (g.num_heads, g.num_kv_heads, g.head_dim);
        let each = |m: &Matrix| apply_each(m, xs, g.prec, rows);
        let (qs, ks, vs) = (
            each(&self.q_proj)?,
            each(&self.k_proj)?,
            each(&self.v_proj)?,
        );
        qs.into_iter()
            .zip(ks)
            .zip(vs)
            .map(|((q, k), v)| {
                let t = q.dim(0)?;
                // Qwen3.5: q_proj rows are [query_h | gate_h] per head; Qwen3: query only.
                let (q, gate) = if self.gated {
                    let qg = q.reshape((t, nh, 2 * hd))?;
                    (
                        qg.narrow(2, 0, hd)?,
                        Some(qg.narrow(2, hd, hd)?.reshape((t, nh * hd))?),
                    )
                } else {
                    (q.reshape((t, nh, hd))?, None)
                };
                Ok(Projected {
                    q: self.q_norm.forward(&q.contiguous()?)?,
                    gate,
                    k: self.k_norm.forward(&k.reshape((t, nkv, hd))?)?,
                    v: v.reshape((t, nkv, hd))?,
                })
            })
            .collect()
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
        cache: StateUse<'_, KvCache>,
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
            StateUse::Continue(c) => {
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
            StateUse::Snapshot { at, into } => {
                into.k = Some(k.narrow(2, 0, at)?.contiguous()?);
                into.v = Some(v.narrow(2, 0, at)?.contiguous()?);
                0
            }
            StateUse::Fresh => 0,
        };
        // eager_attention_forward: (q·kᵀ)·scale and the mask in the model
        // dtype, softmax in f32 cast back, probs·v in the model dtype; the
        // key/value heads as repeat_kv repeats them (`gqa`).
        let out = eager_attention(&q, &k, &v, past, prec)?;
        Ok(out.squeeze(0)?.transpose(0, 1)?.reshape((t, nh * hd))?)
    }

    /// The output gate (gated attention) on the attended `[T, nh·hd]`:
    /// `o_proj`'s input.
    fn gate(&self, out: Tensor, gate: Option<Tensor>) -> Result<Tensor> {
        let prec = self.geo.prec;
        match gate {
            Some(gate) => {
                let gate = prec.round(&candle_nn::ops::sigmoid(&gate)?)?;
                prec.round(&(out * gate)?)
            }
            None => Ok(out),
        }
    }
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

#[cfg(test)]
pub(super) mod tests {
    use candle_core::{Device, Tensor};

    use crate::precision::Precision;

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

    pub(in crate::models::layers) fn bits(t: &Tensor) -> Vec<u32> {
        let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    }
}
