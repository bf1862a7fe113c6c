//! The prefill-vs-incremental check inside the capture's own sweep: for one
//! prompt, each path's layer leaves, beside its outputs, the state a prefill
//! of all but the prompt's last `steps` tokens hands on (conv history,
//! delta-rule state, KV cache: [`DecoderLayer::forward_snapshot`]), and then
//! runs those tokens one at a time (recurrent form, continuing that state),
//! as transformers' `generate` runs a cached decode after the prefill.
//! Teacher-forced on the prompt's own tokens, every layer's step inputs are
//! known when the layer runs, so the check needs no second pass over the
//! weights and no prefill of its own: it uses the layer the capture has
//! just loaded and the capture's forward of the prompt. Each row of that
//! forward depends on no later row (the causal softmax sums a row over its
//! visible keys only, `models::layers::causal_softmax`), so the state is a
//! separate prefill's, bit for bit, wherever that prefill's products take
//! the blocked route the capture's do (tested in `tests/batched_forward.rs`);
//! on a prompt too short for it, and in a sparse MoE layer where an expert
//! gets one token of the prefill (the single-row route), it is the same
//! state to round-off. The
//! outputs are the same, bit for bit, as a separate layer-major pass
//! (`crate::parity::incremental::check`) gives.
//!
//! The check costs the steps alone (eight single-token forwards per path and
//! layer, and the delta rule's last part chunk again), whatever the prompt's
//! length, and it steps where a decode after the prompt would: at its last
//! positions, with a state built over the whole prompt (across chunk
//! boundaries, ending mid-chunk when the prefill's length is not a multiple
//! of 64; a hand-off exactly at a boundary is covered by the incremental
//! tests).

use candle_core::Tensor;

use super::share::same_input;
use super::{Done, Mode, Outputs, Ran, Run};
use crate::error::Result;
use crate::models::{DecoderLayer, LayerState, Positions, TextModelSpec};

/// Prefill tokens and steps of the check on a prompt of `len ≥ 2` tokens:
/// the steps are the last `steps` (at most `len − 1`) tokens.
pub fn split(len: usize, steps: usize) -> (usize, usize) {
    let steps = steps.min(len - 1);
    (len - steps, steps)
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn the_prefill_takes_all_but_the_steps() {
        assert_eq!(split(2, 8), (1, 1));
        assert_eq!(split(9, 8), (1, 8));
        assert_eq!(split(128, 8), (120, 8));
        assert_eq!(split(4096, 8), (4088, 8));
    }
}

/// Which prompt the check runs on and how many single-token steps it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedDecode {
    /// Prompt index (at least `steps + 1` tokens).
    pub prompt: usize,
    /// Single-token steps after the prefill.
    pub steps: usize,
}

/// The check's prefill length and its steps' positions.
pub(super) struct DecodePlan {
    pub(super) check: CachedDecode,
    /// Tokens in the prefill.
    pub(super) pre: usize,
    pos_step: Vec<Positions>,
}

impl DecodePlan {
    /// The plan for `check` on a prompt of `len` tokens; `None` when it has
    /// fewer than two (nothing to step).
    pub(super) fn new(
        spec: &TextModelSpec,
        check: CachedDecode,
        len: usize,
    ) -> Result<Option<Self>> {
        if len < 2 {
            return Ok(None);
        }
        let (pre, steps) = split(len, check.steps);
        Ok(Some(Self {
            check: CachedDecode { steps, ..check },
            pre,
            pos_step: (pre..pre + steps)
                .map(|t| spec.positions(t, 1))
                .collect::<Result<_>>()?,
        }))
    }

    /// The steps' inputs to the first layer: their rows of the prompt's
    /// embeddings `[T, H]`.
    pub(super) fn steps_input(&self, emb: &Tensor) -> Result<DecodeRows> {
        Ok(DecodeRows {
            steps: emb.narrow(0, self.pre, self.check.steps)?,
        })
    }

    /// The single-token steps of `layer` continuing `state`, the state its
    /// forward of the prompt left after the prefill's tokens (`[steps, H]`,
    /// one row per step).
    pub(super) fn steps(
        &self,
        layer: &DecoderLayer,
        spec: &TextModelSpec,
        rows: &DecodeRows,
        state: &mut LayerState,
    ) -> Result<Tensor> {
        layer.forward_steps(&rows.steps, spec, &self.pos_step, state)
    }
}

/// One path's rows of the check at one layer boundary: the steps'
/// `[steps, H]` (one row per step).
#[derive(Debug, Clone)]
pub(super) struct DecodeRows {
    pub(super) steps: Tensor,
}

/// A path's own forward of a layer with the cached decode: its inputs, the
/// earlier runs it may reuse, path 0's inputs to run its local forward on in
/// the same batch (empty: none), and the check's inputs.
#[derive(Clone, Copy)]
pub(super) struct Own<'a> {
    pub(super) inputs: &'a [Tensor],
    pub(super) done: &'a [Done<'a>],
    pub(super) locals: &'a [Tensor],
    /// Its cached decode's inputs at this layer.
    pub(super) rows: &'a DecodeRows,
}

/// What [`Run::with_decode`] gives: the own outputs, the cached decode's
/// rows, and the stacked local forward's outputs (per prompt; empty: none).
pub(super) type OwnRun = (Outputs, Option<DecodeRows>, Ran);

impl Run<'_> {
    /// Path p's own forward of `layer` with the cached decode: the check's
    /// prompt leaves the state its first `plan.pre` tokens hand on
    /// ([`DecoderLayer::forward_snapshot`]), and the single-token steps
    /// continue it. `same`: the earlier paths with the same layer; the steps
    /// (`done_rows[q]`) of one whose check inputs (that prompt's rows and
    /// the steps' rows) are bitwise equal to p's are reused.
    pub(super) fn with_decode(
        &self,
        layer: &DecoderLayer,
        p: usize,
        own: Own,
        plan: &DecodePlan,
        done_rows: &[DecodeRows],
        same: &[(usize, &[Tensor], &DecodeRows)],
    ) -> Result<OwnRun> {
        let k = plan.check.prompt;
        let mine = [own.inputs[k].clone(), own.rows.steps.clone()];
        let earlier: Vec<(usize, [Tensor; 2])> = same
            .iter()
            .map(|(q, inputs, r)| (*q, [inputs[k].clone(), r.steps.clone()]))
            .collect();
        let seen = earlier.iter().map(|(q, t)| (*q, t.as_slice()));
        let locals = self.local_sequences(own.locals);
        if let Some(q) = same_input(seen, &mine)? {
            let (out, lo) = self.forward(layer, p, own.inputs, own.done, Mode::Own, locals)?;
            return Ok((out, Some(done_rows[q].clone()), lo));
        }
        let mut state = layer.new_state(self.spec);
        let mode = Mode::Snapshot {
            prompt: k,
            at: plan.pre,
            into: &mut state,
        };
        let (out, ran) = self.forward(layer, p, own.inputs, own.done, mode, locals)?;
        let steps = plan.steps(layer, self.spec, own.rows, &mut state)?;
        Ok((out, Some(DecodeRows { steps }), ran))
    }
}
