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
pub fn looks_like(path: &Path) -> Result<bool> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(false);
    };
    let Ok(v) = serde_json::from_str::<Value>(&text) else {
        return Ok(false);
    };
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
            x.as_f64()
                .map(|f| f as f32)
                .ok_or_else(|| Error::Format(format!("{what} holds {x}, not a number")))
        })
        .collect()
}

/// Reads a response JSON (object or list).
pub fn read(path: &Path, opts: &ImportOptions) -> Result<Imported> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
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
    for (k, (r, prompt)) in rs.into_iter().zip(sent).enumerate() {
        let at = |key: &str| format!("{}: response {k} key `{key}`", path.display());
        let hs = r.pointer("/meta_info/hidden_states").ok_or_else(|| {
            Error::Format(format!(
                "{}: response {k}: no `meta_info.hidden_states` key (request with \"return_hidden_states\": true \
                 on a server started with --enable-return-hidden-states)",
                path.display()
            ))
        })?;
        let parts = hs.as_array().ok_or_else(|| {
            Error::Format(format!("{} is not a list", at("meta_info.hidden_states")))
        })?;
        let Some(first) = parts.first() else {
            return Err(Error::Format(format!(
                "{} is empty",
                at("meta_info.hidden_states")
            )));
        };
        let mut rows: Vec<Vec<f32>> = Vec::new();
        // prefill: a list of rows (a single-token prompt may come as one row)
        match first.as_array().and_then(|a| a.first()) {
            Some(Value::Array(_)) => {
                for (i, x) in first.as_array().expect("array").iter().enumerate() {
                    rows.push(row(
                        x,
                        &format!("{}[0][{i}]", at("meta_info.hidden_states")),
                    )?);
                }
            }
            _ => rows.push(row(
                first,
                &format!("{}[0]", at("meta_info.hidden_states")),
            )?),
        }
        let prefill = rows.len();
        for (j, x) in parts.iter().enumerate().skip(1) {
            // a decode row is [H] (some versions wrap it as [[H]])
            let x = match x.as_array().map(|a| a.as_slice()) {
                Some([inner @ Value::Array(_)]) => inner,
                _ => x,
            };
            rows.push(row(x, &format!("{}[{j}]", at("meta_info.hidden_states")))?);
        }
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
        let decode = rows.len() - prefill;
        let mut ids = prompt.clone();
        if decode > 0 {
            let out = r.get("output_ids").and_then(Value::as_array).ok_or_else(|| {
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
        let w = rows[0].len();
        if let Some((i, r)) = rows.iter().enumerate().find(|(_, r)| r.len() != w) {
            return Err(Error::Format(format!(
                "{}: row {i} has {} values, row 0 has {w}",
                at("meta_info.hidden_states"),
                r.len()
            )));
        }
        check_width(
            w,
            opts,
            &mut width,
            &format!(
                "{} (a row wider than H is the aux capture of an EAGLE-3/DFlash target, not the final state)",
                at("meta_info.hidden_states")
            ),
        )?;
        let flat: Vec<f32> = rows.concat();
        let t = Tensor::from_vec(flat, (ids.len(), w), &Device::Cpu)?;
        let mut p = ImportedPrompt {
            source: path.to_path_buf(),
            input_ids: ids,
            loss_mask: None,
            hidden_states: Default::default(),
            last_layer_output: None,
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
        stored_dtype: "json-float".into(),
        trimmed: Vec::new(),
        notes,
    })
}
