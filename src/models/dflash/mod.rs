//! DFlash v1 block-diffusion drafter (`DFlashDraftModel`, z-lab `dflash/model.py`
//! @44947fb L185-345; the `dflash` 0.1.0 wheel's forward is identical).
//!
//! The drafter has no embedding and no LM head: the block `[anchor, M, …, M]`
//! is embedded with the **target's** `embed_tokens` and its outputs go through
//! the target's `lm_head`. Target hidden states at `target_layer_ids` enter
//! only as extra keys/values: `c = hidden_norm(fc(ctx))` is projected by every
//! layer's `k_proj`/`v_proj` (then `k_norm` and rope at the context rows'
//! absolute positions) and prepended to the block's own keys/values. Full
//! layers attend without a mask; sliding layers are causal within the block and
//! windowed (`_attention_mask` of the wheel).

mod config;
mod context;
mod linears;
mod weights;

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};
use crate::loading::WeightSource;
use crate::models::layers::gqa::grouped_matmul;
use crate::models::layers::mlp::Mlp;
use crate::models::layers::norm::PlainRmsNorm;
use crate::models::layers::rope::Rotary;
use crate::models::layers::{apply_each, each_stacked, linear, Matrix, Rows};
use crate::precision::Precision;
pub use config::{DflashConfig, DraftLayerType};
pub(crate) use context::narrow_pieces;
pub use context::{CachedDraft, DraftContext};
pub use weights::DrafterWeights;

/// Checks that `name` exists with shape `want` (from its header, not read).
fn check_shape(src: &dyn WeightSource, name: &str, want: &[usize]) -> Result<()> {
    match src.shape(name) {
        Some(s) if s == want => Ok(()),
        Some(s) => Err(Error::Checkpoint(format!(
            "drafter tensor {name}: expected shape {want:?}, found {s:?}"
        ))),
        None => src.tensor(name).map(drop),
    }
}

/// One draft layer for one forward: its prepared matrices, or its weights
/// widened to f32 (rounded to the drafter's dtype) for that forward.
struct DraftLayer {
    input_layernorm: PlainRmsNorm,
    q_proj: Matrix,
    k_proj: Matrix,
    v_proj: Matrix,
    o_proj: Matrix,
    q_norm: PlainRmsNorm,
    k_norm: PlainRmsNorm,
    post_attention_layernorm: PlainRmsNorm,
    mlp: Mlp,
    layer_type: DraftLayerType,
}

/// One block through the drafter's layers ([`Drafter::run_layers_each`]).
struct BlockRun<'k> {
    /// `[B, H]`: the block's tokens embedded by the target.
    noise: Tensor,
    /// `hidden_norm(fc(ctx))` of the context rows this run projects.
    c_proj: Option<Tensor>,
    /// Position of `c_proj`'s first row.
    ctx_start: usize,
    /// Position of the block's first row.
    block_start: usize,
    /// Context keys the block attends to before its own.
    keys_before: usize,
    /// Layer i's keys and values of the projected rows → those attended to.
    #[allow(clippy::type_complexity)]
    keys: Box<dyn FnMut(usize, Tensor, Tensor) -> Result<(Tensor, Tensor)> + 'k>,
}

impl BlockRun<'_> {
    /// A block attending to exactly the context rows `c_proj` projects
    /// (none when `None`).
    fn whole(
        noise: &Tensor,
        c_proj: Option<Tensor>,
        ctx_start: usize,
        block_start: usize,
    ) -> Result<Self> {
        Ok(Self {
            noise: noise.clone(),
            keys_before: c_proj.as_ref().map_or(Ok(0), |c| c.dim(0))?,
            c_proj,
            ctx_start,
            block_start,
            keys: Box::new(|_, k, v| Ok((k, v))),
        })
    }
}

/// A run's RoPE tables and sliding-window mask ([`Drafter::geometry`]).
struct Geometry {
    b: usize,
    c: usize,
    cos: Tensor,
    sin: Tensor,
    cos_q: Tensor,
    sin_q: Tensor,
    sliding: Option<Tensor>,
}

