//! A checkpoint on disk: where it is ([`resolve`]), its `config.json`
//! ([`config`]), its tensor headers ([`headers`]) and its lazily mapped data
//! ([`weights`]).

pub mod compare;
pub mod config;
pub mod headers;
pub mod resolve;
pub mod weights;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use config::ModelConfig;
pub use headers::{HeaderIndex, TensorHeader};
pub use resolve::{ResolvedSource, SourceKind};
pub use weights::Weights;

use crate::error::{Error, Result};

/// An opened checkpoint: everything the loading paths need, read header-only.
/// Opening reads `config.json` and the safetensors headers, never tensor data.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// What `<CHECKPOINT>` resolved to.
    pub source: ResolvedSource,
    /// Path of `config.json`.
    pub config_path: PathBuf,
    /// Parsed `config.json`.
    pub config: ModelConfig,
    /// All tensor headers (names, dtypes, shapes, shards).
    pub headers: Arc<HeaderIndex>,
    /// `tokenizer.json`, when present.
    pub tokenizer: Option<PathBuf>,
    /// Shared data handle (shards mapped lazily, once).
    pub weights: Arc<Weights>,
}

impl Checkpoint {
    /// Resolves `arg` (a directory or a Hub id in the local cache, see
    /// [`resolve::resolve`]) and opens it.
    ///
    /// Errors: [`Error::Input`] for an unresolvable argument, then as [`Self::open_source`].
    pub fn open(arg: &str) -> Result<Self> {
        Self::open_source(resolve::resolve(arg)?)
    }

    /// As [`Self::open`], with an explicit hub cache directory (tests, `--cache-dir`).
    pub fn open_with_cache(arg: &str, cache_dir: &Path) -> Result<Self> {
        Self::open_source(resolve::resolve_with_cache(arg, Some(cache_dir))?)
    }

    /// Opens an already resolved checkpoint directory.
    ///
    /// Errors: missing `config.json` ([`Error::Config`]), an invalid or
    /// unsupported config ([`Error::Config`]), any header problem
    /// ([`Error::Checkpoint`], see [`HeaderIndex::read_dir`]).
    pub fn open_source(source: ResolvedSource) -> Result<Self> {
        let config_path = source.dir.join("config.json");
        if std::fs::symlink_metadata(&config_path).is_err() {
            let inside = resolve::subfolders_with_config(&source.dir)
                .map(|s| format!("; its subfolders {s} hold one: pass one of those"))
                .unwrap_or_default();
            return Err(Error::Config(format!(
                "{}: not found: no config.json in the checkpoint directory (expected a transformers checkpoint){inside}",
                config_path.display()
            )));
        }
        let config = ModelConfig::from_file(&config_path)?;
        let headers = Arc::new(HeaderIndex::read_dir(&source.dir)?);
        check_backed(&config, &headers, &config_path)?;
        let tok = source.dir.join("tokenizer.json");
        // Present when something is there: a FIFO or folder named
        // tokenizer.json is refused, saying what it is, when it is read.
        let tokenizer = tok.exists().then_some(tok);
        let weights = Arc::new(Weights::new(headers.clone()));
        Ok(Checkpoint {
            source,
            config_path,
            config,
            headers,
            tokenizer,
            weights,
        })
    }
}

/// Counts a config may claim however few tensors the checkpoint holds: a
/// model with some layers (or experts) MISSING is still inventoried and run,
/// as transformers would build it (a finding, exit 1).
pub const COUNT_FLOOR: usize = 1024;

/// Checks, before anything is allocated from them, that the counts
/// `config.json` gives (decoder layers, vision blocks, experts per layer)
/// are ones the checkpoint's headers can back: at most as many as the
/// checkpoint has tensors, or at most [`COUNT_FLOOR`]. Beyond that the
/// config describes some other model, and building its state dict (one
/// entry per layer and tensor) would take memory the input cannot justify.
///
/// Errors ([`Error::Config`], naming the file and field).
pub fn check_backed(config: &ModelConfig, headers: &HeaderIndex, path: &Path) -> Result<()> {
    let limit = headers.len().max(COUNT_FLOOR);
    let text = if config.is_vlm() { "text_config." } else { "" };
    let vision_depth = config
        .vision_config
        .as_ref()
        .and_then(|v| v.get("depth"))
        .and_then(serde_json::Value::as_u64)
        .map_or(0, |d| usize::try_from(d).unwrap_or(usize::MAX));
    let counts = [
        (
            format!("{text}num_hidden_layers"),
            config.text.num_hidden_layers,
        ),
        ("vision_config.depth".to_string(), vision_depth),
        (
            format!("{text}num_experts"),
            config.text.moe.as_ref().map_or(0, |m| m.num_experts),
        ),
    ];
    for (field, n) in counts {
        if n > limit {
            return Err(Error::Config(format!(
                "{}: {field} = {n}, but the checkpoint's headers hold {} tensors: more than that \
                 (beyond {COUNT_FLOOR}) cannot be backed by this checkpoint, so the config describes \
                 another model",
                path.display(),
                headers.len()
            )));
        }
    }
    Ok(())
}
