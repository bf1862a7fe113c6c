//! Loading paths: what each transformers Auto class does with a checkpoint
//! (renames, ignore rules, unexpected, missing → newly initialised, tied
//! `lm_head`, dtype), emulated from headers only, plus the tensor view a
//! candle model reads its weights through.
//!
//! The transformers 5.23.0 behaviour this follows is summarised, with its
//! source files and functions, in `docs/architecture.md` ("loading paths")
//! and `docs/loading-paths.md`.

pub mod conversion;
pub mod experts;
pub mod init;
pub mod inventory;
pub mod paths;
pub mod resident;
pub mod resolve;
pub mod shadow;
pub mod source;
pub mod spec;
mod tie;
pub mod view;

pub use conversion::{Converted, ConvertedRule, DroppedConversion};
pub use inventory::{
    inventory, ComponentCount, Inventory, PathInventory, ResolvedPath, SCHEMA_VERSION,
};
pub use paths::{resolve_dtype, LoadingPath, ModelClass};
pub use resolve::resolve;
pub use shadow::NoiseShadow;
pub use source::{check_ids, select_rows, PairWords, WeightSource};
pub use spec::{Component, InitRule};
pub use view::{NonFinite, TensorView, WeightOrigin};
