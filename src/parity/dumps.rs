//! Parity between two saved captures (dumps), aligned by
//! `p{k}.hidden_states.{i}` — the same metrics and verdicts as a live
//! `compare` (Polygraphy's "compare saved outputs without re-running").
//!
//! Dumps may be partial (an engine's capture holds only some indices): the
//! indices both hold are compared and the others listed as skipped. A dump
//! without `input_ids` is compared when every prompt has the same number of
//! tokens on both sides, and the inputs are reported as not verified.

use std::collections::BTreeMap;

use candle_core::Tensor;
use serde::Serialize;

use super::align::{align, Alignment};
use super::conventions::ConventionFinding;
use super::localise::PromptInputs;
use super::metrics::{Accumulator, Metrics};
use super::noise::{BandRole, NoiseFloor};
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

/// The `hidden_states` indices one dump holds and the other does not (not compared).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Skipped {
    /// Indices of dump `a` without a counterpart in `b` (after the tap offset).
    pub a: Vec<usize>,
    /// Indices of dump `b` without a counterpart in `a`.
    pub b: Vec<usize>,
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
    /// Indices held by one dump only.
    pub skipped: Skipped,
    /// False when a dump has no `input_ids` (then equal lengths were required).
    pub inputs_verified: bool,
    /// True when a dump does not hold every index 0..=N (an engine's capture).
    pub partial: bool,
    /// `--align`: for every index of `b`, the index of `a` it matches best.
    pub alignment: Option<Alignment>,
    /// What the reader should know (skipped indices, unverified inputs), one line each.
    pub notes: Vec<String>,
    /// A failing state that another convention explains (pre-norm last state).
    pub convention: Option<ConventionFinding>,
    /// NaN and ±Inf values each dump holds at the first divergent index
    /// (`[a, b]`), when either holds any.
    #[serde(skip)]
    pub non_finite: Option<[usize; 2]>,
}

/// What to compare: `b`'s index = `a`'s + `tap_offset`; `align` adds the best-match search.
#[derive(Debug, Clone, Copy, Default)]
pub struct DiffSettings {
    /// `b`'s index = `a`'s index + `tap_offset` (the other tap convention: ±1).
    pub tap_offset: i64,
    /// For every index of `b`, find the index of `a` it matches best (by cosine).
    pub align: bool,
    /// `b`'s `hidden_states[N]` is the last layer's pre-norm output: compare
    /// it with `a`'s `last_layer_output`.
    pub b_last_pre_norm: bool,
}

/// The input-equality gate. Returns whether the inputs were verified.
///
/// Errors ([`Error::Input`]): different prompt counts; different `input_ids`
/// (both printed); without ids on one side, different lengths.
fn input_gate(a: &Dump, b: &Dump, (a_name, b_name): (&str, &str)) -> Result<bool> {
    if a.prompts.len() != b.prompts.len() {
        return Err(Error::Input(format!(
            "input-equality gate: {a_name} has {} prompts, {b_name} has {}",
            a.prompts.len(),
            b.prompts.len()
        )));
    }
    for (k, (p, q)) in a.prompts.iter().zip(&b.prompts).enumerate() {
        match (&p.input_ids, &q.input_ids) {
            (Some(x), Some(y)) if x != y => {
                let at = x.iter().zip(y).take_while(|(u, v)| u == v).count();
                let tok = |v: &[i64]| v.get(at).map_or("end of prompt".to_string(), |t| format!("token {t}"));
                return Err(Error::Input(format!(
                    "input-equality gate: prompt p{k}'s input_ids differ first at position {at} ({a_name}: {}, \
                     {b_name}: {}; {} vs {} tokens), so the hidden states are not comparable",
                    tok(x),
                    tok(y),
                    x.len(),
                    y.len()
                )))
            }
            (Some(_), Some(_)) => {}
            _ if p.rows() != q.rows() => {
                return Err(Error::Input(format!(
                    "input-equality gate: {} has no input_ids, so the inputs cannot be verified and the dumps must \
                     hold as many tokens per prompt: p{k} has {} rows in {a_name}, {} in {b_name}",
                    if p.input_ids.is_none() { a_name } else { b_name },
                    p.rows(),
                    q.rows()
                )))
            }
            _ => {}
        }
    }
    Ok(a.has_input_ids() && b.has_input_ids())
}

