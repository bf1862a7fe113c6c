//! The decoder layer every family shares: pre-norm token mixer (Gated
//! DeltaNet or softmax attention), a feed-forward slot (SwiGLU MLP, or the
//! MoE family's sparse MoE block), two residuals; and its decode state.

use candle_core::Tensor;

use crate::checkpoint::config::LayerType;
use crate::error::Result;
use crate::loading::WeightSource;
use crate::models::layers::attention::{Attention, KvCache};
use crate::models::layers::mlp::Mlp;
use crate::models::layers::norm::Norm;
use crate::models::layers::{each_stacked, Rows, StateUse, MAX_STACK_ROWS};
use crate::models::moe::{Routing, SparseMoeBlock};
use crate::models::qwen3_5::gated_delta_net::{GatedDeltaNet, GdnForm, GdnState};
use crate::models::{Positions, TextModelSpec};
use crate::precision::Precision;

/// One sequence of a [`DecoderLayer::forward_batch`]: its input `[T, H]`,
/// positions, delta-rule form and decode state (`None`: a fresh prefill).
pub struct Sequence<'a> {
    /// Input hidden states `[T, H]`.
    pub h: &'a Tensor,
    /// Rotary positions of its tokens.
    pub pos: &'a Positions,
    /// Delta-rule form of a Gated DeltaNet mixer.
    pub form: GdnForm,
    /// State to continue from and update.
    pub state: Option<&'a mut LayerState>,
    /// `(at, into)`: a fresh sequence (`state` `None`) also leaves in `into`
    /// the state a prefill of its first `at` tokens hands on
    /// ([`DecoderLayer::forward_snapshot`]).
    pub snapshot: Option<(usize, &'a mut LayerState)>,
}

/// The token mixer of a layer.
#[derive(Debug, Clone)]
pub enum Mixer {
    /// Gated DeltaNet (`linear_attn`).
    Linear(GatedDeltaNet),
    /// Softmax attention (`self_attn`).
    Full(Attention),
}

/// How a verified block's rejected tail leaves the caches (what a
/// speculative loop's cache crop does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheCrop {
    /// KV caches truncated, Gated DeltaNet conv and recurrent state advanced
    /// by exactly the kept tokens ([`GdnState::commit`]).
    #[default]
    Exact,
    /// transformers 5.23.0's `DynamicCache.crop` on a Qwen3.5 cache: KV
    /// truncated, the Gated DeltaNet conv history cut back, the recurrent
    /// state left over every verified token ([`GdnState::commit_conv_only`]).
    ConvOnly,
}

/// The feed-forward slot of a layer (`mlp`).
#[derive(Debug, Clone)]
pub enum FeedForward {
    /// SwiGLU MLP (`Qwen3_5MLP`, `Qwen3MLP`).
    Dense(Mlp),
    /// Sparse MoE block (`Qwen3_5MoeSparseMoeBlock`).
    SparseMoe(SparseMoeBlock),
}

impl From<Mlp> for FeedForward {
    fn from(m: Mlp) -> Self {
        FeedForward::Dense(m)
    }
}

impl FeedForward {
    /// `[T, H]` → `[T, H]`, and the router's choice of an MoE block.
    pub fn forward(&self, x: &Tensor) -> Result<(Tensor, Option<Routing>)> {
        self.forward_rows(x, Rows::Tokens)
    }

    /// [`Self::forward`] on rows that are `rows`. A sparse MoE block takes
    /// [`Rows::Steps`] one row at a time and reports no routing for them.
    pub fn forward_rows(&self, x: &Tensor, rows: Rows) -> Result<(Tensor, Option<Routing>)> {
        match (self, rows) {
            (FeedForward::Dense(m), _) => Ok((m.forward_rows(x, rows)?, None)),
            (FeedForward::SparseMoe(b), Rows::Tokens) => {
                let o = b.forward(x)?;
                Ok((o.output, Some(o.routing)))
            }
            (FeedForward::SparseMoe(b), Rows::Steps) => {
                let ys = (0..x.dim(0)?)
                    .map(|r| Ok(b.forward(&x.narrow(0, r, 1)?)?.output))
                    .collect::<Result<Vec<_>>>()?;
                Ok((Tensor::cat(&ys, 0)?, None))
            }
        }
    }
}

/// Per-layer decode state, matching the layer's mixer.
#[derive(Debug, Clone)]
pub enum LayerState {
    /// Conv and recurrent state of a Gated DeltaNet layer.
    Linear(GdnState),
    /// Keys and values of an attention layer.
    Full(KvCache),
}

impl LayerState {
    /// Fresh (empty) state of a layer of kind `ty`.
    pub fn fresh(spec: &TextModelSpec, ty: LayerType) -> Self {
        match ty {
            LayerType::LinearAttention => LayerState::Linear(GdnState::zeros(&spec.geo)),
            LayerType::FullAttention => LayerState::Full(KvCache::default()),
        }
    }

