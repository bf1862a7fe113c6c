//! Loading paths: what each transformers Auto class does with a checkpoint
//! (renames, ignore rules, unexpected, missing → newly initialised, tied
//! `lm_head`, dtype), emulated from headers only, plus the tensor view a
//! candle model reads its weights through.
//!
//! See `research/qwen3_5.md` §1-2 and §6 for the transformers 5.23.0
//! behaviour this follows.

pub mod experts;
pub mod inventory;
pub mod paths;
pub mod spec;
pub mod view;

pub use inventory::{
    inventory, resolve, ComponentCount, Inventory, PathInventory, ResolvedPath, SCHEMA_VERSION,
};
pub use paths::{resolve_dtype, LoadingPath, ModelClass, ModelDtype};
pub use spec::{Component, InitRule};
pub use view::{NonFinite, TensorView, WeightOrigin};
