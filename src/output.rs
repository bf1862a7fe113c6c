//! Writing results to disk: atomically (temp file in the same folder, then
//! rename) and never over something the user has unless `--force`.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// Fails with [`Error::Refused`] when `path` exists and `force` is false.
pub fn check_overwrite(path: &Path, force: bool) -> Result<()> {
    if path.exists() && !force {
        return Err(Error::Refused(format!(
            "{} already exists; pass --force to overwrite it",
            path.display()
        )));
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically: a temporary file in the same folder is
/// written, flushed and renamed over `path`, so a reader never sees a partial
/// file. Creates missing parent folders. Errors: `path` exists and `force` is
/// false ([`Error::Refused`]), or any I/O failure ([`Error::Io`]).
pub fn write_atomic(path: &Path, bytes: &[u8], force: bool) -> Result<()> {
    check_overwrite(path, force)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let mut tmp = tempfile::NamedTempFile::new_in(&dir).map_err(|e| Error::io(&dir, e))?;
    tmp.write_all(bytes).map_err(|e| Error::io(path, e))?;
    tmp.as_file().sync_all().map_err(|e| Error::io(path, e))?;
    tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}
