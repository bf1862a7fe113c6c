//! Where a teacher-forced sweep over a prompt the DFlash loop has already
//! prefilled can start instead of at token 0: the prefill's state at a
//! Gated DeltaNet chunk boundary of its prompt, and the rows it kept before
//! it ([`Resume`]). triage feeds each lane's prompt twice, once in its loop
//! and once teacher-forced on the baseline's tokens; from a resume point the
//! second feed sweeps only the prompt's last 257 to 320 tokens and the
//! continuation, with the bits of the whole sweep.
//!
//! Why the bits agree. Where [`Sequence::resume_at`] places a point (a dense
//! model on the CPU), a row of a forward is computed from that row and the
//! rows before it alone, the same way whatever follows, as long as every
//! sweep feeds at least [`MIN_ROWS`] rows:
//! - a linear map of that many rows takes candle's blocked route outside its
//!   small-size and horizontal rules (for any output width above 1 and input
//!   width above 2, as every layer of these models has), and sums in
//!   k-blocks that depend on `k` alone (`kernels::routes`,
//!   `models::layers::rows_batchable`); sequences stacked in one sweep keep
//!   their bits the same way (`DecoderLayer::forward_batch`);
//! - attention on the CPU takes a row's visible keys and no more
//!   (`models::layers::attention::eager`, `eager_attention`);
//! - the chunked delta rule runs chunks of 64 tokens from token 0 (after a
//!   reset, from the reset), and a chunk boundary is where one call of its
//!   kernel can end and the next begin with the same state
//!   (`GatedDeltaNet::forward_snapshot`).
//!
//! So the first `at` rows of a prefill of `P` tokens are those of a forward
//! over `P + n` tokens, a prefill split at `at` leaves the state the whole
//! one passes through there, and feeding the rest from that state gives the
//! rest of the whole forward's rows; the LM head reads the same rows (the
//! logits' range moves back by `at`).
//!
//! A point holds the kept rows before it (every hidden state in triage's
//! baseline group; in bf16 for a model computing in bf16, whose states are
//! bf16 values) from the prefill until the teacher-forced sweep
//! has read them; lanes that share a prefill share the point.

use candle_core::{DType, Tensor};

use super::{Capture, PrefillKey, Sequence, StepOut, TargetId, TargetModel};
use crate::drafter::Forced;
use crate::error::{Error, Result};
use crate::models::qwen3_5::gated_delta_net::CHUNK_SIZE;
use crate::models::TextModelSpec;
use crate::precision::Precision;

/// Rows every part of a split sweep feeds at least: more than candle's
/// horizontal rule covers for any output width (`m·n <= 256`), so more than
/// its small-size rule (`m, n <= 64`) too.
pub const MIN_ROWS: usize = 257;

/// A prefill's state after its first `at` tokens and what it kept of those
/// rows: where a teacher-forced sweep of the same tokens can start.
pub struct Resume {
    /// The target that ran the prefill ([`TargetModel::identity`]).
    target: TargetId,
    /// The prefill's sequence after its first `at` tokens.
    seq: Sequence,
    /// Those tokens.
    ids: Vec<u32>,
    /// The rows `0..at` of each capture the prefill kept.
    kept: Vec<(Capture, Tensor)>,
}

impl Sequence {
    /// Where a prefill of this fresh sequence's prompt can leave a
    /// [`Resume`]: the last Gated DeltaNet chunk boundary with at least
    /// [`MIN_ROWS`] prompt tokens after it, when at least as many lie before
    /// it; on the CPU, for a dense model. The chunks run from token 0, or
    /// from a reset inside the prompt, which starts them anew. `None`
    /// otherwise: a prompt of fewer than 577 tokens (with a reset at K
    /// inside it, fewer than K + 257), a sparse MoE block (its expert
    /// products take as many rows as the router sends), another device,
    /// `HSPARITY_NO_RESUME` set (any value: every sweep from token 0, the
    /// same bits, slower).
    pub(crate) fn resume_at(&self, spec: &TextModelSpec) -> Option<usize> {
        let plain = spec.moe.is_none() && spec.device.is_cpu() && !switched_off();
        let first = self.prefill_key().reset_inside.unwrap_or(0);
        let room = self.prompt_len.checked_sub(MIN_ROWS)?.checked_sub(first)?;
        let at = first + room / CHUNK_SIZE * CHUNK_SIZE;
        (plain && at >= MIN_ROWS && self.is_empty()).then_some(at)
    }

