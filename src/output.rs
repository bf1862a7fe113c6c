//! Writing results to disk: atomically (temp file in the same folder, then
//! rename) and never over something the user has unless `--force`.

use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// Fails with [`Error::Refused`] when `path` exists and `force` is false, and
/// with [`Error::Input`] when `path` is a directory.
pub fn check_overwrite(path: &Path, force: bool) -> Result<()> {
    if path.is_dir() {
        return Err(Error::Input(format!(
            "{} is a directory; give a file path",
            path.display()
        )));
    }
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
    if force {
        tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    } else {
        // Never clobber a file that appeared since the check.
        tmp.persist_noclobber(path)
            .map_err(|e| match e.error.kind() {
                std::io::ErrorKind::AlreadyExists => Error::Refused(format!(
                    "{} already exists; pass --force to overwrite it",
                    path.display()
                )),
                _ => Error::io(path, e.error),
            })?;
    }
    Ok(())
}

/// Checks, before a long run, that `dir` can be created and written —
/// without creating it (a failed run leaves nothing behind): the nearest
/// existing ancestor must be a writable directory. Errors: `dir` (or an
/// ancestor) is a file, or the ancestor is not writable ([`Error::Io`]).
pub fn ensure_writable_dir(dir: &Path) -> Result<()> {
    let mut probe = dir;
    loop {
        if probe.exists() {
            if !probe.is_dir() {
                return Err(Error::Input(format!(
                    "{} is a file, not a directory (report folder {})",
                    probe.display(),
                    dir.display()
                )));
            }
            return tempfile::NamedTempFile::new_in(probe)
                .map(drop)
                .map_err(|e| Error::io(probe, e));
        }
        match probe.parent() {
            Some(p) if !p.as_os_str().is_empty() => probe = p,
            _ => probe = Path::new("."),
        }
    }
}
