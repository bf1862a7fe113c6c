//! Qwen3 dense text decoder (`Qwen3Model` + `lm_head`), after
//! `transformers/models/qwen3/modeling_qwen3.py` (5.23.0): full attention
//! only, ungated, with q/k norms, plain RMSNorms (`w·norm(x)`), full rotary.
//! Its config is [`crate::checkpoint::config::Qwen3Config`].

use crate::error::Result;
use crate::loading::WeightSource;
use crate::models::decoder::{DecoderLayer, Mixer};
use crate::models::layers::attention::Attention;
use crate::models::layers::mlp::Mlp;
use crate::models::layers::norm::{Norm, PlainRmsNorm};
use crate::models::qwen3_5::{ATTENTION_TENSORS, MLP_AND_NORM_TENSORS};
use crate::models::TextModelSpec;
use crate::precision::Precision;

/// `Qwen3RMSNorm` `{prefix}.weight`.
pub fn norm(src: &dyn WeightSource, prefix: &str, eps: f64, prec: Precision) -> Result<Norm> {
    Ok(Norm::Plain(PlainRmsNorm::load(src, prefix, eps, prec)?))
}

/// `Qwen3DecoderLayer` `layers.{i}`. Errors: any tensor missing or unreadable.
pub fn load_layer(
    spec: &TextModelSpec,
    src: &dyn WeightSource,
    i: usize,
    prec: Precision,
) -> Result<DecoderLayer> {
    let p = format!("layers.{i}");
    let geo = spec.geo.with_precision(prec);
    let eps = geo.eps;
    Ok(DecoderLayer {
        input_layernorm: norm(src, &format!("{p}.input_layernorm"), eps, prec)?,
        mixer: Mixer::Full(Attention::load(
            src,
            &format!("{p}.self_attn"),
            geo,
            false,
            |n| norm(src, n, eps, prec),
        )?),
        post_attention_layernorm: norm(src, &format!("{p}.post_attention_layernorm"), eps, prec)?,
        mlp: Mlp::load(src, &format!("{p}.mlp"), prec)?.into(),
        prec,
    })
}

/// Names (relative to the text model) of every tensor layer `i` reads.
pub fn layer_tensor_names(i: usize) -> Vec<String> {
    ATTENTION_TENSORS
        .iter()
        .chain(MLP_AND_NORM_TENSORS)
        .map(|s| format!("layers.{i}.{s}"))
        .collect()
}
