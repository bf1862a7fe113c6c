//! The target of a drafter evaluation, run layer-major: one sweep over the
//! decoder layers advances every sequence of a batch (each with its own
//! decode state), so each layer's weights are read and widened once per
//! sweep however many prompts (or triage variants) share them. The weights
//! come from a [`WeightSource`]: the mapped checkpoint (streamed) or a
//! [`crate::loading::resident::Resident`] copy in the stored dtype; the LM
//! head is applied in vocabulary chunks; the embedding is a row gather. The
//! whole model is never widened to f32.

use std::ops::Range;

use candle_core::Tensor;

use super::faults::Faults;
use crate::error::{Error, Result};
use crate::loading::WeightSource;
use crate::models::{
    DecoderLayer, Embedding, FinalNorm, GdnForm, LayerState, Positions, TextModelSpec,
};
use crate::precision::Precision;

mod resume;
pub use resume::{Resume, MIN_ROWS};

/// A target model as a drafter evaluation runs it: geometry, where its
/// weights and its lm_head come from, the dtype it computes in.
#[derive(Clone, Copy)]
pub struct TargetModel<'a> {
    /// Geometry.
    pub spec: &'a TextModelSpec,
    /// Text-model tensors (embedding, layers, final norm).
    pub weights: &'a dyn WeightSource,
    /// Where `lm_head.weight` comes from (this path's, or a borrowed one).
    pub head: &'a dyn WeightSource,
    /// Compute dtype.
    pub prec: Precision,
}

/// Which target a state was computed on: its weights source and spec (by
/// address) and dtype ([`TargetModel::identity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TargetId(usize, usize, Precision);

impl TargetModel<'_> {
    /// This target's [`TargetId`]: two targets with the same one compute
    /// the same states (the head aside).
    pub(crate) fn identity(&self) -> TargetId {
        let weights = self.weights as *const dyn WeightSource as *const () as usize;
        let spec = self.spec as *const TextModelSpec as usize;
        TargetId(weights, spec, self.prec)
    }
}

/// A hidden state a sweep keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// Tap L: the output of decoder layer L before any norm (`hidden_states[L+1]`
    /// for L < N−1; the raw last-layer output for L = N−1).
    Tap(usize),
    /// transformers' `hidden_states[i]` (i = N: final-normed).
    Hidden(usize),
}

impl Capture {
    /// The taps `layers` (a drafter's `target_layer_ids`), in order.
    pub fn taps(layers: &[usize]) -> Vec<Capture> {
        layers.iter().map(|&l| Capture::Tap(l)).collect()
    }
}

/// One sequence's decode state across sweeps: the per-layer caches and how
/// its positions are laid out.
#[derive(Clone)]
pub struct Sequence {
    /// Tokens of the prompt (positions past it carry `decode_shift`).
    pub prompt_len: usize,
    /// Delta-rule form of multi-token forwards (single tokens with a state
    /// take the recurrent form, as transformers' decode does).
    pub form: GdnForm,
    /// Added to the positions of tokens after the prompt (0 normally; a stale
    /// rope offset when emulating one).
    pub decode_shift: usize,
    /// Harness or engine faults emulated ([`Faults`]; none by default).
    pub faults: Faults,
    states: Vec<LayerState>,
    len: usize,
    /// Tokens held before the tentative block now in the state.
    block_start: Option<usize>,
}

impl Sequence {
    /// An empty sequence for `spec`'s layers.
    pub fn new(
        spec: &TextModelSpec,
        prompt_len: usize,
        form: GdnForm,
        decode_shift: usize,
    ) -> Self {
        Self {
            prompt_len,
            form,
            decode_shift,
            faults: Faults::default(),
            states: spec
                .layer_types
                .iter()
                .map(|&t| LayerState::fresh(spec, t))
                .collect(),
            len: 0,
            block_start: None,
        }
    }

    /// The same sequence with `faults` emulated (call before feeding it).
    pub fn with_faults(mut self, faults: Faults) -> Self {
        if faults.kv_fp8 {
            for s in self.states.iter_mut() {
                if let LayerState::Full(c) = s {
                    *c = crate::models::layers::attention::KvCache::fp8();
                }
            }
        }
        self.faults = faults;
        self
    }