    /// A Gated DeltaNet layer's state.
    fn linear(&mut self) -> Option<&mut GdnState> {
        match self {
            LayerState::Linear(s) => Some(s),
            LayerState::Full(_) => None,
        }
    }

    /// An attention layer's cache.
    fn kv(&mut self) -> Option<&mut KvCache> {
        match self {
            LayerState::Full(c) => Some(c),
            LayerState::Linear(_) => None,
        }
    }

    /// The next forward is a tentative block (see [`GdnState::begin_tentative`]).
    pub fn begin_tentative(&mut self) {
        if let LayerState::Linear(s) = self {
            s.begin_tentative();
        }
    }

    /// Keeps `kept` tokens in all: the first `kept − before` tokens of the
    /// tentative block fed on top of `before` committed ones.
    ///
    /// Errors: a tensor failure.
    pub fn commit(&mut self, before: usize, kept: usize) -> Result<()> {
        self.commit_as(before, kept, CacheCrop::Exact)
    }

    /// [`Self::commit`] with the cache crop `crop`.
    ///
    /// Errors: a tensor failure.
    pub fn commit_as(&mut self, before: usize, kept: usize, crop: CacheCrop) -> Result<()> {
        match (self, crop) {
            (LayerState::Linear(s), CacheCrop::Exact) => {
                s.commit(kept - before);
                Ok(())
            }
            (LayerState::Linear(s), CacheCrop::ConvOnly) => {
                s.commit_conv_only(kept - before);
                Ok(())
            }
            (LayerState::Full(c), _) => c.truncate(kept),
        }
    }
}

/// A decoder layer (`Qwen3_5DecoderLayer`, `modeling_qwen3_5.py` 867-907;
/// `Qwen3DecoderLayer` has the same structure): pre-norm mixer and SwiGLU
/// MLP, two residuals. The family's model file ([`crate::models::qwen3_5`],
/// [`crate::models::qwen3`]) builds it with its own norms and mixers.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    /// `input_layernorm`.
    pub input_layernorm: Norm,
    /// `linear_attn` or `self_attn`.
    pub mixer: Mixer,
    /// `post_attention_layernorm`.
    pub post_attention_layernorm: Norm,
    /// `mlp`.
    pub mlp: FeedForward,
    /// Compute dtype.
    pub prec: Precision,
}

impl DecoderLayer {
    /// The same layer with its products' f32 sums rounded as `rounding`
    /// says: what loading it through [`crate::loading::NoiseShadow`] gives
    /// (every product of a layer is a [`crate::models::layers::Matrix`]'s or
    /// a sparse MoE block's, which take the source's rounding), without
    /// reading its weights again.
    pub fn with_rounding(self, rounding: crate::precision::ProductRounding) -> Self {
        Self {
            mixer: match self.mixer {
                Mixer::Linear(m) => Mixer::Linear(m.with_rounding(rounding)),
                Mixer::Full(m) => Mixer::Full(m.with_rounding(rounding)),
            },
            mlp: match self.mlp {
                FeedForward::Dense(m) => FeedForward::Dense(m.with_rounding(rounding)),
                FeedForward::SparseMoe(m) => FeedForward::SparseMoe(m.with_rounding(rounding)),
            },
            ..self
        }
    }

    /// Loads `layers.{i}.*` with the model file of `spec.family`, computing
    /// in `prec`. Errors: any tensor missing or unreadable.
    pub fn load(
        spec: &TextModelSpec,
        src: &dyn WeightSource,
        i: usize,
        prec: Precision,
    ) -> Result<Self> {
        spec.model.load_layer(spec, src, i, prec)
    }

    /// Fresh (empty) decode state for this layer.
    pub fn new_state(&self, spec: &TextModelSpec) -> LayerState {
        match self.mixer {
            Mixer::Linear(_) => LayerState::Linear(GdnState::zeros(&spec.geo)),
            Mixer::Full(_) => LayerState::Full(KvCache::default()),
        }
    }

    /// `h`: `[T, H]` → `[T, H]` (the layer's output after both residuals,
    /// what `hidden_states[i+1]` records). `state`: continue from earlier
    /// tokens (decode); `None` = fresh prefill.
    pub fn forward(
        &self,
        h: &Tensor,
        spec: &TextModelSpec,
        pos: &Positions,
        form: GdnForm,
        state: Option<&mut LayerState>,
    ) -> Result<Tensor> {
        Ok(self.forward_routed(h, spec, pos, form, state)?.0)
    }

