//! Writing results to disk: atomically (temp file in the same folder, then
//! rename) and never over something the user has unless `--force`; and the
//! report folder every reporting verb writes into ([`ReportSettings`] →
//! [`ReportFolder`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The longest file name (bytes) the platform allows (`NAME_MAX` of Linux's
/// `limits.h`, and of macOS): a longer `--name` is refused before the run.
pub const NAME_MAX: usize = 255;

/// Prefix of the temporary folders and files written beside their final place.
const TEMP_PREFIX: &str = ".hsparity-";

/// What is at `path` itself (a final symlink not followed), `None` if nothing.
fn entry(path: &Path) -> Option<std::fs::Metadata> {
    std::fs::symlink_metadata(path).ok()
}

/// A symbolic link, in words, with where it points and whether it resolves.
fn link_words(path: &Path) -> String {
    let to = std::fs::read_link(path)
        .map(|t| t.display().to_string())
        .unwrap_or_default();
    if path.exists() {
        format!("a symbolic link (to {to})")
    } else {
        format!("a dangling symbolic link (to {to}, which does not exist)")
    }
}

/// Fails when `path` is a directory ([`Error::Input`]); when something is
/// there (a file, or a symlink even a dangling one) and `force` is false
/// ([`Error::Refused`]); and when `force` is true but it is not a regular
/// file (a FIFO, device, socket or symlink: `--force` replaces regular files
/// only, [`Error::Refused`]).
pub fn check_overwrite(path: &Path, force: bool) -> Result<()> {
    let Some(meta) = entry(path) else {
        return Ok(());
    };
    if meta.is_dir() {
        return Err(Error::Input(format!(
            "{} is a directory; give a file path",
            path.display()
        )));
    }
    let what = if meta.file_type().is_symlink() {
        Some(link_words(path))
    } else {
        crate::input::kind_of(&meta).map(str::to_string)
    };
    match (force, what) {
        (false, None) => Err(Error::Refused(format!(
            "{} already exists; pass --force to overwrite it",
            path.display()
        ))),
        (false, Some(w)) => Err(Error::Refused(format!(
            "{} already exists ({w}); remove it or choose another path",
            path.display()
        ))),
        (true, Some(w)) => Err(Error::Refused(format!(
            "{} is {w}: --force replaces regular files only",
            path.display()
        ))),
        (true, None) => Ok(()),
    }
}

/// Mode bits asked for new files and folders; the umask applies, as it does
/// to any file a program creates (not 0600 as for private temporary files).
#[cfg(unix)]
fn mode(dir: bool) -> std::fs::Permissions {
    use std::os::unix::fs::PermissionsExt;
    std::fs::Permissions::from_mode(if dir { 0o777 } else { 0o666 })
}

/// A builder of temporary files (or folders: `dir`) named with
/// [`TEMP_PREFIX`] whose modes honour the umask.
fn builder(dir: bool) -> tempfile::Builder<'static, 'static> {
    let mut b = tempfile::Builder::new();
    b.prefix(TEMP_PREFIX);
    #[cfg(unix)]
    b.permissions(mode(dir));
    b
}

/// Writes `bytes` to `path` atomically: a temporary file in the same folder is
/// written, flushed and renamed over `path`, so a reader never sees a partial
/// file; the file honours the umask. Creates missing parent folders. Errors:
/// as [`check_overwrite`], or any I/O failure ([`Error::Io`]).
pub fn write_atomic(path: &Path, bytes: &[u8], force: bool) -> Result<()> {
    write_atomic_with(path, force, |tmp| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(tmp)
            .and_then(|mut f| f.write_all(bytes))
            .map_err(|e| Error::io(path, e))
    })
}

