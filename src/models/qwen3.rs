//! Qwen3 dense text decoder (`Qwen3Model` + `lm_head`), after
//! `transformers/models/qwen3/modeling_qwen3.py` (5.23.0): full attention
//! only, ungated, with q/k norms, plain RMSNorms (`w·norm(x)`), full rotary.
//! Its config is [`crate::checkpoint::config::Qwen3Config`].

use crate::checkpoint::config::LayerType;
use crate::error::Result;
use crate::loading::WeightSource;
use crate::models::decoder::{DecoderLayer, Mixer};
use crate::models::family::{self, ModelFamily};
use crate::models::layers::attention::Attention;
use crate::models::layers::mlp::Mlp;
use crate::models::layers::norm::{Norm, PlainRmsNorm};
use crate::models::qwen3_5::{ATTENTION_TENSORS, MLP_TENSORS, NORM_TENSORS};
use crate::models::TextModelSpec;
use crate::precision::Precision;

/// The Qwen3 dense family ([`ModelFamily`]): full attention only, ungated,
/// with the Qwen3.5 family's tensor names.
#[derive(Debug)]
pub struct Qwen3;

impl ModelFamily for Qwen3 {
    /// `Qwen3DecoderLayer` `layers.{i}`.
    fn load_layer(
        &self,
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
            post_attention_layernorm: norm(
                src,
                &format!("{p}.post_attention_layernorm"),
                eps,
                prec,
            )?,
            mlp: Mlp::load(src, &format!("{p}.mlp"), prec)?.into(),
            prec,
        })
    }

    /// Every layer is full attention, whatever `_ty` says.
    fn layer_tensor_names(&self, i: usize, _ty: LayerType) -> Vec<String> {
        family::layer_names(i, &[ATTENTION_TENSORS, NORM_TENSORS, MLP_TENSORS])
    }

    fn zero_centred_norms(&self) -> bool {
        false
    }
}

/// `Qwen3RMSNorm` `{prefix}.weight`.
pub fn norm(src: &dyn WeightSource, prefix: &str, eps: f64, prec: Precision) -> Result<Norm> {
    Ok(Norm::Plain(PlainRmsNorm::load(src, prefix, eps, prec)?))
}