/// What the dumps record of each prompt's inputs, for [`PairReport::localise`]:
/// the ids, where the prompt ends (the first cached-decode position), the masks.
pub fn inputs_of(a: &Dump, b: &Dump) -> Vec<PromptInputs> {
    a.prompts
        .iter()
        .zip(&b.prompts)
        .map(|(p, q)| PromptInputs {
            ids: p.input_ids.clone().or_else(|| q.input_ids.clone()),
            prompt_end: q
                .prompt_length
                .or(p.prompt_length)
                .filter(|&n| n < p.rows()),
            masks: [p.attention_mask.clone(), q.attention_mask.clone()],
        })
        .collect()
}

/// How the dumps' recorded inputs besides the ids differ (attention masks,
/// position ids), one line per finding: the gate lets them through, since
/// a harness feeding other masks or positions is what `diff` must expose.
fn input_differences(a: &Dump, b: &Dump, (a_name, b_name): (&str, &str)) -> Vec<String> {
    let mut notes = Vec::new();
    let runs = |v: &[usize]| super::localise::prompt_runs(v);
    type Field = fn(&crate::dump::DumpPrompt) -> Option<&Vec<i64>>;
    let fields: [(&str, Field); 2] = [
        ("attention_mask", |p| p.attention_mask.as_ref()),
        ("position_ids", |p| p.position_ids.as_ref()),
    ];
    for (field, get) in fields {
        let (mut one_side, mut differ) = (Vec::new(), Vec::new());
        let mut first = None;
        for (k, (p, q)) in a.prompts.iter().zip(&b.prompts).enumerate() {
            match (get(p), get(q)) {
                (Some(x), Some(y)) if x != y => {
                    let at = x.iter().zip(y).take_while(|(u, v)| u == v).count();
                    first.get_or_insert((k, at, x.get(at).copied(), y.get(at).copied()));
                    differ.push(k);
                }
                (Some(x), None) | (None, Some(x)) if field == "position_ids" || x.contains(&0) => {
                    one_side.push(k)
                }
                _ => {}
            }
        }
        if let Some((k, at, x, y)) = first {
            notes.push(format!(
                "inputs differ: {field} of {} differ (p{k} first at position {at}: {a_name} {}, {b_name} {})",
                runs(&differ),
                x.map_or("-".into(), |v| v.to_string()),
                y.map_or("-".into(), |v| v.to_string())
            ));
        }
        if !one_side.is_empty() {
            let (has, lacks) = if get(&a.prompts[one_side[0]]).is_some() {
                (a_name, b_name)
            } else {
                (b_name, a_name)
            };
            let what = if field == "attention_mask" {
                "masking some positions"
            } else {
                "recorded"
            };
            notes.push(format!(
                "inputs differ: {has} has {field} ({what}) for {}, {lacks} has none",
                runs(&one_side)
            ));
        }
    }
    notes
}

/// Per index, one `[T_k, H]` tensor per prompt (the shape [`align`] takes).
pub fn rows_by_index(d: &Dump) -> BTreeMap<usize, Vec<Tensor>> {
    d.indices()
        .into_iter()
        .map(|i| {
            let rows = d.prompts.iter().map(|p| p.hidden_states[&i].clone());
            (i, rows.collect())
        })
        .collect()
}

/// Compares `x` and `y` of every prompt (and after rounding both to `lower`).
fn metrics<'a>(
    pairs: impl Iterator<Item = (&'a Tensor, &'a Tensor)>,
    lower: Option<Precision>,
    what: &dyn Fn(usize) -> String,
) -> Result<(Metrics, Option<Metrics>)> {
    let (mut acc, mut acc_cast) = (Accumulator::default(), Accumulator::default());
    for (k, (x, y)) in pairs.enumerate() {
        acc.add(k, x, y)
            .map_err(|e| Error::Input(format!("{}: {e}", what(k))))?;
        if let Some(l) = lower {
            acc_cast.add(k, &l.round(x)?, &l.round(y)?)?;
        }
    }
    Ok((acc.finish(), lower.map(|_| acc_cast.finish())))
}

