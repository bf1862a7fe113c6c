//! Loading paths (which Auto class the user calls), the model class each
//! resolves to, and the dtype that class would pick.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::HeaderIndex;
use crate::error::{Error, Result};
use crate::loading::experts::ConversionScope;
use crate::precision::Precision;

/// A transformers Auto class applied to the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LoadingPath {
    /// `causal-lm`: `AutoModelForCausalLM` → `Qwen3_5ForCausalLM` (text config only).
    #[serde(rename = "causal-lm")]
    CausalLm,
    /// `vlm`: `AutoModel` → `Qwen3_5Model` (no `lm_head`); `Qwen3_5TextModel` for a text-only config.
    #[serde(rename = "vlm")]
    Vlm,
    /// `image-text-to-text`: `AutoModelForImageTextToText` → `Qwen3_5ForConditionalGeneration`.
    #[serde(rename = "image-text-to-text")]
    ImageTextToText,
}

impl LoadingPath {
    /// All paths, in report order.
    pub const ALL: [LoadingPath; 3] = [
        LoadingPath::CausalLm,
        LoadingPath::Vlm,
        LoadingPath::ImageTextToText,
    ];

    /// CLI / report name: `causal-lm`, `vlm`, `image-text-to-text`.
    pub fn name(self) -> &'static str {
        match self {
            LoadingPath::CausalLm => "causal-lm",
            LoadingPath::Vlm => "vlm",
            LoadingPath::ImageTextToText => "image-text-to-text",
        }
    }

    /// The transformers Auto class.
    pub fn auto_class(self) -> &'static str {
        match self {
            LoadingPath::CausalLm => "AutoModelForCausalLM",
            LoadingPath::Vlm => "AutoModel",
            LoadingPath::ImageTextToText => "AutoModelForImageTextToText",
        }
    }

    /// The class the Auto class instantiates for this config
    /// (`models/auto/modeling_auto.py` mappings, 5.23.0), or `None` when the
    /// Auto class has no mapping for the config's `model_type`
    /// (`image-text-to-text` on a `qwen3_5_text` config).
    pub fn class_for(self, cfg: &ModelConfig) -> Option<ModelClass> {
        use crate::checkpoint::config::Family;
        if cfg.text.family == Family::Qwen3_5Moe {
            // modeling_auto.py: MODEL_FOR_CAUSAL_LM_MAPPING qwen3_5_moe and
            // qwen3_5_moe_text -> Qwen3_5MoeForCausalLM; MODEL_MAPPING
            // qwen3_5_moe -> Qwen3_5MoeModel, qwen3_5_moe_text ->
            // Qwen3_5MoeTextModel; image-text-to-text for qwen3_5_moe only.
            return match (self, cfg.is_vlm()) {
                (LoadingPath::CausalLm, _) => Some(ModelClass::MoeForCausalLm),
                (LoadingPath::Vlm, true) => Some(ModelClass::MoeModel),
                (LoadingPath::Vlm, false) => Some(ModelClass::MoeTextModel),
                (LoadingPath::ImageTextToText, true) => {
                    Some(ModelClass::MoeForConditionalGeneration)
                }
                (LoadingPath::ImageTextToText, false) => None,
            };
        }
        if cfg.text.family == Family::Qwen3 {
            // MODEL_FOR_CAUSAL_LM_MAPPING qwen3 -> Qwen3ForCausalLM,
            // MODEL_MAPPING qwen3 -> Qwen3Model, no image-text-to-text entry.
            return match self {
                LoadingPath::CausalLm => Some(ModelClass::Qwen3ForCausalLm),
                LoadingPath::Vlm => Some(ModelClass::Qwen3Model),
                LoadingPath::ImageTextToText => None,
            };
        }
        match (self, cfg.is_vlm()) {
            (LoadingPath::CausalLm, _) => Some(ModelClass::ForCausalLm),
            (LoadingPath::Vlm, true) => Some(ModelClass::Model),
            (LoadingPath::Vlm, false) => Some(ModelClass::TextModel),
            (LoadingPath::ImageTextToText, true) => Some(ModelClass::ForConditionalGeneration),
            (LoadingPath::ImageTextToText, false) => None,
        }
    }

    /// The paths that apply to `cfg` (all three for `qwen3_5` and
    /// `qwen3_5_moe`; `causal-lm` and `vlm` for the text-only types and `qwen3`).
    pub fn applicable(cfg: &ModelConfig) -> Vec<LoadingPath> {
        Self::ALL
            .into_iter()
            .filter(|p| p.class_for(cfg).is_some())
            .collect()
    }
}

