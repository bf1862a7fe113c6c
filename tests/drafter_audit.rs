//! The drafter–target audit (`hsparity::drafter::audit`): every fact a DFlash
//! drafter's config records about its target, checked against the target it
//! runs on. A drafter made for another target (each recorded fact alone) is
//! a finding — FAIL, exit 1, both values named — in `drafter`, `compare
//! --drafter` and `triage`; what cannot run at all (no taps, a tap or the
//! mask token outside the target) exits 2; a drafter given as the target, or
//! a target as the drafter, is named as such.

use std::path::{Path, PathBuf};

use crate::common;
use serde_json::Value;

const TARGET: &str = "fixtures/toy-pair/target";
const DRAFTER: &str = "fixtures/toy-pair/drafter";
/// A short run: one prompt, 8 new tokens.
const SHORT: [&str; 5] = [
    "--prompt",
    "count 347: 347 348",
    "--max-new-tokens",
    "8",
    "--quiet",
];

/// A copy of the toy drafter under `root` with `edit` applied to its config.
fn drafter_with(root: &Path, edit: impl Fn(&mut Value)) -> PathBuf {
    let dir = root.join("drafter");
    std::fs::create_dir_all(&dir).unwrap();
    let src = common::repo_root().join(DRAFTER);
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&cfg).unwrap(),
    )
    .unwrap();
    dir
}

/// `hsparity VERB TARGET --drafter D SHORT… --json`: exit code, JSON, stderr.
fn run(verb: &str, target: &str, drafter: &Path, extra: &[&str]) -> (i32, Value, String) {
    let out = common::hsparity()
        .args([verb, target, "--drafter", drafter.to_str().unwrap()])
        .args(SHORT)
        .args(extra)
        .arg("--json")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), v, err)
}

/// The audit of a report's drafter (`drafter.audit`, or triage's `drafter_audit`).
fn audit_of(v: &Value) -> &Vec<Value> {
    v["drafter"]["audit"]
        .as_array()
        .or_else(|| v["drafter_audit"].as_array())
        .unwrap_or_else(|| panic!("no audit in {v}"))
}

#[test]
fn a_drafter_made_for_this_target_passes_every_check() {
    let (code, v, err) = run("drafter", TARGET, &common::repo_root().join(DRAFTER), &[]);
    assert_eq!(code, 0, "{err}");
    let audit = audit_of(&v);
    let fields: Vec<&str> = audit.iter().map(|c| c["field"].as_str().unwrap()).collect();
    assert_eq!(
        fields,
        [
            "num_target_layers",
            "vocab_size",
            "hidden_size",
            "target_layer_ids",
            "mask_token_id",
            "block_size"
        ]
    );
    assert!(audit.iter().all(|c| c["agrees"] == true), "{audit:?}");
    // The toy drafter's config records the toy target's 4 layers and 40 tokens.
    assert_eq!(audit[0]["drafter"], "4");
    assert_eq!(audit[1]["target"], "40");
}

