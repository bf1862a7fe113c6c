//! Resolving the `<CHECKPOINT>` argument: a local directory, or a Hub id
//! `org/name[@revision]` looked up in the local Hugging Face cache only.
//!
//! hsparity never touches the network, so `HF_HUB_OFFLINE` is honoured
//! trivially. The cache layout is the one `huggingface_hub` (Python) and
//! `hf-hub` write:
//!
//! ```text
//! <cache>/models--{org}--{name}/refs/{revision}          text: 40-hex commit
//! <cache>/models--{org}--{name}/blobs/{etag}             file bytes
//! <cache>/models--{org}--{name}/snapshots/{commit}/{f}   symlink ../../blobs/{etag}
//! ```
//!
//! The cache directory follows `huggingface_hub.constants`:
//! `HF_HUB_CACHE` > `HUGGINGFACE_HUB_CACHE` > `$HF_HOME/hub` >
//! `$XDG_CACHE_HOME/huggingface/hub` > `~/.cache/huggingface/hub`.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};

/// Where a checkpoint argument was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// A local directory given by path.
    Local,
    /// A snapshot in the Hugging Face hub cache.
    HubCache,
}

/// What `<CHECKPOINT>` resolved to; recorded in reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResolvedSource {
    /// The argument as the user gave it (e.g. `Qwen/Qwen3.6-27B@main` or `./ckpt`).
    pub display: String,
    /// Local directory or hub-cache snapshot directory holding `config.json`.
    pub dir: PathBuf,
    /// Local directory or hub cache.
    pub kind: SourceKind,
    /// `org/name` for a hub id, `None` for a local directory.
    pub repo_id: Option<String>,
    /// The revision asked for (`main` by default), `None` for a local directory.
    pub revision: Option<String>,
    /// The 40-hex snapshot commit, `None` for a local directory.
    pub commit: Option<String>,
}

/// The hub cache directory from the environment, in `huggingface_hub` order:
/// `HF_HUB_CACHE` > `HUGGINGFACE_HUB_CACHE` > `$HF_HOME/hub` >
/// `$XDG_CACHE_HOME/huggingface/hub` > `$HOME/.cache/huggingface/hub`.
///
/// Returns `None` only when none of these variables is set (no `HOME` either).
pub fn hub_cache_dir() -> Option<PathBuf> {
    hub_cache_dir_from(|k| std::env::var(k).ok())
}

/// [`hub_cache_dir`] with an explicit variable lookup (empty values count as
/// unset), so the precedence can be tested without touching the process
/// environment.
pub fn hub_cache_dir_from(lookup: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let get = |k: &str| lookup(k).filter(|v| !v.is_empty());
    if let Some(p) = get("HF_HUB_CACHE").or_else(|| get("HUGGINGFACE_HUB_CACHE")) {
        return Some(PathBuf::from(p));
    }
    if let Some(home) = get("HF_HOME") {
        return Some(PathBuf::from(home).join("hub"));
    }
    if let Some(xdg) = get("XDG_CACHE_HOME") {
        return Some(PathBuf::from(xdg).join("huggingface").join("hub"));
    }
    get("HOME").map(|h| {
        PathBuf::from(h)
            .join(".cache")
            .join("huggingface")
            .join("hub")
    })
}

/// Splits `org/name[@revision]` into `(repo_id, revision)`; `None` when the
/// argument does not have that shape (exactly one `/`, both parts made of
/// `[A-Za-z0-9._-]`, not starting with `.`). The revision may contain `/`
/// (e.g. `refs/pr/1`).
pub fn parse_repo_id(arg: &str) -> Option<(String, Option<String>)> {
    let (id, rev) = match arg.split_once('@') {
        Some((id, rev)) if !rev.is_empty() => (id, Some(rev.to_string())),
        Some(_) => return None,
        None => (arg, None),
    };
    let (org, name) = id.split_once('/')?;
    let ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    if ok(org) && ok(name) {
        Some((id.to_string(), rev))
    } else {
        None
    }
}