    /// Tokens held in the state (the next token's position before any shift).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing has been fed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the first `n` tokens of the tentative block fed last (KV caches
    /// cropped, Gated DeltaNet states advanced by exactly those tokens).
    ///
    /// Errors ([`Error::Input`]): no tentative block, or `n` beyond it.
    pub fn commit(&mut self, n: usize) -> Result<()> {
        let start = self
            .block_start
            .take()
            .ok_or_else(|| Error::Input("commit without a tentative block".into()))?;
        if start + n > self.len {
            return Err(Error::Input(format!(
                "commit of {n} tokens, but the block holds {}",
                self.len - start
            )));
        }
        for s in self.states.iter_mut() {
            s.commit_as(start, start + n, self.faults.crop)?;
        }
        self.len = start + n;
        Ok(())
    }

    /// True when a prefill of one prompt leaves this sequence in `other`'s
    /// state, bit for bit: the same prompt length and form, fp8 keys and
    /// values, and Gated DeltaNet reset inside the prompt. A decode shift
    /// moves only positions past the prompt ([`Self::positions`]), a cache
    /// crop acts only when a verified block is committed, and a reset at or
    /// past the prompt's end only in a later sweep.
    pub(crate) fn same_prefill(&self, other: &Sequence) -> bool {
        self.prefill_key() == other.prefill_key()
    }

    /// What of this sequence's settings a prefill's state depends on
    /// ([`Self::same_prefill`]).
    fn prefill_key(&self) -> PrefillKey {
        PrefillKey::of(self.prompt_len, self.form, &self.faults)
    }

    /// Takes the decode state `twin` reached over the same prompt (its KV
    /// caches' tensors shared, its Gated DeltaNet states copied) and its
    /// length, keeping this sequence's own decode shift, cache crop and
    /// reset past the prompt: the DFlash loop's shared prefill.
    ///
    /// Errors ([`Error::Input`]): this sequence was fed, `twin` holds a
    /// tentative block, or a prefill would not give the two the same state
    /// ([`Self::same_prefill`]).
    pub(crate) fn adopt_state(&mut self, twin: &Sequence) -> Result<()> {
        if self.len != 0 || twin.block_start.is_some() || !self.same_prefill(twin) {
            return Err(Error::Input(
                "a fresh sequence can adopt only the committed prefill state of a sequence \
                 with the same prompt length, form and faults inside the prompt"
                    .into(),
            ));
        }
        self.states = twin.states.clone();
        self.len = twin.len;
        Ok(())
    }

    /// Absolute positions of `t` new tokens.
    fn positions(&self, t: usize) -> Vec<usize> {
        (self.len..self.len + t)
            .map(|p| {
                if p >= self.prompt_len {
                    p + self.decode_shift
                } else {
                    p
                }
            })
            .collect()
    }
}

/// The settings of a sequence a prefill's state depends on: prompt length,
/// form, fp8 keys and values, a Gated DeltaNet reset inside the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PrefillKey {
    prompt_len: usize,
    form: GdnForm,
    kv_fp8: bool,
    reset_inside: Option<usize>,
}

impl PrefillKey {
    fn of(prompt_len: usize, form: GdnForm, faults: &Faults) -> Self {
        Self {
            prompt_len,
            form,
            kv_fp8: faults.kv_fp8,
            reset_inside: faults.gdn_reset_at.filter(|&k| k < prompt_len),
        }
    }
}

/// One sequence's part of a sweep.
pub struct Step<'s> {
    /// The sequence (its state advanced by the sweep).
    pub seq: &'s mut Sequence,
    /// Token ids fed.
    pub ids: &'s [u32],
    /// Feed them tentatively (a verification block, committed later).
    pub tentative: bool,
    /// Rows (of `ids`) whose logits are wanted.
    pub logits: Range<usize>,
}

