//! The cache directory from the environment (`HF_HUB_CACHE`, `HF_HOME`),
//! read by the binary: each run is its own process with its own
//! environment, so nothing here sets a variable of the test process.

use crate::common;

/// `inventory ID --json` with `HF_HOME` set to `home` (and `HF_HUB_CACHE`
/// to `hub_cache` when given): exit code, stdout, stderr.
fn inventory(
    id: &str,
    home: &std::path::Path,
    hub_cache: Option<&std::path::Path>,
) -> (i32, String, String) {
    let mut cmd = common::hsparity();
    cmd.args(["inventory", id, "--json"])
        .env_remove("HF_HUB_CACHE")
        .env_remove("HUGGINGFACE_HUB_CACHE")
        .env("HF_HOME", home)
        .env("HF_HUB_OFFLINE", "1");
    if let Some(c) = hub_cache {
        cmd.env("HF_HUB_CACHE", c);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn env_vars_select_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hf_home");
    common::fake_hub_cache(&home.join("hub"), "EnvOrg/Tiny");
    let (code, out, err) = inventory("EnvOrg/Tiny", &home, None);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(common::COMMIT),
        "the snapshot's commit is reported: {out}"
    );

    // HF_HUB_CACHE takes precedence over HF_HOME.
    let other = tmp.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let (code, _, err) = inventory("EnvOrg/Tiny", &home, Some(&other));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&other.display().to_string()), "{err}");
}
