//! The prefill-vs-incremental check inside the capture's own sweep: for one
//! prompt, each path's layer also runs a prefill of all but the last `steps`
//! of its first `PREFILL_CAP + steps` tokens
//! ([`split`]) (chunked form, fresh state) and then those tokens one at a time
//! (recurrent form, continuing the prefill's conv, recurrent and KV state),
//! as transformers' `generate` runs a cached decode. Teacher-forced on the
//! prompt's own tokens, every layer's step inputs are known when the layer
//! runs, so the check needs no second pass over the weights: it uses the
//! layer the capture has just loaded, and the prefill's feed-forward is
//! stacked with the capture's prompts ([`DecoderLayer::forward_batch`]).
//! The outputs are the same, bit for bit, as a separate layer-major pass
//! (`crate::parity::incremental::check`) gives.

use candle_core::Tensor;

use crate::error::Result;
use crate::models::{DecoderLayer, GdnForm, LayerState, Positions, Sequence, TextModelSpec};

/// The most prompt tokens the check's prefill takes: 4 full delta-rule
/// chunks of 64 and a partial one of 44, so the prefill hands on a state
/// built across chunk boundaries and ending mid-chunk, a KV cache of 300
/// rows and a conv state, and the steps run at positions 300–307 of the
/// prompt, compared with the capture's rows there. On longer prompts the
/// check then costs at most 308 tokens per path whatever the prompt's
/// length (the capture costs T: at 4096 tokens the check is under 8 % of
/// it), instead of a second forward of the whole prompt (with `--gdn-form
/// recurrent`, whose full forward the check computes itself, that forward
/// also stops at 308 tokens). What it cannot see: a fault that only a decode
/// past position 307 shows (a window or a cache size reached later: no
/// supported family has one), a hand-off exactly at a chunk boundary (the
/// incremental tests cover it), and drift that grows over more than five
/// chunks of prefill.
pub const PREFILL_CAP: usize = 300;

// The prefill crosses chunk boundaries and ends mid-chunk.
const _: () = assert!(
    PREFILL_CAP > crate::models::qwen3_5::gated_delta_net::CHUNK_SIZE
        && !PREFILL_CAP.is_multiple_of(crate::models::qwen3_5::gated_delta_net::CHUNK_SIZE)
);

/// Prefill tokens and steps of the check on a prompt of `len ≥ 2` tokens:
/// the steps are the last `STEPS` (at most `len − 1`) tokens of its first
/// `PREFILL_CAP + STEPS`.
pub fn split(len: usize, steps: usize) -> (usize, usize) {
    let steps = steps.min(len - 1);
    ((len - steps).min(PREFILL_CAP), steps)
}

#[cfg(test)]
mod tests {
    use super::{split, PREFILL_CAP};

    #[test]
    fn the_prefill_takes_all_but_the_steps_up_to_the_cap() {
        assert_eq!(split(2, 8), (1, 1));
        assert_eq!(split(9, 8), (1, 8));
        assert_eq!(split(PREFILL_CAP + 8, 8), (PREFILL_CAP, 8));
        assert_eq!(split(PREFILL_CAP + 9, 8), (PREFILL_CAP, 8));
        assert_eq!(split(4096, 8), (PREFILL_CAP, 8));
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

/// The check's positions: the prefill's and each step's.
pub(super) struct DecodePlan {
    pub(super) check: CachedDecode,
    /// Tokens in the prefill.
    pub(super) pre: usize,
    pos_pre: Positions,
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
            pos_pre: spec.positions(0, pre)?,
            pos_step: (pre..pre + steps)
                .map(|t| spec.positions(t, 1))
                .collect::<Result<_>>()?,
        }))
    }

    /// The check's inputs to the first layer: the prompt's embeddings `[T, H]`
    /// split into the prefill rows and the steps' rows.
    pub(super) fn split(&self, emb: &Tensor) -> Result<DecodeRows> {
        Ok(DecodeRows {
            prefill: emb.narrow(0, 0, self.pre)?,
            steps: emb.narrow(0, self.pre, self.check.steps)?,
        })
    }

    /// The prefill as one more sequence of a layer's batch, continuing `state`.
    pub(super) fn prefill_sequence<'a>(
        &'a self,
        rows: &'a DecodeRows,
        state: &'a mut LayerState,
    ) -> Sequence<'a> {
        Sequence {
            h: &rows.prefill,
            pos: &self.pos_pre,
            form: GdnForm::Chunked,
            state: Some(state),
        }
    }

    /// The single-token steps of `layer` after its prefill left `state`
    /// (`[steps, H]`, one row per step).
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

/// One path's rows of the check at one layer boundary: the prefill's
/// `[pre, H]` and the steps' `[steps, H]` (one row per step).
#[derive(Debug, Clone)]
pub(super) struct DecodeRows {
    pub(super) prefill: Tensor,
    pub(super) steps: Tensor,
}

impl DecodeRows {
    /// Both tensors, in order (to compare two paths' rows bit for bit).
    pub(super) fn tensors(&self) -> [Tensor; 2] {
        [self.prefill.clone(), self.steps.clone()]
    }
}