/// The rows of every index both dumps hold, the dtype-noise rows, and the skipped indices.
fn compare_rows(
    (a, b): (&Dump, &Dump),
    (a_name, b_name): (&str, &str),
    tap_offset: i64,
    lower: Option<Precision>,
    pair: &mut PairReport,
) -> Result<(Vec<DtypeNoiseRow>, Skipped)> {
    let n_layers = a.num_layers().or(b.num_layers()).unwrap_or(usize::MAX);
    let (ia, ib) = (a.indices(), b.indices());
    let mut noise = Vec::new();
    let mut skipped = Skipped::default();
    for &i in &ia {
        let j = i as i64 + tap_offset;
        if j < 0 || !ib.contains(&(j as usize)) {
            skipped.a.push(i);
            continue;
        }
        let j = j as usize;
        let what = |k: usize| {
            format!("{a_name} p{k}.hidden_states.{i} vs {b_name} p{k}.hidden_states.{j}")
        };
        let xs = a.prompts.iter().map(|p| &p.hidden_states[&i]);
        let ys = b.prompts.iter().map(|q| &q.hidden_states[&j]);
        let (m, cast) = metrics(xs.zip(ys), lower, &what)?;
        pair.push_row(i, HiddenKind::of_index(i, n_layers), m, None);
        if let (Some(l), Some(m)) = (lower, cast) {
            noise.push(DtypeNoiseRow {
                index: i,
                max_abs_after_cast: m.max_abs,
                rel_l2_after_cast: m.rel_l2,
                dtype_noise: Tolerance::for_precision(l).judge(&m) == Verdict::Pass,
            });
        }
    }
    skipped.b = ib
        .into_iter()
        .filter(|&j| {
            let i = j as i64 - tap_offset;
            i < 0 || !ia.contains(&(i as usize))
        })
        .collect();
    Ok((noise, skipped))
}

