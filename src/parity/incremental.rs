//! "Prefill vs incremental": a path's cached decode (a prefill, then
//! single-token steps with the KV cache and the Gated DeltaNet conv and
//! recurrent state, as transformers' `generate` runs them) against its own
//! full forward, compared on the final-normed hidden states of the stepped
//! tokens.

use candle_core::Tensor;
use serde::Serialize;

use super::{Accumulator, Metrics, Tolerance, Verdict};
use crate::error::Result;
use crate::loading::{ResolvedPath, WeightSource};
use crate::models::{DecoderLayer, Embedding, FinalNorm, GdnForm};
use crate::precision::Precision;
use crate::session::{weights_key, Session};

/// Cached steps of the check.
pub const STEPS: usize = 8;

/// One path's check (a row of `compare --json`'s `incremental`).
#[derive(Debug, Clone, Serialize)]
pub struct IncrementalCheck {
    /// Loading path.
    pub path: String,
    /// Prompt index used.
    pub prompt: usize,
    /// Tokens in the prefill.
    pub prefill_tokens: usize,
    /// Single-token steps after it.
    pub steps: usize,
    /// Metrics of the stepped rows (decode vs full forward).
    pub metrics: Metrics,
    /// Verdict under the path dtype's tolerance.
    pub verdict: Verdict,
}

/// The prompt the check runs on: the first with at least two tokens.
pub fn prompt_of(session: &Session) -> Option<usize> {
    session.prompts.iter().position(|p| p.ids.len() >= 2)
}

/// Prefill `ids[..n-s]`, then `s` single cached steps (single tokens take
/// the recurrent form, as transformers' decode does); compare the stepped
/// rows' final-normed states with the full forward's.
///
/// Teacher-forced on the prompt's own tokens, so it runs layer-major: each
/// layer's weights are loaded once, run on the full sequence, the prefill
/// and every step, then dropped — one layer resident at a time, as in
/// [`crate::capture::run`].
///
/// `full_last`: the full forward's final-normed states `[T, H]` when the
/// capture already computed them (chunked form, same path and dtype);
/// `None` computes them here. `None` when no prompt has two tokens.
///
/// Errors: a tensor cannot be loaded or computed.
pub fn check(
    session: &Session,
    path: &ResolvedPath,
    prec: Precision,
    full_last: Option<&Tensor>,
) -> Result<Option<IncrementalCheck>> {
    let Some(k) = prompt_of(session) else {
        return Ok(None);
    };
    let (spec, src) = (&session.spec, &path.view as &dyn WeightSource);
    let ids = &session.prompts[k].ids;
    let steps = STEPS.min(ids.len() - 1);
    let pre = ids.len() - steps;
    let emb = Embedding::gather(src, prec, ids)?;
    let mut full = full_last.is_none().then(|| emb.clone());
    let mut prefill = emb.narrow(0, 0, pre)?;
    let mut stepped = emb.narrow(0, pre, steps)?;
    let pos_full = spec.positions(0, ids.len())?;
    let pos_pre = spec.positions(0, pre)?;
    let pos_step: Vec<_> = (pre..ids.len())
        .map(|t| spec.positions(t, 1))
        .collect::<Result<_>>()?;
    for l in 0..spec.num_layers() {
        let layer = DecoderLayer::load(spec, src, l, prec)?;
        if let Some(f) = full.as_mut() {
            *f = layer.forward(f, spec, &pos_full, GdnForm::Chunked, None)?;
        }
        let mut state = layer.new_state(spec);
        prefill = layer.forward(&prefill, spec, &pos_pre, GdnForm::Chunked, Some(&mut state))?;
        // The steps at once, bitwise one by one (`DecoderLayer::forward_steps`).
        stepped = layer.forward_steps(&stepped, spec, &pos_step, &mut state)?;
    }
    let norm = FinalNorm::load(spec, src, prec)?;
    let full_last = match (full_last, &full) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => norm.forward(f)?,
        (None, None) => return Ok(None), // not reached: computed above when not given
    };
    let normed = norm.forward(&stepped)?;
    judge(path.path.name(), prec, k, pre, &normed, &full_last).map(Some)
}

/// The check's row: the stepped tokens' final-normed states `steps`
/// (`[steps, H]`, after a prefill of `pre` tokens of prompt `k`) against
/// the full forward's `full_last` (`[T, H]`), judged under `prec`'s tolerance.
fn judge(
    path: &str,
    prec: Precision,
    k: usize,
    pre: usize,
    steps: &Tensor,
    full_last: &Tensor,
) -> Result<IncrementalCheck> {
    let n = steps.dim(0)?;
    let mut acc = Accumulator::default();
    for j in 0..n {
        acc.add(
            k,
            &steps.narrow(0, j, 1)?,
            &full_last.narrow(0, pre + j, 1)?,
        )?;
    }
    let metrics = acc.finish();
    let verdict = Tolerance::for_precision(prec).judge(&metrics);
    Ok(IncrementalCheck {
        path: path.into(),
        prompt: k,
        prefill_tokens: pre,
        steps: n,
        metrics,
        verdict,
    })
}

/// The check from the capture's own cached decode
/// ([`crate::capture::CaptureOptions::cached_decode`], chunked form):
/// `steps[i]` are path i's final-normed stepped states `[steps, H]` after a prefill of
/// `pre` tokens of prompt `k`, `full_rows[i]` its full forward's
/// final-normed states of that prompt. The same rows as [`check_all`].
///
/// Errors: a tensor failure; a path without its full forward's rows.
pub fn from_capture(
    session: &Session,
    precisions: &[Precision],
    (k, pre): (usize, usize),
    full_rows: &[Option<Tensor>],
    steps: &[Tensor],
) -> Result<Vec<IncrementalCheck>> {
    session
        .paths
        .iter()
        .zip(precisions)
        .zip(full_rows.iter().zip(steps))
        .map(|((p, &prec), (full, steps))| match full {
            Some(full) => judge(p.path.name(), prec, k, pre, steps, full),
            None => Err(crate::error::Error::Tensor(candle_core::Error::Msg(
                format!(
                    "{}: the capture kept no full forward for the prefill-vs-incremental check",
                    p.path.name()
                ),
            ))),
        })
        .collect()
}

/// The check on every path of `session` computing in `precisions[i]`, run
/// once per distinct set of weights and dtype (every kernel is
/// deterministic, so paths reading the same bytes in the same dtype give the
/// same check). `full_rows[i]`: path i's full-forward final-normed states
/// of the check's prompt when the capture kept them.
///
/// Errors: as [`check`].
pub fn check_all(
    session: &Session,
    precisions: &[Precision],
    full_rows: &[Option<Tensor>],
) -> Result<Vec<IncrementalCheck>> {
    let mut done: Vec<((Precision, Vec<String>), IncrementalCheck)> = Vec::new();
    let mut out = Vec::new();
    for (i, (p, &prec)) in session.paths.iter().zip(precisions).enumerate() {
        let key = weights_key(&session.spec, &p.view, None, prec);
        let c = match done.iter().find(|(k, _)| *k == key) {
            Some((_, c)) => Some(IncrementalCheck {
                path: p.path.name().into(),
                ..c.clone()
            }),
            None => check(session, p, prec, full_rows.get(i).and_then(Option::as_ref))?,
        };
        if let Some(c) = c {
            done.push((key, c.clone()));
            out.push(c);
        }
    }
    Ok(out)
}
