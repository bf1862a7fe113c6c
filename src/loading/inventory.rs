//! The inventory: what each loading path loads from a checkpoint
//! ([`PathInventory`], built by [`fn@super::resolve`]), and the checkpoint-level
//! [`Inventory`] of `inventory --json`.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::checkpoint::config::TextConfig;
use crate::checkpoint::{Checkpoint, ResolvedSource};
use crate::error::Result;
use crate::loading::conversion::Converted;
use crate::loading::paths::{LoadingPath, ModelClass};
use crate::loading::resolve::resolve;
use crate::loading::view::TensorView;
use crate::precision::Precision;

/// Current `schema_version` of [`Inventory`].
pub const SCHEMA_VERSION: u32 = 1;

/// Tensors, parameters and bytes of one component on one path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ComponentCount {
    /// True when the component is part of the path's model. Then the counts
    /// are the model's state-dict entries and `bytes` = params × the path's
    /// dtype size. When false, the counts are the checkpoint tensors of that
    /// component (dropped or unexpected) and `bytes` is their size on disk.
    pub loaded: bool,
    /// Number of tensors.
    pub tensors: usize,
    /// Number of parameters (elements).
    pub params: u64,
    /// Bytes (see `loaded`).
    pub bytes: u64,
}

/// What one loading path does with the checkpoint (`inventory --json`,
/// `docs/report-schema.md` §2.3). Invariant: `tensors == consumed + missing`.
/// `consumed` counts state-dict entries; `dropped_by_rule` and `unexpected`
/// count checkpoint keys (an `mtp.*` expert parameter fused then dropped
/// counts its per-expert keys), as transformers' load report does.
#[derive(Debug, Clone, Serialize)]
pub struct PathInventory {
    /// Path name: `causal-lm`, `vlm`, `image-text-to-text`.
    pub name: String,
    /// The transformers Auto class.
    pub auto_class: String,
    /// The class it instantiates.
    pub class: String,
    /// Resolved compute dtype (`f32`, `bf16`, `f16`).
    pub dtype: Precision,
    /// Why: `text_config.dtype`, `config.dtype`, `index metadata.dtype`, or
    /// `first weight on disk (<shard>: <tensor>)`.
    pub dtype_reason: String,
    /// Model state-dict entries (a tied `lm_head.weight` counts).
    pub tensors: usize,
    /// State-dict entries filled from checkpoint bytes (a tied lm_head counts: it reads the embedding).
    pub consumed: usize,
    /// Checkpoint keys dropped silently by `_keys_to_ignore_on_load_unexpected`.
    pub dropped_by_rule: usize,
    /// Checkpoint keys the model has no place for (reported UNEXPECTED, then dropped).
    pub unexpected: usize,
    /// State-dict entries absent from the checkpoint (reported MISSING, newly initialised).
    pub missing: usize,
    /// True when `lm_head.weight` takes the embedding's values (or the reverse).
    pub tied_lm_head: bool,
    /// The expert conversion (MoE families only; absent for the dense ones):
    /// checkpoint keys fused into parameters, per rule, and those fused then
    /// dropped. A fused parameter counts once in `consumed`; the keys it was
    /// fused from count in `converted.checkpoint_keys`, so the checkpoint
    /// keys this path reads are `consumed − converted.parameters +
    /// converted.checkpoint_keys` (a tied `lm_head` aside).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub converted: Option<Converted>,
    /// Renames that applied (`"model.language_model.X -> model.X"`) and ignore rules (`"ignore ^mtp.*"`).
    pub rules: Vec<String>,
    /// Missing state-dict keys (model naming).
    pub missing_names: Vec<String>,
    /// Unexpected checkpoint keys (after renames).
    pub unexpected_names: Vec<String>,
    /// Checkpoint keys dropped by an ignore rule (all of them, checkpoint order).
    pub dropped_names: Vec<String>,
    /// Missing key → the init transformers would use (`normal(0, 0.02)`, `zeros`, `ones`, `log(U(0.01, 16))`).
    pub missing_init: BTreeMap<String, String>,
    /// Number of checkpoint keys renamed on the way in.
    pub renamed: usize,
    /// Model parameters, a tied lm_head not counted twice (`model.num_parameters()`).
    pub params: u64,
    /// Per component: `language_model`, `vision_tower`, `mtp`, `lm_head`.
    pub components: BTreeMap<String, ComponentCount>,
    /// Other remarks (tie decisions, ...).
    pub notes: Vec<String>,
    /// Why a MISSING `lm_head.weight` was not tied, when the config's other
    /// tie flag says to (also one of `notes`; not a member of the JSON).
    #[serde(skip)]
    pub untied_lm_head: Option<String>,
}