/// Logits and the pre-norm `last_layer_output` (offset 0, both dumps hold
/// them). The latter is compared for full dumps too: the final RMSNorm is
/// scale-invariant, so `hidden_states[N]` can agree while the states it
/// normalises do not.
fn compare_extras(a: &Dump, b: &Dump, tap_offset: i64, pair: &mut PairReport) -> Result<bool> {
    if tap_offset != 0 {
        return Ok(false);
    }
    let logits: Option<(Vec<Tensor>, Vec<Tensor>)> = a
        .prompts
        .iter()
        .zip(&b.prompts)
        .map(|(p, q)| Some((p.logits.clone()?, q.logits.clone()?)))
        .collect::<Option<Vec<_>>>()
        .map(|v| v.into_iter().unzip());
    if let Some((la, lb)) = logits {
        if let Some((k, (x, y))) = la
            .iter()
            .zip(&lb)
            .enumerate()
            .find(|(_, (x, y))| x.dims() != y.dims())
        {
            let width = |t: &Tensor| t.dims().last().copied().unwrap_or(0);
            return Err(Error::Input(format!(
                "p{k}.logits are {:?} in one dump and {:?} in the other: {}",
                x.dims(),
                y.dims(),
                if width(x) != width(y) {
                    format!(
                        "vocabularies of {} and {} entries (dumps of different models, or a padded lm_head); dump without logits (--no-logits) to compare the hidden states",
                        width(x),
                        width(y)
                    )
                } else {
                    "different token counts".to_string()
                }
            )));
        }
        pair.set_logits(
            super::pairs::compare_prompts(&la, &lb)?,
            super::pairs::argmax_agreement(&la, &lb)?,
        );
    }
    let last: Option<Vec<(&Tensor, &Tensor)>> = a
        .prompts
        .iter()
        .zip(&b.prompts)
        .map(|(p, q)| Some((p.last_layer_output.as_ref()?, q.last_layer_output.as_ref()?)))
        .collect();
    match last {
        Some(pairs) => {
            let what = |k: usize| format!("p{k}.last_layer_output");
            pair.last_layer_output = Some(metrics(pairs.into_iter(), None, &what)?.0);
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// The noise floor either dump measured (`__metadata__` `noise_floor`,
/// written by `hsparity dump` in half precision), by `a`'s indices (`b`'s
/// shifted by `tap_offset`; the last layer's only at offset 0); the wider
/// per index when both did; and a note saying whose it is.
///
/// Errors ([`Error::Input`]): a `noise_floor` value that is not one, or
/// one in a dump hsparity did not write.
fn floor_of(
    (a, b): (&Dump, &Dump),
    (a_name, b_name): (&str, &str),
    tap_offset: i64,
) -> Result<(Option<NoiseFloor>, Option<String>)> {
    let read = |d: &Dump, name: &str| -> Result<Option<NoiseFloor>> {
        let Some(s) = d.metadata.get("noise_floor") else {
            return Ok(None);
        };
        let tool = d
            .metadata
            .get("tool_version")
            .map(String::as_str)
            .unwrap_or("");
        if !tool.starts_with("hsparity ") {
            return Err(Error::Input(format!(
                "{name}: __metadata__ noise_floor in a dump written by {tool:?}, not by hsparity (only `hsparity dump` measures one)"
            )));
        }
        let f = NoiseFloor::from_metadata(s, name, d.dtype(name)?, d.num_layers())?;
        super::routers::check_floor(&f, d, name)?;
        Ok(Some(f))
    };
    let fa = read(a, a_name)?;
    let fb = read(b, b_name)?.map(|mut f| {
        f.rows = f
            .rows
            .into_iter()
            .filter_map(|mut r| {
                r.index = usize::try_from(r.index as i64 - tap_offset).ok()?;
                Some(r)
            })
            .collect();
        if tap_offset != 0 {
            f.last_layer_output = None;
        }
        f
    });
    let whose = match (&fa, &fb) {
        (Some(_), Some(_)) => Some(format!("the wider of {a_name}'s and {b_name}'s")),
        (Some(_), None) => Some(format!("{a_name}'s")),
        (None, Some(_)) => Some(format!("{b_name}'s")),
        (None, None) => None,
    };
    let note = whose
        .map(|w| format!("noise floor: {w} run against its noise shadow (docs/noise-floor.md)"));
    Ok((NoiseFloor::wider(fa.as_ref(), fb.as_ref()), note))
}

/// Compares dump `a` (reference) with dump `b`.
///
/// Errors ([`Error::Input`]): the input-equality gate (different prompts, or
/// different lengths where one side has no ids), dumps of models of different
/// depths at offset 0 (without `align`), or nothing to compare.
pub fn compare_dumps(
    a: &Dump,
    b: &Dump,
    a_name: &str,
    b_name: &str,
    settings: DiffSettings,
) -> Result<DumpComparison> {
    let tap_offset = settings.tap_offset;
    if settings.align && tap_offset != 0 {
        return Err(Error::Input(format!(
            "--align finds the offset between the dumps and --tap-offset {tap_offset} applies one: pass one of them"
        )));
    }
    let inputs_verified = input_gate(a, b, (a_name, b_name))?;
    let moved;
    let b = if settings.b_last_pre_norm {
        moved = super::conventions::last_as_pre_norm(a, b, (a_name, b_name))?;
        &moved
    } else {
        b
    };
    let (da, db) = (a.dtype(a_name)?, b.dtype(b_name)?);
    let lower = (da != db).then(|| da.lower(db));
    let mut pair = PairReport::new(a_name, da, b_name, db);
    if let Some(l) = lower {
        // Different dtypes: judge rows by the lower dtype's tolerance.
        pair.tolerance = Tolerance::for_precision(l);
        pair.tolerance_rule = format!("{l} tolerance (the lower of the dumps' {da} and {db})");
    }
    let (floor, floor_note) = floor_of((a, b), (a_name, b_name), tap_offset)?;
    pair.set_noise_floor(floor, BandRole::Widens);
    if let (Some(na), Some(nb), 0, false) =
        (a.num_layers(), b.num_layers(), tap_offset, settings.align)
    {
        if na != nb {
            return Err(Error::Input(format!(
                "{a_name} holds a {na}-layer model's states, {b_name} a {nb}-layer one's: dumps of models with \
                 different depths cannot be aligned index by index (use --tap-offset to shift one against the \
                 other, or --align)"
            )));
        }
    }
    let (dtype_noise, skipped) =
        compare_rows((a, b), (a_name, b_name), tap_offset, lower, &mut pair)?;
    pair.localise(&inputs_of(a, b));
    let convention = super::conventions::detect(a, b, &pair)?;
    let last = compare_extras(a, b, tap_offset, &mut pair)?;
    let router_notes = super::routers::compare((a, b), (a_name, b_name), tap_offset, &mut pair)?;
    if pair.hidden_states.is_empty() && !last && !settings.align {
        return Err(Error::Input(if tap_offset != 0 {
            format!(
                "--tap-offset {tap_offset} leaves no common hidden state ({a_name} has {}, {b_name} has {})",
                a.indices().len(),
                b.indices().len()
            )
        } else {
            format!(
                "{a_name} and {b_name} hold no common hidden state ({a_name}: {:?}, {b_name}: {:?}); --align finds \
                 which of a's indices b's match",
                a.indices(),
                b.indices()
            )
        }));
    }
    let alignment = settings
        .align
        .then(|| align(&rows_by_index(a), &rows_by_index(b)))
        .transpose()?;
    let partial = !(a.is_full() && b.is_full());
    let shown = if partial {
        skipped.clone()
    } else {
        Skipped::default()
    };
    let non_finite = non_finite_at(a, b, pair.first_divergent, tap_offset)?;
    let mut notes = input_differences(a, b, (a_name, b_name));
    notes.extend(floor_note);
    notes.extend(pair.wide_band_note());
    notes.extend(beyond_floor_note(&pair));
    notes.extend(router_notes);
    notes.extend(notes_of(&pair, &shown, (a, b), (a_name, b_name), last));
    Ok(DumpComparison {
        non_finite,
        partial,
        pair,
        tap_offset,
        lower_dtype: lower,
        dtype_noise,
        skipped,
        inputs_verified,
        alignment,
        notes,
        convention,
    })
}

/// The rows that pass but lie beyond the measured noise floor, as a note
/// naming what it can be and how to tell (`None`: none).
fn beyond_floor_note(pair: &PairReport) -> Option<String> {
    let rows = pair.beyond_floor();
    if rows.is_empty() {
        return None;
    }
    let listed: Vec<String> = rows
        .iter()
        .take(4)
        .map(|(what, r)| match r {
            Some(r) => format!("{what} ({r:.1}×)"),
            None => format!("{what} (over an empty band)"),
        })
        .collect();
    let more = match rows.len() {
        n if n > 4 => format!(" and {} more", n - 4),
        _ => String::new(),
    };
    Some(format!(
        "{}{more} pass the {} tolerance but lie beyond the measured noise floor: more than reordered products \
         explain — one side's implementation rounds elsewhere (an engine's fused norm, activation or attention \
         kernels) or one side computes something slightly different (a weight, an eps); to tell, run both in f32 \
         (hsparity dump --dtype f32; the engine in float32): reordering noise shrinks to round-off there, a real \
         difference stays",
        listed.join(", "),
        pair.dtype_a
    ))
}

/// The lines a reader needs about what was (not) compared.
fn notes_of(
    pair: &PairReport,
    skipped: &Skipped,
    (a, b): (&Dump, &Dump),
    (a_name, b_name): (&str, &str),
    last: bool,
) -> Vec<String> {
    let list = |v: &[usize]| {
        v.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut notes = Vec::new();
    for (d, name) in [(a, a_name), (b, b_name)] {
        if !d.has_input_ids() {
            notes.push(format!(
                "warning: {name} has no input_ids: the inputs could not be verified (compared because every \
                 prompt has as many tokens on both sides)"
            ));
        }
    }
    if skipped.a.len() + skipped.b.len() > 0 {
        let compared: Vec<usize> = pair.hidden_states.iter().map(|r| r.index).collect();
        let mut s = format!(
            "compared hidden_states [{}] (the indices both dumps hold); skipped",
            list(&compared)
        );
        for (v, name) in [(&skipped.a, a_name), (&skipped.b, b_name)] {
            if !v.is_empty() {
                s.push_str(&format!(" {name}'s [{}]", list(v)));
            }
        }
        notes.push(s);
    }
    if last {
        notes.push(
            "last_layer_output (the pre-norm output of the last layer, where an engine's last-layer tap \
             lands) compared too"
                .into(),
        );
    }
    notes
}

/// NaN and ±Inf values of `a` and `b` at `index` (b's at `index +
/// tap_offset`), when either holds any.
///
/// Errors: a tensor failure.
fn non_finite_at(
    a: &Dump,
    b: &Dump,
    index: Option<usize>,
    tap_offset: i64,
) -> Result<Option<[usize; 2]>> {
    let Some(i) = index else {
        return Ok(None);
    };
    let x = a.non_finite(i)?.total();
    let y = match usize::try_from(i as i64 + tap_offset) {
        Ok(j) => b.non_finite(j)?.total(),
        Err(_) => 0,
    };
    Ok((x + y > 0).then_some([x, y]))
}
