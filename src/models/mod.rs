//! Model implementations (candle, CPU). A model never knows which loading path
//! it emulates: it reads its weights through a [`WeightSource`] built by
//! [`crate::loading`], named relative to the text model.

pub mod dflash;
pub mod precision;
pub mod qwen3_5;

use candle_core::Tensor;

use crate::error::Result;

/// Where a model gets its weights. Names are relative to the text model, the
/// way `Qwen3_5TextModel` and `Qwen3_5ForCausalLM` see them after the loading
/// path's renames: `embed_tokens.weight`, `layers.{i}.…`, `norm.weight`, and
/// `lm_head.weight`.
pub trait WeightSource {
    /// The tensor `name` as an f32 CPU tensor with the checkpoint's shape.
    ///
    /// Errors: the name is unknown to this source, the shard cannot be read, or
    /// the stored dtype cannot be converted.
    fn tensor(&self, name: &str) -> Result<Tensor>;

    /// A key identifying the bytes `name` resolves to (e.g. the checkpoint key
    /// plus dtype, or an init rule plus seed). Two sources giving the same key
    /// for every tensor of a layer may share one loaded copy of that layer.
    fn identity(&self, name: &str) -> String;
}
