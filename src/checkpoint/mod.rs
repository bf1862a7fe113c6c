//! A checkpoint on disk: where it is ([`resolve`]), its `config.json`
//! ([`config`]), its tensor headers ([`headers`]) and its lazily mapped data
//! ([`weights`]).

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
        if !config_path.is_file() {
            return Err(Error::Config(format!(
                "{}: not found: no config.json in the checkpoint directory (expected a transformers checkpoint)",
                config_path.display()
            )));
        }
        let config = ModelConfig::from_file(&config_path)?;
        let headers = Arc::new(HeaderIndex::read_dir(&source.dir)?);
        let tok = source.dir.join("tokenizer.json");
        let tokenizer = tok.is_file().then_some(tok);
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