/// Each recorded fact alone, changed: FAIL (exit 1), naming both values, in
/// `drafter` and `compare --drafter`.
#[test]
fn a_drafter_made_for_another_target_fails_naming_both_values() {
    for (field, value, target) in [
        ("num_target_layers", 6, "4"),
        ("vocab_size", 384, "40"),
        ("draft_vocab_size", 32, "40"),
        ("target_hidden_size", 128, "64"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let d = drafter_with(tmp.path(), |c| c[field] = value.into());
        let want = format!(
            "the drafter was made for another target: {field} {value} (this target: {target})"
        );
        let (code, v, err) = run("drafter", TARGET, &d, &[]);
        assert_eq!(code, 1, "{field}: {err}");
        assert_eq!(v["verdict"], "fail");
        assert!(
            v["summary"].as_str().unwrap().contains(&want),
            "{}",
            v["summary"]
        );
        let bad: Vec<&Value> = audit_of(&v)
            .iter()
            .filter(|c| c["agrees"] == false)
            .collect();
        assert_eq!(bad.len(), 1, "{field}: only it disagrees");
        assert_eq!(bad[0]["field"], field);
        let (code, v, err) = run("compare", TARGET, &d, &["--no-report"]);
        assert_eq!(code, 1, "compare {field}: {err}");
        assert!(
            v["summary"].as_str().unwrap().contains(&want),
            "{}",
            v["summary"]
        );
    }
}

/// The target of another family: the toy drafter on the tiny Qwen3.5
/// checkpoint (6 layers, 384 tokens) runs, and fails on both facts.
#[test]
fn compare_on_a_foreign_target_is_a_finding_not_a_pass() {
    let drafter = common::repo_root().join(DRAFTER);
    let (code, v, err) = run(
        "compare",
        "fixtures/tiny-qwen3_5",
        &drafter,
        &["--no-report"],
    );
    assert_eq!(code, 1, "{err}");
    let s = v["summary"].as_str().unwrap();
    assert!(
        s.contains("the drafter was made for another target: num_target_layers 4 (this target: 6), vocab_size 40 (this target: 384)"),
        "{s}"
    );
}

#[test]
fn triage_fails_on_a_drafter_made_for_another_target() {
    let tmp = tempfile::tempdir().unwrap();
    let d = drafter_with(tmp.path(), |c| c["num_target_layers"] = 8.into());
    let (code, v, err) = run("triage", TARGET, &d, &["--no-report"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        v["summary"]
            .as_str()
            .unwrap()
            .contains("num_target_layers 8 (this target: 4)"),
        "{}",
        v["summary"]
    );
    assert!(audit_of(&v)
        .iter()
        .any(|c| c["field"] == "num_target_layers" && c["agrees"] == false));
}

/// A change to a drafter config.
type Edit = Box<dyn Fn(&mut Value)>;

/// What a run cannot start with exits 2 with both values named; taps are
/// never guessed.
#[test]
fn what_cannot_run_is_refused() {
    let cases: [(&str, Edit, &str); 8] = [
        (
            "a fact recorded twice with two values",
            Box::new(|c| c["dflash_config"]["num_target_layers"] = 5.into()),
            "num_target_layers is 4 at the top level and 5 under dflash_config",
        ),
        (
            "a tap twice",
            Box::new(|c| c["dflash_config"]["target_layer_ids"] = serde_json::json!([1, 1])),
            "target_layer_ids [1, 1] repeats layer 1",
        ),
        (
            "a rotary base of 0",
            Box::new(|c| c["rope_parameters"]["rope_theta"] = 0.into()),
            "rope_theta = 0: the rotary base must be a positive number",
        ),
        (
            "a negative rotary base",
            Box::new(|c| c["rope_parameters"]["rope_theta"] = (-10000.0).into()),
            "rope_theta = -10000",
        ),
        (
            "a fact of the wrong type",
            Box::new(|c| c["num_target_layers"] = "4".into()),
            "num_target_layers must be a non-negative integer, found \"4\"",
        ),
        (
            "no taps",
            Box::new(|c| {
                c["dflash_config"]
                    .as_object_mut()
                    .unwrap()
                    .remove("target_layer_ids");
            }),
            "no target_layer_ids",
        ),
        (
            "a tap outside",
            Box::new(|c| c["dflash_config"]["target_layer_ids"] = serde_json::json!([1, 4])),
            "target_layer_ids contains 4, but the target has decoder layers 0..3",
        ),
        (
            "the mask outside",
            Box::new(|c| c["dflash_config"]["mask_token_id"] = 40.into()),
            "mask_token_id 40 is outside the target's vocabulary (40 rows)",
        ),
    ];
    for (what, edit, want) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let d = drafter_with(tmp.path(), edit);
        let (code, _, err) = run("drafter", TARGET, &d, &[]);
        assert_eq!(code, 2, "{what}: {err}");
        assert!(err.contains(want), "{what}: {err}");
    }
}

#[test]
fn a_drafter_as_the_target_and_a_target_as_the_drafter_are_named() {
    let out = common::hsparity()
        .args(["compare", DRAFTER, "--no-report", "--quiet"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("this is a DFlash drafter (DFlashDraftModel), not a target checkpoint"),
        "{err}"
    );
    let (code, _, err) = run("drafter", TARGET, &common::repo_root().join(TARGET), &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "this is a target checkpoint (Qwen3_5ForConditionalGeneration), not a DFlash drafter"
        ),
        "{err}"
    );
}

/// The common mistakes say what was passed and what to pass instead: the
/// pair's parent folder as the drafter or the checkpoint, a mistyped local
/// path (not told to download it from the Hub).
#[test]
fn common_mistakes_say_what_to_pass() {
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "drafter",
                TARGET,
                "--drafter",
                "fixtures/toy-pair",
                "--quiet",
            ],
            "its subfolders drafter/, target/ hold one",
        ),
        (
            &["compare", "fixtures/toy-pair", "--no-report", "--quiet"],
            "its subfolders drafter/, target/ hold one",
        ),
        (
            &["compare", "fixtures/tiny-qwen3_6", "--no-report", "--quiet"],
            "no such directory; fixtures holds tiny-qwen3_5/",
        ),
    ];
    for (args, want) in cases {
        let out = common::hsparity().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            !err.contains("os error") && !err.contains("huggingface-cli"),
            "{err}"
        );
    }
}