/// What a sweep gives one sequence.
#[derive(Clone)]
pub struct StepOut {
    /// One `[T, H]` per requested [`Capture`], in order.
    pub captures: Vec<Tensor>,
    /// `[rows, V]` logits of the requested rows (`None` when none asked).
    pub logits: Option<Tensor>,
}

impl TargetModel<'_> {
    /// Runs every step's tokens through every decoder layer (one layer's
    /// weights loaded at a time, shared by all steps), then the final norm
    /// and the LM head (vocabulary chunks, each read once for all steps).
    ///
    /// Errors: an id out of range, a capture outside the model, a tensor failure.
    pub fn sweep(&self, steps: &mut [Step], capture: &[Capture]) -> Result<Vec<StepOut>> {
        let each = vec![capture; steps.len()];
        self.sweep_each(steps, &each, &[])
    }

    /// [`Self::sweep`] keeping `capture[j]` of step j, and running the
    /// steps `shadowed` marks through each layer's noise shadow (the layer
    /// as [`crate::loading::NoiseShadow`] loads it,
    /// [`DecoderLayer::with_rounding`]), from the same read of its weights:
    /// a shadowed step gets the bits a sweep of the shadow target gives it.
    ///
    /// Errors: as [`Self::sweep`].
    pub fn sweep_each(
        &self,
        steps: &mut [Step],
        capture: &[&[Capture]],
        shadowed: &[bool],
    ) -> Result<Vec<StepOut>> {
        let mut parts = [Part {
            target: *self,
            steps,
            capture,
            shadowed,
        }];
        Ok(sweep_together(&mut parts)?.pop().unwrap_or_default())
    }

    /// The start of a sweep: every step's positions and embedded tokens
    /// (capture `Hidden(0)`), its Gated DeltaNet reset, its tentative block.
    ///
    /// Errors: an id out of range; a tensor failure.
    fn begin(&self, steps: &mut [Step], capture: &[&[Capture]]) -> Result<Pass> {
        let spec = self.spec;
        let mut pass = Pass {
            pos: Vec::with_capacity(steps.len()),
            h: Vec::with_capacity(steps.len()),
            kept: Vec::with_capacity(steps.len()),
        };
        for s in steps.iter_mut() {
            let p = s.seq.positions(s.ids.len());
            let (cos, sin) = spec.rotary.cos_sin(&p, &spec.device)?;
            pass.pos.push(Positions { cos, sin });
            let e = Embedding::gather(self.weights, self.prec, s.ids)?;
            let caps = capture[pass.kept.len()];
            let mut k = vec![None; caps.len()];
            keep(&mut k, caps, |c| c == Capture::Hidden(0), &e);
            pass.kept.push(k);
            pass.h.push(e);
            if let Some(k) = s.seq.faults.gdn_reset_at {
                let (len, t) = (s.seq.len, s.ids.len());
                if (len..len + t).contains(&k) {
                    for st in s.seq.states.iter_mut() {
                        if let LayerState::Linear(g) = st {
                            g.reset_before(k - len);
                        }
                    }
                }
            }
            if s.tentative {
                s.seq.block_start = Some(s.seq.len);
                s.seq
                    .states
                    .iter_mut()
                    .for_each(LayerState::begin_tentative);
            }
        }
        Ok(pass)
    }

    /// Every step of `pass` through decoder layer `l` (loaded once; its
    /// noise shadow made from the same load when a step is `shadowed`).
    ///
    /// Errors: a tensor failure.
    fn through(&self, part: &mut Part, pass: &mut Pass, l: usize) -> Result<()> {
        let (spec, n) = (self.spec, self.spec.num_layers());
        let steps = &mut *part.steps;
        let is_shadowed = |j: usize| part.shadowed.get(j).copied().unwrap_or(false);
        let layer = DecoderLayer::load(spec, self.weights, l, self.prec)?;
        let shadow = (0..steps.len()).any(is_shadowed).then(|| {
            layer
                .clone()
                .with_rounding(crate::precision::ProductRounding::NearMidpointsFlipped)
        });
        let mut out: Vec<Option<Tensor>> = vec![None; steps.len()];
        for (which, layer) in [(false, Some(&layer)), (true, shadow.as_ref())] {
            let Some(layer) = layer else {
                continue;
            };
            // Every sequence's step through the layer at once: the products
            // stacked where that is bitwise, the mixers' state per sequence.
            let (idx, mut seqs): (Vec<usize>, Vec<crate::models::Sequence>) = steps
                .iter_mut()
                .zip(&pass.h)
                .zip(&pass.pos)
                .enumerate()
                .filter(|(j, _)| is_shadowed(*j) == which)
                .map(|(j, ((s, h), pos))| (j, layer_step(s, h, pos, l)))
                .unzip();
            if idx.is_empty() {
                continue;
            }
            for (j, (o, _)) in idx.into_iter().zip(layer.forward_batch(&mut seqs, spec)?) {
                out[j] = Some(o);
            }
        }
        for (j, o) in out.into_iter().enumerate() {
            pass.h[j] = o.expect("every step runs through the layer");
            let is =
                |c: Capture| c == Capture::Tap(l) || (l + 1 < n && c == Capture::Hidden(l + 1));
            keep(&mut pass.kept[j], part.capture[j], is, &pass.h[j]);
        }
        Ok(())
    }

    /// The end of a sweep: the final norm (capture `Hidden(N)`), then the
    /// LM head over the rows each step asks (vocabulary chunks, each read
    /// once for all steps).
    ///
    /// Errors: the head cannot be read; a tensor failure.
    fn finish(&self, part: &mut Part, pass: Pass) -> Result<Vec<StepOut>> {
        let n = self.spec.num_layers();
        let norm = FinalNorm::load(self.spec, self.weights, self.prec)?;
        let Pass { h, mut kept, .. } = pass;
        let mut rows = Vec::new();
        for (j, s) in part.steps.iter_mut().enumerate() {
            s.seq.len += s.ids.len();
            let normed = norm.forward(&h[j])?;
            let is_final = |c| c == Capture::Hidden(n);
            keep(&mut kept[j], part.capture[j], is_final, &normed);
            let r = &s.logits;
            if r.end > r.start {
                rows.push((j, normed.narrow(0, r.start, r.end - r.start)?));
            }
        }
        let mut logits: Vec<Option<Tensor>> = vec![None; part.steps.len()];
        if !rows.is_empty() {
            let inputs: Vec<Tensor> = rows.iter().map(|(_, t)| t.clone()).collect();
            let out = crate::models::LmHead::forward_streamed(self.head, self.prec, &[&inputs])?;
            for ((j, _), l) in rows.iter().zip(out.into_iter().next().unwrap_or_default()) {
                logits[*j] = Some(l);
            }
        }
        Ok(kept
            .into_iter()
            .zip(logits)
            .map(|(k, logits)| StepOut {
                captures: k
                    .into_iter()
                    .map(|t| t.expect("every capture is filled"))
                    .collect(),
                logits,
            })
            .collect())
    }
}

