//! Which convention a failing compared state follows: where `diff` finds a
//! state that fails at its own index, it tries the known alternatives and
//! says which one holds: the residual stream vs its RMS-normed form (a
//! capture of each layer's input norm), and the pre- vs post-final-norm last state
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
    /// `pre_norm_last`: the state is the last decoder layer's output before
    /// the final norm; `normed_stream`: the states are the layers' input
    /// norms' outputs, not the residual stream.
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

/// Tries the known alternative readings of a failing state: the pre-norm
/// last state (`pre_norm_last`), then the RMS-normed residual stream
/// (`normed_stream`).
///
/// Errors: tensors of different shapes ([`Error::Input`]).
pub fn detect(a: &Dump, b: &Dump, pair: &PairReport) -> Result<Option<ConventionFinding>> {
    if let Some(f) = pre_norm_last(a, b, pair)? {
        return Ok(Some(f));
    }
    normed_stream(a, b, pair)
}

/// One prompt's `[T, H]` rows as f32, with H.
fn rows_of(t: &candle_core::Tensor) -> Result<(Vec<f32>, usize)> {
    let (_, h) = t.dims2()?;
    Ok((
        t.to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1()?,
        h,
    ))
}

/// `y` read as `x / rms(x) ⊙ w` with one weight `w` per feature (an RMSNorm's
/// output, `w` estimated from the rows as the median ratio): the metrics of
/// that reconstruction against `y`, or `None` when the shapes differ.
fn as_normed(xs: &[&candle_core::Tensor], ys: &[&candle_core::Tensor]) -> Result<Option<Metrics>> {
    let mut data = Vec::new();
    for (x, y) in xs.iter().zip(ys) {
        let ((x, h), (y, hy)) = (rows_of(x)?, rows_of(y)?);
        if h != hy || x.len() != y.len() || h == 0 {
            return Ok(None);
        }
        // A norm's output has unit RMS before its weight: a zero row (a
        // state never written) or a non-finite one is no normed state.
        if y.chunks(h).any(|r| r.iter().all(|v| *v == 0.0)) || y.iter().any(|v| !v.is_finite()) {
            return Ok(None);
        }
        data.push((x, y, h));
    }
    let Some(&(_, _, h)) = data.first() else {
        return Ok(None);
    };
    let rms =
        |r: &[f32]| (r.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / r.len() as f64).sqrt();
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); h];
    for (x, y, _) in &data {
        for (rx, ry) in x.chunks(h).zip(y.chunks(h)) {
            let r = rms(rx);
            for (f, (&vx, &vy)) in rx.iter().zip(ry).enumerate() {
                if r > 0.0 && (vx as f64).abs() > 1e-3 * r {
                    ratios[f].push(vy as f64 * r / vx as f64);
                }
            }
        }
    }
    let w: Vec<f64> = ratios
        .into_iter()
        .map(|mut v| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        })
        .collect();
    let mut acc = Accumulator::default();
    for (k, (x, y, _)) in data.iter().enumerate() {
        let rebuilt: Vec<f32> = x
            .chunks(h)
            .flat_map(|rx| {
                let r = rms(rx).max(f64::MIN_POSITIVE);
                rx.iter()
                    .zip(&w)
                    .map(move |(&v, &wf)| (v as f64 / r * wf) as f32)
            })
            .collect();
        acc.add_rows(k, &rebuilt, y, h);
    }
    Ok(Some(acc.finish()))
}

/// Every failing index below N at which one dump holds the RMS-normed
/// residual stream (the layer's input norm applied: a hook on
/// `input_layernorm`, SGLang's dumper name `input_layernorm.output.0`) where
/// the other holds the residual stream itself.
///
/// Errors: a tensor failure.
fn normed_stream(a: &Dump, b: &Dump, pair: &PairReport) -> Result<Option<ConventionFinding>> {
    let n = a.num_layers().or(b.num_layers()).unwrap_or(usize::MAX);
    let failing: Vec<usize> = pair
        .hidden_states
        .iter()
        .filter(|r| r.verdict != Verdict::Pass && r.index < n)
        .map(|r| r.index)
        .collect();
    let Some(&first) = failing.first() else {
        return Ok(None);
    };
    fn at(d: &Dump, i: usize) -> Option<Vec<&candle_core::Tensor>> {
        d.prompts.iter().map(|p| p.hidden_states.get(&i)).collect()
    }
    for (side, d, other) in [("b", b, a), ("a", a, b)] {
        let (Some(ys), Some(xs)) = (at(d, first), at(other, first)) else {
            continue;
        };
        let Some(m) = as_normed(&xs, &ys)? else {
            continue;
        };
        if pair.tolerance.judge(&m) != Verdict::Pass {
            continue;
        }
        let mut explained = vec![first];
        for &i in &failing[1..] {
            if let (Some(ys), Some(xs)) = (at(d, i), at(other, i)) {
                if as_normed(&xs, &ys)?.is_some_and(|m| pair.tolerance.judge(&m) == Verdict::Pass) {
                    explained.push(i);
                }
            }
        }
        let other_side = if side == "b" { "a" } else { "b" };
        let list = super::verdict::runs_text(&super::verdict::runs(&explained), "hs ");
        return Ok(Some(ConventionFinding {
            index: first,
            side: side.into(),
            convention: "normed_stream".into(),
            sentence: format!(
                "{side}'s {list} are the RMS-normed residual stream (x / rms(x) · w, one weight per feature: \
                 cos_min {:.8}, rel L2 {:.2e} at hidden_states[{first}]), not the residual stream {other_side} \
                 holds — a capture of each layer's input norm (a hook on input_layernorm, SGLang's dumper name \
                 input_layernorm.output.0) where the residual (output.1) was meant",
                m.cos_min, m.rel_l2
            ),
            fix: format!(
                "capture the residual stream instead of the norm's output ({side}'s writer: the residual sum \
                 entering each layer, SGLang's input_layernorm.output.1); a drafter trained on one and fed the \
                 other reads a different tensor"
            ),
            metrics: m,
        }));
    }
    Ok(None)
}

/// Tries the pre-norm reading of the last state when `hidden_states[N]` fails
/// while every earlier compared index passes.
///
/// Errors: tensors of different shapes ([`Error::Input`]).
fn pre_norm_last(a: &Dump, b: &Dump, pair: &PairReport) -> Result<Option<ConventionFinding>> {
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
