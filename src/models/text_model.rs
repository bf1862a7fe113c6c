//! A text model built piecewise — [`Embedding`], one
//! [`crate::models::DecoderLayer`] at a time, [`FinalNorm`], [`LmHead`] — so
//! [`crate::capture`] can stream layer by layer, and whole ([`TextModel`])
//! for generation, where every step runs every layer.

use candle_core::Tensor;

use crate::error::{Error, Result};
use crate::loading::WeightSource;
use crate::models::layers::elementwise::cat_columns;
use crate::models::layers::norm::Norm;
use crate::models::layers::{each_stacked, linear, matrix_rows, param, Matrix};
use crate::models::{DecoderLayer, GdnForm, LayerState, Positions, TextModelSpec};
use crate::precision::Precision;

/// `embed_tokens`: plain lookup, no scaling (`modeling_qwen3_5.py` 1235).
#[derive(Debug, Clone)]
pub struct Embedding {
    /// `[V, H]`.
    weight: Tensor,
}

impl Embedding {
    /// Loads `embed_tokens.weight` in `prec`.
    pub fn load(src: &dyn WeightSource, prec: Precision) -> Result<Self> {
        Ok(Self {
            weight: param(src, "embed_tokens.weight", prec)?,
        })
    }

    /// `embed_tokens(ids)` without loading the table: the rows are gathered
    /// from the source (the mapped checkpoint), rounded to `prec`. Bitwise
    /// equal to `Embedding::load(src, prec)?.forward(ids)`.
    ///
    /// Errors: an id out of range, a tensor that cannot be read.
    pub fn gather(src: &dyn WeightSource, prec: Precision, ids: &[u32]) -> Result<Tensor> {
        src.rows("embed_tokens.weight", ids, prec)
    }

    /// `ids` (each `< V`) → `[T, H]`. Errors: an id out of range.
    pub fn forward(&self, ids: &[u32]) -> Result<Tensor> {
        crate::loading::select_rows(&self.weight, "embed_tokens.weight", ids)
    }
}

/// Final `norm` (zero-centred for Qwen3.5, `modeling_qwen3_5.py` 1283; plain for Qwen3).
#[derive(Debug, Clone)]
pub struct FinalNorm(Norm);

impl FinalNorm {
    /// Loads `norm.weight` with the family's norm, computing in `prec`.
    pub fn load(spec: &TextModelSpec, src: &dyn WeightSource, prec: Precision) -> Result<Self> {
        let eps = spec.geo.eps;
        Ok(Self(spec.model.norm(src, "norm", eps, prec)?))
    }
    /// `[T, H]` → `[T, H]`.
    pub fn forward(&self, h: &Tensor) -> Result<Tensor> {
        self.0.forward(h)
    }
}

/// `lm_head` (no bias, no softcap; lines 1708-1710).
#[derive(Debug, Clone)]
pub struct LmHead {
    /// `[V, H]`.
    weight: Tensor,
    prec: Precision,
}

impl LmHead {
    /// Loads `lm_head.weight` (the loading path decides whether that is tied).
    pub fn load(src: &dyn WeightSource, prec: Precision) -> Result<Self> {
        Ok(Self {
            weight: param(src, "lm_head.weight", prec)?,
            prec,
        })
    }
    /// `[T, H]` (final-normed) → logits `[T, V]`.
    pub fn forward(&self, h: &Tensor) -> Result<Tensor> {
        linear(h, &self.weight, self.prec)
    }

    /// The weight `[V, H]` (a drafter projects its outputs with it).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// Logits without holding the whole head: `lm_head.weight` is read in
    /// vocabulary chunks of about [`LM_HEAD_CHUNK_BYTES`] (f32), each chunk
    /// applied to every input before it is dropped. `inputs[c]` are consumer
    /// `c`'s final-normed states (`[T, H]` each, e.g. one per prompt); the
    /// result has the same nesting, `[T, V]` each. Every logit is the same
    /// dot product as in [`Self::forward`] (rounded once to `prec`).
    ///
    /// Errors: the head cannot be read, shapes disagree.
    pub fn forward_streamed(
        src: &dyn WeightSource,
        prec: Precision,
        inputs: &[&[Tensor]],
    ) -> Result<Vec<Vec<Tensor>>> {
        let name = "lm_head.weight";
        let mut parts: Vec<Vec<Vec<Tensor>>> = inputs
            .iter()
            .map(|hs| hs.iter().map(|_| Vec::new()).collect())
            .collect();
        let all: Vec<&Tensor> = inputs.iter().flat_map(|hs| hs.iter()).collect();
        for_each_vocab_chunk(src, name, prec, |_, w| {
            // Every input against the chunk at once (bitwise each alone).
            let mut ys =
                each_stacked(&all, |t| w.rows_batchable(t), |x| w.linear(x, prec))?.into_iter();
            for out in parts.iter_mut() {
                for (o, y) in out.iter_mut().zip(ys.by_ref()) {
                    o.push(y);
                }
            }
            Ok(())
        })?;
        parts
            .into_iter()
            .map(|per| per.into_iter().map(|chunks| cat_columns(&chunks)).collect())
            .collect()
    }
}

