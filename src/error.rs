//! Error type shared by the library. Every variant is a user-facing failure
//! (bad input, unreadable file, inconsistent checkpoint): the binary maps all of
//! them to exit code 2 and prints the message, never a panic.

use std::path::PathBuf;

/// Result alias used across hsparity.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, phrased so the user can fix it: each message names the
/// file or field and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        #[source]
        /// What the OS said.
        source: std::io::Error,
    },
    /// A checkpoint is incomplete or inconsistent (missing shard, truncated
    /// header, index pointing at a missing file, shape mismatch...).
    #[error("checkpoint {0}")]
    Checkpoint(String),
    /// `config.json` is missing a field, has an unknown `model_type`, or is not JSON.
    #[error("config: {0}")]
    Config(String),
    /// A command-line argument or input file is invalid.
    #[error("{0}")]
    Input(String),
    /// A safety rule refused the operation (e.g. overwriting without `--force`).
    #[error("{0}")]
    Refused(String),
    /// Tensor computation failed (candle error). Indicates a shape bug or an
    /// inconsistent checkpoint that slipped past validation.
    #[error("tensor computation: {}", candle_message(.0))]
    Tensor(#[from] candle_core::Error),
    /// A dump or report file is malformed.
    #[error("{0}")]
    Format(String),
}

/// A candle error's message without the backtrace candle appends when
/// `RUST_BACKTRACE` is set (`candle_core::Error::WithBacktrace`): the user
/// gets one line.
pub(crate) fn candle_message(e: &candle_core::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

impl Error {
    /// Shorthand for [`Error::Io`] with the offending path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
