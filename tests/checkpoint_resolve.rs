//! `<CHECKPOINT>` as a Hub id resolved through a fake local cache laid out
//! exactly as hf-hub writes it. No network, ever: the cache directory is
//! passed explicitly (the env-var lookup is tested in its own process, see
//! `checkpoint_resolve_env.rs`).

use crate::common;

use hsparity::checkpoint::resolve::resolve_with_cache;
use hsparity::checkpoint::{Checkpoint, SourceKind};
use hsparity::error::Error;
use hsparity::loading;

#[test]
fn hub_id_default_revision() {
    let tmp = tempfile::tempdir().unwrap();
    common::fake_hub_cache(tmp.path(), "FakeOrg/Tiny-Qwen3.5");
    let ckpt = Checkpoint::open_with_cache("FakeOrg/Tiny-Qwen3.5", tmp.path()).unwrap();
    let s = &ckpt.source;
    assert_eq!(s.kind, SourceKind::HubCache);
    assert_eq!(s.repo_id.as_deref(), Some("FakeOrg/Tiny-Qwen3.5"));
    assert_eq!(s.revision.as_deref(), Some("main"));
    assert_eq!(s.commit.as_deref(), Some(common::COMMIT));
    assert!(s.dir.ends_with(format!("snapshots/{}", common::COMMIT)));
    assert!(ckpt.tokenizer.is_some());
    let inv = loading::inventory(&ckpt, &[]).unwrap();
    assert_eq!(inv.checkpoint, "FakeOrg/Tiny-Qwen3.5");
    assert_eq!(inv.checkpoint_tensors, 129);
    // Data through the symlinked snapshot.
    let r = loading::resolve(&ckpt, loading::LoadingPath::CausalLm).unwrap();
    use hsparity::loading::WeightSource;
    assert_eq!(r.view.tensor("norm.weight").unwrap().dims(), &[64]);
}

#[test]
fn hub_id_explicit_main_and_commit() {
    let tmp = tempfile::tempdir().unwrap();
    common::fake_hub_cache(tmp.path(), "FakeOrg/Tiny-Qwen3.5");
    let a = resolve_with_cache("FakeOrg/Tiny-Qwen3.5@main", Some(tmp.path())).unwrap();
    let b = resolve_with_cache(
        &format!("FakeOrg/Tiny-Qwen3.5@{}", common::COMMIT),
        Some(tmp.path()),
    )
    .unwrap();
    assert_eq!(a.dir, b.dir);
    assert_eq!(b.commit.as_deref(), Some(common::COMMIT));
    assert_eq!(b.revision.as_deref(), Some(common::COMMIT));
}

#[test]
fn ref_with_trailing_newline() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = common::fake_hub_cache(tmp.path(), "o/n");
    std::fs::write(repo.join("refs/main"), format!("{}\n", common::COMMIT)).unwrap();
    let s = resolve_with_cache("o/n", Some(tmp.path())).unwrap();
    assert_eq!(s.commit.as_deref(), Some(common::COMMIT));
}

#[test]
fn not_in_cache_says_offline_and_how_to_download() {
    let tmp = tempfile::tempdir().unwrap();
    let e = resolve_with_cache("Nobody/Missing-Model", Some(tmp.path())).unwrap_err();
    assert!(matches!(e, Error::Input(_)), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains("huggingface-cli download Nobody/Missing-Model"),
        "{m}"
    );
    assert!(m.contains("never downloads"), "{m}");
    assert!(m.contains(&tmp.path().display().to_string()), "{m}");
}

#[test]
fn unknown_revision_lists_cached_snapshots() {
    let tmp = tempfile::tempdir().unwrap();
    common::fake_hub_cache(tmp.path(), "o/n");
    let e = resolve_with_cache("o/n@v2", Some(tmp.path())).unwrap_err();
    assert!(matches!(e, Error::Input(_)), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains("v2") && m.contains(common::COMMIT) && m.contains("--revision v2"),
        "{m}"
    );
}

#[test]
fn snapshot_dir_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = common::fake_hub_cache(tmp.path(), "o/n");
    std::fs::write(repo.join("refs/main"), "f".repeat(40)).unwrap();
    let e = resolve_with_cache("o/n", Some(tmp.path())).unwrap_err();
    assert!(matches!(e, Error::Input(_)), "{e:?}");
    assert!(e.to_string().contains(&"f".repeat(40)), "{e}");
}

#[test]
fn local_directory_wins() {
    let dir = common::repo_root().join("fixtures/tiny-qwen3_5");
    let s = resolve_with_cache(dir.to_str().unwrap(), None).unwrap();
    assert_eq!(s.kind, SourceKind::Local);
    assert_eq!(s.repo_id, None);
}

#[test]
fn neither_dir_nor_repo_id() {
    for arg in ["a/b/c", "../nope", "", "x@y"] {
        let e = resolve_with_cache(arg, None).unwrap_err();
        assert!(matches!(e, Error::Input(_)), "{arg}: {e:?}");
        assert!(e.to_string().contains("org/name"), "{arg}: {e}");
    }
}
