//! Qwen3.5 MoE text decoder (`Qwen3_5MoeTextModel` + `lm_head`), after
//! `transformers/models/qwen3_5_moe/modeling_qwen3_5_moe.py` (5.23.0):
//! `Qwen3_5MoeDecoderLayer` is `Qwen3_5DecoderLayer` with its MLP slot
//! holding a `Qwen3_5MoeSparseMoeBlock`. The Gated DeltaNet, the gated
//! attention, the zero-centred RMSNorms and the partial rotary are Qwen3.5's
//! ([`crate::models::qwen3_5`]); the block is [`crate::models::moe`].
//!
//! Streaming: a layer holds its mixer, norms, router and shared expert; its
//! routed experts are read from the checkpoint one at a time when a token
//! first routes to them ([`SparseMoeBlock::load`]), so one layer's experts
//! at most are resident, and only those some token picks are widened.

use crate::checkpoint::config::LayerType;
use crate::error::{Error, Result};
use crate::loading::WeightSource;
use crate::models::decoder::{DecoderLayer, FeedForward};
use crate::models::family::{self, ModelFamily};
use crate::models::moe::SparseMoeBlock;
use crate::models::qwen3_5::{self, NORM_TENSORS};
use crate::models::TextModelSpec;
use crate::precision::Precision;

/// The tensors of a layer's sparse MoE block (`mlp.*`), as the model sees
/// them after the loading path's expert conversion.
pub const MOE_TENSORS: &[&str] = &[
    "mlp.gate.weight",
    "mlp.experts.gate_up_proj",
    "mlp.experts.down_proj",
    "mlp.shared_expert.gate_proj.weight",
    "mlp.shared_expert.up_proj.weight",
    "mlp.shared_expert.down_proj.weight",
    "mlp.shared_expert_gate.weight",
];

/// The Qwen3.5 MoE family ([`ModelFamily`]): Qwen3.5's layers with the
/// sparse MoE block in the MLP slot.
#[derive(Debug)]
pub struct Qwen3_5Moe;

impl ModelFamily for Qwen3_5Moe {
    /// `Qwen3_5MoeDecoderLayer` `layers.{i}`: Gated DeltaNet or gated
    /// attention by `layer_types[i]`, then the sparse MoE block (top-k and
    /// the router's softmax from `spec.moe`). Errors also: a spec without
    /// MoE sizes ([`Error::Config`]).
    fn load_layer(
        &self,
        spec: &TextModelSpec,
        src: &dyn WeightSource,
        i: usize,
        prec: Precision,
    ) -> Result<DecoderLayer> {
        let moe = spec.moe.ok_or_else(|| {
            Error::Config("a qwen3_5_moe model needs num_experts and num_experts_per_tok".into())
        })?;
        let block = SparseMoeBlock::load(
            src,
            &format!("layers.{i}.mlp"),
            moe.config.num_experts_per_tok,
            prec,
        )?
        .with_router_softmax(moe.router_softmax);
        qwen3_5::load_layer_with(spec, src, i, prec, FeedForward::SparseMoe(block))
    }

    /// The mixer's, the norms and the MoE block's.
    fn layer_tensor_names(&self, i: usize, ty: LayerType) -> Vec<String> {
        family::layer_names(
            i,
            &[qwen3_5::mixer_tensor_names(ty), NORM_TENSORS, MOE_TENSORS],
        )
    }

    fn zero_centred_norms(&self) -> bool {
        true
    }
}
