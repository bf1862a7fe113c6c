//! The drafter's outputs of a round's drafts ([`draft_outputs`]): the
//! drafts of one drafter through its layers together, so each of its
//! weights is read (and widened) once per batch of drafts instead of once
//! per draft.

use candle_core::Tensor;

use super::DraftTarget;
use crate::error::Result;
use crate::models::dflash::{CachedDraft, DraftContext};

/// One draft to make ([`draft_outputs`]): the drafter and target, the
/// trajectory's tokens, the anchor `start` and the block's `b` slots, the
/// trajectory's context, and the context's features of positions `a..e` as
/// `rows(a, e)`.
pub(crate) struct DraftRequest<'a> {
    pub(crate) t: &'a DraftTarget<'a>,
    pub(crate) tokens: &'a [u32],
    pub(crate) start: usize,
    pub(crate) b: usize,
    pub(crate) ctx: &'a mut DraftContext,
    pub(crate) rows: &'a dyn Fn(usize, usize) -> Result<Tensor>,
}

/// Each draft's final-normed outputs `[b-1, H]` of its draft slots
/// `[start+1 .. start+b)` ([`super::draft_logits`] before the
/// `lm_head`): the drafts of one drafter through its layers together, each
/// bitwise its own forward
/// ([`crate::models::dflash::Drafter::forward_cached_each`]). No two
/// drafts share a context (each holds its own `&mut`).
pub(crate) fn draft_outputs(drafts: Vec<DraftRequest<'_>>) -> Result<Vec<Tensor>> {
    let n = drafts.len();
    let mut out: Vec<Option<Tensor>> = vec![None; n];
    let mut left: Vec<(usize, DraftRequest)> = drafts.into_iter().enumerate().collect();
    while let Some(first) = left.first() {
        let drafter = first.1.t.drafter;
        let (these, rest): (Vec<_>, Vec<_>) = left
            .into_iter()
            .partition(|(_, d)| std::ptr::eq(d.t.drafter, drafter));
        left = rest;
        let mut noises = Vec::with_capacity(these.len());
        for (_, d) in &these {
            let mut block = vec![drafter.cfg.mask_token_id; d.b];
            block[0] = d.tokens[d.start];
            noises.push(d.t.weights.rows("embed_tokens.weight", &block, d.t.prec)?);
        }
        let mut slots = Vec::with_capacity(these.len());
        let mut cached = Vec::with_capacity(these.len());
        for ((i, d), noise) in these.into_iter().zip(&noises) {
            slots.push((i, d.b));
            cached.push(CachedDraft {
                noise,
                start: d.start,
                ctx: d.ctx,
                rows: d.rows,
            });
        }
        for ((i, b), y) in slots.into_iter().zip(drafter.forward_cached_each(cached)?) {
            out[i] = Some(y.narrow(0, 1, b - 1)?);
        }
    }
    Ok(out
        .into_iter()
        .map(|y| y.expect("every draft is made"))
        .collect())
}
