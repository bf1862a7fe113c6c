//! The text-model config (`Qwen3_5TextConfig` fields; the Qwen3 dense
//! config converts into it, see [`super::qwen3`]): sizes, layer types, rope,
//! and the invariants the forward relies on.

use serde::Deserialize;

use super::Family;
use crate::error::{Error, Result};

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
    /// Legacy top-level `rope_theta`.
    pub rope_theta: Option<f64>,
    /// `partial_rotary_factor`.
    #[serde(default)]
    /// Top-level `partial_rotary_factor` (when not in `rope_parameters`).
    pub partial_rotary_factor: Option<f64>,
}

/// Text model config (`Qwen3_5TextConfig`). Defaults follow
/// `configuration_qwen3_5.py` (5.23.0, lines 82-117). Fields hsparity does
/// not use are ignored, as transformers keeps unknown keys as attributes.
#[derive(Debug, Clone, Deserialize)]
pub struct TextConfig {
    #[serde(default = "d_vocab")]
    /// `vocab_size` (rows of the embedding and LM head).
    pub vocab_size: usize,
    #[serde(default = "d_hidden")]
    /// `hidden_size` H.
    pub hidden_size: usize,
    #[serde(default = "d_inter")]
    /// `intermediate_size` of the MLP.
    pub intermediate_size: usize,
    #[serde(default = "d_layers")]
    /// `num_hidden_layers` N.
    pub num_hidden_layers: usize,
    #[serde(default = "d_heads")]
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    #[serde(default = "d_kv_heads")]
    /// `num_key_value_heads` (GQA).
    pub num_key_value_heads: usize,
    #[serde(default = "d_head_dim")]
    /// `head_dim`.
    pub head_dim: usize,
    #[serde(default = "d_eps")]
    /// `rms_norm_eps`.
    pub rms_norm_eps: f64,
    #[serde(default = "d_max_pos")]
    /// `max_position_embeddings`: the longest sequence.
    pub max_position_embeddings: usize,
    #[serde(default = "d_init_range")]
    /// `initializer_range`: std of the normal init of MISSING weights.
    pub initializer_range: f64,
    #[serde(default)]
    /// `tie_word_embeddings` of the text config (`None` when absent).
    pub tie_word_embeddings: Option<bool>,
    /// `dtype` (the legacy `torch_dtype` is used when `dtype` is absent).
    #[serde(default)]
    pub dtype: Option<String>,
    #[serde(default)]
    /// `layer_types` as written (see [`TextConfig::layer_types`]).
    pub layer_types: Option<Vec<String>>,
    #[serde(default = "d_interval")]
    /// `full_attention_interval`: derives `layer_types` when absent.
    pub full_attention_interval: usize,
    #[serde(default = "d_conv")]
    /// `linear_conv_kernel_dim` K of the Gated DeltaNet causal conv.
    pub linear_conv_kernel_dim: usize,
    #[serde(default = "d_lin_dim")]
    /// `linear_key_head_dim` dk.
    pub linear_key_head_dim: usize,
    #[serde(default = "d_lin_dim")]
    /// `linear_value_head_dim` dv.
    pub linear_value_head_dim: usize,
    #[serde(default = "d_lin_k_heads")]
    /// `linear_num_key_heads` nk.
    pub linear_num_key_heads: usize,
    #[serde(default = "d_lin_v_heads")]
    /// `linear_num_value_heads` nv.
    pub linear_num_value_heads: usize,
    /// `hidden_act` (default `silu`, the only one implemented).
    #[serde(default)]
    pub hidden_act: Option<String>,
    #[serde(default, deserialize_with = "rope_object")]
    /// `rope_parameters` (transformers 5 spelling).
    pub rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    /// Legacy top-level `rope_theta`.
    pub rope_theta: Option<f64>,
    #[serde(default, deserialize_with = "rope_object")]
    /// Legacy `rope_scaling`.
    pub rope_scaling: Option<RopeParameters>,
    #[serde(default)]
    /// Top-level `partial_rotary_factor` (when not in `rope_parameters`).
    pub partial_rotary_factor: Option<f64>,
    #[serde(default)]
    /// The text config's own `model_type`, when written.
    pub model_type: Option<String>,
    /// Qwen3 `use_sliding_window` (sliding layers are not implemented).
    #[serde(default)]
    pub use_sliding_window: Option<bool>,
    /// Decoder family (from the top-level `model_type`, not a JSON field).
    #[serde(skip)]
    pub family: Family,
    /// The sparse MoE block's sizes ([`Family::Qwen3_5Moe`] only; read by
    /// [`super::Qwen3_5MoeConfig`], not by this struct).
    #[serde(skip)]
    pub moe: Option<super::MoeConfig>,
}

