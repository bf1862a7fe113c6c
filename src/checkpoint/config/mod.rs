//! `config.json` structures, deserialised with serde and named exactly as the
//! JSON fields (`transformers/models/qwen3_5/configuration_qwen3_5.py`:
//! `Qwen3_5Config`, `Qwen3_5TextConfig`).
//!
//! A `qwen3_5` (VLM) config nests the text model under `text_config`; a
//! `qwen3_5_text` config is the text model itself at the top level; a
//! `qwen3` (dense) config is [`qwen3::Qwen3Config`], with its own defaults;
//! a `qwen3_5_moe` (VLM, text under `text_config`) or `qwen3_5_moe_text`
//! config is [`qwen3_5_moe::Qwen3_5MoeConfig`], with its own defaults and the
//! MoE sizes.

mod qwen3;
mod qwen3_5_moe;
#[cfg(test)]
mod tests;
mod text;

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
pub use qwen3::Qwen3Config;
pub use qwen3_5_moe::{MoeConfig, Qwen3_5MoeConfig};
pub use text::{LayerType, RopeParameters, TextConfig};

/// Model families hsparity knows how to emulate.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "qwen3_5",
    "qwen3_5_text",
    "qwen3",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
];

/// The decoder family a config describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// Qwen3.5 hybrid (`qwen3_5`, `qwen3_5_text`): Gated DeltaNet + gated
    /// attention, zero-centred RMSNorm, partial rotary.
    #[default]
    Qwen3_5,
    /// Qwen3 dense (`qwen3`, `transformers/models/qwen3/modeling_qwen3.py`):
    /// full attention only, ungated, plain RMSNorm `w·x`, full rotary.
    Qwen3,
    /// Qwen3.5 MoE (`qwen3_5_moe`, `qwen3_5_moe_text`,
    /// `transformers/models/qwen3_5_moe/modeling_qwen3_5_moe.py`): the
    /// Qwen3.5 hybrid decoder with a sparse MoE block (router, routed
    /// experts, gated shared expert) in every layer's MLP slot.
    Qwen3_5Moe,
}

impl Family {
    /// The family of a top-level `model_type` (one of [`SUPPORTED_MODEL_TYPES`]).
    pub fn of_model_type(model_type: &str) -> Self {
        match model_type {
            "qwen3" => Family::Qwen3,
            "qwen3_5_moe" | "qwen3_5_moe_text" => Family::Qwen3_5Moe,
            _ => Family::Qwen3_5,
        }
    }
}

/// The whole `config.json`: the raw JSON (for fields hsparity only reports)
/// plus the parsed text config.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Top-level `model_type` (one of [`SUPPORTED_MODEL_TYPES`]).
    pub model_type: String,
    /// The parsed text model config: `text_config` for `qwen3_5` and
    /// `qwen3_5_moe`, the top level for the text-only types and `qwen3`.
    pub text: TextConfig,
    /// Top-level `tie_word_embeddings` (VLM classes tie by this one). `None` when absent.
    pub tie_word_embeddings: Option<bool>,
    /// Top-level `dtype` (or legacy `torch_dtype`), `None` when absent.
    pub dtype: Option<String>,
    /// `vision_config` as raw JSON, when present (always an object).
    pub vision_config: Option<Value>,
    /// The raw top-level JSON.
    pub raw: Value,
}

/// What a JSON value is, for messages ("a string", "an array", …).
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl ModelConfig {
    /// Reads and parses `config.json`. Every error names `path`.
    ///
    /// Errors ([`Error::Config`], except [`Error::Io`] for an unreadable file):
    /// invalid JSON or not a JSON object; a `model_type` that is not a string
    /// or not one of [`SUPPORTED_MODEL_TYPES`]; a `qwen3_5` config without a
    /// `text_config` object; a badly typed field (the message gives its path,
    /// e.g. `text_config.hidden_size`); a text config that breaks an
    /// invariant the forward relies on (`TextConfig`'s checks: every size at
    /// least 1, heads that divide, an even rotary dim, silu, default rope,
    /// valid `layer_types`).
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = crate::input::read(path)?;
        let label = path.display().to_string();
        if let Some(m) = crate::input::bom_message(&bytes) {
            return Err(Error::Config(format!("{label}: {m}")));
        }
        let raw: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Config(format!("{label}: not valid JSON: {e}")))?;
        Self::parse(raw, &label)
    }

    /// Parses an already-loaded `config.json` value. Same errors as
    /// [`Self::from_file`], naming the file as `config.json`.
    pub fn from_value(raw: Value) -> Result<Self> {
        Self::parse(raw, "config.json")
    }

    fn parse(raw: Value, label: &str) -> Result<Self> {
        let err = |m: String| Error::Config(format!("{label}: {m}"));
        let Some(obj) = raw.as_object() else {
            return Err(err(format!(
                "top level is not a JSON object (found {}): config.json is not a JSON object",
                json_kind(&raw)
            )));
        };
        // A DFlash drafter given where a target checkpoint is expected (its
        // `model_type` is often a target's, e.g. qwen3).
        let drafter_arch = obj
            .get("architectures")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find(|a| a.contains("DFlash"));
        if let Some(arch) =
            drafter_arch.or(obj.contains_key("dflash_config").then_some("dflash_config"))
        {
            return Err(err(format!(
                "this is a DFlash drafter ({arch}), not a target checkpoint: pass the target's folder \
                 as the checkpoint and this one as --drafter"
            )));
        }
        let model_type = model_type_of(obj).map_err(err)?;
        let (text_value, prefix) = text_section(&raw, &model_type).map_err(err)?;
        let vision_config = match obj.get("vision_config") {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v.clone()),
            Some(v) => {
                return Err(err(format!(
                    "vision_config must be an object, found {}",
                    json_kind(v)
                )))
            }
        };
        let family = Family::of_model_type(&model_type);
        let text = parse_text(text_value, family, prefix).map_err(err)?;
        let tie_word_embeddings = match obj.get("tie_word_embeddings") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(v) => {
                return Err(err(format!(
                    "tie_word_embeddings: expected true or false, found {}",
                    json_kind(v)
                )))
            }
        };
        let dtype = match string_field(obj.get("dtype"), "dtype").map_err(err)? {
            Some(d) => Some(d),
            None => string_field(obj.get("torch_dtype"), "torch_dtype").map_err(err)?,
        };
        Ok(ModelConfig {
            model_type,
            text,
            tie_word_embeddings,
            dtype,
            vision_config,
            raw,
        })
    }

    /// True for a VLM config (`qwen3_5`, `qwen3_5_moe`: text under `text_config`).
    pub fn is_vlm(&self) -> bool {
        is_vlm_type(&self.model_type)
    }
}