/// `inventory --json`: all paths over one checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Inventory {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The checkpoint argument as given.
    pub checkpoint: String,
    /// What it resolved to.
    pub source: ResolvedSource,
    /// `model_type` of `config.json`.
    pub model_type: String,
    /// Tensors on disk.
    pub checkpoint_tensors: usize,
    /// Parameters on disk.
    pub checkpoint_params: u64,
    /// Number of shard files.
    pub shards: usize,
    /// Tensor count per on-disk dtype (`"BF16": 1199`).
    pub checkpoint_dtypes: BTreeMap<String, usize>,
    /// One entry per requested path.
    pub paths: Vec<PathInventory>,
    /// Loading paths that do not apply to this checkpoint, with the reason.
    pub not_applicable: Vec<String>,
}

/// A loading path resolved against a checkpoint.
#[derive(Debug, Clone)]
pub struct ResolvedPath {
    /// The path.
    pub path: LoadingPath,
    /// The class it builds.
    pub class: ModelClass,
    /// Resolved dtype (same as `inventory.dtype`): what the path loads in.
    pub dtype: Precision,
    /// The dtype it computes in: `dtype`, unless the run overrides it
    /// (`--dtype`, resolved once by `Session::open`: [`Self::computing_in`]).
    pub compute: Precision,
    /// The inventory.
    pub inventory: PathInventory,
    /// Text-model tensors for the candle model.
    pub view: TensorView,
    /// The text config the model is built from.
    pub text_config: TextConfig,
}

impl ResolvedPath {
    /// The same path with missing tensors initialised from `seed` and every
    /// tensor placed on `device`.
    pub fn seeded(mut self, seed: u64, device: &candle_core::Device) -> Self {
        self.view = self.view.with_seed(seed).with_device(device.clone());
        self
    }

    /// The same path computing in `dtype` (`None`: its own).
    pub fn computing_in(mut self, dtype: Option<Precision>) -> Self {
        self.compute = dtype.unwrap_or(self.dtype);
        self
    }
}

/// The inventory of `paths` over `ckpt` (all applicable paths when `paths`
/// is empty). Header-only: never reads tensor data.
///
/// Errors: as [`resolve`] for each path.
pub fn inventory(ckpt: &Checkpoint, paths: &[LoadingPath]) -> Result<Inventory> {
    let list = if paths.is_empty() {
        LoadingPath::applicable(&ckpt.config)
    } else {
        paths.to_vec()
    };
    let paths = list
        .into_iter()
        .map(|p| resolve(ckpt, p).map(|r| r.inventory))
        .collect::<Result<Vec<_>>>()?;
    Ok(inventory_of(ckpt, paths))
}

/// The checkpoint-level [`Inventory`] around path inventories already
/// resolved (e.g. by a [`crate::session::Session`]).
pub fn inventory_of(ckpt: &Checkpoint, paths: Vec<PathInventory>) -> Inventory {
    let mut checkpoint_dtypes = BTreeMap::new();
    for t in &ckpt.headers.tensors {
        *checkpoint_dtypes.entry(t.dtype.clone()).or_insert(0) += 1;
    }
    Inventory {
        schema_version: SCHEMA_VERSION,
        checkpoint: ckpt.source.display.clone(),
        source: ckpt.source.clone(),
        model_type: ckpt.config.model_type.clone(),
        checkpoint_tensors: ckpt.headers.len(),
        checkpoint_params: ckpt.headers.total_params(),
        shards: ckpt.headers.shards.len(),
        checkpoint_dtypes,
        paths,
        not_applicable: LoadingPath::ALL
            .into_iter()
            .filter(|p| p.class_for(&ckpt.config).is_none())
            .map(|p| {
                format!(
                    "{} ({}) does not apply to model_type {}: transformers raises \"Unrecognized configuration class\"",
                    p.name(),
                    p.auto_class(),
                    ckpt.config.model_type
                )
            })
            .collect(),
    }
}