/// `rope_parameters` / `rope_scaling`: null, or an object. serde would read
/// a struct from a JSON array by position (an empty array as every default);
/// transformers reads these as dicts (`rope_parameters.get("rope_type")`), so
/// anything but an object is refused.
fn rope_object<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<RopeParameters>, D::Error> {
    use serde::de::{value::MapAccessDeserializer, MapAccess, Visitor};
    struct MapOnly;
    impl<'de> Visitor<'de> for MapOnly {
        type Value = RopeParameters;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object such as {\"rope_type\": \"default\", \"rope_theta\": 10000000}")
        }
        fn visit_map<A: MapAccess<'de>>(
            self,
            m: A,
        ) -> std::result::Result<RopeParameters, A::Error> {
            RopeParameters::deserialize(MapAccessDeserializer::new(m))
        }
    }
    struct Opt;
    impl<'de> Visitor<'de> for Opt {
        type Value = Option<RopeParameters>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("null or an object")
        }
        fn visit_none<E>(self) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: serde::Deserializer<'de>>(
            self,
            d: D2,
        ) -> std::result::Result<Self::Value, D2::Error> {
            d.deserialize_map(MapOnly).map(Some)
        }
    }
    d.deserialize_option(Opt)
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
        self.check_layer_types(prefix)?;
        let n = self.full_attention_interval.max(1);
        Ok(match (&self.layer_types, self.family) {
            (_, Family::Qwen3) => vec![LayerType::FullAttention; self.num_hidden_layers],
            (Some(v), _) => v
                .iter()
                .map(|s| match s.as_str() {
                    "full_attention" => LayerType::FullAttention,
                    _ => LayerType::LinearAttention,
                })
                .collect(),
            (None, _) => (0..self.num_hidden_layers)
                .map(|i| {
                    if (i + 1) % n != 0 {
                        LayerType::LinearAttention
                    } else {
                        LayerType::FullAttention
                    }
                })
                .collect(),
        })
    }

    /// The checks of [`Self::layer_types`] without building the list (a
    /// config is checked before its sizes are known to be backed by the
    /// checkpoint, so nothing is allocated from `num_hidden_layers` here).
    fn check_layer_types(&self, prefix: &str) -> std::result::Result<(), String> {
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
            return Ok(());
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
                match v
                    .iter()
                    .enumerate()
                    .find(|(_, s)| !matches!(s.as_str(), "linear_attention" | "full_attention"))
                {
                    Some((i, other)) => Err(format!(
                        "{prefix}layer_types[{i}] = {other:?}: expected \"linear_attention\" or \"full_attention\""
                    )),
                    None => Ok(()),
                }
            }
            None => {
                let n = self.full_attention_interval;
                if n == 0 {
                    return Err(format!(
                        "{prefix}full_attention_interval = 0: must be at least 1 (transformers derives \
                         layer_types as (i + 1) % full_attention_interval)"
                    ));
                }
                Ok(())
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
                Family::Qwen3_5 | Family::Qwen3_5Moe => 0.25,
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
    pub(super) fn check(&self, prefix: &str) -> std::result::Result<(), String> {
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
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(format!(
                "{prefix}num_attention_heads {} is not a multiple of {prefix}num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self
            .linear_num_value_heads
            .is_multiple_of(self.linear_num_key_heads)
        {
            return Err(format!(
                "{prefix}linear_num_value_heads {} is not a multiple of {prefix}linear_num_key_heads {}",
                self.linear_num_value_heads, self.linear_num_key_heads
            ));
        }
        let rd = self.rotary_dim();
        if !rd.is_multiple_of(2) || rd == 0 || rd > self.head_dim {
            return Err(format!(
                "rotary dim {rd} ({prefix}head_dim {} x partial_rotary_factor {prf}) must be even, at least 2 and <= head_dim",
                self.head_dim
            ));
        }
        self.check_layer_types(prefix)?;
        if let Some(moe) = &self.moe {
            moe.check(prefix, self.hidden_size)?;
        }
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
