//! `config.json` structures, deserialised with serde and named exactly as the
//! JSON fields (`transformers/models/qwen3_5/configuration_qwen3_5.py`:
//! `Qwen3_5Config`, `Qwen3_5TextConfig`).
//!
//! A `qwen3_5` (VLM) config nests the text model under `text_config`; a
//! `qwen3_5_text` config is the text model itself at the top level.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// Model families hsparity knows how to emulate.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &["qwen3_5", "qwen3_5_text", "qwen3"];

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
}

/// The whole `config.json`: the raw JSON (for fields hsparity only reports)
/// plus the parsed text config.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Top-level `model_type` (`qwen3_5`, `qwen3_5_text` or `qwen3`).
    pub model_type: String,
    /// The parsed text model config: `text_config` for `qwen3_5`, the top level for `qwen3_5_text`.
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

/// `rope_parameters` (or the legacy `rope_scaling`): the fields hsparity
/// reads. Other keys (`mrope_section`, `mrope_interleaved`, …) are ignored:
/// with text-only positions, multimodal rope equals default rope.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RopeParameters {
    /// `rope_type`; only `default` is implemented.
    #[serde(default)]
    pub rope_type: Option<String>,
    /// Legacy spelling of `rope_type` (`rope_scaling.type`).
    #[serde(default, rename = "type")]
    pub legacy_type: Option<String>,
    /// `rope_theta`.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// `partial_rotary_factor`.
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
}

/// Text model config (`Qwen3_5TextConfig`). Defaults follow
/// `configuration_qwen3_5.py` (5.23.0, lines 82-117). Fields hsparity does
/// not use are ignored, as transformers keeps unknown keys as attributes.
#[derive(Debug, Clone, Deserialize)]
pub struct TextConfig {
    #[serde(default = "d_vocab")]
    pub vocab_size: usize,
    #[serde(default = "d_hidden")]
    pub hidden_size: usize,
    #[serde(default = "d_inter")]
    pub intermediate_size: usize,
    #[serde(default = "d_layers")]
    pub num_hidden_layers: usize,
    #[serde(default = "d_heads")]
    pub num_attention_heads: usize,
    #[serde(default = "d_kv_heads")]
    pub num_key_value_heads: usize,
    #[serde(default = "d_head_dim")]
    pub head_dim: usize,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "d_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default = "d_init_range")]
    pub initializer_range: f64,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    /// `dtype` (the legacy `torch_dtype` is used when `dtype` is absent).
    #[serde(default)]
    pub dtype: Option<String>,
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    #[serde(default = "d_interval")]
    pub full_attention_interval: usize,
    #[serde(default = "d_conv")]
    pub linear_conv_kernel_dim: usize,
    #[serde(default = "d_lin_dim")]
    pub linear_key_head_dim: usize,
    #[serde(default = "d_lin_dim")]
    pub linear_value_head_dim: usize,
    #[serde(default = "d_lin_k_heads")]
    pub linear_num_key_heads: usize,
    #[serde(default = "d_lin_v_heads")]
    pub linear_num_value_heads: usize,
    /// `hidden_act` (default `silu`, the only one implemented).
    #[serde(default)]
    pub hidden_act: Option<String>,
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<RopeParameters>,
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    #[serde(default)]
    pub model_type: Option<String>,
    /// Qwen3 `use_sliding_window` (sliding layers are not implemented).
    #[serde(default)]
    pub use_sliding_window: Option<bool>,
    /// Decoder family (from the top-level `model_type`, not a JSON field).
    #[serde(skip)]
    pub family: Family,
}

fn d_vocab() -> usize {
    248320
}
fn d_hidden() -> usize {
    4096
}
fn d_inter() -> usize {
    12288
}
fn d_layers() -> usize {
    32
}
fn d_heads() -> usize {
    16
}
fn d_kv_heads() -> usize {
    4
}
fn d_head_dim() -> usize {
    256
}
fn d_eps() -> f64 {
    1e-6
}
fn d_max_pos() -> usize {
    32768
}
fn d_init_range() -> f64 {
    0.02
}
fn d_interval() -> usize {
    4
}
fn d_conv() -> usize {
    4
}
fn d_lin_dim() -> usize {
    128
}
fn d_lin_k_heads() -> usize {
    16
}
fn d_lin_v_heads() -> usize {
    32
}