    /// This sequence's resume point on `target`: its state (it holds exactly
    /// the first tokens of its prompt, `ids`, none of them tentative) and
    /// the rows of `kept` the sweeps that fed them kept.
    ///
    /// Errors ([`Error::Input`]): a tentative block, or a state that is not
    /// `ids`'s.
    pub(crate) fn resume_point(
        &self,
        target: &TargetModel,
        ids: &[u32],
        kept: Vec<(Capture, Tensor)>,
    ) -> Result<Resume> {
        if self.block_start.is_some() || self.len != ids.len() || ids.len() >= self.prompt_len {
            return Err(Error::Input(format!(
                "a resume point needs a committed state inside the prompt: {} tokens held, {} \
                 given, a {}-token prompt",
                self.len,
                ids.len(),
                self.prompt_len
            )));
        }
        let kept = kept
            .into_iter()
            .map(|(c, t)| Ok((c, stored(t, target.prec)?)))
            .collect::<Result<_>>()?;
        Ok(Resume {
            target: target.identity(),
            seq: self.clone(),
            ids: ids.to_vec(),
            kept,
        })
    }
}

/// A kept f32 tensor `t` as a point holds it: in bf16 when the model
/// computes in bf16 and every value is a bf16 value (half the bytes; read
/// back exactly), else as it is.
///
/// Errors: a tensor failure.
fn stored(t: Tensor, prec: Precision) -> Result<Tensor> {
    if prec != Precision::Bf16 || t.dtype() != DType::F32 {
        return Ok(t);
    }
    let half = t.to_dtype(DType::BF16)?;
    let exact = half
        .to_dtype(DType::F32)?
        .eq(&t)?
        .min_all()?
        .to_scalar::<u8>()?
        == 1;
    Ok(if exact { half } else { t })
}

/// `HSPARITY_NO_RESUME` is set (read once).
fn switched_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var_os("HSPARITY_NO_RESUME").is_some())
}

impl Resume {
    /// Tokens the state holds.
    pub fn at(&self) -> usize {
        self.ids.len()
    }

    /// True when the teacher-forced sweep `f` on `target`, keeping
    /// `capture`, can start here with the bits of the same sweep from token
    /// 0: the target that ran the prefill, the same first tokens, settings a
    /// prefill leaves in the same state (`Sequence::same_prefill`: a reset
    /// inside the prompt, at or before this point, is the same; one past the
    /// prompt acts in the rest), at least [`MIN_ROWS`] tokens left to feed,
    /// and every capture kept here.
    pub fn serves(&self, target: &TargetModel, f: &Forced, capture: &[Capture]) -> bool {
        self.target == target.identity()
            && PrefillKey::of(f.prompt_len, f.form, &f.faults) == self.seq.prefill_key()
            && f.tokens.len() >= self.at() + MIN_ROWS
            && f.tokens.starts_with(&self.ids)
            && capture
                .iter()
                .all(|c| self.kept.iter().any(|(k, _)| k == c))
    }

    /// `seq` (fresh, for `f`, which this point serves: [`Self::serves`])
    /// takes this state; feed it `f.tokens[self.at()..]`.
    ///
    /// Errors ([`Error::Input`]): `seq` was fed, or the point does not
    /// serve `f` on `target` keeping `capture`.
    pub fn start(
        &self,
        seq: &mut Sequence,
        (target, f, capture): (&TargetModel, &Forced, &[Capture]),
    ) -> Result<()> {
        if !seq.is_empty() || !self.serves(target, f, capture) {
            return Err(Error::Input(format!(
                "a teacher-forced sweep of {} tokens cannot start at this resume point ({} tokens \
                 of another prefill, target or capture list)",
                f.tokens.len(),
                self.at()
            )));
        }
        debug_assert!(self.seq.block_start.is_none(), "a committed state");
        seq.states = self.seq.states.clone();
        seq.len = self.seq.len;
        Ok(())
    }

    /// `out` of a sweep started here, keeping `capture`, with the kept rows
    /// `0..at` before each capture's rows.
    ///
    /// Errors: a capture not kept here; a tensor failure.
    pub fn prepend(&self, capture: &[Capture], mut out: StepOut) -> Result<StepOut> {
        for (c, t) in capture.iter().zip(out.captures.iter_mut()) {
            let (_, head) =
                self.kept.iter().find(|(k, _)| k == c).ok_or_else(|| {
                    Error::Input(format!("{c:?} is not kept at this resume point"))
                })?;
            *t = Tensor::cat(&[&head.to_dtype(t.dtype())?, &*t], 0)?;
        }
        Ok(out)
    }
}

impl std::fmt::Debug for Resume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resume")
            .field("at", &self.at())
            .field(
                "kept",
                &self.kept.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
            )
            .finish()
    }
}