/// True for the model types whose text model sits under `text_config`.
fn is_vlm_type(model_type: &str) -> bool {
    matches!(model_type, "qwen3_5" | "qwen3_5_moe")
}

/// The top-level `model_type`, one of [`SUPPORTED_MODEL_TYPES`].
fn model_type_of(obj: &serde_json::Map<String, Value>) -> std::result::Result<String, String> {
    match obj.get("model_type") {
        Some(Value::String(s)) if SUPPORTED_MODEL_TYPES.contains(&s.as_str()) => Ok(s.clone()),
        Some(Value::String(other)) => Err(format!(
            "unknown model_type {other:?}: hsparity supports {}",
            SUPPORTED_MODEL_TYPES.join(", ")
        )),
        None | Some(Value::Null) => Err("no \"model_type\" field".into()),
        Some(v) => Err(format!(
            "model_type must be a string, found {}",
            json_kind(v)
        )),
    }
}

/// Where the text model's fields are (`text_config` of a VLM config, else
/// the top level) and the prefix that names them in messages.
fn text_section<'a>(
    raw: &'a Value,
    model_type: &str,
) -> std::result::Result<(&'a Value, &'static str), String> {
    if !is_vlm_type(model_type) {
        return Ok((raw, ""));
    }
    match raw.get("text_config") {
        Some(v @ Value::Object(_)) => Ok((v, "text_config.")),
        None | Some(Value::Null) => Err(format!(
            "model_type {model_type:?} but no \"text_config\" object"
        )),
        Some(v) => Err(format!(
            "text_config must be an object, found {}",
            json_kind(v)
        )),
    }
}

/// The text config of `family` from `v` (fields named with `prefix` in
/// messages), checked ([`TextConfig::check`]).
fn parse_text(v: &Value, family: Family, prefix: &str) -> std::result::Result<TextConfig, String> {
    let named = |e: serde_path_to_error::Error<serde_json::Error>| {
        let path = e.path().to_string();
        if path == "." || path.is_empty() {
            format!("{}", e.inner())
        } else {
            format!("{prefix}{path}: {}", e.inner())
        }
    };
    let mut text = match family {
        Family::Qwen3_5 => serde_path_to_error::deserialize::<_, TextConfig>(v).map_err(named)?,
        Family::Qwen3 => {
            let sizes: Qwen3Config = serde_path_to_error::deserialize(v).map_err(named)?;
            let mut rest = v.clone();
            if let Some(o) = rest.as_object_mut() {
                for k in qwen3::SIZE_FIELDS {
                    o.remove(k);
                }
            }
            sizes.into_text(serde_path_to_error::deserialize(&rest).map_err(named)?)
        }
        Family::Qwen3_5Moe => {
            let sizes: Qwen3_5MoeConfig = serde_path_to_error::deserialize(v).map_err(named)?;
            let mut rest = v.clone();
            if let Some(o) = rest.as_object_mut() {
                for k in qwen3_5_moe::SIZE_FIELDS {
                    o.remove(k);
                }
            }
            sizes.into_text(serde_path_to_error::deserialize(&rest).map_err(named)?)
        }
    };
    // Legacy `torch_dtype` counts only when `dtype` is absent.
    if text.dtype.is_none() {
        text.dtype = string_field(v.get("torch_dtype"), &format!("{prefix}torch_dtype"))?;
    }
    text.family = family;
    text.check(prefix)?;
    Ok(text)
}

/// An optional string field: absent or null → `None`, a string → `Some`,
/// anything else → an error naming `field`.
fn string_field(v: Option<&Value>, field: &str) -> std::result::Result<Option<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(format!(
            "{field}: expected a string such as \"bfloat16\", found {}",
            json_kind(v)
        )),
    }
}