/// [`write_atomic`] with the contents written by `fill` to the temporary
/// file's path (for a writer that streams a large file instead of holding
/// its bytes). The temporary file lies in a temporary folder of its own
/// beside `path`, so a writer that stages its own sibling and renames it
/// over the path (as some libraries' file writers do) leaves nothing else
/// beside `path` if the run is killed. Whatever the path holds after
/// `fill` gets the temporary file's mode (the umask's), is flushed, and is
/// renamed to `path`.
pub fn write_atomic_with(
    path: &Path,
    force: bool,
    fill: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    check_overwrite(path, force)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| {
        // A file where a folder of the path should be: say which.
        match dir.ancestors().find(|a| a.is_file()) {
            Some(f) => Error::Input(format!(
                "{}: {} is a file, not a folder, so {} cannot be written under it",
                path.display(),
                f.display(),
                path.file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
            )),
            None => Error::io(&dir, e),
        }
    })?;
    let stage = builder(true)
        .tempdir_in(&dir)
        .map_err(|e| Error::io(&dir, e))?;
    let tmp = builder(false)
        .tempfile_in(stage.path())
        .map_err(|e| Error::io(&dir, e))?;
    let tmp_path = tmp.path().to_path_buf();
    let mode = tmp
        .as_file()
        .metadata()
        .map_err(|e| Error::io(&tmp_path, e))?
        .permissions();
    fill(&tmp_path)?;
    let written = std::fs::File::open(&tmp_path).map_err(|e| Error::io(path, e))?;
    written
        .set_permissions(mode)
        .map_err(|e| Error::io(path, e))?;
    written.sync_all().map_err(|e| Error::io(path, e))?;
    if force {
        check_overwrite(path, force)?;
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

/// Creates `dir` and its missing ancestors; returns those it created, outermost
/// first (what a failed run removes again).
///
/// Errors: an ancestor is a file, a dangling symlink or otherwise not a folder
/// ([`Error::Input`], saying which); creation fails ([`Error::Io`]).
fn create_dirs(dir: &Path, what: &Path) -> Result<Vec<PathBuf>> {
    let mut missing = Vec::new();
    let mut probe = dir;
    loop {
        if let Some(meta) = entry(probe) {
            if !probe.is_dir() {
                let is = if meta.file_type().is_symlink() {
                    link_words(probe)
                } else {
                    crate::input::kind_of(&meta).unwrap_or("a file").to_string()
                };
                return Err(Error::Input(format!(
                    "{} is {is}, not a directory (report folder {})",
                    probe.display(),
                    what.display()
                )));
            }
            break;
        }
        missing.push(probe.to_path_buf());
        match probe.parent() {
            Some(p) if !p.as_os_str().is_empty() => probe = p,
            _ => break,
        }
    }
    let mut created = Vec::new();
    for d in missing.into_iter().rev() {
        match std::fs::create_dir(&d) {
            Ok(()) => created.push(d),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) => {
                remove_dirs(&created);
                return Err(Error::io(&d, e));
            }
        }
    }
    Ok(created)
}

/// Removes the (empty) folders `dirs`, innermost first; what is not empty stays.
fn remove_dirs(dirs: &[PathBuf]) {
    for d in dirs.iter().rev() {
        let _ = std::fs::remove_dir(d);
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
    /// The report folder, claimed before the run: `--name` fits the
    /// platform's file-name limit, none of `files` exists unless `force` (and
    /// then each is a regular file), and the folder is created now, so a
    /// concurrent run cannot take the same default name (it gets the next
    /// `-2`, `-3`, …). A run that fails before [`ReportFolder::write`]
    /// removes the folders it created (the claim is dropped). `None` with
    /// `--no-report`. `base` names the default folder
    /// ([`default_report_dir`]).
    ///
    /// Errors: a bad `--name` or an existing file ([`Error::Input`],
    /// [`Error::Refused`]), a folder that cannot be created ([`Error::Io`]).
    pub fn prepare(&self, base: &str, files: &[&str]) -> Result<Option<ReportFolder>> {
        if !self.enabled {
            return Ok(None);
        }
        if let Some(n) = &self.name {
            validate_report_name(n)?;
            let dir = self.dir.join(n);
            for f in files {
                check_overwrite(&dir.join(f), self.force)?;
            }
        }
        let mut created = create_dirs(&self.dir, &self.dir)?;
        let claim = |dir: &Path| std::fs::create_dir(dir);
        let dir = match &self.name {
            Some(n) => {
                let dir = self.dir.join(n);
                match claim(&dir) {
                    Ok(()) => created.push(dir.clone()),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
                    Err(e) => {
                        remove_dirs(&created);
                        return Err(match entry(&dir) {
                            Some(m) if m.file_type().is_symlink() => Error::Input(format!(
                                "{} is {}, not a directory",
                                dir.display(),
                                link_words(&dir)
                            )),
                            Some(_) => Error::Input(format!(
                                "{} exists and is not a directory",
                                dir.display()
                            )),
                            None => Error::io(&dir, e),
                        });
                    }
                }
                dir
            }
            None => {
                let mut dir = default_report_dir(&self.dir, base);
                loop {
                    match claim(&dir) {
                        Ok(()) => break,
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                            dir = default_report_dir(&self.dir, base);
                        }
                        Err(e) => {
                            remove_dirs(&created);
                            return Err(Error::io(&dir, e));
                        }
                    }
                }
                created.push(dir.clone());
                dir
            }
        };
        Ok(Some(ReportFolder {
            dir,
            force: self.force,
            created,
            done: false,
        }))
    }
}

/// A report folder claimed by [`ReportSettings::prepare`]. Dropped without a
/// successful [`Self::write`], it removes the folders the claim created.
#[derive(Debug)]
pub struct ReportFolder {
    dir: PathBuf,
    force: bool,
    /// Folders the claim created (outermost first), the report's own last.
    created: Vec<PathBuf>,
    done: bool,
}

