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
pub const SUPPORTED_MODEL_TYPES: &[&str] = &["qwen3_5", "qwen3_5_text"];

/// The whole `config.json`: the raw JSON (for fields hsparity only reports)
/// plus the parsed text config.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Top-level `model_type` (`qwen3_5` or `qwen3_5_text`).
    pub model_type: String,
    /// The parsed text model config: `text_config` for `qwen3_5`, the top level for `qwen3_5_text`.
    pub text: TextConfig,
    /// Top-level `tie_word_embeddings` (VLM classes tie by this one). `None` when absent.
    pub tie_word_embeddings: Option<bool>,
    /// Top-level `dtype` (or legacy `torch_dtype`), `None` when absent.
    pub dtype: Option<String>,
    /// `vision_config` as raw JSON, when present.
    pub vision_config: Option<Value>,
    /// The raw top-level JSON.
    pub raw: Value,
}

/// Text model config (`Qwen3_5TextConfig`). Defaults follow
/// `configuration_qwen3_5.py` (5.23.0, lines 82-117).
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
    #[serde(default, alias = "torch_dtype")]
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
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    #[serde(default)]
    pub model_type: Option<String>,
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
    /// Errors: an unknown entry or a length different from `num_hidden_layers`.
    pub fn layer_types(&self) -> Result<Vec<LayerType>> {
        match &self.layer_types {
            Some(v) => {
                if v.len() != self.num_hidden_layers {
                    return Err(Error::Config(format!(
                        "text_config.layer_types has {} entries, num_hidden_layers is {}",
                        v.len(),
                        self.num_hidden_layers
                    )));
                }
                v.iter()
                    .enumerate()
                    .map(|(i, s)| match s.as_str() {
                        "linear_attention" => Ok(LayerType::LinearAttention),
                        "full_attention" => Ok(LayerType::FullAttention),
                        other => Err(Error::Config(format!(
                            "text_config.layer_types[{i}] = {other:?}: expected \"linear_attention\" or \"full_attention\""
                        ))),
                    })
                    .collect()
            }
            None => {
                let n = self.full_attention_interval.max(1);
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
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
            .or(self.rope_theta)
            .unwrap_or(10000.0)
    }

    /// `partial_rotary_factor`: `rope_parameters` first, then the plain field,
    /// default 0.25 (`Qwen3_5TextConfig.__post_init__`).
    pub fn partial_rotary_factor(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|p| p.get("partial_rotary_factor"))
            .and_then(Value::as_f64)
            .or(self.partial_rotary_factor)
            .unwrap_or(0.25)
    }

    /// Rotary dims per head: `int(head_dim * partial_rotary_factor)`.
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim as f64 * self.partial_rotary_factor()) as usize
    }

    /// Checks the structural invariants the forward relies on (divisibility of
    /// heads, even rotary dim). Errors name the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.num_key_value_heads == 0 || self.num_attention_heads % self.num_key_value_heads != 0
        {
            return bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.linear_num_key_heads == 0
            || self.linear_num_value_heads % self.linear_num_key_heads != 0
        {
            return bad(format!(
                "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                self.linear_num_value_heads, self.linear_num_key_heads
            ));
        }
        let rd = self.rotary_dim();
        if rd % 2 != 0 || rd > self.head_dim {
            return bad(format!(
                "rotary dim {rd} (head_dim {} x partial_rotary_factor {}) must be even and <= head_dim",
                self.head_dim,
                self.partial_rotary_factor()
            ));
        }
        if self.linear_conv_kernel_dim == 0 {
            return bad("linear_conv_kernel_dim must be >= 1".into());
        }
        self.layer_types()?;
        Ok(())
    }
}

impl ModelConfig {
    /// Reads and parses `config.json`.
    ///
    /// Errors: unreadable file, invalid JSON, a `model_type` other than
    /// [`SUPPORTED_MODEL_TYPES`], a `qwen3_5` config without `text_config`, or
    /// a text config that fails [`TextConfig::validate`].
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let raw: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Config(format!("{}: not valid JSON: {e}", path.display())))?;
        Self::from_value(raw)
    }

    /// Parses an already-loaded `config.json` value. Same errors as [`Self::from_file`].
    pub fn from_value(raw: Value) -> Result<Self> {
        let model_type = raw
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::Config("config.json has no \"model_type\"".into()))?
            .to_string();
        let text_value = match model_type.as_str() {
            "qwen3_5" => raw.get("text_config").cloned().ok_or_else(|| {
                Error::Config("model_type \"qwen3_5\" but no \"text_config\" object".into())
            })?,
            "qwen3_5_text" => raw.clone(),
            other => {
                return Err(Error::Config(format!(
                    "unknown model_type {other:?}: hsparity supports {}",
                    SUPPORTED_MODEL_TYPES.join(", ")
                )))
            }
        };
        let text: TextConfig = serde_json::from_value(text_value)
            .map_err(|e| Error::Config(format!("text config: {e}")))?;
        text.validate()?;
        let tie_word_embeddings = raw.get("tie_word_embeddings").and_then(Value::as_bool);
        let dtype = raw
            .get("dtype")
            .or_else(|| raw.get("torch_dtype"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let vision_config = raw.get("vision_config").cloned();
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