    /// [`Self::forward`], also returning the router's choice when the
    /// feed-forward slot is a sparse MoE block.
    pub fn forward_routed(
        &self,
        h: &Tensor,
        spec: &TextModelSpec,
        pos: &Positions,
        form: GdnForm,
        state: Option<&mut LayerState>,
    ) -> Result<(Tensor, Option<Routing>)> {
        let h = self.mix(h, spec, pos, form, state)?;
        self.feed_forward(&h, Rows::Tokens)
    }

    /// [`Self::forward_routed`] on independent sequences, each as if it ran
    /// alone, bit for bit: the token mixer's products over the stacked rows
    /// of the sequences ([`GatedDeltaNet::forward_each`],
    /// [`Attention::forward_each`]), its conv, delta rule or attention per
    /// sequence (with its own form, positions and decode state); a dense
    /// feed-forward once over the stacked rows ([`each_stacked`]) of every
    /// sequence long enough that its rows are computed exactly as in a call
    /// of its own ([`Mlp::rows_batchable`]). So each weight matrix is read
    /// (and packed) once for all of them instead of once per sequence.
    /// Sparse MoE blocks run per sequence (their routing is reported per
    /// sequence).
    ///
    /// Errors: a snapshot of a sequence that continues a state, or as
    /// [`Self::forward_routed`]; the sequences' states and snapshots are
    /// then unspecified.
    pub fn forward_batch(
        &self,
        seqs: &mut [Sequence<'_>],
        spec: &TextModelSpec,
    ) -> Result<Vec<(Tensor, Option<Routing>)>> {
        let mixed = self.mix_each(seqs, spec)?;
        match &self.mlp {
            FeedForward::Dense(m) => {
                let refs: Vec<&Tensor> = mixed.iter().collect();
                let ys = each_stacked(
                    &refs,
                    |t| m.rows_batchable(t),
                    |h| Ok(self.feed_forward(h, Rows::Tokens)?.0),
                )?;
                Ok(ys.into_iter().map(|y| (y, None)).collect())
            }
            FeedForward::SparseMoe(_) => mixed
                .iter()
                .map(|h| self.feed_forward(h, Rows::Tokens))
                .collect(),
        }
    }

    /// `S` single-token decode steps from `state` at once: `h` `[S, H]`
    /// holds the steps' inputs (teacher-forced: known before the layer
    /// runs), `pos[i]` step i's position. Bitwise `S` calls of
    /// [`Self::forward`] on one row each in the recurrent form, continuing
    /// `state` step after step; every dense product takes each row alone
    /// ([`Rows::Steps`]), reading its weight once for all steps where
    /// the single-row kernel ([`crate::kernels::Kernel::Gemv`]) reproduces the single-row route. A
    /// sparse MoE block runs row by row.
    ///
    /// Errors: a state of another kind than the layer's mixer, or as
    /// [`Self::forward`].
    pub fn forward_steps(
        &self,
        h: &Tensor,
        spec: &TextModelSpec,
        pos: &[Positions],
        state: &mut LayerState,
    ) -> Result<Tensor> {
        let x = self.input_layernorm.forward(h)?;
        let x = match (&self.mixer, state) {
            (Mixer::Linear(m), LayerState::Linear(s)) => m.forward_steps(&x, s)?,
            (Mixer::Full(m), LayerState::Full(c)) => m.forward_steps(&x, &spec.rotary, pos, c)?,
            _ => {
                return Err(candle_core::Error::Msg(
                    "decode steps: the layer's state is not of its mixer's kind".into(),
                )
                .into())
            }
        };
        let h = self.prec.round(&(h + x)?)?;
        Ok(self.feed_forward(&h, Rows::Steps)?.0)
    }

    /// [`Self::forward_routed`] of a fresh sequence, also leaving in `into`
    /// the state a prefill of its first `at` tokens (`1 ≤ at ≤ T`) hands on:
    /// the conv history and delta-rule state, or the KV cache (the mixers'
    /// `forward_each` with [`StateUse::Snapshot`]).
    /// The outputs are the bits of [`Self::forward_routed`]; `into` is the
    /// state of a separate prefill of those tokens, bit for bit, whenever
    /// that prefill's products sum as this forward's do (the rows of both
    /// take candle's blocked route, [`crate::models::layers::rows_batchable`];
    /// not for an expert of a sparse MoE block that the prefill gives one
    /// row). Rows past `at` do not change the state: each row of a forward
    /// depends on no later row (`layers::causal_softmax`).
    ///
    /// Errors: `at` is 0 or past `T`, or as [`Self::forward_routed`].
    pub fn forward_snapshot(
        &self,
        h: &Tensor,
        spec: &TextModelSpec,
        pos: &Positions,
        form: GdnForm,
        (at, into): (usize, &mut LayerState),
    ) -> Result<(Tensor, Option<Routing>)> {
        let seq = Sequence {
            h,
            pos,
            form,
            state: None,
            snapshot: Some((at, into)),
        };
        let h = self.mix_each(&mut [seq], spec)?.remove(0);
        self.feed_forward(&h, Rows::Tokens)
    }

    /// The first half of the layer: `h + mixer(input_layernorm(h))`, rounded.
    fn mix(
        &self,
        h: &Tensor,
        spec: &TextModelSpec,
        pos: &Positions,
        form: GdnForm,
        state: Option<&mut LayerState>,
    ) -> Result<Tensor> {
        let seq = Sequence {
            h,
            pos,
            form,
            state,
            snapshot: None,
        };
        Ok(self.mix_each(&mut [seq], spec)?.remove(0))
    }

    /// [`Self::mix`] of each of `seqs` (a snapshot's state left in its
    /// `into`), the mixer's products shared ([`Self::forward_batch`]) within
    /// runs of consecutive sequences of at most [`MAX_STACK_ROWS`] rows (a
    /// longer one alone), so that the normed inputs and projections of a
    /// long prompt set are not all held at once. A state of the other
    /// mixer's kind is not continued: that sequence starts fresh.
    fn mix_each(&self, seqs: &mut [Sequence<'_>], spec: &TextModelSpec) -> Result<Vec<Tensor>> {
        let mut out = Vec::with_capacity(seqs.len());
        let mut rest = seqs;
        while !rest.is_empty() {
            let mut rows = 0;
            let n = rest
                .iter()
                .take_while(|s| {
                    rows += s.h.dim(0).unwrap_or(0);
                    rows <= MAX_STACK_ROWS
                })
                .count()
                .max(1);
            let (run, later) = rest.split_at_mut(n);
            out.extend(self.mix_run(run, spec)?);
            rest = later;
        }
        Ok(out)
    }

    /// [`Self::mix_each`] of one run of sequences.
    fn mix_run(&self, seqs: &mut [Sequence<'_>], spec: &TextModelSpec) -> Result<Vec<Tensor>> {
        let xs = seqs
            .iter()
            .map(|s| self.input_layernorm.forward(s.h))
            .collect::<Result<Vec<_>>>()?;
        let ys = match &self.mixer {
            Mixer::Linear(m) => {
                let fresh = || LayerState::Linear(GdnState::zeros(&spec.geo));
                let runs = seqs
                    .iter_mut()
                    .zip(&xs)
                    .map(|(s, x)| Ok((x, s.form, state_use(s, fresh, LayerState::linear)?)))
                    .collect::<Result<Vec<_>>>()?;
                m.forward_each(runs)?
            }
            Mixer::Full(m) => {
                let fresh = || LayerState::Full(KvCache::default());
                let runs = seqs
                    .iter_mut()
                    .zip(&xs)
                    .map(|(s, x)| Ok((x, s.pos, state_use(s, fresh, LayerState::kv)?)))
                    .collect::<Result<Vec<_>>>()?;
                m.forward_each(&spec.rotary, runs)?
            }
        };
        seqs.iter()
            .zip(ys)
            .map(|(s, y)| self.prec.round(&(s.h + y)?))
            .collect()
    }

    /// The second half: `h + mlp(post_attention_layernorm(h))`, rounded
    /// (row by row: any stack of sequences' rows), and an MoE block's routing.
    fn feed_forward(&self, h: &Tensor, rows: Rows) -> Result<(Tensor, Option<Routing>)> {
        let (y, routing) = self
            .mlp
            .forward_rows(&self.post_attention_layernorm.forward(h)?, rows)?;
        Ok((self.prec.round(&(h + y)?)?, routing))
    }
}

/// How sequence `s` uses its layer state, as the mixer's own state `S`
/// (`of` picks it out of a [`LayerState`]): a snapshot's `into` is set to
/// `fresh()` first; a state of another kind is not continued.
///
/// Errors: a snapshot of a sequence that continues a state.
fn state_use<'s, S>(
    s: &'s mut Sequence<'_>,
    fresh: impl Fn() -> LayerState,
    of: fn(&mut LayerState) -> Option<&mut S>,
) -> Result<StateUse<'s, S>> {
    match (s.snapshot.as_mut(), s.state.as_deref_mut()) {
        (Some(_), Some(_)) => Err(candle_core::Error::Msg(
            "a snapshot of a sequence that continues a state".into(),
        )
        .into()),
        (Some((at, into)), None) => {
            **into = fresh();
            let into = of(into).expect("a fresh state of the mixer's kind");
            Ok(StateUse::Snapshot { at: *at, into })
        }
        (None, Some(state)) => Ok(of(state).map_or(StateUse::Fresh, StateUse::Continue)),
        (None, None) => Ok(StateUse::Fresh),
    }
}
