//! Parity between two saved captures (dumps), aligned by
//! `p{k}.hidden_states.{i}` — the same metrics and verdicts as a live
//! `compare` (Polygraphy's "compare saved outputs without re-running").

use candle_core::Tensor;
use serde::Serialize;

use super::metrics::Accumulator;
use super::pairs::PairReport;
use super::verdict::{Tolerance, Verdict};
use crate::capture::HiddenKind;
use crate::dump::Dump;
use crate::error::{Error, Result};
use crate::precision::Precision;

/// How each row's difference relates to the dumps' dtypes.
#[derive(Debug, Clone, Serialize)]
pub struct DtypeNoiseRow {
    /// `hidden_states` index of dump `a`.
    pub index: usize,
    /// Max abs diff after rounding both sides to the lower precision.
    pub max_abs_after_cast: f64,
    /// Relative L2 after rounding both sides to the lower precision.
    pub rel_l2_after_cast: f64,
    /// True when the difference is within what that dtype's rounding explains
    /// (the cast comparison passes the lower dtype's tolerance).
    pub dtype_noise: bool,
}

/// The result of comparing two dumps.
#[derive(Debug, Clone, Serialize)]
pub struct DumpComparison {
    /// Per-index parity (rows use dump `a`'s indices; `b` is shifted by `tap_offset`).
    pub pair: PairReport,
    /// `b`'s index = `a`'s index + `tap_offset`.
    pub tap_offset: i64,
    /// The lower of the two dumps' dtypes when they differ.
    pub lower_dtype: Option<Precision>,
    /// Per-row dtype-noise analysis (only when the dtypes differ).
    pub dtype_noise: Vec<DtypeNoiseRow>,
}

/// Compares dump `a` (reference) with dump `b`.
///
/// Errors ([`Error::Input`]): the dumps do not hold the same prompts (the
/// input-equality gate: both `input_ids` are printed), or `tap_offset` leaves
/// no common hidden state.
pub fn compare_dumps(
    a: &Dump,
    b: &Dump,
    a_name: &str,
    b_name: &str,
    tap_offset: i64,
) -> Result<DumpComparison> {
    if a.prompts.len() != b.prompts.len() {
        return Err(Error::Input(format!(
            "input-equality gate: {a_name} has {} prompts, {b_name} has {}",
            a.prompts.len(),
            b.prompts.len()
        )));
    }
    for (k, (p, q)) in a.prompts.iter().zip(&b.prompts).enumerate() {
        if p.input_ids != q.input_ids {
            return Err(Error::Input(format!(
                "input-equality gate: p{k}.input_ids differ, so the hidden states are not comparable:\n  {a_name}: {:?}\n  {b_name}: {:?}",
                p.input_ids, q.input_ids
            )));
        }
    }
    let dtype_of = |d: &Dump, name: &str| -> Result<Precision> {
        match d.metadata.get("dtype") {
            None => Ok(Precision::F32),
            Some(s) => Precision::from_name(s).ok_or_else(|| {
                Error::Input(format!(
                    "{name}: __metadata__ dtype {s:?} is not f32, bf16 or f16 (or their torch names)"
                ))
            }),
        }
    };
    let da = dtype_of(a, a_name)?;
    let db = dtype_of(b, b_name)?;
    let lower = (da != db).then(|| da.lower(db));
    let mut pair = PairReport::new(a_name, da, b_name, db);
    if let Some(l) = lower {
        // Different dtypes: judge rows by the lower dtype's tolerance.
        pair.tolerance = Tolerance::for_precision(l);
    }
    let na = a.prompts[0].hidden_states.len();
    let nb = b.prompts[0].hidden_states.len();
    if na != nb && tap_offset == 0 {
        return Err(Error::Input(format!(
            "{a_name} has {na} hidden states, {b_name} has {nb}: dumps of models with different depths \
             cannot be aligned index by index (use --tap-offset to shift one against the other)"
        )));
    }
    let mut dtype_noise = Vec::new();
    let n_layers = na.saturating_sub(1);
    for i in 0..na {
        let j = i as i64 + tap_offset;
        if j < 0 || j as usize >= nb {
            continue;
        }
        let j = j as usize;
        let (mut acc, mut acc_cast) = (Accumulator::default(), Accumulator::default());
        for (k, (p, q)) in a.prompts.iter().zip(&b.prompts).enumerate() {
            let (x, y) = (&p.hidden_states[i], &q.hidden_states[j]);
            acc.add(k, x, y).map_err(|e| {
                Error::Input(format!(
                    "{a_name} p{k}.hidden_states.{i} vs {b_name} p{k}.hidden_states.{j}: {e}"
                ))
            })?;
            if let Some(l) = lower {
                acc_cast.add(k, &l.round(x)?, &l.round(y)?)?;
            }
        }
        pair.push_row(i, HiddenKind::of_index(i, n_layers), acc.finish(), None);
        if let Some(l) = lower {
            let m = acc_cast.finish();
            dtype_noise.push(DtypeNoiseRow {
                index: i,
                max_abs_after_cast: m.max_abs,
                rel_l2_after_cast: m.rel_l2,
                dtype_noise: Tolerance::for_precision(l).judge(&m) == Verdict::Pass,
            });
        }
    }
    if pair.hidden_states.is_empty() {
        return Err(Error::Input(format!(
            "--tap-offset {tap_offset} leaves no common hidden state ({a_name} has {na}, {b_name} has {nb})"
        )));
    }
    let logits: Option<(Vec<Tensor>, Vec<Tensor>)> = a
        .prompts
        .iter()
        .zip(&b.prompts)
        .map(|(p, q)| Some((p.logits.clone()?, q.logits.clone()?)))
        .collect::<Option<Vec<_>>>()
        .map(|v| v.into_iter().unzip());
    if let (Some((la, lb)), 0) = (logits, tap_offset) {
        pair.set_logits(
            super::pairs::compare_prompts(&la, &lb)?,
            super::pairs::argmax_agreement(&la, &lb)?,
        );
    }
    Ok(DumpComparison {
        pair,
        tap_offset,
        lower_dtype: lower,
        dtype_noise,
    })
}