/// Facts recorded under `dflash_config` (as SGLang's `DFlashDraftConfig`
/// accepts them) are audited like top-level ones.
#[test]
fn facts_under_dflash_config_are_audited_too() {
    let tmp = tempfile::tempdir().unwrap();
    let d = drafter_with(tmp.path(), |c| {
        c.as_object_mut().unwrap().remove("num_target_layers");
        c["dflash_config"]["num_target_layers"] = 5.into();
    });
    let (code, v, err) = run("drafter", TARGET, &d, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(
        v["summary"]
            .as_str()
            .unwrap()
            .contains("num_target_layers 5 (this target: 4)"),
        "{}",
        v["summary"]
    );
}

/// An EAGLE-3 drafter is named as one (not as a target checkpoint), with the
/// `compare --taps` that checks the target at its aux layers, in each
/// project's index convention.
#[test]
fn an_eagle3_drafter_is_named_with_the_taps_to_compare() {
    let eagle = |c: &mut Value, top: bool| {
        let o = c.as_object_mut().unwrap();
        o.remove("dflash_config");
        o.insert(
            "architectures".into(),
            serde_json::json!(["LlamaForCausalLMEagle3"]),
        );
        o.insert("draft_vocab_size".into(), 32.into());
        if top {
            o.insert(
                "eagle_aux_hidden_state_layer_ids".into(),
                serde_json::json!([1, 2, 3]),
            );
        } else {
            o.insert(
                "eagle_config".into(),
                serde_json::json!({"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}),
            );
        }
    };
    // A DFlash drafter that carries an eagle_config too stays a DFlash one.
    let tmp = tempfile::tempdir().unwrap();
    let d = drafter_with(tmp.path(), |c| {
        c["eagle_config"] = serde_json::json!({"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    });
    let (code, _, err) = run("drafter", TARGET, &d, &[]);
    assert_eq!(code, 0, "{err}");
    for (top, taps) in [(false, "--taps 0,1,2"), (true, "--taps 0,1,2")] {
        let tmp = tempfile::tempdir().unwrap();
        let d = drafter_with(tmp.path(), |c| eagle(c, top));
        let (code, _, err) = run("drafter", TARGET, &d, &[]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains("this is an EAGLE-3 drafter (LlamaForCausalLMEagle3)"),
            "{err}"
        );
        assert!(err.contains(taps), "top-level ids {top}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
