//! Writing results to disk: atomically (temp file in the same folder, then
//! rename) and never over something the user has unless `--force`; and the
//! report folder every reporting verb writes into ([`ReportSettings`] →
//! [`ReportFolder`]).

use std::io::Write;
use std::path::{Path, PathBuf};

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

/// Where a verb's report files go: the shared report flags (`--report-dir`,
/// `--name`, `--no-report`, `--force`).
#[derive(Debug, Clone)]
pub struct ReportSettings {
    /// Folder for reports (files go to `<dir>/<name>/`).
    pub dir: PathBuf,
    /// Report name (default: the checkpoint's name + a UTC time stamp).
    pub name: Option<String>,
    /// False with `--no-report`: nothing is written.
    pub enabled: bool,
    /// Overwrite existing report files.
    pub force: bool,
}

impl ReportSettings {
    /// The report folder, checked before the run: none of `files` exists
    /// unless `force`, and the folder can be created and written (it is not
    /// created yet). `None` with `--no-report`. `base` names the default
    /// folder ([`default_report_dir`]).
    ///
    /// Errors: a bad `--name` or an existing file ([`Error::Input`],
    /// [`Error::Refused`]), an unwritable folder ([`Error::Io`]).
    pub fn prepare(&self, base: &str, files: &[&str]) -> Result<Option<ReportFolder>> {
        if !self.enabled {
            return Ok(None);
        }
        let dir = match &self.name {
            Some(n) => {
                validate_report_name(n)?;
                self.dir.join(n)
            }
            None => default_report_dir(&self.dir, base),
        };
        for f in files {
            check_overwrite(&dir.join(f), self.force)?;
        }
        ensure_writable_dir(&dir)?;
        Ok(Some(ReportFolder {
            dir,
            force: self.force,
        }))
    }
}

/// A report folder checked by [`ReportSettings::prepare`].
#[derive(Debug, Clone)]
pub struct ReportFolder {
    dir: PathBuf,
    force: bool,
}

impl ReportFolder {
    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `files` (`(file name, contents)`) into the folder, each
    /// atomically, in order; every file is checked for overwriting before
    /// the first is written.
    ///
    /// Errors: as [`check_overwrite`] and [`write_atomic`].
    pub fn write(&self, files: &[(&str, String)]) -> Result<()> {
        for (name, _) in files {
            check_overwrite(&self.dir.join(name), self.force)?;
        }
        for (name, text) in files {
            write_atomic(&self.dir.join(name), text.as_bytes(), self.force)?;
        }
        Ok(())
    }
}

/// Checks a `--name`: a plain folder name (no path separators, not `.`/`..`).
///
/// Errors ([`Error::Input`]): anything else.
pub fn validate_report_name(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\']) {
        return Err(Error::Input(format!(
            "--name {name:?}: expected a plain folder name (no '/', not '.' or '..')"
        )));
    }
    Ok(())
}

/// Default report folder under `report_dir`: the checkpoint's name (`base`:
/// a local directory's own name, or the last part of a Hub id) plus a UTC
/// time stamp, with `-2`, `-3`, … appended if that folder already exists.
pub fn default_report_dir(report_dir: &Path, base: &str) -> PathBuf {
    let local = Path::new(base);
    let name = if local.is_dir() {
        local
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
    } else {
        base.split('@')
            .next()
            .and_then(|id| id.rsplit('/').next())
            .map(str::to_string)
    };
    let name = name
        .filter(|b| validate_report_name(b).is_ok() && !b.starts_with('.'))
        .unwrap_or_else(|| "report".into());
    let stem = format!("{name}-{}", utc_stamp());
    let mut dir = report_dir.join(&stem);
    let mut k = 2;
    while dir.exists() {
        dir = report_dir.join(format!("{stem}-{k}"));
        k += 1;
    }
    dir
}

/// `YYYYMMDD-HHMMSS` in UTC, for default report names.
pub fn utc_stamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}
