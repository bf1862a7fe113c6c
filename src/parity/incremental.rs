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
    pub path: crate::loading::LoadingPath,
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

/// Prefill the first `pre` tokens, then `s` single cached steps (single
/// tokens take the recurrent form, as transformers' decode does), `(pre, s)`
/// from [`crate::capture::decode::split`]; compare the stepped rows'
/// final-normed states with the full forward's at the same positions.
///
/// Teacher-forced on the prompt's own tokens, so it runs layer-major: each
/// layer's weights are loaded once, run on the full sequence (chunked form,
/// leaving the state after its first `pre` tokens, the prefill's:
/// [`DecoderLayer::forward_snapshot`]) and on every step, then dropped — one
/// layer resident at a time, as in [`crate::capture::run`]. The same rows as
/// the check inside the capture's sweep
/// ([`crate::capture::CaptureOptions::cached_decode`]), which runs it with
/// the chunked form; this pass serves `--gdn-form recurrent`, whose capture
/// is not the chunked forward the check compares with. `None` when no
/// prompt has two tokens.
///
/// Errors: a tensor cannot be loaded or computed.
pub fn check(
    session: &Session,
    path: &ResolvedPath,
    prec: Precision,
) -> Result<Option<IncrementalCheck>> {
    let Some(k) = prompt_of(session) else {
        return Ok(None);
    };
    let (spec, src) = (&session.spec, &path.view as &dyn WeightSource);
    let ids = &session.prompts[k].ids;
    let (pre, steps) = crate::capture::decode::split(ids.len(), STEPS);
    let mut full = Embedding::gather(src, prec, ids)?;
    let mut stepped = full.narrow(0, pre, steps)?;
    let pos_full = spec.positions(0, ids.len())?;
    let pos_step: Vec<_> = (pre..pre + steps)
        .map(|t| spec.positions(t, 1))
        .collect::<Result<_>>()?;
    for l in 0..spec.num_layers() {
        let layer = DecoderLayer::load(spec, src, l, prec)?;
        let mut state = layer.new_state(spec);
        let snapshot = (pre, &mut state);
        full = layer
            .forward_snapshot(&full, spec, &pos_full, GdnForm::Chunked, snapshot)?
            .0;
        // The steps at once, bitwise one by one (`DecoderLayer::forward_steps`).
        stepped = layer.forward_steps(&stepped, spec, &pos_step, &mut state)?;
    }
    let norm = FinalNorm::load(spec, src, prec)?;
    let (normed, full_last) = (norm.forward(&stepped)?, norm.forward(&full)?);
    judge(path.path, prec, k, pre, &normed, &full_last).map(Some)
}