impl fmt::Display for LoadingPath {
    /// The name, padded as the format asks (`{:<20}`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for LoadingPath {
    type Err = Error;

    /// Parses `causal-lm`, `vlm`, `image-text-to-text` (also the Auto class
    /// names). Errors: [`Error::Input`] listing the accepted names.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "causal-lm" | "causal_lm" | "AutoModelForCausalLM" => Ok(LoadingPath::CausalLm),
            "vlm" | "AutoModel" => Ok(LoadingPath::Vlm),
            "image-text-to-text" | "image_text_to_text" | "itt" | "AutoModelForImageTextToText" => {
                Ok(LoadingPath::ImageTextToText)
            }
            other => Err(Error::Input(format!(
                "unknown loading path {other:?}: expected causal-lm, vlm or image-text-to-text"
            ))),
        }
    }
}

/// The transformers model class a loading path builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ModelClass {
    /// `Qwen3_5ForCausalLM`: `model.*` (text) + `lm_head`; config = `text_config`.
    ForCausalLm,
    /// `Qwen3_5Model`: `visual.*` + `language_model.*`, no `lm_head`.
    Model,
    /// `Qwen3_5TextModel`: `embed_tokens`, `layers.*`, `norm` (base model of a text-only config).
    TextModel,
    /// `Qwen3_5ForConditionalGeneration`: `model.visual.*`, `model.language_model.*`, `lm_head`.
    ForConditionalGeneration,
    /// `Qwen3ForCausalLM` (dense Qwen3): `model.*` + `lm_head` (tied by `tie_word_embeddings`).
    Qwen3ForCausalLm,
    /// `Qwen3Model` (what `AutoModel` returns for `qwen3`): `embed_tokens`, `layers.*`, `norm`.
    Qwen3Model,
    /// `Qwen3_5MoeForCausalLM`: `model.*` (text) + `lm_head`; config = `text_config`.
    MoeForCausalLm,
    /// `Qwen3_5MoeModel`: `visual.*` + `language_model.*`, no `lm_head`.
    MoeModel,
    /// `Qwen3_5MoeTextModel` (`AutoModel` on a `qwen3_5_moe_text` config).
    MoeTextModel,
    /// `Qwen3_5MoeForConditionalGeneration`: `model.visual.*`, `model.language_model.*`, `lm_head`.
    MoeForConditionalGeneration,
}

impl ModelClass {
    /// The Python class name.
    pub fn name(self) -> &'static str {
        match self {
            ModelClass::ForCausalLm => "Qwen3_5ForCausalLM",
            ModelClass::Model => "Qwen3_5Model",
            ModelClass::TextModel => "Qwen3_5TextModel",
            ModelClass::ForConditionalGeneration => "Qwen3_5ForConditionalGeneration",
            ModelClass::Qwen3ForCausalLm => "Qwen3ForCausalLM",
            ModelClass::Qwen3Model => "Qwen3Model",
            ModelClass::MoeForCausalLm => "Qwen3_5MoeForCausalLM",
            ModelClass::MoeModel => "Qwen3_5MoeModel",
            ModelClass::MoeTextModel => "Qwen3_5MoeTextModel",
            ModelClass::MoeForConditionalGeneration => "Qwen3_5MoeForConditionalGeneration",
        }
    }

    /// True when the class has an `lm_head`.
    pub fn has_lm_head(self) -> bool {
        matches!(
            self,
            ModelClass::ForCausalLm
                | ModelClass::ForConditionalGeneration
                | ModelClass::Qwen3ForCausalLm
                | ModelClass::MoeForCausalLm
                | ModelClass::MoeForConditionalGeneration
        )
    }

    /// True when the class sees only the text config (`text_config` of a VLM
    /// config, swapped in by `auto_factory.py::from_pretrained`, 392-408), so
    /// dtype and tie come from the text config.
    pub fn uses_text_config(self) -> bool {
        matches!(
            self,
            ModelClass::ForCausalLm
                | ModelClass::TextModel
                | ModelClass::Qwen3ForCausalLm
                | ModelClass::Qwen3Model
                | ModelClass::MoeForCausalLm
                | ModelClass::MoeTextModel
        )
    }

    /// True when the class's state-dict keys start with `base_model_prefix`
    /// (`model.`): the head classes.
    pub fn has_base_prefix(self) -> bool {
        self.has_lm_head()
    }

    /// Prefix of text-model keys in this class's state dict.
    pub fn text_prefix(self) -> &'static str {
        match self {
            ModelClass::ForCausalLm | ModelClass::Qwen3ForCausalLm | ModelClass::MoeForCausalLm => {
                "model."
            }
            ModelClass::Model | ModelClass::MoeModel => "language_model.",
            ModelClass::TextModel | ModelClass::Qwen3Model | ModelClass::MoeTextModel => "",
            ModelClass::ForConditionalGeneration | ModelClass::MoeForConditionalGeneration => {
                "model.language_model."
            }
        }
    }

    /// Prefix of vision keys in this class's state dict (`None` without a vision tower).
    pub fn vision_prefix(self) -> Option<&'static str> {
        match self {
            ModelClass::Model | ModelClass::MoeModel => Some("visual."),
            ModelClass::ForConditionalGeneration | ModelClass::MoeForConditionalGeneration => {
                Some("model.visual.")
            }
            _ => None,
        }
    }

    /// `_keys_to_ignore_on_load_unexpected` as regex strings
    /// (`Qwen3_5PreTrainedModel`: `^mtp.*`; `Qwen3_5ForCausalLM` adds
    /// `^model.visual.*`; the MoE classes the same).
    pub fn ignore_patterns(self) -> &'static [&'static str] {
        match self {
            ModelClass::ForCausalLm | ModelClass::MoeForCausalLm => &["^mtp.*", "^model.visual.*"],
            // Qwen3PreTrainedModel declares none.
            ModelClass::Qwen3ForCausalLm | ModelClass::Qwen3Model => &[],
            _ => &["^mtp.*"],
        }
    }

    /// The scope of the expert conversion this class applies
    /// (`conversion_mapping.py::get_model_conversion_mapping`): unscoped for
    /// the classes whose root model is `qwen3_5_moe_text`, the language model
    /// only for the VLM classes; `None` for the dense families (no expert keys).
    pub fn expert_scope(self) -> Option<ConversionScope> {
        match self {
            ModelClass::MoeForCausalLm | ModelClass::MoeTextModel => {
                Some(ConversionScope::Unscoped)
            }
            ModelClass::MoeModel | ModelClass::MoeForConditionalGeneration => {
                Some(ConversionScope::LanguageModel)
            }
            _ => None,
        }
    }
}

