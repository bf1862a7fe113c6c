//! A model family as one trait: each family's file (`qwen3_5`, `qwen3`,
//! `qwen3_5_moe`) implements [`ModelFamily`] — how it builds a decoder
//! layer, which tensors that layer reads, its RMSNorm — and a family that
//! extends another reuses its blocks by import, as candle's `qwen3_moe.rs`
//! reuses `qwen3.rs`. The config's [`Family`] picks the implementation once,
//! in [`of`], when the spec is built ([`super::TextModelSpec::new`]).

use std::fmt;

use crate::checkpoint::config::{Family, LayerType};
use crate::error::Result;
use crate::loading::WeightSource;
use crate::models::decoder::DecoderLayer;
use crate::models::layers::norm::Norm;
use crate::models::TextModelSpec;
use crate::precision::Precision;

/// What a model family's file provides.
pub trait ModelFamily: fmt::Debug + Send + Sync {
    /// Decoder layer `layers.{i}` of `spec` read from `src`, computing in
    /// `prec`.
    ///
    /// Errors: any tensor missing or unreadable.
    fn load_layer(
        &self,
        spec: &TextModelSpec,
        src: &dyn WeightSource,
        i: usize,
        prec: Precision,
    ) -> Result<DecoderLayer>;

    /// Names (relative to the text model) of every tensor layer `i` (of
    /// kind `ty`) reads: which layers two loading paths can share, and which
    /// rows a randomly initialised tensor taints. The family's tests check
    /// that [`Self::load_layer`] reads exactly these.
    fn layer_tensor_names(&self, i: usize, ty: LayerType) -> Vec<String>;

    /// True when the family's RMSNorms are zero-centred (`norm(x)·(1+w)`,
    /// Qwen3.5's), false when plain (`w·norm(x)`, Qwen3's).
    fn zero_centred_norms(&self) -> bool;

    /// The family's RMSNorm `{prefix}.weight`.
    ///
    /// Errors: the tensor missing or unreadable.
    fn norm(
        &self,
        src: &dyn WeightSource,
        prefix: &str,
        eps: f64,
        prec: Precision,
    ) -> Result<Norm> {
        if self.zero_centred_norms() {
            crate::models::qwen3_5::norm(src, prefix, eps, prec)
        } else {
            crate::models::qwen3::norm(src, prefix, eps, prec)
        }
    }
}

/// `layers.{i}.{name}` for every name of `blocks`, in order: a layer's
/// tensor names from its blocks' lists.
pub fn layer_names(i: usize, blocks: &[&[&str]]) -> Vec<String> {
    blocks
        .iter()
        .flat_map(|b| b.iter())
        .map(|s| format!("layers.{i}.{s}"))
        .collect()
}

/// The implementation of `family`.
pub fn of(family: Family) -> &'static dyn ModelFamily {
    match family {
        Family::Qwen3_5 => &crate::models::qwen3_5::Qwen3_5,
        Family::Qwen3 => &crate::models::qwen3::Qwen3,
        Family::Qwen3_5Moe => &crate::models::qwen3_5_moe::Qwen3_5Moe,
    }
}
