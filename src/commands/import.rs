//! `hsparity import <FILE|DIR>`: an engine's hidden-state capture (SpecForge
//! records, vLLM `extract_hidden_states` files, SGLang dumper files or a
//! `/generate` response) converted to an hsparity dump, the layer indices
//! mapped to transformers' `hidden_states` and the mapping stated.

use std::path::PathBuf;

use crate::checkpoint::resolve;
use crate::error::{Error, Result};
use crate::import::{self, Format, ImportOptions, Imported};
use crate::models::dflash::DflashConfig;
use crate::report::ImportReport;

/// Options of `import`.
#[derive(Debug, Clone, Default)]
pub struct ImportCmdOptions {
    /// The engine's file or folder.
    pub path: PathBuf,
    /// The format (`None`: detected where the file makes it unambiguous).
    pub format: Option<Format>,
    /// What the file does not say (layer ids, N, H, prompt ids, …).
    pub read: ImportOptions,
    /// A DFlash drafter (directory or Hub id) whose config gives the SpecForge
    /// taps (`target_layer_ids`), N (`num_target_layers`) and H where not given.
    pub drafter: Option<String>,
    /// Where to write the dump (`None`: report the mapping only).
    pub out: Option<PathBuf>,
    /// Overwrite an existing `out`.
    pub force: bool,
    /// The command line, for the report.
    pub command_line: String,
}

/// `read` completed from the drafter's config: its taps, `num_target_layers`
/// and `hidden_size`, where `read` does not give them.
///
/// Errors: the drafter does not resolve, or its config is invalid.
pub fn with_drafter(mut read: ImportOptions, source: &str) -> Result<ImportOptions> {
    let dir = resolve::resolve_as("drafter", source)?.dir;
    let path = dir.join("config.json");
    let cfg = DflashConfig::from_file(&path)?;
    read.target_layer_ids.get_or_insert(cfg.target_layer_ids);
    read.hidden_size.get_or_insert(cfg.hidden_size);
    if read.num_layers.is_none() {
        let v: serde_json::Value = serde_json::from_str(&crate::input::read_to_string(&path)?)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        read.num_layers = v
            .get("num_target_layers")
            .and_then(serde_json::Value::as_u64)
            .map(|n| n as usize);
    }
    Ok(read)
}

/// Reads `path` as `format` (detected when `None`).
///
/// Errors: as [`import::read`] and [`import::detect`].
pub fn read(
    path: &std::path::Path,
    format: Option<Format>,
    opts: &ImportOptions,
) -> Result<Imported> {
    match format {
        Some(f) => import::read(path, f, opts),
        None => import::read_auto(path, opts),
    }
}

/// Imports the file, writes the dump when asked, and reports the mapping.
///
/// Errors: an existing `out` without `force` (checked first), a drafter that
/// does not load, and every refusal of the readers (a missing key, a width
/// that does not divide by the layer ids, a bool or int32 tensor, an unknown
/// or ambiguous format: one line naming the file and the key).
pub fn run(o: &ImportCmdOptions) -> Result<ImportReport> {
    if let Some(out) = &o.out {
        crate::output::check_overwrite(out, o.force)?;
    }
    let opts = match &o.drafter {
        Some(d) => with_drafter(o.read.clone(), d)?,
        None => o.read.clone(),
    };
    let imp = read(&o.path, o.format, &opts)?;
    if let Some(out) = &o.out {
        imp.to_dump().write(out, o.force)?;
    }
    Ok(crate::report::import::build(
        &imp,
        o.out.as_deref(),
        o.command_line.clone(),
    ))
}
