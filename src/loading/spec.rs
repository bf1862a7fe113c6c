//! What a transformers model instance expects: state-dict keys (relative to
//! the text model or the vision tower), shapes derived from the config, and
//! the init each would get when missing from the checkpoint.
//!
//! Follows `transformers/models/qwen3_5/modeling_qwen3_5.py` (5.23.0):
//! `Qwen3_5GatedDeltaNet.__init__` (500-542), `Qwen3_5Attention.__init__`
//! (745-767), `Qwen3_5DecoderLayer` (854-865), `Qwen3_5TextModel` (1203-1288),
//! `Qwen3_5VisionModel` (1117-1200), `Qwen3_5PreTrainedModel._init_weights`
//! (926-938) and `modeling_utils.py::PreTrainedModel._init_weights` (2295-2345).
//! The MoE family (`modeling_qwen3_5_moe.py`) has the same layers with the
//! MLP slot holding a sparse MoE block ([`moe_tensors`]).
//! Key order is `state_dict()` order (module registration order).

use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::checkpoint::config::{Family, LayerType, MoeConfig, TextConfig};
use crate::error::{Error, Result};

/// The init transformers gives a parameter that is missing from the
/// checkpoint ("newly initialized" in the LOAD REPORT).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InitRule {
    /// `normal_(0, std)`: Linear, Conv and Embedding weights (`std = initializer_range`).
    Normal {
        /// Standard deviation (`initializer_range`).
        std: f64,
    },
    /// `zeros_`: zero-centred `Qwen3_5RMSNorm` weights, biases.
    Zeros,
    /// `ones_`: `Qwen3_5RMSNormGated` weight (`linear_attn.norm.weight`), `dt_bias`, LayerNorm weights.
    Ones,
    /// `A_log = log(U(lo, hi))` (`Qwen3_5PreTrainedModel._init_weights`, lo 0.01, hi 16).
    LogUniform {
        /// Lower bound of U.
        lo: f64,
        /// Upper bound of U.
        hi: f64,
    },
}

impl fmt::Display for InitRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitRule::Normal { std } => write!(f, "normal(0, {std})"),
            InitRule::Zeros => write!(f, "zeros"),
            InitRule::Ones => write!(f, "ones"),
            InitRule::LogUniform { lo, hi } => write!(f, "log(U({lo}, {hi}))"),
        }
    }
}

/// Which part of the model a tensor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Component {
    /// The text decoder (`embed_tokens`, `layers.*`, `norm`).
    LanguageModel,
    /// The vision tower (`visual.*`).
    VisionTower,
    /// Multi-token-prediction head (`mtp.*`; checkpoint only, no transformers module).
    Mtp,
    /// The output projection `lm_head.weight`.
    LmHead,
}

impl Component {
    /// snake_case name used in reports (`language_model`, `vision_tower`, `mtp`, `lm_head`).
    pub fn as_str(self) -> &'static str {
        match self {
            Component::LanguageModel => "language_model",
            Component::VisionTower => "vision_tower",
            Component::Mtp => "mtp",
            Component::LmHead => "lm_head",
        }
    }

    /// Component of a checkpoint key (any prefix spelling).
    pub fn of_checkpoint_key(key: &str) -> Component {
        if key.starts_with("mtp") {
            Component::Mtp
        } else if key == "lm_head.weight" || key.starts_with("lm_head.") {
            Component::LmHead
        } else if key.starts_with("model.visual.") || key.starts_with("visual.") {
            Component::VisionTower
        } else {
            Component::LanguageModel
        }
    }
}

/// One parameter a model expects.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpectedTensor {
    /// Key relative to its sub-model (`layers.0.mlp.up_proj.weight`, `blocks.3.attn.qkv.bias`).
    pub key: String,
    /// Shape derived from the config.
    pub shape: Vec<usize>,
    /// Init used when missing.
    pub init: InitRule,
}

fn t(key: String, shape: Vec<usize>, init: InitRule) -> ExpectedTensor {
    ExpectedTensor { key, shape, init }
}

