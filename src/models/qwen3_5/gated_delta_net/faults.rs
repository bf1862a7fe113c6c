//! The Gated DeltaNet state as faulty serving and eval loops leave it (triage's
//! harness and engine suspects), beside the correct handling in the parent
//! module:
//!
//! - [`GdnState::commit_conv_only`]: the crop of transformers 5.23.0's
//!   `cache_utils.py::LinearAttentionCacheLayerMixin.crop`, which a
//!   speculative loop (z-lab `dflash` 0.1.0 `dflash_generate`, through its
//!   `_crop_to`) calls after each verification: the conv history is cut back
//!   to the kept tokens, the recurrent state keeps every verified token,
//!   rejected drafts included;
//! - [`GdnState::reset_before`]: the conv history and the recurrent state
//!   dropped at a row of the next forward, as a prefix-cache or chunked-prefill
//!   path that restores the attention KV but not the linear-attention state
//!   leaves them.

use super::{chunked, recurrent, Block, DeltaRuleInputs, GdnForm, GdnState};

impl GdnState {
    /// Keeps the first `n` tokens of the tentative block the way
    /// `LinearAttentionCacheLayerMixin.crop` does: the conv history ends at
    /// token `n − 1` (the slice `conv_states[..., -remove-K:-remove]`), the
    /// recurrent state is left as the block forward computed it, over all
    /// of the block. No tentative block: nothing to do.
    pub fn commit_conv_only(&mut self, n: usize) {
        self.roll_conv_back(n);
    }

    /// Ends the tentative block keeping its first `n` tokens in the conv
    /// history (what both crops do); returns the block when `n` is short of
    /// it (the recurrent state is then the caller's to set), `None` when
    /// there is no block or all of it is kept.
    pub(super) fn roll_conv_back(&mut self, n: usize) -> Option<Box<Block>> {
        let b = self.block.take()?;
        if n >= b.inputs.t {
            return None;
        }
        let (c, hist) = (b.channels, self.conv.len() / b.channels.max(1));
        self.conv.copy_from_slice(&b.padded[n * c..(n + hist) * c]);
        Some(b)
    }

    /// The next forward drops the state before its row `row`: rows from
    /// `row` on see a zero conv history and start the delta rule from a zero
    /// state; rows before it are computed as without the reset (bitwise).
    pub fn reset_before(&mut self, row: usize) {
        self.reset_row = Some(row);
    }
}

impl DeltaRuleInputs {
    /// The tokens from `n` on.
    pub fn suffix(&self, n: usize) -> Self {
        let (nh, dk, dv) = (self.heads, self.dk, self.dv);
        Self {
            t: self.t - n,
            heads: nh,
            dk,
            dv,
            q: self.q[n * nh * dk..].to_vec(),
            k: self.k[n * nh * dk..].to_vec(),
            v: self.v[n * nh * dv..].to_vec(),
            g: self.g[n * nh..].to_vec(),
            beta: self.beta[n * nh..].to_vec(),
        }
    }
}

/// The delta rule over `inp` in `form` from `state` (left at the end); with
/// `reset = Some(r)`, rows `r..` restart from a zero state. Each kernel's
/// row `i` reads only rows `≤ i`, so rows before `r` are bitwise the same.
pub(super) fn kernel(
    inp: &DeltaRuleInputs,
    form: GdnForm,
    state: &mut [f32],
    reset: Option<usize>,
) -> Vec<f32> {
    let run = |i: &DeltaRuleInputs, s: &mut [f32]| match form {
        GdnForm::Chunked => chunked(i, s),
        GdnForm::Recurrent => recurrent(i, s),
    };
    match reset.filter(|&r| r < inp.t) {
        None => run(inp, state),
        Some(r) => {
            let mut o = if r > 0 {
                run(&inp.prefix(r), state)
            } else {
                Vec::new()
            };
            state.iter_mut().for_each(|x| *x = 0.0);
            o.extend(run(&inp.suffix(r), state));
            o
        }
    }
}

/// Zeroes the rows of the conv history (`[hist, c]`, positions `t − hist ..
/// t` of a forward of `t` rows) that lie before a reset at row `r`.
pub(super) fn clear_before_reset(conv: &mut [f32], c: usize, t: usize, r: usize) {
    let hist = conv.len() / c.max(1);
    let stale = (r + hist).saturating_sub(t).min(hist);
    conv[..stale * c].iter_mut().for_each(|x| *x = 0.0);
}