/// One target's share of [`sweep_together`]: its steps, what each keeps
/// (`capture[j]` for step j), which run through the noise shadow
/// ([`TargetModel::sweep_each`]).
pub struct Part<'a, 'p, 's> {
    /// The target these steps run on.
    pub target: TargetModel<'a>,
    /// Its steps.
    pub steps: &'p mut [Step<'s>],
    /// One capture list per step.
    pub capture: &'p [&'p [Capture]],
    /// Steps run through the layers' noise shadow (missing: none).
    pub shadowed: &'p [bool],
}

/// A sweep under way: per step its positions, its hidden state, the
/// captures kept so far.
struct Pass {
    pos: Vec<Positions>,
    h: Vec<Tensor>,
    kept: Vec<Vec<Option<Tensor>>>,
}

/// Sweeps several targets together, layer-major across all of them: layer
/// l of every target runs before layer l+1 of any, so targets that read the
/// same checkpoint (in another dtype, with another head, with their own
/// numerics) read each layer's bytes from disk once per sweep — the later
/// loads of a layer find its pages in the page cache. Each part gets
/// exactly what its own [`TargetModel::sweep_each`] gives: the parts share
/// no arithmetic.
///
/// Errors: as [`TargetModel::sweep_each`], for any part.
pub fn sweep_together(parts: &mut [Part]) -> Result<Vec<Vec<StepOut>>> {
    let mut passes = Vec::with_capacity(parts.len());
    for p in parts.iter_mut() {
        check_captures(p.capture, p.steps.len(), p.target.spec.num_layers())?;
        passes.push(p.target.begin(p.steps, p.capture)?);
    }
    let layers = parts.iter().map(|p| p.target.spec.num_layers()).max();
    for l in 0..layers.unwrap_or(0) {
        // Parts reading the same bf16 bytes (in bf16, f32, f16) read layer
        // l's pairs once: the shards hold them until every part ran it.
        let _held = (parts.len() > 1).then(|| HeldPairs::new(parts));
        for (p, pass) in parts.iter_mut().zip(passes.iter_mut()) {
            if l < p.target.spec.num_layers() {
                let t = p.target;
                t.through(p, pass, l)?;
            }
        }
    }
    parts
        .iter_mut()
        .zip(passes)
        .map(|(p, pass)| {
            let t = p.target;
            t.finish(p, pass)
        })
        .collect()
}

