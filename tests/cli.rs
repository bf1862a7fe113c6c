//! The `hsparity` binary end to end: exit codes (0 pass, 1 divergence or
//! missing tensors, 2 bad input), report files, JSON contract, dumps.

use crate::common;

use common::hsparity;

use std::collections::HashMap;

use serde_json::Value;

const CKPT: &str = "fixtures/tiny-qwen3_5";

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn compare_passes_and_writes_reports_atomically_without_overwriting() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let args = [
        "compare",
        CKPT,
        "--quiet",
        "--report-dir",
        dir,
        "--name",
        "t",
        "--taps",
        "1,4",
    ];
    let out = hsparity().args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("PASS: causal-lm and vlm agree bitwise at all 7 hidden states"),
        "{text}"
    );
    assert!(text.contains("◆"), "taps marked");
    let md = std::fs::read_to_string(tmp.path().join("t/report.md")).unwrap();
    assert!(md.starts_with("PASS:"));
    assert!(md.contains("## Reproduce"));
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("t/report.json")).unwrap())
            .unwrap();
    assert_eq!(json["verdict"], "pass");
    // A second run refuses to overwrite, before running anything.
    let again = hsparity().args(args).output().unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(stderr(&again).contains("--force"), "{}", stderr(&again));
    let forced = hsparity().args(args).arg("--force").output().unwrap();
    assert_eq!(forced.status.code(), Some(0), "{}", stderr(&forced));
    // The folder holds exactly the three report files (no temporary left).
    let mut files: Vec<String> = std::fs::read_dir(tmp.path().join("t"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files, ["parity.svg", "report.json", "report.md"]);
    // parity.svg alone is protected too, and refused before the run: nothing is written.
    std::fs::remove_file(tmp.path().join("t/report.md")).unwrap();
    std::fs::remove_file(tmp.path().join("t/report.json")).unwrap();
    let svg_only = hsparity().args(args).output().unwrap();
    assert_eq!(svg_only.status.code(), Some(2));
    assert!(
        stderr(&svg_only).contains("parity.svg"),
        "{}",
        stderr(&svg_only)
    );
    assert!(!tmp.path().join("t/report.md").exists());
}