/// Size of one vocabulary chunk of the LM head, in f32 bytes.
pub const LM_HEAD_CHUNK_BYTES: usize = 64 << 20;

/// Calls `f(start_row, chunk)` for consecutive row chunks of `name` of
/// about [`LM_HEAD_CHUNK_BYTES`] each, as [`matrix_rows`] holds them (for
/// `prec`); a source that cannot tell the shape gives one chunk.
///
/// Errors: the tensor cannot be read; what `f` returns.
pub fn for_each_vocab_chunk(
    src: &dyn WeightSource,
    name: &str,
    prec: Precision,
    mut f: impl FnMut(usize, Matrix) -> Result<()>,
) -> Result<()> {
    match src.shape(name) {
        Some(shape) if shape.len() == 2 && shape[0] > 0 => {
            let (v, hdim) = (shape[0], shape[1].max(1));
            let rows = (LM_HEAD_CHUNK_BYTES / 4 / hdim).clamp(1, v);
            let mut start = 0;
            while start < v {
                let n = rows.min(v - start);
                f(start, matrix_rows(src, name, (start, n), prec)?)?;
                start += n;
            }
            Ok(())
        }
        _ => f(0, Matrix::of_param(src.tensor_in(name, prec)?, prec, true)?),
    }
}

/// Per-layer decode state of a whole model plus the number of tokens it holds
/// (transformers' `DynamicCache` with `LinearAttentionLayer`s).
#[derive(Debug, Clone)]
pub struct DecodeState {
    /// One state per decoder layer.
    pub layers: Vec<LayerState>,
    /// Tokens processed so far (the next token's position).
    pub len: usize,
}

/// A whole text model resident in memory (for generation, where every step
/// runs every layer). Built from one loading path's weights. Cloning shares
/// the weight tensors (candle tensors are reference-counted), so a variant
/// (another lm_head, a decode shift) costs no second copy of the model.
#[derive(Clone)]
pub struct TextModel {
    /// Geometry.
    pub spec: TextModelSpec,
    embed: Embedding,
    layers: Vec<DecoderLayer>,
    norm: FinalNorm,
    lm_head: Option<LmHead>,
    /// Added to the positions of tokens decoded after a prefill (0 normally;
    /// a stale rope offset when emulating one, e.g. transformers' cached
    /// `rope_deltas` from an earlier multimodal call added at decode).
    decode_shift: usize,
}

/// What one [`TextModel::forward`] call returns.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// `hidden_states` entries (N+1 of `[T, H]`, the last final-normed) when requested.
    pub hidden_states: Option<Vec<Tensor>>,
    /// `[T, V]` logits (when the model has a head).
    pub logits: Option<Tensor>,
    /// Raw output of the last decoder layer `[T, H]` (pre final norm) when
    /// hidden states were requested.
    pub last_layer_output: Option<Tensor>,
}

impl TextModel {
    /// Loads every layer. `head`: where `lm_head.weight` comes from (the
    /// path's own source, another path's when this class has none, or
    /// `None` for no logits).
    pub fn load(
        spec: &TextModelSpec,
        src: &dyn WeightSource,
        head: Option<&dyn WeightSource>,
        prec: Precision,
    ) -> Result<Self> {
        Ok(Self {
            spec: spec.clone(),
            embed: Embedding::load(src, prec)?,
            layers: (0..spec.num_layers())
                .map(|i| DecoderLayer::load(spec, src, i, prec))
                .collect::<Result<_>>()?,
            norm: FinalNorm::load(spec, src, prec)?,
            lm_head: head.map(|h| LmHead::load(h, prec)).transpose()?,
            decode_shift: 0,
        })
    }

    /// Shifts the positions of every token decoded after the prefill by `k`
    /// (a stale rope offset). A uniform shift of all positions would change
    /// nothing: rope attention depends on relative positions only.
    pub fn with_decode_shift(mut self, k: usize) -> Self {
        self.decode_shift = k;
        self
    }