/// Text-model parameters (`Qwen3_5TextModel.state_dict()` order):
/// `embed_tokens.weight [V, H]`, per layer 14 tensors (linear attention) or
/// 11 (full attention; the MoE family: 18 or 15), `norm.weight [H]`. With `lm_head`, append
/// [`lm_head_tensor`].
///
/// Errors: invalid `layer_types` ([`Error::Config`]).
pub fn text_tensors(tc: &TextConfig) -> Result<Vec<ExpectedTensor>> {
    let h = tc.hidden_size;
    let i_ = tc.intermediate_size;
    let normal = InitRule::Normal {
        std: tc.initializer_range,
    };
    let dk = tc.linear_num_key_heads * tc.linear_key_head_dim;
    let dv = tc.linear_num_value_heads * tc.linear_value_head_dim;
    let nv = tc.linear_num_value_heads;
    let conv = 2 * dk + dv;
    let (nh, nkv, hd) = (tc.num_attention_heads, tc.num_key_value_heads, tc.head_dim);
    // Qwen3.5: q_proj holds [query | gate] per head, RMSNorms are zero-centred
    // (zeros init). Qwen3: plain q_proj, RMSNorms `w·x` (ones init).
    let (q_rows, norm_init) = match tc.family {
        Family::Qwen3_5 | Family::Qwen3_5Moe => (2 * nh * hd, InitRule::Zeros),
        Family::Qwen3 => (nh * hd, InitRule::Ones),
    };
    let mut v = vec![t(
        "embed_tokens.weight".into(),
        vec![tc.vocab_size, h],
        normal,
    )];
    for (l, ty) in tc.layer_types()?.into_iter().enumerate() {
        let p = |s: &str| format!("layers.{l}.{s}");
        match ty {
            LayerType::LinearAttention => {
                v.push(t(p("linear_attn.dt_bias"), vec![nv], InitRule::Ones));
                v.push(t(
                    p("linear_attn.A_log"),
                    vec![nv],
                    InitRule::LogUniform { lo: 0.01, hi: 16.0 },
                ));
                v.push(t(
                    p("linear_attn.conv1d.weight"),
                    vec![conv, 1, tc.linear_conv_kernel_dim],
                    normal,
                ));
                v.push(t(
                    p("linear_attn.norm.weight"),
                    vec![tc.linear_value_head_dim],
                    InitRule::Ones,
                ));
                v.push(t(p("linear_attn.out_proj.weight"), vec![h, dv], normal));
                v.push(t(
                    p("linear_attn.in_proj_qkv.weight"),
                    vec![conv, h],
                    normal,
                ));
                v.push(t(p("linear_attn.in_proj_z.weight"), vec![dv, h], normal));
                v.push(t(p("linear_attn.in_proj_b.weight"), vec![nv, h], normal));
                v.push(t(p("linear_attn.in_proj_a.weight"), vec![nv, h], normal));
            }
            LayerType::FullAttention => {
                v.push(t(p("self_attn.q_proj.weight"), vec![q_rows, h], normal));
                v.push(t(p("self_attn.k_proj.weight"), vec![nkv * hd, h], normal));
                v.push(t(p("self_attn.v_proj.weight"), vec![nkv * hd, h], normal));
                v.push(t(p("self_attn.o_proj.weight"), vec![h, nh * hd], normal));
                v.push(t(p("self_attn.q_norm.weight"), vec![hd], norm_init));
                v.push(t(p("self_attn.k_norm.weight"), vec![hd], norm_init));
            }
        }
        match &tc.moe {
            Some(moe) => v.extend(moe_tensors(&p("mlp"), moe, h, normal)),
            None => {
                v.push(t(p("mlp.gate_proj.weight"), vec![i_, h], normal));
                v.push(t(p("mlp.up_proj.weight"), vec![i_, h], normal));
                v.push(t(p("mlp.down_proj.weight"), vec![h, i_], normal));
            }
        }
        v.push(t(p("input_layernorm.weight"), vec![h], norm_init));
        v.push(t(p("post_attention_layernorm.weight"), vec![h], norm_init));
    }
    v.push(t("norm.weight".into(), vec![h], norm_init));
    Ok(v)
}

/// The sparse MoE block `{mlp}.*` of one `Qwen3_5MoeDecoderLayer`
/// (`Qwen3_5MoeSparseMoeBlock.__init__`, registration order): the router
/// `gate.weight [E, H]`, the fused experts `experts.gate_up_proj [E, 2I, H]`
/// and `experts.down_proj [E, H, I]` (no `.weight` suffix), the shared
/// expert `shared_expert.{gate,up,down}_proj.weight` (`[S, H]`, `[S, H]`,
/// `[H, S]`) and `shared_expert_gate.weight [1, H]`. All `normal(0,
/// initializer_range)` when missing (`Qwen3_5MoePreTrainedModel._init_weights`:
/// the experts and the router explicitly, the linears by default).
pub fn moe_tensors(mlp: &str, moe: &MoeConfig, h: usize, normal: InitRule) -> Vec<ExpectedTensor> {
    let (e, i, s) = (
        moe.num_experts,
        moe.moe_intermediate_size,
        moe.shared_expert_intermediate_size,
    );
    [
        ("gate.weight", vec![e, h]),
        ("experts.gate_up_proj", vec![e, 2 * i, h]),
        ("experts.down_proj", vec![e, h, i]),
        ("shared_expert.gate_proj.weight", vec![s, h]),
        ("shared_expert.up_proj.weight", vec![s, h]),
        ("shared_expert.down_proj.weight", vec![h, s]),
        ("shared_expert_gate.weight", vec![1, h]),
    ]
    .into_iter()
    .map(|(k, shape)| t(format!("{mlp}.{k}"), shape, normal))
    .collect()
}

