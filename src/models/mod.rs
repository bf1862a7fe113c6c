//! Model implementations (candle; CPU, CUDA optional). A model never knows
//! which loading path it emulates: it reads its weights through a
//! [`crate::loading::WeightSource`] built by [`crate::loading`], named
//! relative to the text model.
//!
//! - [`spec`]: geometry and rope ([`TextModelSpec`]);
//! - [`layers`]: what the families share (linear, norms, rope, attention, MLP);
//! - [`family`]: the one trait a family implements ([`family::ModelFamily`]);
//!   [`qwen3_5`] (hybrid: Gated DeltaNet + gated attention), [`qwen3`]
//!   (dense) and [`qwen3_5_moe`] (hybrid with a sparse MoE block in every
//!   layer): each family's model file, building [`DecoderLayer`]s;
//! - [`decoder`]: the decoder layer and its decode state;
//! - [`text_model`]: embedding, final norm, LM head, the whole model;
//! - [`moe`]: the sparse MoE block of `qwen3_5_moe` (router, routed and shared experts);
//! - [`dflash`]: the DFlash drafter.

pub mod decoder;
pub mod dflash;
pub mod family;
pub mod layers;
pub mod moe;
pub mod qwen3;
pub mod qwen3_5;
pub mod qwen3_5_moe;
pub mod spec;
pub mod text_model;

pub use decoder::{CacheCrop, DecoderLayer, FeedForward, LayerState, Mixer, Sequence};
pub use qwen3_5::gated_delta_net::GdnForm;
pub use spec::{LayerGeometry, MoeSpec, Positions, TextModelSpec};
pub use text_model::{
    DecodeState, Embedding, FinalNorm, LmHead, StepOutput, TextModel, LM_HEAD_CHUNK_BYTES,
};
