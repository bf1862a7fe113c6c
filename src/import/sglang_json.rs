//! SGLang `/generate` (or `Engine.generate`) responses with `return_hidden_states`
//! (server flag `--enable-return-hidden-states`): `meta_info.hidden_states` is a
//! list whose first element holds the prefill rows (`[T_prompt][H]`) and each
//! further element one decode step's row (`[H]`), JSON floats of the tensor fed
//! to the LM head: the final-normed `hidden_states[N]` (N is required). A
//! response list (a batched request) gives one prompt per element.
//!
//! The response does not hold the prompt ids: they are the `input_ids` sent
//! ([`ImportOptions::prompt_ids`]). The sequence of an imported prompt is the
//! prompt plus the output tokens that were fed back (one per decode row; the
//! last sampled token is never fed).

use std::path::Path;

use candle_core::{Device, Tensor};
use serde_json::Value;

use super::{
    check_width, Format, ImportOptions, Imported, ImportedPrompt, IndexMapping, LayerMapping,
    StateIndex,
};
use crate::error::{Error, Result};

fn responses(v: &Value) -> Vec<&Value> {
    match v {
        Value::Array(a) => a.iter().collect(),
        other => vec![other],
    }
}

/// True when the JSON file is a response (or list of them) with `meta_info.hidden_states`.
///
/// Errors ([`Error::Format`]): the file is not JSON (its reason, instead of
/// "no meta_info.hidden_states"), or unreadable.
pub fn looks_like(path: &Path) -> Result<bool> {
    let text = crate::input::read_to_string(path)?;
    let v = serde_json::from_str::<Value>(&text)
        .map_err(|e| Error::Format(format!("{}: not JSON: {e}", path.display())))?;
    Ok(responses(&v)
        .first()
        .is_some_and(|r| r.pointer("/meta_info/hidden_states").is_some()))
}

fn row(v: &Value, what: &str) -> Result<Vec<f32>> {
    let a = v
        .as_array()
        .ok_or_else(|| Error::Format(format!("{what} is not a list of numbers")))?;
    a.iter()
        .map(|x| {
            let f = x
                .as_f64()
                .ok_or_else(|| Error::Format(format!("{what} holds {x}, not a number")))?;
            if f.abs() > f32::MAX as f64 {
                // tolist() of a bf16/f32 state never holds it: it would land as ±inf.
                return Err(Error::Format(format!(
                    "{what} holds {x}, beyond the range of f32 (what the engine's states are stored in)"
                )));
            }
            Ok(f as f32)
        })
        .collect()
}

/// The rows of one response's `meta_info.hidden_states`: the prefill rows, then one per decode
/// step. Returns the rows and how many are prefill.
fn rows_of(r: &Value, k: usize, path: &Path) -> Result<(Vec<Vec<f32>>, usize)> {
    let at = format!(
        "{}: response {k} key `meta_info.hidden_states`",
        path.display()
    );
    let hs = r.pointer("/meta_info/hidden_states").ok_or_else(|| {
        Error::Format(format!(
            "{}: response {k}: no `meta_info.hidden_states` key (request with \"return_hidden_states\": true \
             on a server started with --enable-return-hidden-states)",
            path.display()
        ))
    })?;
    let parts = hs
        .as_array()
        .ok_or_else(|| Error::Format(format!("{at} is not a list")))?;
    let Some(first) = parts.first() else {
        return Err(Error::Format(format!("{at} is empty")));
    };
    let mut rows: Vec<Vec<f32>> = Vec::new();
    // prefill: a list of rows (a single-token prompt may come as one row)
    match first.as_array().and_then(|a| a.first()) {
        Some(Value::Array(_)) => {
            for (i, x) in first.as_array().expect("array").iter().enumerate() {
                rows.push(row(x, &format!("{at}[0][{i}]"))?);
            }
        }
        _ => rows.push(row(first, &format!("{at}[0]"))?),
    }
    let prefill = rows.len();
    for (j, x) in parts.iter().enumerate().skip(1) {
        // a decode row is [H] (some versions wrap it as [[H]])
        let x = match x.as_array().map(|a| a.as_slice()) {
            Some([inner @ Value::Array(_)]) => inner,
            _ => x,
        };
        rows.push(row(x, &format!("{at}[{j}]"))?);
    }
    let w = rows[0].len();
    if let Some((i, r)) = rows.iter().enumerate().find(|(_, r)| r.len() != w) {
        return Err(Error::Format(format!(
            "{at}: row {i} has {} values, row 0 has {w}",
            r.len()
        )));
    }
    Ok((rows, prefill))
}