/// The mixer of one decoder layer (`layer_types[i]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    /// Gated DeltaNet (`linear_attn.*`).
    LinearAttention,
    /// Gated full softmax attention (`self_attn.*`).
    FullAttention,
}

impl LayerType {
    /// The transformers spelling (`"linear_attention"` / `"full_attention"`).
    pub fn as_str(self) -> &'static str {
        match self {
            LayerType::LinearAttention => "linear_attention",
            LayerType::FullAttention => "full_attention",
        }
    }
}

impl TextConfig {
    /// Layer types: `layer_types` when given, else derived as transformers does:
    /// `"linear_attention" if (i+1) % full_attention_interval else "full_attention"`
    /// (`Qwen3_5TextConfig.__post_init__`).
    ///
    /// Errors: an unknown entry, a length different from `num_hidden_layers`,
    /// or `full_attention_interval = 0` when `layer_types` is absent.
    pub fn layer_types(&self) -> Result<Vec<LayerType>> {
        self.layer_types_at("text_config.").map_err(Error::Config)
    }

    fn layer_types_at(&self, prefix: &str) -> std::result::Result<Vec<LayerType>, String> {
        if self.family == Family::Qwen3 {
            if self.use_sliding_window == Some(true) {
                return Err(format!(
                    "{prefix}use_sliding_window = true: sliding-window attention is not implemented for Qwen3 targets"
                ));
            }
            if let Some(v) = &self.layer_types {
                if v.len() != self.num_hidden_layers {
                    return Err(format!(
                        "{prefix}layer_types has {} entries, {prefix}num_hidden_layers is {}",
                        v.len(),
                        self.num_hidden_layers
                    ));
                }
                if let Some((i, t)) = v.iter().enumerate().find(|(_, t)| *t != "full_attention") {
                    return Err(format!(
                        "{prefix}layer_types[{i}] = {t:?}: hsparity implements full_attention Qwen3 layers only"
                    ));
                }
            }
            return Ok(vec![LayerType::FullAttention; self.num_hidden_layers]);
        }
        match &self.layer_types {
            Some(v) => {
                if v.len() != self.num_hidden_layers {
                    return Err(format!(
                        "{prefix}layer_types has {} entries, {prefix}num_hidden_layers is {}",
                        v.len(),
                        self.num_hidden_layers
                    ));
                }
                v.iter()
                    .enumerate()
                    .map(|(i, s)| match s.as_str() {
                        "linear_attention" => Ok(LayerType::LinearAttention),
                        "full_attention" => Ok(LayerType::FullAttention),
                        other => Err(format!(
                            "{prefix}layer_types[{i}] = {other:?}: expected \"linear_attention\" or \"full_attention\""
                        )),
                    })
                    .collect()
            }
            None => {
                let n = self.full_attention_interval;
                if n == 0 {
                    return Err(format!(
                        "{prefix}full_attention_interval = 0: must be at least 1 (transformers derives \
                         layer_types as (i + 1) % full_attention_interval)"
                    ));
                }
                Ok((0..self.num_hidden_layers)
                    .map(|i| {
                        if (i + 1) % n != 0 {
                            LayerType::LinearAttention
                        } else {
                            LayerType::FullAttention
                        }
                    })
                    .collect())
            }
        }
    }