impl Drop for ReportFolder {
    fn drop(&mut self) {
        if !self.done {
            remove_dirs(&self.created);
        }
    }
}

impl ReportFolder {
    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `files` (`(file name, contents)`): all of them or none. Every
    /// file is checked for overwriting, then written complete and flushed in
    /// a temporary folder beside the report folder; only then is that folder
    /// renamed into place (the claimed folder is still empty), or each file
    /// renamed into the existing folder. A failure before (a full disk)
    /// leaves nothing. Files and folder honour the umask.
    ///
    /// Errors: as [`check_overwrite`]; I/O failures ([`Error::Io`]).
    pub fn write(mut self, files: &[(&str, String)]) -> Result<()> {
        for (name, _) in files {
            check_overwrite(&self.dir.join(name), self.force)?;
        }
        let parent = match self.dir.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let tmp = builder(true)
            .tempdir_in(&parent)
            .map_err(|e| Error::io(&parent, e))?;
        for (name, text) in files {
            let p = tmp.path().join(name);
            let mut f = std::fs::File::create(&p).map_err(|e| Error::io(self.dir.join(name), e))?;
            f.write_all(text.as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(|e| Error::io(self.dir.join(name), e))?;
        }
        let claimed = self.created.last() == Some(&self.dir);
        if !(claimed && std::fs::rename(tmp.path(), &self.dir).is_ok()) {
            for (name, _) in files {
                let to = self.dir.join(name);
                check_overwrite(&to, self.force)?;
                std::fs::rename(tmp.path().join(name), &to).map_err(|e| Error::io(&to, e))?;
            }
        }
        self.done = true;
        Ok(())
    }
}

/// Checks a `--name`: a plain folder name (no path separators, not `.`/`..`)
/// of at most [`NAME_MAX`] bytes.
///
/// Errors ([`Error::Input`]): anything else.
pub fn validate_report_name(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
        return Err(Error::Input(format!(
            "--name {name:?}: expected a plain folder name (no '/', not '.' or '..')"
        )));
    }
    if name.len() > NAME_MAX {
        return Err(Error::Input(format!(
            "--name is {} bytes long: a file name is at most {NAME_MAX} bytes on this platform",
            name.len()
        )));
    }
    Ok(())
}

/// Default report folder under `report_dir`: the checkpoint's name (`base`:
/// a local directory's own name, or the last part of a Hub id) plus a UTC
/// time stamp, with `-2`, `-3`, … appended if that name is taken (by anything,
/// a dangling symlink included).
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
    // Room for the stamp and a `-k` within NAME_MAX.
    let mut cut = name.len().min(NAME_MAX - 32);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let stem = format!("{}-{}", &name[..cut], utc_stamp());
    let mut dir = report_dir.join(&stem);
    let mut k = 2;
    while entry(&dir).is_some() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path, name: Option<&str>) -> ReportSettings {
        ReportSettings {
            dir: dir.to_path_buf(),
            name: name.map(str::to_string),
            enabled: true,
            force: false,
        }
    }

    #[test]
    fn a_report_is_all_of_its_files_or_none() {
        let tmp = tempfile::tempdir().unwrap();
        let reports = tmp.path().join("reports");
        let f = settings(&reports, Some("r"))
            .prepare("x", &["a.json"])
            .unwrap()
            .unwrap();
        assert!(reports.join("r").is_dir(), "claimed before the run");
        // The second file cannot be written (as on a full disk): nothing is left,
        // not the first file, the temporary folder or the claimed folders.
        let files = [("a.json", "{}".to_string()), ("no/such/b.md", "x".into())];
        assert!(f.write(&files).is_err());
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
        // A complete write renames the folder into place.
        let f = settings(&reports, Some("r"))
            .prepare("x", &[])
            .unwrap()
            .unwrap();
        f.write(&[("a.json", "{}".into()), ("b.md", "x".into())])
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(reports.join("r/b.md")).unwrap(),
            "x"
        );
        let names: Vec<_> = std::fs::read_dir(&reports).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary folder left: {names:?}");
    }

    #[test]
    fn default_names_are_claimed_once_and_names_fit_the_platform() {
        let tmp = tempfile::tempdir().unwrap();
        let s = settings(tmp.path(), None);
        let a = s.prepare("ckpt", &[]).unwrap().unwrap();
        let b = s.prepare("ckpt", &[]).unwrap().unwrap();
        assert_ne!(a.dir(), b.dir());
        drop((a, b));
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
        let long = "n".repeat(NAME_MAX + 1);
        assert!(validate_report_name(&long).is_err());
        assert!(validate_report_name(&"n".repeat(NAME_MAX)).is_ok());
        let d = default_report_dir(tmp.path(), &"n".repeat(250));
        assert!(d.file_name().unwrap().len() <= NAME_MAX);
    }
}
