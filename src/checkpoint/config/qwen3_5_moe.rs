//! The Qwen3.5 MoE config (`model_type: qwen3_5_moe` with its text model
//! under `text_config`, or a text-only `qwen3_5_moe_text`;
//! `transformers/models/qwen3_5_moe/configuration_qwen3_5_moe.py::Qwen3_5MoeTextConfig`,
//! 5.23.0): the hybrid Qwen3.5 decoder with every MLP replaced by a sparse
//! MoE block. Its own defaults for the sizes that differ from
//! `Qwen3_5TextConfig` (`hidden_size` 2048, 40 layers, 2 key/value heads)
//! and the MoE fields (`num_experts` 256, `num_experts_per_tok` 8,
//! `moe_intermediate_size` 512, `shared_expert_intermediate_size` 512); the
//! rest as the shared [`TextConfig`] reads it. There is no dense
//! `intermediate_size` (the field is read but unused) and no
//! `norm_topk_prob` switch (the router always renormalises).

use serde::{Deserialize, Serialize};

use super::{Family, TextConfig};

/// The fields [`Qwen3_5MoeConfig`] reads (the shared [`TextConfig`] never sees them).
pub const SIZE_FIELDS: [&str; 7] = [
    "hidden_size",
    "num_hidden_layers",
    "num_key_value_heads",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
];

/// The sparse MoE block's sizes (`Qwen3_5MoeSparseMoeBlock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MoeConfig {
    /// `num_experts` E (routed experts per layer).
    pub num_experts: usize,
    /// `num_experts_per_tok` k (top-k).
    pub num_experts_per_tok: usize,
    /// `moe_intermediate_size` I of each routed expert.
    pub moe_intermediate_size: usize,
    /// `shared_expert_intermediate_size` S of the shared expert.
    pub shared_expert_intermediate_size: usize,
}

impl MoeConfig {
    /// Checks the MoE sizes (messages name the field with `prefix`): each at
    /// least 1, `num_experts_per_tok <= num_experts`, and expert weights
    /// whose element counts (in f64 bytes) fit.
    pub fn check(&self, prefix: &str, hidden: usize) -> std::result::Result<(), String> {
        for (name, v) in [
            ("num_experts", self.num_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("moe_intermediate_size", self.moe_intermediate_size),
            (
                "shared_expert_intermediate_size",
                self.shared_expert_intermediate_size,
            ),
        ] {
            if v == 0 {
                return Err(format!("{prefix}{name} = 0: must be at least 1"));
            }
        }
        if self.num_experts_per_tok > self.num_experts {
            return Err(format!(
                "{prefix}num_experts_per_tok = {} exceeds {prefix}num_experts = {}",
                self.num_experts_per_tok, self.num_experts
            ));
        }
        let fits = self
            .num_experts
            .checked_mul(self.moe_intermediate_size)
            .and_then(|x| x.checked_mul(2))
            .and_then(|x| x.checked_mul(hidden))
            .and_then(|x| x.checked_mul(8))
            .and_then(|_| self.shared_expert_intermediate_size.checked_mul(hidden))
            .and_then(|x| x.checked_mul(8));
        fits.map(|_| ()).ok_or_else(|| {
            format!(
                "{prefix}num_experts {}, {prefix}moe_intermediate_size {} and {prefix}hidden_size {hidden} \
                 give expert weights whose element counts overflow",
                self.num_experts, self.moe_intermediate_size
            )
        })
    }
}

/// `Qwen3_5MoeTextConfig`'s fields with their MoE defaults. `null` counts as
/// absent, as the Python dataclass defaults do.
#[derive(Debug, Clone, Deserialize)]
pub struct Qwen3_5MoeConfig {
    /// `hidden_size` (2048).
    #[serde(default)]
    pub hidden_size: Option<usize>,
    /// `num_hidden_layers` (40).
    #[serde(default)]
    pub num_hidden_layers: Option<usize>,
    /// `num_key_value_heads` (2).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// `num_experts` (256).
    #[serde(default)]
    pub num_experts: Option<usize>,
    /// `num_experts_per_tok` (8).
    #[serde(default)]
    pub num_experts_per_tok: Option<usize>,
    /// `moe_intermediate_size` (512).
    #[serde(default)]
    pub moe_intermediate_size: Option<usize>,
    /// `shared_expert_intermediate_size` (512).
    #[serde(default)]
    pub shared_expert_intermediate_size: Option<usize>,
}

impl Qwen3_5MoeConfig {
    /// The shared text config of this MoE model (family
    /// [`Family::Qwen3_5Moe`]): these sizes (or their defaults) over `rest`,
    /// the other fields read without `SIZE_FIELDS`.
    pub fn into_text(self, rest: TextConfig) -> TextConfig {
        TextConfig {
            hidden_size: self.hidden_size.unwrap_or(2048),
            num_hidden_layers: self.num_hidden_layers.unwrap_or(40),
            num_key_value_heads: self.num_key_value_heads.unwrap_or(2),
            moe: Some(MoeConfig {
                num_experts: self.num_experts.unwrap_or(256),
                num_experts_per_tok: self.num_experts_per_tok.unwrap_or(8),
                moe_intermediate_size: self.moe_intermediate_size.unwrap_or(512),
                shared_expert_intermediate_size: self
                    .shared_expert_intermediate_size
                    .unwrap_or(512),
            }),
            family: Family::Qwen3_5Moe,
            ..rest
        }
    }
}