/// The check's row: the stepped tokens' final-normed states `steps`
/// (`[steps, H]`, after a prefill of `pre` tokens of prompt `k`) against
/// the full forward's `full_last` (`[T, H]`), judged under `prec`'s tolerance.
fn judge(
    path: crate::loading::LoadingPath,
    prec: Precision,
    k: usize,
    pre: usize,
    steps: &Tensor,
    full_last: &Tensor,
) -> Result<IncrementalCheck> {
    let n = steps.dim(0)?;
    let mut acc = Accumulator::default();
    acc.add(k, steps, &full_last.narrow(0, pre, n)?)?;
    let mut metrics = acc.finish();
    // Where the largest difference is, as a position in the prompt.
    if let Some(at) = metrics.max_abs_at.as_mut() {
        at.token += pre;
    }
    let verdict = Tolerance::for_precision(prec).judge(&metrics);
    Ok(IncrementalCheck {
        path,
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
    (k, pre): (usize, usize),
    full_rows: &[Option<Tensor>],
    steps: &[Tensor],
) -> Result<Vec<IncrementalCheck>> {
    session
        .paths
        .iter()
        .zip(full_rows.iter().zip(steps))
        .map(|(p, (full, steps))| match full {
            Some(full) => judge(p.path, p.compute, k, pre, steps, full),
            None => Err(crate::error::Error::Tensor(candle_core::Error::Msg(
                format!(
                    "{}: the capture kept no full forward for the prefill-vs-incremental check",
                    p.path.name()
                ),
            ))),
        })
        .collect()
}

/// The check on every path of `session` in its compute dtype, run
/// once per distinct set of weights and dtype (every kernel is
/// deterministic, so paths reading the same bytes in the same dtype give the
/// same check).
///
/// Errors: as [`check`].
pub fn check_all(session: &Session) -> Result<Vec<IncrementalCheck>> {
    let mut done: Vec<((Precision, Vec<String>), IncrementalCheck)> = Vec::new();
    let mut out = Vec::new();
    for p in &session.paths {
        let prec = p.compute;
        let key = weights_key(&session.spec, &p.view, None, prec);
        let c = match done.iter().find(|(k, _)| *k == key) {
            Some((_, c)) => Some(IncrementalCheck {
                path: p.path,
                ..c.clone()
            }),
            None => check(session, p, prec)?,
        };
        if let Some(c) = c {
            done.push((key, c.clone()));
            out.push(c);
        }
    }
    Ok(out)
}

/// Whether `compare` runs the prefill-vs-incremental check, resolved once
/// from the flags, the model and the CPU ([`IncrementalPlan::resolve`]) and
/// reported: a skip says why in the report's notes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IncrementalPlan {
    /// The check runs: in the capture's sweep in the chunked form, as a
    /// second pass with `--gdn-form recurrent`.
    Run,
    /// It does not; the note saying why.
    Skip(String),
}

/// The prefill-vs-incremental check adds, per path and layer, [`STEPS`]
/// single-token steps to the capture's sweep, on the layer already loaded
/// (their prefill is the capture's own forward of the prompt). Where the steps' products can run in one pass
/// over each weight (the CPU has the single-row kernel,
/// [`crate::kernels::Capabilities::cpu_reads_weights_once`], whatever
/// `HSPARITY_NO_AVX512_GEMM` says, so that the switch changes the check's
/// speed, not whether it runs) that costs a few percent of the sweep and the
/// check runs by default on any model; elsewhere each step reads the
/// layer's weights again (from memory), and by default it runs when the f32
/// text weights take at most this many bytes. With `--gdn-form recurrent`
/// the check is a second layer-major pass over the checkpoint, and the byte
/// limit applies too.
pub const INCREMENTAL_AUTO_BYTES: u64 = 4 << 30;

impl IncrementalPlan {
    /// `--incremental` (`Some(true)`) / `--no-incremental` (`Some(false)`),
    /// else automatic: on where the check's steps read each weight once (the
    /// chunked form on a CPU with [`crate::kernels::Capabilities::cpu_reads_weights_once`]),
    /// else for text weights of at most [`INCREMENTAL_AUTO_BYTES`] in f32.
    pub fn resolve(
        flag: Option<bool>,
        f32_bytes: u64,
        form: GdnForm,
        on_cpu: bool,
        caps: &crate::kernels::Capabilities,
    ) -> Self {
        let in_sweep = form == GdnForm::Chunked;
        let steps_once = in_sweep && on_cpu && caps.cpu_reads_weights_once();
        match flag {
            Some(true) => return Self::Run,
            Some(false) => {
                return Self::Skip("prefill-vs-incremental check not run (--no-incremental)".into())
            }
            None if steps_once || f32_bytes <= INCREMENTAL_AUTO_BYTES => return Self::Run,
            None => {}
        }
        let gib = f32_bytes as f64 / (1u64 << 30) as f64;
        let why = if in_sweep && !on_cpu {
            format!("on this device its {STEPS} single-token steps read every layer's weights {STEPS} more times per path ({gib:.1} GiB in f32 each time)")
        } else if in_sweep {
            format!("without AVX-512F its {STEPS} single-token steps read every layer's weights {STEPS} more times per path ({gib:.1} GiB in f32 each time)")
        } else {
            format!("with --gdn-form recurrent it is a second pass over the checkpoint per path ({gib:.1} GiB in f32)")
        };
        Self::Skip(format!(
            "prefill-vs-incremental check skipped: {why}; pass --incremental to force it"
        ))
    }

    /// [`Self::resolve`] for `session`'s first path (its text weights' f32
    /// bytes), device and this process's CPU; a skip with its note when no
    /// prompt has the two tokens the check needs (unless skipped anyway).
    pub fn for_session(flag: Option<bool>, session: &Session, form: GdnForm) -> Self {
        if flag != Some(false) && prompt_of(session).is_none() {
            return Self::Skip(
                "prefill-vs-incremental check not run: no prompt has two tokens (it prefills \
                 all but a prompt's last tokens and steps through them)"
                    .into(),
            );
        }
        let f32_bytes = session.paths[0]
            .inventory
            .components
            .get("language_model")
            .map(|c| c.params * 4)
            .unwrap_or(0);
        Self::resolve(
            flag,
            f32_bytes,
            form,
            session.spec.device.is_cpu(),
            crate::kernels::capabilities(),
        )
    }

    /// True for [`Self::Run`].
    pub fn runs(&self) -> bool {
        *self == Self::Run
    }
}
