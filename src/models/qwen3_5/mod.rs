//! Qwen3.5 hybrid text decoder (`Qwen3_5TextModel` + `lm_head`), after
//! `transformers/models/qwen3_5/modeling_qwen3_5.py` (5.23.0): Gated
//! DeltaNet ([`gated_delta_net`]) and gated full attention layers, with
//! zero-centred RMSNorms (`norm(x)·(1+w)`) and partial rotary.

mod delta_rule;
pub mod gated_delta_net;

use crate::checkpoint::config::LayerType;
use crate::error::Result;
use crate::loading::WeightSource;
use crate::models::decoder::{DecoderLayer, FeedForward, Mixer};
use crate::models::family::{self, ModelFamily};
use crate::models::layers::attention::Attention;
use crate::models::layers::mlp::Mlp;
use crate::models::layers::norm::{Norm, RmsNorm};
use crate::models::TextModelSpec;
use crate::precision::Precision;
use gated_delta_net::GatedDeltaNet;

/// The Qwen3.5 family ([`ModelFamily`]).
#[derive(Debug)]
pub struct Qwen3_5;

impl ModelFamily for Qwen3_5 {
    /// `Qwen3_5DecoderLayer` `layers.{i}`: Gated DeltaNet or gated attention
    /// by `layer_types[i]`, then the dense MLP.
    fn load_layer(
        &self,
        spec: &TextModelSpec,
        src: &dyn WeightSource,
        i: usize,
        prec: Precision,
    ) -> Result<DecoderLayer> {
        let mlp = Mlp::load(src, &format!("layers.{i}.mlp"), prec)?.into();
        load_layer_with(spec, src, i, prec, mlp)
    }

    fn layer_tensor_names(&self, i: usize, ty: LayerType) -> Vec<String> {
        family::layer_names(i, &[mixer_tensor_names(ty), NORM_TENSORS, MLP_TENSORS])
    }

    fn zero_centred_norms(&self) -> bool {
        true
    }
}

/// `Qwen3_5RMSNorm` `{prefix}.weight`.
pub fn norm(src: &dyn WeightSource, prefix: &str, eps: f64, prec: Precision) -> Result<Norm> {
    Ok(Norm::ZeroCentred(RmsNorm::load(src, prefix, eps, prec)?))
}

/// Layer `layers.{i}` of the Qwen3.5 families around its feed-forward `mlp`
/// (the dense MLP here, the sparse MoE block in `qwen3_5_moe`): the mixer
/// by `layer_types[i]` and the two zero-centred norms.
///
/// Errors: any tensor missing or unreadable.
pub fn load_layer_with(
    spec: &TextModelSpec,
    src: &dyn WeightSource,
    i: usize,
    prec: Precision,
    mlp: FeedForward,
) -> Result<DecoderLayer> {
    let p = format!("layers.{i}");
    let geo = spec.geo.with_precision(prec);
    let eps = geo.eps;
    let mixer = match spec.layer_types[i] {
        LayerType::LinearAttention => {
            Mixer::Linear(GatedDeltaNet::load(src, &format!("{p}.linear_attn"), geo)?)
        }
        LayerType::FullAttention => Mixer::Full(Attention::load(
            src,
            &format!("{p}.self_attn"),
            geo,
            true,
            |n| norm(src, n, eps, prec),
        )?),
    };
    Ok(DecoderLayer {
        input_layernorm: norm(src, &format!("{p}.input_layernorm"), eps, prec)?,
        mixer,
        post_attention_layernorm: norm(src, &format!("{p}.post_attention_layernorm"), eps, prec)?,
        mlp,
        prec,
    })
}

/// The tensors of a layer's mixer (`layer_types[i]`), relative to the layer.
pub fn mixer_tensor_names(ty: LayerType) -> &'static [&'static str] {
    match ty {
        LayerType::LinearAttention => GATED_DELTA_NET_TENSORS,
        LayerType::FullAttention => ATTENTION_TENSORS,
    }
}

/// The tensors of a `linear_attn` (Gated DeltaNet) block.
pub const GATED_DELTA_NET_TENSORS: &[&str] = &[
    "linear_attn.in_proj_qkv.weight",
    "linear_attn.in_proj_z.weight",
    "linear_attn.in_proj_b.weight",
    "linear_attn.in_proj_a.weight",
    "linear_attn.conv1d.weight",
    "linear_attn.dt_bias",
    "linear_attn.A_log",
    "linear_attn.norm.weight",
    "linear_attn.out_proj.weight",
];

/// The tensors of a `self_attn` block.
pub const ATTENTION_TENSORS: &[&str] = &[
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
];

/// The two norms of a decoder layer.
pub const NORM_TENSORS: &[&str] = &["input_layernorm.weight", "post_attention_layernorm.weight"];

/// The tensors of a dense SwiGLU MLP.
pub const MLP_TENSORS: &[&str] = &[
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];