/// `lm_head.weight [V, H]`, `normal(0, initializer_range)` when missing.
pub fn lm_head_tensor(tc: &TextConfig) -> ExpectedTensor {
    t(
        "lm_head.weight".into(),
        vec![tc.vocab_size, tc.hidden_size],
        InitRule::Normal {
            std: tc.initializer_range,
        },
    )
}

fn vget(vc: &Value, k: &str, default: usize) -> Result<usize> {
    match vc.get(k) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_u64().map(|x| x as usize).ok_or_else(|| {
            Error::Config(format!(
                "vision_config.{k} = {v}: expected a non-negative integer"
            ))
        }),
    }
}

/// Vision-tower parameters (`Qwen3_5VisionModel.state_dict()` order):
/// `patch_embed.proj.{weight [vh, C, tp, p, p], bias}`, `pos_embed.weight [P, vh]`,
/// 12 per block (`norm1/norm2` LayerNorms, `attn.qkv [3vh, vh]`, `attn.proj`,
/// `mlp.linear_fc1 [vI, vh]`, `mlp.linear_fc2`, each with bias), then
/// `merger.{norm [vh], linear_fc1 [4vh, 4vh], linear_fc2 [out, 4vh]}` (6), and,
/// when `deepstack_visual_indexes` is non-empty, 6 per entry under
/// `deepstack_merger_list.{k}.` with a post-shuffle norm `[4vh]` (Qwen3-VL
/// naming). `4vh` = `hidden_size · spatial_merge_size²`.
///
/// Defaults follow `configuration_qwen3_5.py::Qwen3_5VisionConfig`.
/// Errors: a non-integer size field ([`Error::Config`]).
pub fn vision_tensors(vc: Option<&Value>) -> Result<Vec<ExpectedTensor>> {
    let empty = Value::Object(Default::default());
    let vc = vc.unwrap_or(&empty);
    let depth = vget(vc, "depth", 27)?;
    let vh = vget(vc, "hidden_size", 1152)?;
    let vi = vget(vc, "intermediate_size", 4304)?;
    let ch = vget(vc, "in_channels", 3)?;
    let p = vget(vc, "patch_size", 16)?;
    let tp = vget(vc, "temporal_patch_size", 2)?;
    let merge = vget(vc, "spatial_merge_size", 2)?;
    let out = vget(vc, "out_hidden_size", 3584)?;
    let npos = vget(vc, "num_position_embeddings", 2304)?;
    let std = vc
        .get("initializer_range")
        .and_then(Value::as_f64)
        .unwrap_or(0.02);
    let deepstack = vc
        .get("deepstack_visual_indexes")
        .and_then(Value::as_array)
        .map(Vec::len)
        .unwrap_or(0);
    let normal = InitRule::Normal { std };
    let (ones, zeros) = (InitRule::Ones, InitRule::Zeros);
    let m = vh * merge * merge;
    let mut v = vec![
        t(
            "patch_embed.proj.weight".into(),
            vec![vh, ch, tp, p, p],
            normal,
        ),
        t("patch_embed.proj.bias".into(), vec![vh], zeros),
        t("pos_embed.weight".into(), vec![npos, vh], normal),
    ];
    for b in 0..depth {
        let k = |s: &str| format!("blocks.{b}.{s}");
        v.push(t(k("norm1.weight"), vec![vh], ones));
        v.push(t(k("norm1.bias"), vec![vh], zeros));
        v.push(t(k("norm2.weight"), vec![vh], ones));
        v.push(t(k("norm2.bias"), vec![vh], zeros));
        v.push(t(k("attn.qkv.weight"), vec![3 * vh, vh], normal));
        v.push(t(k("attn.qkv.bias"), vec![3 * vh], zeros));
        v.push(t(k("attn.proj.weight"), vec![vh, vh], normal));
        v.push(t(k("attn.proj.bias"), vec![vh], zeros));
        v.push(t(k("mlp.linear_fc1.weight"), vec![vi, vh], normal));
        v.push(t(k("mlp.linear_fc1.bias"), vec![vi], zeros));
        v.push(t(k("mlp.linear_fc2.weight"), vec![vh, vi], normal));
        v.push(t(k("mlp.linear_fc2.bias"), vec![vh], zeros));
    }
    let merger = |prefix: String, norm_dim: usize, v: &mut Vec<ExpectedTensor>| {
        v.push(t(format!("{prefix}norm.weight"), vec![norm_dim], ones));
        v.push(t(format!("{prefix}norm.bias"), vec![norm_dim], zeros));
        v.push(t(format!("{prefix}linear_fc1.weight"), vec![m, m], normal));
        v.push(t(format!("{prefix}linear_fc1.bias"), vec![m], zeros));
        v.push(t(
            format!("{prefix}linear_fc2.weight"),
            vec![out, m],
            normal,
        ));
        v.push(t(format!("{prefix}linear_fc2.bias"), vec![out], zeros));
    };
    merger("merger.".into(), vh, &mut v);
    for d in 0..deepstack {
        merger(format!("deepstack_merger_list.{d}."), m, &mut v);
    }
    Ok(v)
}