fn is_commit_hash(s: &str) -> bool {
    s.len() == 40 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// True for a revision that can name a file under `refs/`: a branch, tag or
/// `refs/pr/N`, made of non-empty `/`-separated components, none of them `.`
/// or `..`, no backslash, NUL or control character, not absolute.
pub fn is_valid_revision(rev: &str) -> bool {
    !rev.is_empty()
        && !rev.chars().any(|c| c == '\\' || c.is_control())
        && rev
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

/// Resolves `<CHECKPOINT>` using the cache directory from the environment
/// ([`hub_cache_dir`]). See [`resolve_with_cache`].
pub fn resolve(arg: &str) -> Result<ResolvedSource> {
    resolve_with_cache(arg, hub_cache_dir().as_deref())
}

/// Resolves `<CHECKPOINT>`: an existing directory is used as is; otherwise
/// the argument must be `org/name[@revision]` and is looked up in `cache_dir`
/// (`refs/{revision}` → commit; a 40-hex revision is used directly as the
/// commit) → `snapshots/{commit}/`. Never downloads.
///
/// Errors ([`Error::Input`]): the argument is neither an existing directory
/// nor `org/name[@rev]`; the repository, revision or snapshot is not in the
/// cache (the message names the cache directory and suggests
/// `huggingface-cli download org/name`).
pub fn resolve_with_cache(arg: &str, cache_dir: Option<&Path>) -> Result<ResolvedSource> {
    resolve_named("checkpoint", arg, cache_dir)
}

/// [`resolve`] for a model the command line names otherwise (`--drafter`):
/// the messages call it `what` instead of "checkpoint".
pub fn resolve_as(what: &str, arg: &str) -> Result<ResolvedSource> {
    resolve_named(what, arg, hub_cache_dir().as_deref())
}

/// [`resolve_with_cache`], the argument called `what` in messages.
fn resolve_named(what: &str, arg: &str, cache_dir: Option<&Path>) -> Result<ResolvedSource> {
    let p = Path::new(arg);
    if p.is_dir() {
        return Ok(ResolvedSource {
            display: arg.to_string(),
            dir: p.to_path_buf(),
            kind: SourceKind::Local,
            repo_id: None,
            revision: None,
            commit: None,
        });
    }
    if p.exists() {
        return Err(Error::Input(format!(
            "{what} {arg}: is a file, expected a directory holding config.json and *.safetensors, or a Hub id org/name[@revision]"
        )));
    }
    let Some((repo_id, rev)) = parse_repo_id(arg) else {
        return Err(Error::Input(format!(
            "{what} {arg}: no such directory, and not a Hub id of the form org/name[@revision]"
        )));
    };
    let Some(cache_dir) = cache_dir else {
        return Err(Error::Input(format!(
            "{what} {arg}: not a local directory, and no Hugging Face cache directory is known \
             (set HF_HUB_CACHE or HF_HOME)"
        )));
    };
    let revision = rev.unwrap_or_else(|| "main".to_string());
    if !is_valid_revision(&revision) {
        return Err(Error::Input(format!(
            "{what} {arg}: revision {revision:?} is not a valid revision name (expected a branch, \
             tag or 40-hex commit, without empty, `.` or `..` path components)"
        )));
    }
    let not_cached = |missing: String| {
        Error::Input(format!(
            "{what} {arg}: {missing} in the Hugging Face cache {} (hsparity never downloads, as if \
             HF_HUB_OFFLINE=1); fetch it first with `huggingface-cli download {repo_id}{}`",
            cache_dir.display(),
            if revision == "main" {
                String::new()
            } else {
                format!(" --revision {revision}")
            }
        ))
    };
    let repo =
        hf_hub::Repo::with_revision(repo_id.clone(), hf_hub::RepoType::Model, revision.clone());
    let repo_dir = cache_dir.join(repo.folder_name());
    if !repo_dir.is_dir() {
        if let Some(near) = local_near_misses(p) {
            return Err(Error::Input(format!(
                "{what} {arg}: no such directory; {near}"
            )));
        }
        return Err(not_cached(format!(
            "not a local directory, and {repo_id} is not"
        )));
    }
    let ref_path = repo_dir.join("refs").join(&revision);
    let commit = match crate::input::read(&ref_path) {
        Ok(bytes) => {
            let s = String::from_utf8_lossy(&bytes);
            let c = s.trim();
            if !is_commit_hash(c) {
                return Err(Error::Input(format!(
                    "{what} {arg}: {}: expected a 40-hex commit hash, found {:?} (corrupt Hugging Face cache?)",
                    ref_path.display(),
                    crate::text::preview(c)
                )));
            }
            c.to_ascii_lowercase()
        }
        // A ref that is there but is not a regular file (a FIFO) is refused as such.
        Err(e @ Error::Input(_)) => return Err(e),
        Err(_) if is_commit_hash(&revision) => revision.to_ascii_lowercase(),
        Err(_) => {
            let known = list_dir(&repo_dir.join("snapshots"));
            return Err(not_cached(format!(
                "revision {revision:?} of {repo_id} (no refs/{revision}; cached snapshots: {}) is not",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
    };
    let dir = repo_dir.join("snapshots").join(&commit);
    if !dir.is_dir() {
        return Err(not_cached(format!(
            "snapshot {commit} of {repo_id} (revision {revision}) is not"
        )));
    }
    Ok(ResolvedSource {
        display: arg.to_string(),
        dir,
        kind: SourceKind::HubCache,
        repo_id: Some(repo_id),
        revision: Some(revision),
        commit: Some(commit),
    })
}

fn list_dir(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// For an argument that names a local folder that does not exist but whose
/// parent does (a mistyped path, not a Hub id): what the parent holds, the
/// closest names first.
fn local_near_misses(p: &Path) -> Option<String> {
    let parent = p
        .parent()
        .filter(|d| !d.as_os_str().is_empty() && d.is_dir())?;
    let name = p.file_name()?.to_string_lossy().into_owned();
    let mut dirs: Vec<String> = std::fs::read_dir(parent)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let shared = |d: &String| {
        d.chars()
            .zip(name.chars())
            .take_while(|(a, b)| a == b)
            .count()
    };
    dirs.sort_by(|a, b| shared(b).cmp(&shared(a)).then(a.cmp(b)));
    let shown: Vec<String> = dirs.iter().take(4).map(|d| format!("{d}/")).collect();
    Some(match shown.is_empty() {
        true => format!("{} holds no folder", parent.display()),
        false => format!("{} holds {}", parent.display(), shown.join(", ")),
    })
}

/// The subfolders of `dir` that hold a `config.json` (a folder of
/// checkpoints given instead of one of them), as `a/, b/`.
pub fn subfolders_with_config(dir: &Path) -> Option<String> {
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("config.json").is_file())
        .map(|e| format!("{}/", e.file_name().to_string_lossy()))
        .collect();
    found.sort();
    (!found.is_empty()).then(|| found.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_id_shapes() {
        assert_eq!(
            parse_repo_id("Qwen/Qwen3.6-27B"),
            Some(("Qwen/Qwen3.6-27B".into(), None))
        );
        assert_eq!(
            parse_repo_id("a/b@refs/pr/1"),
            Some(("a/b".into(), Some("refs/pr/1".into())))
        );
        assert_eq!(parse_repo_id("a/b/c"), None);
        assert_eq!(parse_repo_id("./x"), None);
        assert_eq!(parse_repo_id("noslash"), None);
        assert_eq!(parse_repo_id("a/b@"), None);
    }

    #[test]
    fn cache_dir_precedence() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let all = [
            ("HF_HUB_CACHE", "/a"),
            ("HUGGINGFACE_HUB_CACHE", "/b"),
            ("HF_HOME", "/c"),
            ("XDG_CACHE_HOME", "/d"),
            ("HOME", "/e"),
        ];
        for skip in 0..5 {
            let pairs: &'static [(&str, &str)] = Box::leak(all[skip..].to_vec().into_boxed_slice());
            let got = hub_cache_dir_from(env(pairs)).unwrap();
            let want = [
                "/a",
                "/b",
                "/c/hub",
                "/d/huggingface/hub",
                "/e/.cache/huggingface/hub",
            ][skip];
            assert_eq!(got, PathBuf::from(want));
        }
        assert_eq!(hub_cache_dir_from(|_| None), None);
    }

    #[test]
    fn revisions_that_escape_refs_are_invalid() {
        for ok in [
            "main",
            "v1.0",
            "refs/pr/1",
            "0123456789abcdef0123456789abcdef01234567",
        ] {
            assert!(is_valid_revision(ok), "{ok}");
        }
        for bad in [
            "", "..", "../x", "a/../b", "/etc", "a//b", "a/", "./a", "a\\b", "a\nb",
        ] {
            assert!(!is_valid_revision(bad), "{bad:?}");
        }
    }

    fn fake_repo(cache: &Path, refs_main: &str) -> PathBuf {
        let repo = cache.join("models--org--m");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::create_dir_all(
            repo.join("snapshots")
                .join("0123456789abcdef0123456789abcdef01234567"),
        )
        .unwrap();
        std::fs::write(repo.join("refs/main"), refs_main).unwrap();
        repo
    }

    #[test]
    fn refs_must_hold_a_commit_hash() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path();
        fake_repo(cache, "0123456789abcdef0123456789abcdef01234567\n");
        let r = resolve_with_cache("org/m", Some(cache)).unwrap();
        assert_eq!(
            r.commit.as_deref(),
            Some("0123456789abcdef0123456789abcdef01234567")
        );
        for bad in [
            "/etc",
            "../../../etc",
            "",
            "0123456789abcdef0123456789abcdef0123456",
            "main",
        ] {
            fake_repo(cache, bad);
            let e = resolve_with_cache("org/m", Some(cache)).unwrap_err();
            assert!(matches!(e, Error::Input(_)), "{e:?}");
            let m = e.to_string();
            assert!(
                m.contains("refs/main") && m.contains("40-hex"),
                "{bad:?}: {m}"
            );
        }
        let e = resolve_with_cache("org/m@../../x", Some(cache))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a valid revision"), "{e}");
        // A 40-hex revision without a ref is used directly (case-insensitively).
        let r = resolve_with_cache(
            "org/m@0123456789ABCDEF0123456789ABCDEF01234567",
            Some(cache),
        )
        .unwrap();
        assert_eq!(
            r.commit.as_deref(),
            Some("0123456789abcdef0123456789abcdef01234567")
        );
    }
}