/// `f` on each tensor of `xs` (one per draft).
fn map_each(xs: &[Tensor], f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Vec<Tensor>> {
    xs.iter().map(f).collect()
}

/// The tensors as references (the batched products' argument).
fn as_refs(xs: &[Tensor]) -> Vec<&Tensor> {
    xs.iter().collect()
}

/// A drafter: its config and its weights in their stored dtype, its linear
/// weights prepared once for the products where that costs no bytes
/// (`linears::Linears::prepare`); any other layer weight is widened to f32
/// (rounded to the compute dtype `prec`) when a forward uses it and dropped
/// after, so the drafter is never held widened.
pub struct Drafter {
    /// Its config.
    pub cfg: DflashConfig,
    weights: DrafterWeights,
    linears: linears::Linears,
    rotary: Rotary,
    prec: Precision,
    /// Tensors the drafter's file holds that its forward never reads (what
    /// dflash's `from_pretrained` lists as UNEXPECTED keys), sorted.
    pub unexpected: Vec<String>,
}

impl Drafter {
    /// Builds the drafter for a target with `target_hidden` hidden size,
    /// checking every tensor's shape against the config (headers only).
    ///
    /// Errors: a missing tensor; `fc.weight` not `[H, K·H]` with K =
    /// `len(target_layer_ids)`; the drafter's hidden size differs from the
    /// target's (the taps could not feed `fc`); any other shape mismatch.
    pub fn load(
        cfg: DflashConfig,
        mut weights: DrafterWeights,
        target_hidden: usize,
        prec: Precision,
    ) -> Result<Self> {
        let h = cfg.hidden_size;
        if h != target_hidden {
            return Err(Error::Config(format!(
                "drafter hidden_size {h} differs from the target's hidden_size {target_hidden}: its fc cannot read the target's hidden states"
            )));
        }
        let k = cfg.target_layer_ids.len();
        let (nh, nkv, hd, inter) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.intermediate_size,
        );
        let mul = |a: usize, b: usize| {
            a.checked_mul(b).ok_or_else(|| {
                Error::Config(format!(
                    "drafter sizes {a} x {b} overflow: the config's sizes cannot describe its weights"
                ))
            })
        };
        let (kh, qd, kvd) = (mul(k, h)?, mul(nh, hd)?, mul(nkv, hd)?);
        let mut read: Vec<String> = Vec::new();
        let mut check = |w: &DrafterWeights, n: &str, shape: &[usize]| {
            read.push(n.to_string());
            check_shape(w, n, shape)
        };
        check(&weights, "fc.weight", &[h, kh]).map_err(|e| match e {
            Error::Checkpoint(m) => Error::Checkpoint(format!(
                "{m} (fc in-features must be len(target_layer_ids) x hidden_size = {k} x {h})"
            )),
            other => other,
        })?;
        for n in ["hidden_norm.weight", "norm.weight"] {
            check(&weights, n, &[h])?;
        }
        for i in 0..cfg.num_hidden_layers {
            for (n, shape) in [
                ("input_layernorm.weight", vec![h]),
                ("post_attention_layernorm.weight", vec![h]),
                ("self_attn.q_norm.weight", vec![hd]),
                ("self_attn.k_norm.weight", vec![hd]),
                ("self_attn.q_proj.weight", vec![qd, h]),
                ("self_attn.k_proj.weight", vec![kvd, h]),
                ("self_attn.v_proj.weight", vec![kvd, h]),
                ("self_attn.o_proj.weight", vec![h, qd]),
                ("mlp.gate_proj.weight", vec![inter, h]),
                ("mlp.up_proj.weight", vec![inter, h]),
                ("mlp.down_proj.weight", vec![h, inter]),
            ] {
                check(&weights, &format!("layers.{i}.{n}"), &shape)?;
            }
        }
        let mut unexpected: Vec<String> = weights
            .names()
            .filter(|n| !read.contains(n))
            .cloned()
            .collect();
        unexpected.sort();
        let linears = linears::Linears::prepare(&mut weights, prec, cfg.num_hidden_layers)?;
        Ok(Self {
            unexpected,
            linears,
            rotary: Rotary::new(cfg.rope_theta, hd),
            cfg,
            weights,
            prec,
        })
    }

    /// Loads `config.json` + weights from a drafter folder.
    pub fn load_dir(dir: &std::path::Path, target_hidden: usize, prec: Precision) -> Result<Self> {
        let cfg = DflashConfig::from_file(&dir.join("config.json"))?;
        let w = DrafterWeights::load_dir(dir)?;
        Self::load(cfg, w, target_hidden, prec)
    }

    /// The same drafter (sharing its weights) with every sliding-window layer
    /// run as its full-attention layers are: no window and no causal mask
    /// inside the block, what an engine that drops the layers' window runs
    /// (vLLM before PR #40898).
    pub fn sliding_as_full(&self) -> Drafter {
        let mut cfg = self.cfg.clone();
        cfg.layer_types
            .iter_mut()
            .for_each(|t| *t = DraftLayerType::FullAttention);
        Drafter {
            cfg,
            weights: self.weights.clone(),
            linears: self.linears.clone(),
            rotary: self.rotary.clone(),
            prec: self.prec,
            unexpected: self.unexpected.clone(),
        }
    }

    /// Bytes of the weights as held (stored dtype; prepared bf16 pairs hold
    /// the same bytes).
    pub fn stored_bytes(&self) -> u64 {
        self.weights.bytes() + self.linears.bytes()
    }

    /// The linear weight `name` for one forward.
    fn mat(&self, name: &str) -> Result<Matrix> {
        self.linears.get(&self.weights, name, self.prec)
    }

    /// Layer `i` for one forward.
    fn layer(&self, i: usize) -> Result<DraftLayer> {
        let (p, eps, src) = (self.prec, self.cfg.rms_norm_eps, &self.weights);
        let n = |s: &str| format!("layers.{i}.{s}");
        let norm = |s: &str| PlainRmsNorm::load(src, &n(s), eps, p);
        Ok(DraftLayer {
            input_layernorm: norm("input_layernorm")?,
            q_proj: self.mat(&n("self_attn.q_proj.weight"))?,
            k_proj: self.mat(&n("self_attn.k_proj.weight"))?,
            v_proj: self.mat(&n("self_attn.v_proj.weight"))?,
            o_proj: self.mat(&n("self_attn.o_proj.weight"))?,
            q_norm: norm("self_attn.q_norm")?,
            k_norm: norm("self_attn.k_norm")?,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            mlp: Mlp::of_matrices(
                self.mat(&n("mlp.gate_proj.weight"))?,
                self.mat(&n("mlp.up_proj.weight"))?,
                self.mat(&n("mlp.down_proj.weight"))?,
                p,
            ),
            layer_type: self.cfg.layer_types[i],
        })
    }

    /// `forward`: `noise`: `[B, H]` (block tokens embedded by the target),
    /// `ctx`: `[C, K·H]` target features for positions `ctx_start..ctx_start+C`,
    /// block at positions `block_start..block_start+B` (in DFlash
    /// `ctx_start + C == block_start`). Returns the final-normed `[B, H]`.
    pub fn forward(
        &self,
        noise: &Tensor,
        ctx: &Tensor,
        ctx_start: usize,
        block_start: usize,
    ) -> Result<Tensor> {
        let c_proj = self.project_context_each(&[ctx])?.pop();
        let mut run = BlockRun::whole(noise, c_proj, ctx_start, block_start)?;
        Ok(self
            .run_layers_each(std::slice::from_mut(&mut run))?
            .remove(0))
    }

    /// `hidden_norm(fc(ctx))` of each of `ctxs`: the context rows every
    /// layer's `k_proj` and `v_proj` read; `fc` over the stacked rows where
    /// the kernel sums each row as alone ([`apply_each`]).
    fn project_context_each(&self, ctxs: &[&Tensor]) -> Result<Vec<Tensor>> {
        if ctxs.is_empty() {
            return Ok(Vec::new());
        }
        let p = self.prec;
        let hidden_norm =
            PlainRmsNorm::load(&self.weights, "hidden_norm", self.cfg.rms_norm_eps, p)?;
        apply_each(&self.mat("fc.weight")?, ctxs, p, Rows::Tokens)?
            .iter()
            .map(|y| hidden_norm.forward(y))
            .collect()
    }

    /// The layers and the final norm over each run's block, every layer
    /// read once for all of them: its products over the blocks' stacked
    /// rows where the kernel sums each row as alone ([`apply_each`],
    /// [`each_stacked`]), the norms, RoPE and attention per block, so each
    /// output is bitwise its run's alone. A run's context rows `c_proj`
    /// (positions `ctx_start..`) are projected by each layer's `k_proj` and
    /// `v_proj` in one product with its block; its `keys(i, k, v)` turns
    /// layer i's keys and values of those rows (`[1, kv heads, rows,
    /// head_dim]`, `k_norm` and RoPE applied) into the `keys_before` context
    /// keys and values followed by the block's that the block attends to.
    fn run_layers_each(&self, runs: &mut [BlockRun<'_>]) -> Result<Vec<Tensor>> {
        let p = self.prec;
        let geo = runs
            .iter()
            .map(|r| self.geometry(r))
            .collect::<Result<Vec<_>>>()?;
        let mut xs: Vec<Tensor> = runs.iter().map(|r| r.noise.clone()).collect();
        for i in 0..self.cfg.num_hidden_layers {
            let layer = self.layer(i)?;
            let hs = map_each(&xs, |x| layer.input_layernorm.forward(x))?;
            let qs = apply_each(&layer.q_proj, &as_refs(&hs), p, Rows::Tokens)?;
            let kv_in = runs
                .iter()
                .zip(&hs)
                .map(|(r, h)| match &r.c_proj {
                    Some(c) => Ok(Tensor::cat(&[c, h], 0)?),
                    None => Ok(h.clone()),
                })
                .collect::<Result<Vec<_>>>()?;
            let ks = apply_each(&layer.k_proj, &as_refs(&kv_in), p, Rows::Tokens)?;
            let vs = apply_each(&layer.v_proj, &as_refs(&kv_in), p, Rows::Tokens)?;
            let mut attn = Vec::with_capacity(runs.len());
            for (j, r) in runs.iter_mut().enumerate() {
                let (q, k, v) = (&qs[j], &ks[j], &vs[j]);
                attn.push(self.attend(&layer, &geo[j], (q, k, v), |k, v| (r.keys)(i, k, v))?);
            }
            let os = apply_each(&layer.o_proj, &as_refs(&attn), p, Rows::Tokens)?;
            let mid = xs
                .iter()
                .zip(os)
                .map(|(x, o)| p.round(&(x + o)?))
                .collect::<Result<Vec<_>>>()?;
            let h2 = map_each(&mid, |x| layer.post_attention_layernorm.forward(x))?;
            let ms = each_stacked(
                &as_refs(&h2),
                |t| layer.mlp.rows_batchable(t),
                |x| layer.mlp.forward(x),
            )?;
            xs = mid
                .iter()
                .zip(ms)
                .map(|(x, m)| p.round(&(x + m)?))
                .collect::<Result<Vec<_>>>()?;
        }
        let norm = PlainRmsNorm::load(&self.weights, "norm", self.cfg.rms_norm_eps, p)?;
        map_each(&xs, |x| norm.forward(x))
    }

    /// A run's positions: RoPE's tables over its context and block rows,
    /// and the sliding-window mask its sliding layers share.
    fn geometry(&self, r: &BlockRun<'_>) -> Result<Geometry> {
        let b = r.noise.dim(0)?;
        let c = match &r.c_proj {
            Some(t) => t.dim(0)?,
            None => 0,
        };
        let positions: Vec<usize> = (r.ctx_start..r.ctx_start + c)
            .chain(r.block_start..r.block_start + b)
            .collect();
        let (cos, sin) = self.rotary.cos_sin(&positions, r.noise.device())?;
        let (cos_q, sin_q) = (cos.narrow(0, c, b)?, sin.narrow(0, c, b)?);
        let sliding = if self
            .cfg
            .layer_types
            .contains(&DraftLayerType::SlidingAttention)
        {
            Some(self.sliding_mask(b, r.keys_before, r.noise.device())?)
        } else {
            None
        };
        Ok(Geometry {
            b,
            c,
            cos,
            sin,
            cos_q,
            sin_q,
            sliding,
        })
    }

    /// One block's attention in `layer` from its projections `(q, k, v)`
    /// (`[B, heads·head_dim]`, `[C + B, kv heads·head_dim]` twice): the
    /// norms and RoPE, `keys(k, v)` for the keys and values it attends to,
    /// the scores and the weighted values `[B, heads·head_dim]`, before
    /// `o_proj`.
    fn attend(
        &self,
        layer: &DraftLayer,
        g: &Geometry,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        mut keys: impl FnMut(Tensor, Tensor) -> Result<(Tensor, Tensor)>,
    ) -> Result<Tensor> {
        let p = self.prec;
        let (b, c) = (g.b, g.c);
        let (nh, nkv, hd) = (
            self.cfg.num_attention_heads,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim,
        );
        let scale = (hd as f64).powf(-0.5);
        let q = layer.q_norm.forward(&q.reshape((b, nh, hd))?)?;
        let k = layer.k_norm.forward(&k.reshape((c + b, nkv, hd))?)?;
        let v = v.reshape((c + b, nkv, hd))?;
        let q = q.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
        let k = k.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
        let v = v.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
        let q = self.rotary.apply(&q, &g.cos_q, &g.sin_q, p)?;
        let k = self.rotary.apply(&k, &g.cos, &g.sin, p)?;
        let (k, v) = keys(k, v)?;
        // repeat_kv's heads without the copies (`gqa`).
        let kt = k.t()?.contiguous()?;
        let mut scores = p.round(&(p.round(&grouped_matmul(&q, &kt)?)? * scale)?)?;
        if let (DraftLayerType::SlidingAttention, Some(mask)) = (layer.layer_type, &g.sliding) {
            scores = scores.broadcast_add(mask)?;
        }
        let probs = p.round(&candle_nn::ops::softmax_last_dim(&scores)?)?;
        let a = p.round(&grouped_matmul(&probs, &v)?)?;
        Ok(a.squeeze(0)?.transpose(0, 1)?.reshape((b, nh * hd))?)
    }

    /// The wheel's `_attention_mask(is_causal=True, sliding_window=W)` over
    /// `[C + B]` keys for `B` block queries (query i sits at key index C + i).
    fn sliding_mask(&self, b: usize, c: usize, device: &Device) -> Result<Tensor> {
        let w = self.cfg.sliding_window.unwrap_or(usize::MAX);
        let s = c + b;
        let mut m = vec![0f32; b * s];
        for i in 0..b {
            let qp = c + i;
            for kp in 0..s {
                if kp > qp || qp - kp >= w {
                    m[i * s + kp] = f32::NEG_INFINITY;
                }
            }
        }
        Ok(Tensor::from_vec(m, (b, s), device)?)
    }

    /// Draft logits from final-normed outputs with the target's `lm_head`
    /// (`[V, H]`): `compute_logits` (output multiplier and softcap when set).
    pub fn logits(&self, y: &Tensor, lm_head: &Tensor) -> Result<Tensor> {
        self.scale_logits(linear(y, lm_head, self.prec)?)
    }

    /// As [`Self::logits`] with the target's `lm_head.weight` read from `head`
    /// in vocabulary chunks (rounded to the target's `head_prec`), never held
    /// whole: each logit is the same dot product, so the result is bitwise
    /// that of [`Self::logits`] on the whole (rounded) weight.
    ///
    /// Errors: the head cannot be read; shapes disagree.
    pub fn logits_from(
        &self,
        y: &Tensor,
        head: &dyn WeightSource,
        head_prec: Precision,
    ) -> Result<Tensor> {
        let mut l = Self::logits_from_each(&[(self, y)], head, head_prec)?;
        Ok(l.remove(0))
    }

    /// [`Self::logits_from`] of several drafters' outputs through one head,
    /// reading it once for all of them: each chunk is read once, and the
    /// outputs rounded to one precision go through it in one product over
    /// their stacked rows wherever the kernel sums each row as alone
    /// ([`apply_each`]: the chunk widened once, not once per draft), the
    /// others each alone, so each result is bitwise its own call's.
    ///
    /// Errors: as [`Self::logits_from`].
    pub fn logits_from_each(
        each: &[(&Drafter, &Tensor)],
        head: &dyn WeightSource,
        head_prec: Precision,
    ) -> Result<Vec<Tensor>> {
        let mut parts: Vec<Vec<Tensor>> = each.iter().map(|_| Vec::new()).collect();
        let mut precs: Vec<Precision> = Vec::new();
        for (d, _) in each {
            if !precs.contains(&d.prec) {
                precs.push(d.prec);
            }
        }
        crate::models::text_model::for_each_vocab_chunk(
            head,
            "lm_head.weight",
            head_prec,
            |_, w| {
                // The chunk as bf16 pairs for the bf16 kernel where it
                // applies; candle's sums on every CPU.
                let w = w.with_candle_sums();
                for &prec in &precs {
                    let at: Vec<usize> = (0..each.len())
                        .filter(|&i| each[i].0.prec == prec)
                        .collect();
                    let ys: Vec<&Tensor> = at.iter().map(|&i| each[i].1).collect();
                    for (i, l) in at.into_iter().zip(apply_each(&w, &ys, prec, Rows::Tokens)?) {
                        parts[i].push(l);
                    }
                }
                Ok(())
            },
        )?;
        each.iter()
            .zip(parts)
            .map(|((d, _), p)| d.scale_logits(Tensor::cat(&p, 1)?))
            .collect()
    }

    /// `compute_logits`' output multiplier and softcap.
    fn scale_logits(&self, mut l: Tensor) -> Result<Tensor> {
        if self.cfg.output_multiplier != 1.0 {
            l = (l * self.cfg.output_multiplier)?;
        }
        if let Some(cap) = self.cfg.final_logit_softcapping {
            l = ((l / cap)?.tanh()? * cap)?;
        }
        Ok(l)
    }
}