/// The token sequence of one response: the prompt ids sent, then the `decode` output
/// tokens that were fed back (checked against the prefill rows and `meta_info.prompt_tokens`).
fn fed_ids(
    r: &Value,
    (k, path): (usize, &Path),
    prompt: &[i64],
    (prefill, decode): (usize, usize),
) -> Result<Vec<i64>> {
    let at = |key: &str| format!("{}: response {k} key `{key}`", path.display());
    if prefill != prompt.len() {
        return Err(Error::Input(format!(
            "{}: {prefill} prefill rows but {} prompt ids were given for response {k}",
            path.display(),
            prompt.len()
        )));
    }
    if let Some(pt) = r
        .pointer("/meta_info/prompt_tokens")
        .and_then(Value::as_u64)
    {
        if pt as usize != prompt.len() {
            return Err(Error::Input(format!(
                "{}: meta_info.prompt_tokens is {pt}, {} prompt ids were given for response {k}",
                path.display(),
                prompt.len()
            )));
        }
    }
    let mut ids = prompt.to_vec();
    if decode > 0 {
        let out = r
            .get("output_ids")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                Error::Format(format!(
                "{}: no `output_ids` key: the {decode} decode row(s) cannot be given their tokens",
                path.display()
            ))
            })?;
        if out.len() < decode {
            return Err(Error::Format(format!(
                "{}: {decode} decode rows but {} output_ids",
                at("output_ids"),
                out.len()
            )));
        }
        for x in &out[..decode] {
            ids.push(x.as_i64().ok_or_else(|| {
                Error::Format(format!("{} holds {x}, not a token id", at("output_ids")))
            })?);
        }
    }
    Ok(ids)
}

/// Reads a response JSON (object or list).
pub fn read(path: &Path, opts: &ImportOptions) -> Result<Imported> {
    let text = crate::input::read_to_string(path)?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Format(format!("{}: not JSON: {e}", path.display())))?;
    let n = opts.num_layers.ok_or_else(|| {
        Error::Input(format!(
            "{}: SGLang return_hidden_states is the final-normed hidden_states[N]: pass the number of layers N",
            path.display()
        ))
    })?;
    let rs = responses(&v);
    let sent = opts.prompt_ids.as_ref().ok_or_else(|| {
        Error::Input(format!(
            "{}: an SGLang response does not hold the prompt ids: pass the input_ids sent (--prompt-ids, one \
             list per response)",
            path.display()
        ))
    })?;
    if sent.len() != rs.len() {
        return Err(Error::Input(format!(
            "{}: {} response(s) but {} prompt id list(s)",
            path.display(),
            rs.len(),
            sent.len()
        )));
    }
    let mut width = None;
    let mut prompts = Vec::new();
    let mut notes = Vec::new();
    let mut bf16_exact = true;
    for (k, (r, prompt)) in rs.into_iter().zip(sent).enumerate() {
        let (rows, prefill) = rows_of(r, k, path)?;
        let decode = rows.len() - prefill;
        let ids = fed_ids(r, (k, path), prompt, (prefill, decode))?;
        let w = rows[0].len();
        check_width(
            w,
            opts,
            &mut width,
            &format!(
                "{}: response {k} key `meta_info.hidden_states` (a row wider than H is the aux capture of an \
                 EAGLE-3/DFlash target, not the final state)",
                path.display()
            ),
        )?;
        let flat: Vec<f32> = rows.concat();
        bf16_exact &= flat
            .iter()
            .all(|&x| half::bf16::from_f32(x).to_f32().to_bits() == x.to_bits());
        let t = Tensor::from_vec(flat, (ids.len(), w), &Device::Cpu)?;
        let mut p = ImportedPrompt {
            source: path.to_path_buf(),
            input_ids: ids,
            loss_mask: None,
            hidden_states: Default::default(),
            last_layer_output: None,
            position_ids: None,
            prompt_length: None,
        };
        p.hidden_states.insert(n, t);
        if decode > 0 {
            notes.push(format!(
                "p{k}: {prefill} prefill rows + {decode} decode row(s) (output tokens fed back)"
            ));
        }
        prompts.push(p);
    }
    Ok(Imported {
        format: Format::SglangJson,
        path: path.to_path_buf(),
        mapping: IndexMapping {
            format: Format::SglangJson,
            convention: Format::SglangJson.convention().into(),
            layers: vec![LayerMapping {
                stored_as: "meta_info.hidden_states".into(),
                engine_id: None,
                index: StateIndex::Hidden(n),
            }],
        },
        prompts,
        hidden_size: width.unwrap_or(0),
        num_layers: Some(n),
        stored_dtype: if bf16_exact { "bf16" } else { "json-float" }.into(),
        trimmed: Vec::new(),
        notes,
    })
}