    /// `rope_theta`: `rope_parameters.rope_theta`, else the legacy top-level
    /// `rope_theta`, else 10000.
    pub fn rope_theta(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|p| p.rope_theta)
            .or(self.rope_theta)
            .unwrap_or(10000.0)
    }

    /// `partial_rotary_factor`: `rope_parameters` first, then the plain field,
    /// default 0.25 for Qwen3.5 (`Qwen3_5TextConfig.__post_init__`), 1 for
    /// Qwen3 (full rotary).
    pub fn partial_rotary_factor(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|p| p.partial_rotary_factor)
            .or(self.partial_rotary_factor)
            .unwrap_or(match self.family {
                Family::Qwen3_5 => 0.25,
                Family::Qwen3 => 1.0,
            })
    }

    /// Rotary dims per head: `int(head_dim * partial_rotary_factor)`.
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim as f64 * self.partial_rotary_factor()) as usize
    }

    /// Checks the invariants the forward relies on: every size at least 1,
    /// divisibility of heads, an even rotary dim, a positive `rms_norm_eps`,
    /// `hidden_act = silu`, default rope, valid `layer_types`, and weight
    /// sizes that fit in memory arithmetic. Messages name the field with
    /// `prefix` (`"text_config."` for a VLM config, `""` for a text-only one).
    fn check(&self, prefix: &str) -> std::result::Result<(), String> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
            ("linear_conv_kernel_dim", self.linear_conv_kernel_dim),
            ("linear_key_head_dim", self.linear_key_head_dim),
            ("linear_value_head_dim", self.linear_value_head_dim),
            ("linear_num_key_heads", self.linear_num_key_heads),
            ("linear_num_value_heads", self.linear_num_value_heads),
        ];
        for (name, v) in sizes {
            if v == 0 {
                return Err(format!("{prefix}{name} = 0: must be at least 1"));
            }
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(format!(
                "{prefix}rms_norm_eps = {}: must be a positive number",
                self.rms_norm_eps
            ));
        }
        if !(self.initializer_range.is_finite() && self.initializer_range >= 0.0) {
            return Err(format!(
                "{prefix}initializer_range = {}: must be a non-negative number",
                self.initializer_range
            ));
        }
        if let Some(act) = &self.hidden_act {
            if act != "silu" {
                return Err(format!(
                    "{prefix}hidden_act = {act:?}: unsupported (hsparity implements silu, the Qwen3.5 activation)"
                ));
            }
        }
        for (field, rp) in [
            ("rope_parameters", &self.rope_parameters),
            ("rope_scaling", &self.rope_scaling),
        ] {
            let Some(rp) = rp else { continue };
            for (key, ty) in [("rope_type", &rp.rope_type), ("type", &rp.legacy_type)] {
                // `mrope` is the legacy Qwen-VL spelling of default rope
                // (multimodal sections; identical for text-only positions).
                if let Some(ty) = ty.as_deref().filter(|t| !matches!(*t, "default" | "mrope")) {
                    return Err(format!(
                        "{prefix}{field}.{key}: unsupported rope_type {ty:?} (hsparity implements default rope)"
                    ));
                }
            }
        }
        let theta = self.rope_theta();
        if !(theta.is_finite() && theta > 0.0) {
            return Err(format!(
                "{prefix}rope_parameters.rope_theta = {theta}: must be a positive number"
            ));
        }
        let prf = self.partial_rotary_factor();
        if !(prf.is_finite() && prf > 0.0 && prf <= 1.0) {
            return Err(format!(
                "{prefix}rope_parameters.partial_rotary_factor = {prf}: must be in (0, 1]"
            ));
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(format!(
                "{prefix}num_attention_heads {} is not a multiple of {prefix}num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.linear_num_value_heads % self.linear_num_key_heads != 0 {
            return Err(format!(
                "{prefix}linear_num_value_heads {} is not a multiple of {prefix}linear_num_key_heads {}",
                self.linear_num_value_heads, self.linear_num_key_heads
            ));
        }
        let rd = self.rotary_dim();
        if rd % 2 != 0 || rd == 0 || rd > self.head_dim {
            return Err(format!(
                "rotary dim {rd} ({prefix}head_dim {} x partial_rotary_factor {prf}) must be even, at least 2 and <= head_dim",
                self.head_dim
            ));
        }
        self.layer_types_at(prefix)?;
        self.check_sizes_fit().ok_or_else(|| {
            format!(
                "{prefix}hidden_size {}, {prefix}vocab_size {}, {prefix}intermediate_size {} and the \
                 head sizes give weight shapes whose element counts overflow",
                self.hidden_size, self.vocab_size, self.intermediate_size
            )
        })?;
        Ok(())
    }

    /// Element counts of every weight the config implies, in checked
    /// arithmetic (`None` on overflow), so shape code never wraps or panics.
    fn check_sizes_fit(&self) -> Option<()> {
        let h = self.hidden_size;
        let dk = self
            .linear_num_key_heads
            .checked_mul(self.linear_key_head_dim)?;
        let dv = self
            .linear_num_value_heads
            .checked_mul(self.linear_value_head_dim)?;
        let conv = dk.checked_mul(2)?.checked_add(dv)?;
        let q = self
            .num_attention_heads
            .checked_mul(self.head_dim)?
            .checked_mul(2)?;
        let kv = self.num_key_value_heads.checked_mul(self.head_dim)?;
        for rows in [
            self.vocab_size,
            self.intermediate_size,
            q,
            kv,
            conv,
            dv,
            self.linear_num_value_heads,
        ] {
            // Products in bytes (f64 at most) must fit too.
            rows.checked_mul(h)?.checked_mul(8)?;
        }
        conv.checked_mul(self.linear_conv_kernel_dim)?
            .checked_mul(8)?;
        Some(())
    }
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
    /// e.g. `text_config.hidden_size`); a text config that fails
    /// [`TextConfig::validate`].
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let label = path.display().to_string();
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
        let model_type = match obj.get("model_type") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => return Err(err("no \"model_type\" field".into())),
            Some(v) => {
                return Err(err(format!(
                    "model_type must be a string, found {}",
                    json_kind(v)
                )))
            }
        };
        let (text_value, prefix) = match model_type.as_str() {
            "qwen3_5" => match obj.get("text_config") {
                Some(v @ Value::Object(_)) => (v, "text_config."),
                None | Some(Value::Null) => {
                    return Err(err(
                        "model_type \"qwen3_5\" but no \"text_config\" object".into()
                    ))
                }
                Some(v) => {
                    return Err(err(format!(
                        "text_config must be an object, found {}",
                        json_kind(v)
                    )))
                }
            },
            "qwen3_5_text" | "qwen3" => (&raw, ""),
            other => {
                return Err(err(format!(
                    "unknown model_type {other:?}: hsparity supports {}",
                    SUPPORTED_MODEL_TYPES.join(", ")
                )))
            }
        };
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
        let family = if model_type == "qwen3" {
            Family::Qwen3
        } else {
            Family::Qwen3_5
        };
        // Qwen3Config's defaults differ from Qwen3_5TextConfig's (the serde
        // defaults): fill absent fields the way configuration_qwen3.py does.
        let qwen3_filled;
        let text_value = if family == Family::Qwen3 {
            let mut v = text_value.clone();
            if let Some(o) = v.as_object_mut() {
                let heads = o
                    .get("num_attention_heads")
                    .cloned()
                    .filter(|x| !x.is_null());
                for (k, d) in [
                    ("vocab_size", serde_json::json!(151936)),
                    ("hidden_size", serde_json::json!(4096)),
                    ("intermediate_size", serde_json::json!(22016)),
                    ("num_hidden_layers", serde_json::json!(32)),
                    ("num_attention_heads", serde_json::json!(32)),
                    (
                        "num_key_value_heads",
                        heads.unwrap_or(serde_json::json!(32)),
                    ),
                    ("head_dim", serde_json::json!(128)),
                    ("max_position_embeddings", serde_json::json!(32768)),
                ] {
                    if o.get(k).is_none_or(Value::is_null) {
                        o.insert(k.to_string(), d);
                    }
                }
            }
            qwen3_filled = v;
            &qwen3_filled
        } else {
            text_value
        };
        let mut text: TextConfig = serde_path_to_error::deserialize(text_value).map_err(|e| {
            let path = e.path().to_string();
            if path == "." || path.is_empty() {
                err(format!("{}", e.inner()))
            } else {
                err(format!("{prefix}{path}: {}", e.inner()))
            }
        })?;
        // Legacy `torch_dtype` counts only when `dtype` is absent.
        let legacy = text_value.get("torch_dtype");
        if text.dtype.is_none() {
            text.dtype = string_field(legacy, &format!("{prefix}torch_dtype")).map_err(err)?;
        }
        text.family = family;
        text.check(prefix).map_err(err)?;
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

    /// True for a `qwen3_5` VLM config (text under `text_config`).
    pub fn is_vlm(&self) -> bool {
        self.model_type == "qwen3_5"
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn qwen3_fields_default_as_qwen3config_does() {
        // configuration_qwen3.py (5.23.0): head_dim 128, kv heads = heads when
        // absent, full rotary, every layer full attention.
        let c = ModelConfig::from_value(
            json!({"model_type": "qwen3", "num_attention_heads": 8, "num_hidden_layers": 3}),
        )
        .unwrap();
        let t = &c.text;
        assert_eq!(t.family, Family::Qwen3);
        assert_eq!(
            (t.num_key_value_heads, t.head_dim, t.vocab_size),
            (8, 128, 151936)
        );
        assert_eq!(t.rotary_dim(), 128);
        assert_eq!(t.layer_types().unwrap(), vec![LayerType::FullAttention; 3]);
        let e = ModelConfig::from_value(json!({"model_type": "qwen3", "use_sliding_window": true}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("use_sliding_window"), "{e}");
    }

    /// A minimal valid VLM config (sizes of the tiny fixture).
    fn vlm() -> Value {
        json!({
            "model_type": "qwen3_5",
            "dtype": "float32",
            "tie_word_embeddings": false,
            "text_config": {
                "vocab_size": 384, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 32, "max_position_embeddings": 512, "hidden_act": "silu",
                "layer_types": ["linear_attention", "full_attention"],
                "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                    "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]}
            },
            "vision_config": {"depth": 2}
        })
    }

    fn err(v: Value) -> String {
        let e = ModelConfig::from_value(v).expect_err("must fail");
        assert!(matches!(e, Error::Config(_)), "{e:?}");
        let m = e.to_string();
        assert!(m.contains("config.json"), "names the file: {m}");
        assert!(!m.contains('\n'), "one line: {m}");
        m
    }

    fn with(path: &str, value: Value) -> Value {
        let mut v = vlm();
        let mut cur = &mut v;
        let parts: Vec<&str> = path.split('.').collect();
        for p in &parts[..parts.len() - 1] {
            cur = &mut cur[*p];
        }
        cur[*parts.last().unwrap()] = value;
        v
    }

    fn without(path: &str) -> Value {
        let mut v = vlm();
        let (parent, last) = path.rsplit_once('.').unwrap_or(("", path));
        let mut cur = &mut v;
        for p in parent.split('.').filter(|p| !p.is_empty()) {
            cur = &mut cur[p];
        }
        cur.as_object_mut().unwrap().remove(last);
        v
    }

    #[test]
    fn valid_config_and_defaults() {
        let c = ModelConfig::from_value(vlm()).unwrap();
        assert_eq!(c.text.rotary_dim(), 8);
        assert_eq!(c.dtype.as_deref(), Some("float32"));
        // Absent optional fields take transformers' defaults.
        let mut v = vlm();
        let tc = v["text_config"].as_object_mut().unwrap();
        for k in [
            "hidden_act",
            "rope_parameters",
            "rms_norm_eps",
            "linear_conv_kernel_dim",
        ] {
            tc.remove(k);
        }
        let c = ModelConfig::from_value(v).unwrap();
        assert_eq!(c.text.rope_theta(), 10000.0);
        assert_eq!(c.text.partial_rotary_factor(), 0.25);
        assert_eq!(c.text.rms_norm_eps, 1e-6);
        // Nulls count as absent.
        let c = ModelConfig::from_value(with("text_config.rope_parameters.rope_type", Value::Null))
            .unwrap();
        assert_eq!(c.text.rope_theta(), 10000.0);
        assert!(ModelConfig::from_value(with("vision_config", Value::Null))
            .unwrap()
            .vision_config
            .is_none());
        assert!(
            ModelConfig::from_value(with("tie_word_embeddings", Value::Null))
                .unwrap()
                .tie_word_embeddings
                .is_none()
        );
        // Legacy spellings: torch_dtype, mrope, top-level rope_theta.
        let mut v = without("dtype");
        v["torch_dtype"] = json!("bfloat16");
        v["text_config"]["torch_dtype"] = json!("bfloat16");
        v["text_config"]["dtype"] = json!("float16");
        let c = ModelConfig::from_value(v).unwrap();
        assert_eq!(c.dtype.as_deref(), Some("bfloat16"));
        assert_eq!(
            c.text.dtype.as_deref(),
            Some("float16"),
            "dtype wins over torch_dtype"
        );
        let mut v = without("text_config.rope_parameters");
        v["text_config"]["rope_scaling"] = json!({"type": "mrope", "mrope_section": [2, 1, 1]});
        v["text_config"]["rope_theta"] = json!(5e6);
        let c = ModelConfig::from_value(v).unwrap();
        assert_eq!(c.text.rope_theta(), 5e6);
    }

    #[test]
    fn zero_and_nonpositive_sizes_are_rejected() {
        for f in [
            "num_hidden_layers",
            "hidden_size",
            "vocab_size",
            "head_dim",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "max_position_embeddings",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_conv_kernel_dim",
        ] {
            let m = err(with(&format!("text_config.{f}"), json!(0)));
            assert!(m.contains(&format!("text_config.{f} = 0")), "{m}");
        }
        let mut v = with("text_config.num_hidden_layers", json!(0));
        v["text_config"]["layer_types"] = json!([]);
        assert!(err(v).contains("text_config.num_hidden_layers = 0"));
        for eps in [json!(0.0), json!(-1e-6)] {
            let m = err(with("text_config.rms_norm_eps", eps));
            assert!(
                m.contains("text_config.rms_norm_eps") && m.contains("positive"),
                "{m}"
            );
        }
        let mut v = without("text_config.layer_types");
        v["text_config"]["full_attention_interval"] = json!(0);
        assert!(err(v).contains("text_config.full_attention_interval = 0"));
        let m = err(with("text_config.rope_parameters.rope_theta", json!(0)));
        assert!(m.contains("rope_theta"), "{m}");
        let m = err(with(
            "text_config.rope_parameters.partial_rotary_factor",
            json!(1.5),
        ));
        assert!(m.contains("partial_rotary_factor"), "{m}");
        let m = err(with("text_config.hidden_size", json!(1u64 << 62)));
        assert!(m.contains("overflow"), "{m}");
    }

    #[test]
    fn badly_typed_or_unsupported_fields_are_named() {
        let cases: &[(&str, Value, &str)] = &[
            (
                "text_config.hidden_size",
                json!("x"),
                "config.json: text_config.hidden_size: invalid type: string \"x\", expected usize",
            ),
            (
                "text_config.rope_parameters.rope_theta",
                json!("abc"),
                "text_config.rope_parameters.rope_theta: invalid type: string \"abc\"",
            ),
            (
                "text_config.rope_parameters.partial_rotary_factor",
                json!("x"),
                "text_config.rope_parameters.partial_rotary_factor: invalid type",
            ),
            (
                "text_config.rope_parameters.rope_type",
                json!("yarn"),
                "unsupported rope_type \"yarn\" (hsparity implements default rope)",
            ),
            (
                "text_config.rope_parameters.rope_type",
                json!(3),
                "text_config.rope_parameters.rope_type: invalid type",
            ),
            (
                "text_config.rope_scaling",
                json!({"rope_type": "linear", "factor": 2.0}),
                "text_config.rope_scaling.rope_type: unsupported rope_type \"linear\"",
            ),
            (
                "text_config.rope_scaling",
                json!({"type": "dynamic"}),
                "text_config.rope_scaling.type: unsupported rope_type \"dynamic\"",
            ),
            (
                "text_config.hidden_act",
                json!("gelu"),
                "text_config.hidden_act = \"gelu\"",
            ),
            (
                "text_config.tie_word_embeddings",
                json!("no"),
                "text_config.tie_word_embeddings: invalid type",
            ),
            (
                "tie_word_embeddings",
                json!(1),
                "tie_word_embeddings: expected true or false",
            ),
            ("dtype", json!(5), "dtype: expected a string"),
            (
                "text_config.dtype",
                json!(["bf16"]),
                "text_config.dtype: invalid type",
            ),
            (
                "text_config.layer_types",
                json!("linear_attention"),
                "text_config.layer_types: invalid type",
            ),
            (
                "text_config",
                json!([1, 2]),
                "text_config must be an object, found an array",
            ),
            ("text_config", json!(null), "no \"text_config\" object"),
            (
                "vision_config",
                json!([1]),
                "vision_config must be an object",
            ),
            ("model_type", json!(5), "model_type must be a string"),
        ];
        for (path, value, want) in cases {
            let m = err(with(path, value.clone()));
            assert!(
                m.contains(want),
                "{path} = {value}: expected {want:?} in {m}"
            );
        }
        let mut v = without("dtype");
        v["torch_dtype"] = json!(16);
        assert!(err(v).contains("torch_dtype: expected a string"));
        assert!(err(json!([1, 2])).contains("config.json is not a JSON object"));
        assert!(err(without("model_type")).contains("no \"model_type\""));
    }

    #[test]
    fn text_only_config_names_fields_without_prefix() {
        let mut v = vlm()["text_config"].clone();
        v["model_type"] = json!("qwen3_5_text");
        assert!(ModelConfig::from_value(v.clone()).is_ok());
        v["hidden_size"] = json!(-3);
        let m = err(v);
        assert!(
            m.contains("config.json: hidden_size: invalid value: integer `-3`"),
            "{m}"
        );
    }
}