#[test]
fn compare_json_follows_the_contract() {
    let out = hsparity()
        .args([
            "compare",
            CKPT,
            "--quiet",
            "--no-report",
            "--json",
            "--paths",
            "causal-lm,vlm,image-text-to-text",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["verdict"], "pass");
    assert_eq!(v["inventory"]["checkpoint_tensors"], 129);
    let pairs = v["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 2);
    assert_eq!(pairs[1]["b"], "image-text-to-text");
    assert!(pairs[0]["first_divergent"].is_null());
    let rows = pairs[0]["hidden_states"].as_array().unwrap();
    assert_eq!(rows.len(), 7);
    for key in [
        "index",
        "layer_type",
        "cos_min",
        "cos_mean",
        "max_abs",
        "rel_l2",
        "bitwise",
        "verdict",
    ] {
        assert!(rows[3].get(key).is_some(), "missing {key}");
    }
    assert_eq!(rows[0]["layer_type"], "embedding");
    assert_eq!(rows[3]["layer_type"], "full_attention");
    assert_eq!(rows[6]["layer_type"], "final_norm");
    // Prefill vs incremental ran on every path (a small model) and passed.
    let inc = v["incremental"].as_array().unwrap();
    assert_eq!(inc.len(), 3);
    assert!(inc
        .iter()
        .all(|c| c["verdict"] == "pass" && c["steps"].as_u64().unwrap() >= 1));
    assert!(
        v["environment"]["peak_rss_bytes"].as_u64().unwrap() > 0,
        "peak RSS from the OS"
    );
    // causal-lm vs image-text-to-text: both have an lm_head, logits compared.
    assert_eq!(pairs[1]["logits"]["bitwise"], true);
}

#[test]
fn device_option_is_recorded_and_cuda_is_refused_cleanly_without_it() {
    let out = hsparity()
        .args([
            "compare",
            CKPT,
            "--quiet",
            "--no-report",
            "--json",
            "--device",
            "cpu",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["environment"]["device"], "cpu");

    for verb in [
        vec!["compare", CKPT, "--no-report"],
        vec![
            "dump",
            CKPT,
            "--path",
            "vlm",
            "--out",
            "/nonexistent/d.safetensors",
        ],
        vec![
            "drafter",
            "fixtures/toy-pair/target",
            "--drafter",
            "fixtures/toy-pair/drafter",
        ],
        vec![
            "triage",
            "fixtures/toy-pair/target",
            "--drafter",
            "fixtures/toy-pair/drafter",
            "--no-report",
        ],
    ] {
        assert_bad_input(
            &[verb.clone(), vec!["--device", "tpu"]].concat(),
            "expected cpu, cuda or cuda:N",
        );
        let args = [verb, vec!["--device", "cuda:7", "--quiet"]].concat();
        let out = hsparity().args(&args).output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        if cfg!(feature = "cuda") {
            // A CUDA build: no device 7 here.
            assert!(
                err.contains("--device cuda:7: cannot open the GPU"),
                "{err}"
            );
        } else {
            assert!(err.contains("built without CUDA support"), "{err}");
            assert!(err.contains("--features cuda"), "{err}");
        }
    }
}

#[test]
fn inventory_json_reports_each_path() {
    let out = hsparity()
        .args(["inventory", CKPT, "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["kind"], "inventory");
    assert_eq!(v["verdict"], "pass");
    let paths = v["paths"].as_array().unwrap();
    let by: HashMap<&str, &Value> = paths
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p))
        .collect();
    assert_eq!(by["causal-lm"]["tensors"], 81);
    assert_eq!(by["vlm"]["tensors"], 113);
    assert_eq!(by["vlm"]["unexpected_names"][0], "lm_head.weight");
    assert_eq!(by["image-text-to-text"]["tensors"], 114);
    let table = hsparity().args(["inventory", CKPT]).output().unwrap();
    assert!(stdout(&table).contains("Qwen3_5ForCausalLM"));
}

#[test]
fn dump_writes_the_design_format_and_refuses_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("d.safetensors");
    let run = |extra: &[&str]| {
        hsparity()
            .args([
                "dump",
                CKPT,
                "--path",
                "vlm",
                "--quiet",
                "--prompt-ids",
                "1,2,3,4,5",
                "--out",
            ])
            .arg(&f)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let d = hsparity::dump::Dump::read(&f).unwrap();
    assert_eq!(d.metadata["format"], "hsparity.dump.v1");
    assert_eq!(d.metadata["loading_path"], "vlm");
    assert_eq!(d.metadata["class"], "Qwen3_5Model");
    assert_eq!(d.prompts[0].input_ids, Some(vec![1, 2, 3, 4, 5]));
    assert_eq!(d.prompts[0].hidden_states.len(), 7);
    assert!(d.prompts[0].logits.is_none(), "AutoModel has no lm_head");
    let first = std::fs::read(&f).unwrap();
    assert_eq!(run(&[]).status.code(), Some(2));
    assert_eq!(run(&["--force"]).status.code(), Some(0));
    // The same dump, the same bytes: the header's keys (the metadata's
    // among them) in one order, not a hash map's.
    assert!(
        std::fs::read(&f).unwrap() == first,
        "a second run wrote other bytes"
    );
}

fn assert_bad_input(args: &[&str], needle: &str) {
    let out = hsparity().args(args).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: expected {needle:?} in {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_input_exits_2_with_a_clear_message() {
    assert_bad_input(
        &["compare", "no/such-model", "--no-report"],
        "huggingface-cli download",
    );
    assert_bad_input(
        &["compare", CKPT, "--no-report", "--paths", "causal-lm,bogus"],
        "invalid value 'bogus' for '--paths",
    );
    assert_bad_input(
        &["compare", CKPT, "--no-report", "--paths", "vlm"],
        "at least two",
    );
    assert_bad_input(
        &["compare", CKPT, "--no-report", "--prompt-ids", "1,2,999"],
        "out of range",
    );
    let long: Vec<String> = (0..513).map(|i| (i % 300).to_string()).collect();
    assert_bad_input(
        &[
            "compare",
            CKPT,
            "--no-report",
            "--prompt-ids",
            &long.join(","),
        ],
        "max_position_embeddings",
    );
    assert_bad_input(&["compare", CKPT, "--no-report", "--taps", "6"], "--taps 6");
    assert_bad_input(
        &["compare", CKPT, "--no-report", "--prompt-ids", "1,x"],
        "not a token id",
    );
    assert_bad_input(
        &[
            "compare",
            CKPT,
            "--no-report",
            "--prompts",
            "/nonexistent.jsonl",
        ],
        "nonexistent.jsonl",
    );
    assert_bad_input(
        &["compare", CKPT, "--no-report", "--bogus-flag"],
        "--bogus-flag",
    );
    assert_bad_input(&["dump", CKPT, "--path", "vlm"], "--out");
    // A negative number is the option's value, refused by its own parser
    // (not taken for a flag, with a tip to write `--`).
    let neg = [
        "drafter",
        "fixtures/toy-pair/target",
        "--drafter",
        "fixtures/toy-pair/drafter",
        "--max-new-tokens",
        "-3",
    ];
    assert_bad_input(&neg, "invalid value '-3' for '--max-new-tokens");
    assert_bad_input(
        &[
            "drafter",
            "fixtures/toy-pair/target",
            "--drafter",
            "fixtures/nope",
        ],
        "drafter fixtures/nope: no such directory; fixtures holds",
    );
    let err = stderr(&hsparity().args(neg).output().unwrap());
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!err.contains("tip:"), "{err}");
}

/// No command: clap's help, laid out on several lines, on stderr; exit 2.
#[test]
fn no_command_prints_the_help_and_exits_2() {
    let out = hsparity().output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.lines().any(|l| l.trim() == "Commands:"), "{err}");
    assert!(
        err.lines().any(|l| l.trim_start().starts_with("compare ")),
        "{err}"
    );
    assert!(stdout(&out).is_empty());
}

#[test]
fn truncated_shard_exits_2_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    common::copy_tiny(tmp.path());
    let shard = tmp.path().join("model-00002-of-00003.safetensors");
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let dir = tmp.path().to_str().unwrap();
    assert_bad_input(
        &["compare", dir, "--no-report"],
        "model-00002-of-00003.safetensors",
    );
    assert_bad_input(&["inventory", dir], "model-00002-of-00003.safetensors");
}

/// Rewrites the fixture as one shard after `edit`.
#[test]
fn missing_tensor_is_initialised_reported_and_exits_1() {
    let tmp = tempfile::tempdir().unwrap();
    common::rewrite_tiny_fixture(tmp.path(), |all| {
        assert!(all
            .remove("model.language_model.layers.1.mlp.up_proj.weight")
            .is_some());
    });
    let dir = tmp.path().to_str().unwrap();
    let out = hsparity()
        .args(["compare", dir, "--quiet", "--no-report", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["verdict"], "fail");
    assert!(
        v["summary"].as_str().unwrap().contains("missing"),
        "{}",
        v["summary"]
    );
    let inv = &v["inventory"]["paths"][0];
    assert_eq!(inv["missing"], 1);
    assert_eq!(inv["missing_names"][0], "model.layers.1.mlp.up_proj.weight");
    // Layer 1 (hidden_states[2]) is marked as randomly initialised on both paths, no other.
    let rows = v["pairs"][0]["hidden_states"].as_array().unwrap();
    let marked: Vec<u64> = rows
        .iter()
        .filter(|r| r.get("random_init").is_some())
        .map(|r| r["index"].as_u64().unwrap())
        .collect();
    assert_eq!(marked, vec![2]);
    assert_eq!(
        rows[2]["random_init"],
        serde_json::json!(["causal-lm", "vlm"])
    );
    let inv_out = hsparity().args(["inventory", dir]).output().unwrap();
    assert_eq!(inv_out.status.code(), Some(1));
    assert!(
        stdout(&inv_out).starts_with("FAIL: "),
        "{}",
        stdout(&inv_out)
    );
}

#[test]
fn nan_weights_are_reported_per_tensor_and_exit_1() {
    let tmp = tempfile::tempdir().unwrap();
    let key = "model.language_model.layers.2.self_attn.k_proj.weight";
    common::tiny_fixture_with_non_finite(tmp.path(), key);
    let dir = tmp.path().to_str().unwrap();
    let out = hsparity()
        .args(["compare", dir, "--quiet", "--no-report", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let summary = v["summary"].as_str().unwrap();
    assert!(
        summary.contains(key) && summary.contains("NaN"),
        "{summary}"
    );
    assert_eq!(v["paths"][0]["non_finite_weights"][key]["nan"], 1);
    assert_eq!(v["paths"][0]["non_finite_weights"][key]["inf"], 1);
    // The NaN propagates: hidden states from layer 2 on fail.
    assert_eq!(v["pairs"][0]["hidden_states"][3]["verdict"], "fail");
}
