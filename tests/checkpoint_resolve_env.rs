//! The cache directory from the environment (`HF_HUB_CACHE`, `HF_HOME`).
//! One test in its own binary, so setting variables cannot race with other
//! tests.

mod common;

use hsparity::checkpoint::Checkpoint;

#[test]
fn env_vars_select_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = tmp.path().join("hf_home").join("hub");
    common::fake_hub_cache(&hub, "EnvOrg/Tiny");
    // SAFETY: the only test in this process; no other thread reads the environment.
    unsafe {
        std::env::remove_var("HF_HUB_CACHE");
        std::env::remove_var("HUGGINGFACE_HUB_CACHE");
        std::env::set_var("HF_HOME", tmp.path().join("hf_home"));
        std::env::set_var("HF_HUB_OFFLINE", "1");
    }
    let c = Checkpoint::open("EnvOrg/Tiny").unwrap();
    assert_eq!(c.source.commit.as_deref(), Some(common::COMMIT));

    // HF_HUB_CACHE takes precedence over HF_HOME.
    let other = tmp.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    unsafe { std::env::set_var("HF_HUB_CACHE", &other) };
    let e = Checkpoint::open("EnvOrg/Tiny").unwrap_err();
    assert!(e.to_string().contains(&other.display().to_string()), "{e}");
}