/// The weight sources of a sweep's parts holding the bf16 pairs they hand
/// out ([`WeightSource::hold_pairs`]) until dropped.
struct HeldPairs<'a>(Vec<&'a dyn WeightSource>);

impl<'a> HeldPairs<'a> {
    fn new(parts: &[Part<'a, '_, '_>]) -> Self {
        let sources: Vec<&'a dyn WeightSource> = parts.iter().map(|p| p.target.weights).collect();
        sources.iter().for_each(|w| w.hold_pairs(true));
        Self(sources)
    }
}

impl Drop for HeldPairs<'_> {
    fn drop(&mut self) {
        self.0.iter().for_each(|w| w.hold_pairs(false));
    }
}

/// Refuses capture lists that are not one per step, or that name a layer
/// outside the target's `n`.
///
/// Errors ([`Error::Input`]): as said.
fn check_captures(capture: &[&[Capture]], steps: usize, n: usize) -> Result<()> {
    if capture.len() != steps {
        return Err(Error::Input(format!(
            "a sweep of {steps} steps was given {} capture lists",
            capture.len()
        )));
    }
    for c in capture.iter().flat_map(|c| c.iter()) {
        if matches!(*c, Capture::Tap(l) if l >= n) || matches!(*c, Capture::Hidden(i) if i > n) {
            return Err(Error::Input(format!(
                "{c:?} is outside the target's {n} decoder layers"
            )));
        }
    }
    Ok(())
}

/// Step `s`'s part of layer `l`: its input `h`, positions, form (single
/// tokens after the prompt in the recurrent form) and the layer's state.
fn layer_step<'s>(
    s: &'s mut Step,
    h: &'s Tensor,
    pos: &'s Positions,
    l: usize,
) -> crate::models::Sequence<'s> {
    crate::models::Sequence {
        h,
        pos,
        form: if s.ids.len() == 1 && s.seq.len > 0 {
            GdnForm::Recurrent
        } else {
            s.seq.form
        },
        state: Some(&mut s.seq.states[l]),
        snapshot: None,
    }
}

/// Stores `t` for every capture `is` selects.
fn keep(
    kept: &mut [Option<Tensor>],
    capture: &[Capture],
    is: impl Fn(Capture) -> bool,
    t: &Tensor,
) {
    for (slot, &c) in kept.iter_mut().zip(capture) {
        if is(c) {
            *slot = Some(t.clone());
        }
    }
}

/// Greedy token of every row of `logits` (`[T, V]`): the argmax, lowest id on ties.
///
/// Errors: a tensor failure.
pub fn argmax_rows(logits: &Tensor) -> Result<Vec<u32>> {
    Ok(logits.argmax(candle_core::D::Minus1)?.to_vec1::<u32>()?)
}
