//! Which convention a failing compared state follows: where `diff` finds a
//! state that fails at its own index, it tries the known alternatives and
//! says which one holds — today the pre- vs post-final-norm last state
//! (transformers' `hidden_states[N]` is final-normed; a forward hook on the
//! last decoder layer, and vLLM's aux hidden state N — vLLM
//! `models/qwen3_next.py`, `_maybe_add_hidden_state` after each layer — hold
//! the pre-norm output, which a transformers dump keeps as
//! `last_layer_output`). The layer-index conventions (DFlash/SpecForge tap L
//! = `hidden_states[L+1]`, vLLM aux id k = `hidden_states[k]`) are `--align`'s.

use serde::Serialize;

use super::metrics::{Accumulator, Metrics};
use super::pairs::PairReport;
use super::verdict::Verdict;
use crate::dump::Dump;
use crate::error::{Error, Result};

/// A compared state that matches another convention's state.
#[derive(Debug, Clone, Serialize)]
pub struct ConventionFinding {
    /// The failing `hidden_states` index.
    pub index: usize,
    /// The dump whose state follows the other convention (`a` or `b`).
    pub side: String,
    /// `pre_norm_last`: the state is the last decoder layer's output before the final norm.
    pub convention: String,
    /// The comparison under that convention.
    pub metrics: Metrics,
    /// What holds, in one sentence.
    pub sentence: String,
    /// The option that compares the dumps aligned.
    pub fix: String,
}

/// `hidden_states[N]` of every prompt of `d`, with `last_layer_output` of `other`.
fn pairs<'a>(
    d: &'a Dump,
    other: &'a Dump,
    n: usize,
) -> Option<Vec<(&'a candle_core::Tensor, &'a candle_core::Tensor)>> {
    d.prompts
        .iter()
        .zip(&other.prompts)
        .map(|(p, q)| Some((p.hidden_states.get(&n)?, q.last_layer_output.as_ref()?)))
        .collect()
}

/// Tries the pre-norm reading of the last state when `hidden_states[N]` fails
/// while every earlier compared index passes.
///
/// Errors: tensors of different shapes ([`Error::Input`]).
pub fn detect(a: &Dump, b: &Dump, pair: &PairReport) -> Result<Option<ConventionFinding>> {
    let Some(n) = a.num_layers().or(b.num_layers()) else {
        return Ok(None);
    };
    let failing_last = pair.first_divergent == Some(n)
        && pair
            .hidden_states
            .iter()
            .any(|r| r.index == n && r.verdict != Verdict::Pass);
    if !failing_last {
        return Ok(None);
    }
    for (side, d, other) in [("b", b, a), ("a", a, b)] {
        let Some(rows) = pairs(d, other, n) else {
            continue;
        };
        let mut acc = Accumulator::default();
        for (k, (x, y)) in rows.into_iter().enumerate() {
            acc.add(k, x, y).map_err(|e| {
                Error::Input(format!(
                    "p{k}: hidden_states[{n}] vs last_layer_output: {e}"
                ))
            })?;
        }
        let m = acc.finish();
        if pair.tolerance.judge(&m) != Verdict::Pass {
            continue;
        }
        let other_side = if side == "b" { "a" } else { "b" };
        let fix = if side == "b" {
            "`diff --b-last-pre-norm` compares b's last state with a's last_layer_output"
                .to_string()
        } else {
            "swap the dumps and pass `--b-last-pre-norm`".to_string()
        };
        return Ok(Some(ConventionFinding {
            index: n,
            side: side.into(),
            convention: "pre_norm_last".into(),
            sentence: format!(
                "{side}'s hidden_states[{n}] is the pre-norm output of the last decoder layer: it equals \
                 {other_side}'s last_layer_output (cos_min {:.8}, rel L2 {:.2e}), not the final-normed \
                 hidden_states[{n}] — a capture from a decoder-layer hook or vLLM's aux hidden state {n}; a \
                 drafter trained on one and fed the other reads a different tensor",
                m.cos_min, m.rel_l2
            ),
            fix,
            metrics: m,
        }));
    }
    Ok(None)
}

/// `b` with each prompt's `hidden_states[N]` moved to `last_layer_output`
/// (what `--b-last-pre-norm` compares against `a`'s `last_layer_output`).
///
/// Errors ([`Error::Input`]): neither dump says N; `a` holds no
/// `last_layer_output` (nothing would compare b's last state, and the run
/// would pass without looking at it); `b` holds no `hidden_states[N]`.
pub fn last_as_pre_norm(a: &Dump, b: &Dump, (a_name, b_name): (&str, &str)) -> Result<Dump> {
    let n = b.num_layers().or(a.num_layers()).ok_or_else(|| {
        Error::Input(
            "--b-last-pre-norm: neither dump says its number of layers (num_layers metadata), so \
             hidden_states[N] is unknown"
                .to_string(),
        )
    })?;
    if let Some(k) = a.prompts.iter().position(|p| p.last_layer_output.is_none()) {
        return Err(Error::Input(format!(
            "--b-last-pre-norm: {a_name} p{k} holds no last_layer_output to compare b's last state with \
             (dump the reference with hsparity dump or tools/dump_hidden_states.py, which record it)"
        )));
    }
    let mut d = b.clone();
    for (k, p) in d.prompts.iter_mut().enumerate() {
        let t = p.hidden_states.remove(&n).ok_or_else(|| {
            Error::Input(format!(
                "--b-last-pre-norm: {b_name} p{k} holds no hidden_states[{n}] to read as the last layer's \
                 pre-norm output"
            ))
        })?;
        p.last_layer_output = Some(t);
    }
    Ok(d)
}
