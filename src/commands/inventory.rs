//! `hsparity inventory`: what each loading path would load, header-only.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::loading::{self, Inventory, LoadingPath};

/// Opens `checkpoint` (headers only, no tensor data) and builds the inventory
/// of `paths` (empty = every path that applies to its `model_type`).
///
/// Errors: as [`Checkpoint::open`] and [`loading::inventory`].
pub fn run(checkpoint: &str, paths: &[LoadingPath]) -> Result<Inventory> {
    let ckpt = Checkpoint::open(checkpoint)?;
    loading::inventory(&ckpt, paths)
}
