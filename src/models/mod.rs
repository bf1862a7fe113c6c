//! Model implementations (candle, CPU). A model never knows which loading path
//! it emulates: it reads its weights through a
//! [`crate::loading::WeightSource`] built by [`crate::loading`], named
//! relative to the text model.

pub mod dflash;
pub mod qwen3_5;

pub use qwen3_5::{
    DecoderLayer, Embedding, FinalNorm, GdnForm, LmHead, Positions, StepOutput, TextModel,
    TextModelSpec,
};