    /// The positions [`Self::forward`] gives `t` tokens after `past` cached
    /// ones; a full forward over `prompt_len` prompt tokens followed by decoded
    /// ones uses [`Self::positions_with_prompt`].
    fn positions(&self, past: usize, t: usize) -> Vec<usize> {
        let shift = if past > 0 { self.decode_shift } else { 0 };
        (past..past + t).map(|p| p + shift).collect()
    }

    /// Positions of a whole sequence whose first `prompt_len` tokens were the
    /// prefill: the rest carry the decode shift, as they had when generated.
    pub fn positions_with_prompt(&self, prompt_len: usize, t: usize) -> Vec<usize> {
        (0..t)
            .map(|p| {
                if p >= prompt_len {
                    p + self.decode_shift
                } else {
                    p
                }
            })
            .collect()
    }

    /// Replaces the LM head (e.g. with a randomly initialised one).
    pub fn with_lm_head(mut self, head: Option<LmHead>) -> Self {
        self.lm_head = head;
        self
    }

    /// The token embedding (shared with a drafter).
    pub fn embedding(&self) -> &Embedding {
        &self.embed
    }

    /// The LM head, if loaded.
    pub fn lm_head(&self) -> Option<&LmHead> {
        self.lm_head.as_ref()
    }

    /// Empty decode state.
    pub fn new_state(&self) -> DecodeState {
        DecodeState {
            layers: self
                .layers
                .iter()
                .map(|l| l.new_state(&self.spec))
                .collect(),
            len: 0,
        }
    }

    /// Runs `ids` at positions `state.len ..` (or `0..` without a state),
    /// continuing and updating `state`. Linear-attention layers use the
    /// recurrent form for a single token with a state (as transformers'
    /// decode does) and `form` otherwise.
    ///
    /// Errors: an out-of-range id, a tensor failure.
    pub fn forward(
        &self,
        ids: &[u32],
        state: Option<&mut DecodeState>,
        form: GdnForm,
        want_hidden: bool,
    ) -> Result<StepOutput> {
        let past = state.as_ref().map(|s| s.len).unwrap_or(0);
        let positions = self.positions(past, ids.len());
        self.forward_at(ids, &positions, state, form, want_hidden)
    }

    /// As [`Self::forward`] with explicit absolute positions (one per token).
    pub fn forward_at(
        &self,
        ids: &[u32],
        positions: &[usize],
        mut state: Option<&mut DecodeState>,
        form: GdnForm,
        want_hidden: bool,
    ) -> Result<StepOutput> {
        let (cos, sin) = self.spec.rotary.cos_sin(positions, &self.spec.device)?;
        let pos = Positions { cos, sin };
        let form = if state.is_some() && ids.len() == 1 {
            GdnForm::Recurrent
        } else {
            form
        };
        let mut h = self.embed.forward(ids)?;
        let mut hs = want_hidden.then(|| vec![h.clone()]);
        for (i, layer) in self.layers.iter().enumerate() {
            let st = state.as_mut().map(|s| &mut s.layers[i]);
            h = layer.forward(&h, &self.spec, &pos, form, st)?;
            if let Some(v) = hs.as_mut() {
                v.push(h.clone());
            }
        }
        let normed = self.norm.forward(&h)?;
        let mut last_layer_output = None;
        if let Some(v) = hs.as_mut() {
            last_layer_output = v.pop();
            v.push(normed.clone());
        }
        if let Some(s) = state {
            s.len += ids.len();
        }
        Ok(StepOutput {
            hidden_states: hs,
            logits: self
                .lm_head
                .as_ref()
                .map(|l| l.forward(&normed))
                .transpose()?,
            last_layer_output,
        })
    }

    /// Greedy continuation: prefill `prompt`, then `n` single-token steps
    /// with the cache. Returns the `n` new tokens. Errors: no LM head.
    pub fn greedy(&self, prompt: &[u32], n: usize, form: GdnForm) -> Result<Vec<u32>> {
        if self.lm_head.is_none() {
            return Err(Error::Input("greedy generation needs an lm_head".into()));
        }
        let mut state = self.new_state();
        let mut out = Vec::with_capacity(n);
        let mut logits = self
            .forward(prompt, Some(&mut state), form, false)?
            .logits
            .expect("lm_head checked");
        while out.len() < n {
            let last = logits.dim(0)? - 1;
            let next = logits.get(last)?.argmax(0)?.to_scalar::<u32>()?;
            out.push(next);
            if out.len() == n {
                break;
            }
            logits = self
                .forward(&[next], Some(&mut state), form, false)?
                .logits
                .expect("lm_head checked");
        }
        Ok(out)
    }
}
