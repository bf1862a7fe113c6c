//! The Qwen3 dense config (`model_type: qwen3`,
//! `transformers/models/qwen3/configuration_qwen3.py::Qwen3Config`, 5.23.0):
//! its own defaults for the sizes (`vocab_size` 151936, `hidden_size` 4096,
//! `intermediate_size` 22016, 32 layers, 32 heads, `num_key_value_heads` =
//! `num_attention_heads`, `head_dim` 128, 32768 positions), the rest as the
//! shared [`TextConfig`] reads it. Every layer is full attention (sliding
//! windows are refused), rotary is full.

use serde::Deserialize;

use super::{Family, TextConfig};

/// The fields [`Qwen3Config`] reads (the others are read into the shared
/// [`TextConfig`], which never sees these).
pub const SIZE_FIELDS: [&str; 8] = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
];

/// `Qwen3Config`'s size fields with their Qwen3 defaults. `null` counts as
/// absent, as the Python constructor's keyword defaults do.
#[derive(Debug, Clone, Deserialize)]
pub struct Qwen3Config {
    /// `vocab_size` (151936).
    #[serde(default)]
    pub vocab_size: Option<usize>,
    /// `hidden_size` (4096).
    #[serde(default)]
    pub hidden_size: Option<usize>,
    /// `intermediate_size` (22016).
    #[serde(default)]
    pub intermediate_size: Option<usize>,
    /// `num_hidden_layers` (32).
    #[serde(default)]
    pub num_hidden_layers: Option<usize>,
    /// `num_attention_heads` (32).
    #[serde(default)]
    pub num_attention_heads: Option<usize>,
    /// `num_key_value_heads` (= `num_attention_heads`).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// `head_dim` (128).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// `max_position_embeddings` (32768).
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
}

impl Qwen3Config {
    /// The shared text config of this Qwen3 model (family [`Family::Qwen3`]):
    /// these sizes (or their Qwen3 defaults) over `rest`, the other fields
    /// read without `SIZE_FIELDS`.
    pub fn into_text(self, rest: TextConfig) -> TextConfig {
        let heads = self.num_attention_heads.unwrap_or(32);
        TextConfig {
            vocab_size: self.vocab_size.unwrap_or(151936),
            hidden_size: self.hidden_size.unwrap_or(4096),
            intermediate_size: self.intermediate_size.unwrap_or(22016),
            num_hidden_layers: self.num_hidden_layers.unwrap_or(32),
            num_attention_heads: heads,
            num_key_value_heads: self.num_key_value_heads.unwrap_or(heads),
            head_dim: self.head_dim.unwrap_or(128),
            max_position_embeddings: self.max_position_embeddings.unwrap_or(32768),
            family: Family::Qwen3,
            ..rest
        }
    }
}