/// The dtype `from_pretrained(dtype="auto")` picks for `class`, with the
/// reason, following `modeling_utils.py::_get_dtype` (5.23.0, 810-891):
/// the (text or top-level) `config.dtype` if set, else the index's
/// `metadata.dtype`, else the first floating tensor of the first shard
/// (`get_state_dict_dtype`). `Qwen3_5ForCausalLM` sees `text_config`
/// (`auto_factory.py::from_pretrained`), the VLM classes the top level.
///
/// Reasons: `"text_config.dtype"`, `"config.dtype"`, `"index metadata.dtype"`,
/// `"first weight on disk (<shard file>: <tensor>)"`.
///
/// Errors: an unsupported dtype string in the config ([`Error::Config`]); no
/// floating tensor to sniff, or one that is not F32/BF16/F16 ([`Error::Checkpoint`]).
pub fn resolve_dtype(
    cfg: &ModelConfig,
    class: ModelClass,
    headers: &HeaderIndex,
) -> Result<(Precision, String)> {
    let (field, value) = if class.uses_text_config() {
        if cfg.is_vlm() {
            ("text_config.dtype", cfg.text.dtype.as_deref())
        } else {
            ("config.dtype", cfg.text.dtype.as_deref())
        }
    } else {
        ("config.dtype", cfg.dtype.as_deref())
    };
    if let Some(v) = value {
        if let Some(d) = Precision::from_config_str(v, field)? {
            return Ok((d, field.to_string()));
        }
    }
    if let Some(v) = headers.index_metadata.get("dtype").and_then(|v| v.as_str()) {
        if let Some(d) =
            Precision::from_config_str(v, "model.safetensors.index.json metadata.dtype")?
        {
            return Ok((d, "index metadata.dtype".to_string()));
        }
    }
    let t = headers.first_floating().ok_or_else(|| {
        Error::Checkpoint(format!(
            "no dtype in config.json and no floating tensor in the first shard {} to infer it from",
            headers
                .shards
                .first()
                .map(|s| s.file_name.as_str())
                .unwrap_or("(none)")
        ))
    })?;
    let shard = &headers.shard_of(t).file_name;
    let d = Precision::from_safetensors(&t.dtype).ok_or_else(|| {
        Error::Checkpoint(format!(
            "{shard}: dtype inferred from the first weight {} is {}; hsparity supports F32, BF16 and F16",
            t.name, t.dtype
        ))
    })?;
    Ok((d, format!("first weight on disk ({shard}: {})", t.name)))
}
