//! `hsparity inventory`: what each loading path would load, header-only.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::loading::{self, LoadingPath};
use crate::report::inventory::{build, InventoryReport};
use crate::report::Environment;

/// Opens `checkpoint` (headers only, no tensor data) and builds the inventory
/// of `paths` (empty = every path that applies to its `model_type`), as a
/// report (`command`: the command line).
///
/// Errors: as [`Checkpoint::open`] and [`fn@loading::inventory`].
pub fn run(checkpoint: &str, paths: &[LoadingPath], command: String) -> Result<InventoryReport> {
    let ckpt = Checkpoint::open(checkpoint)?;
    let inv = loading::inventory(&ckpt, paths)?;
    Ok(build(inv, Environment::host(), command))
}
