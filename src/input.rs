//! Opening input files: every file hsparity reads (a checkpoint's config,
//! index and shards, a tokenizer, prompts, templates, trajectories, dumps,
//! engine captures, a drafter) is opened here, and only when it is a regular
//! file after symlinks are resolved. A named pipe would block the read
//! forever, a directory or a device is not what was asked for; each is
//! refused with one line saying what the path is instead.
//!
//! The file is opened non-blocking and checked on the open descriptor
//! (`fstat`), so a path swapped for a FIFO between a check and the open
//! still cannot hang the run.

use std::fs::{File, Metadata};
use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// What a file type is, in words, when it is not a regular file (`None` for
/// a regular file).
pub(crate) fn kind_of(meta: &Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        return None;
    }
    if t.is_dir() {
        return Some("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return Some("a named pipe (FIFO)");
        }
        if t.is_char_device() {
            return Some("a character device");
        }
        if t.is_block_device() {
            return Some("a block device");
        }
        if t.is_socket() {
            return Some("a socket");
        }
    }
    Some("not a regular file")
}

/// The refusal of a non-regular `path`.
fn not_regular(path: &Path, what: &str) -> Error {
    Error::Input(format!(
        "{}: is {what}, not a regular file (hsparity reads input from regular files only)",
        path.display()
    ))
}

/// Fails unless `path` is, after resolving symlinks, a regular file.
///
/// Errors: the path does not exist or cannot be examined ([`Error::Io`]);
/// it is a directory, FIFO, device or socket ([`Error::Input`], saying which).
pub fn check_regular(path: &Path) -> Result<Metadata> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    match kind_of(&meta) {
        None => Ok(meta),
        Some(what) => Err(not_regular(path, what)),
    }
}

/// Opens `path` for reading, refusing anything but a regular file. The open
/// never blocks (`O_NONBLOCK`, which regular files ignore) and the type is
/// checked on the opened descriptor.
///
/// Errors: as [`check_regular`].
pub fn open(path: &Path) -> Result<File> {
    check_regular(path)?;
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let f = opts.open(path).map_err(|e| Error::io(path, e))?;
    let meta = f.metadata().map_err(|e| Error::io(path, e))?;
    match kind_of(&meta) {
        None => Ok(f),
        Some(what) => Err(not_regular(path, what)),
    }
}

/// The bytes of the regular file `path`.
///
/// Errors: as [`open`]; a read failure ([`Error::Io`]).
pub fn read(path: &Path) -> Result<Vec<u8>> {
    let mut f = open(path)?;
    let mut v = Vec::new();
    f.read_to_end(&mut v).map_err(|e| Error::io(path, e))?;
    Ok(v)
}

/// The text of the regular file `path`.
///
/// Errors: as [`read`]; not UTF-8 ([`Error::Input`]).
pub fn read_to_string(path: &Path) -> Result<String> {
    String::from_utf8(read(path)?).map_err(|e| {
        Error::Input(format!(
            "{}: not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
    })
}

/// The UTF-8 byte-order mark.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// `None`, or the message for JSON `bytes` that start with a UTF-8
/// byte-order mark: JSON forbids it (RFC 8259 §8.1), and Python's
/// `json.loads`, which transformers reads its JSON files with
/// (`configuration_utils.py::PretrainedConfig._dict_from_json_file`), refuses
/// it ("Unexpected UTF-8 BOM").
pub fn bom_message(bytes: &[u8]) -> Option<String> {
    bytes.starts_with(BOM).then(|| {
        "starts with a UTF-8 byte-order mark (EF BB BF): JSON does not allow one, and transformers \
         refuses the file too (Python's json.loads: \"Unexpected UTF-8 BOM\"); save it without the mark"
            .to_string()
    })
}

/// `gz` decompressed, refused past `limit` bytes (before the allocator would
/// be: a gzip bomb is a few kilobytes), `what` naming what it should hold.
///
/// Errors ([`Error::Format`], naming `path`): not a gzip stream; more than
/// `limit` bytes.
pub fn gunzip_bounded(gz: &[u8], limit: u64, path: &Path, what: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| {
            Error::Format(format!(
                "{}: not a readable gzip stream: {e}",
                path.display()
            ))
        })?;
    if out.len() as u64 > limit {
        return Err(Error::Format(format!(
            "{}: decompresses to more than {} MiB, more than {what} holds (hsparity's bound)",
            path.display(),
            limit >> 20
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_is_not_a_regular_file() {
        let tmp = tempfile::tempdir().unwrap();
        let e = read(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("is a directory, not a regular file"), "{e}");
        let f = tmp.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        assert_eq!(read(&f).unwrap(), b"x");
        let link = tmp.path().join("l");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert_eq!(read(&link).unwrap(), b"x");
        let e = read(Path::new("/dev/null")).unwrap_err().to_string();
        assert!(e.contains("a character device"), "{e}");
        let fifo = tmp.path().join("p");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read(&fifo).unwrap_err().to_string();
        assert!(e.contains("a named pipe (FIFO)"), "{e}");
        assert!(bom_message(b"\xEF\xBB\xBF{}").is_some());
        assert!(bom_message(b"{}").is_none());
    }
}
