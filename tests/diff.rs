//! `hsparity diff`: dumps captured anywhere compared with the same metrics and
//! verdicts as `compare`; the input-equality gate; dtype noise; tap offsets.

use crate::common;

use common::hsparity;

use serde_json::Value;

const CKPT: &str = "fixtures/tiny-qwen3_5";

fn dump(dir: &std::path::Path, name: &str, args: &[&str]) -> String {
    let out = dir.join(name);
    let o = hsparity()
        .args(["dump", CKPT, "--quiet", "--force", "--out"])
        .arg(&out)
        .args(args)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out.to_str().unwrap().to_string()
}

/// `hsparity diff ARGS --json --no-report`: exit code, JSON (null when none)
/// and stderr.
pub(crate) fn diff(args: &[&str]) -> (i32, Value, String) {
    let o = hsparity()
        .arg("diff")
        .args(args)
        .args(["--json", "--no-report"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o.status.code().unwrap(), v, stderr)
}

#[test]
fn python_dump_script_diffs_clean_against_hsparity() {
    // golden/py-dump-vlm.safetensors was written by tools/dump_hidden_states.py
    // (transformers, AutoModel) on the fixture's first prompt.
    let tmp = tempfile::tempdir().unwrap();
    let ours = dump(
        tmp.path(),
        "vlm.safetensors",
        &[
            "--path",
            "vlm",
            "--prompt",
            "The hidden state of the model.",
        ],
    );
    let (code, v, err) = diff(&[&format!("{CKPT}/golden/py-dump-vlm.safetensors"), &ours]);
    assert_eq!(code, 0, "{err} {v}");
    assert_eq!(v["verdict"], "pass");
    assert_eq!(v["pairs"][0]["hidden_states"].as_array().unwrap().len(), 7);
    assert_eq!(v["schema_version"], 1);
}

#[test]
fn bf16_vs_f32_is_labelled_dtype_noise() {
    let tmp = tempfile::tempdir().unwrap();
    let ids = [
        "--path",
        "causal-lm",
        "--prompts",
        "fixtures/tiny-qwen3_5/prompts.jsonl",
    ];
    let f32 = dump(tmp.path(), "f32.safetensors", &ids);
    let bf16 = dump(
        tmp.path(),
        "bf16.safetensors",
        &[&ids[..], &["--dtype", "bf16"]].concat(),
    );
    let (code, v, err) = diff(&[&f32, &bf16]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["lower_dtype"], "bf16");
    let rows = v["dtype_noise"].as_array().unwrap();
    assert_eq!(rows.len(), 7);
    assert!(rows.iter().all(|r| r["dtype_noise"] == true), "{rows:?}");
    assert!(v["summary"].as_str().unwrap().contains("dtype noise"));
    // A real difference is not dtype noise: bf16 vs f32 of *different* weights
    // would fail; here, shifting the taps by one is a real difference.
    let (code, v, _) = diff(&[&f32, &bf16, "--tap-offset", "1"]);
    assert_eq!(code, 1);
    assert!(v["dtype_noise"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["dtype_noise"] == false));
}

#[test]
fn tap_offset_aligns_the_other_convention() {
    let tmp = tempfile::tempdir().unwrap();
    let a = dump(
        tmp.path(),
        "a.safetensors",
        &["--path", "causal-lm", "--prompt-ids", "5,6,7,8,9"],
    );
    let (code, v, _) = diff(&[&a, &a]);
    assert_eq!((code, v["verdict"].as_str()), (0, Some("pass")));
    let (code, v, _) = diff(&[&a, &a, "--tap-offset", "-1"]);
    assert_eq!(code, 1);
    assert_eq!(v["pairs"][0]["first_divergent"], 1);
    assert_eq!(v["tap_offset"], -1);
}

#[test]
fn different_inputs_are_refused_with_both_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let a = dump(
        tmp.path(),
        "a.safetensors",
        &["--path", "vlm", "--prompt-ids", "1,2,3"],
    );
    let b = dump(
        tmp.path(),
        "b.safetensors",
        &["--path", "vlm", "--prompt-ids", "1,2,4"],
    );
    let (code, _, err) = diff(&[&a, &b]);
    assert_eq!(code, 2);
    assert!(
        err.contains("input-equality gate")
            && err.contains("prompt p0")
            && err.contains("position 2")
            && err.contains("token 3")
            && err.contains("token 4")
            && err.lines().count() == 1,
        "{err}"
    );
    let (code, _, err) = diff(&[&a, "Cargo.toml"]);
    assert_eq!(code, 2);
    assert!(err.contains("Cargo.toml"), "{err}");
}

#[test]
fn diff_writes_the_same_report_formats_as_compare() {
    let tmp = tempfile::tempdir().unwrap();
    let a = dump(
        tmp.path(),
        "a.safetensors",
        &["--path", "vlm", "--prompt-ids", "1,2,3"],
    );
    let reports = tmp.path().join("reports");
    let args = [
        "diff",
        &a,
        &a,
        "--report-dir",
        reports.to_str().unwrap(),
        "--name",
        "d",
    ];
    let o = hsparity().args(args).output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let md = std::fs::read_to_string(reports.join("d/report.md")).unwrap();
    assert!(
        md.starts_with("PASS:") && md.contains("## Reproduce"),
        "{md}"
    );
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(reports.join("d/report.json")).unwrap())
            .unwrap();
    assert_eq!(v["kind"], "diff");
    assert_eq!(
        hsparity().args(args).output().unwrap().status.code(),
        Some(2),
        "no overwrite without --force"
    );
}

/// Rewrites dump `src` into `dst` after `edit` on its tensors and metadata.
pub(crate) fn rewrite_dump(
    src: &str,
    dst: &std::path::Path,
    edit: impl FnOnce(
        &mut std::collections::HashMap<String, candle_core::Tensor>,
        &mut std::collections::HashMap<String, String>,
    ),
) {
    let bytes = std::fs::read(src).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut m: std::collections::HashMap<String, String> =
        meta.metadata().clone().unwrap_or_default();
    let mut t = candle_core::safetensors::load_buffer(&bytes, &candle_core::Device::Cpu).unwrap();
    edit(&mut t, &mut m);
    let views = t.iter().map(|(k, v)| (k.as_str(), v));
    std::fs::write(dst, safetensors::serialize(views, Some(m)).unwrap()).unwrap();
}

#[test]
fn malformed_or_mismatched_dumps_are_refused_and_dtype_names_normalised() {
    let tmp = tempfile::tempdir().unwrap();
    let ids = [
        "--path",
        "causal-lm",
        "--prompts",
        "fixtures/tiny-qwen3_5/prompts.jsonl",
    ];
    let a = dump(tmp.path(), "a.safetensors", &ids);
    // A prompt missing its last hidden state: refused when read.
    let short = tmp.path().join("short.safetensors");
    rewrite_dump(&a, &short, |t, _| {
        t.remove("p1.hidden_states.6");
    });
    let (code, _, err) = diff(&[&a, short.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("p1 has 6 hidden states but p0 has 7"), "{err}");
    // An index missing from every prompt: a partial dump; the others are compared.
    let partial = tmp.path().join("partial.safetensors");
    rewrite_dump(&a, &partial, |t, _| {
        t.remove("p0.hidden_states.6");
        t.remove("p1.hidden_states.6");
    });
    let (code, v, err) = diff(&[&a, partial.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["pairs"][0]["hidden_states"].as_array().unwrap().len(), 6);
    assert_eq!(v["skipped"]["a"], serde_json::json!([6]));
    assert!(v["notes"].to_string().contains("skipped"), "{v}");
    // Different depths (the metadata says so) at offset 0: refused.
    let shallow = tmp.path().join("shallow.safetensors");
    rewrite_dump(&a, &shallow, |t, m| {
        t.remove("p0.hidden_states.6");
        t.remove("p1.hidden_states.6");
        m.insert("num_layers".into(), "5".into());
    });
    let (code, _, err) = diff(&[&a, shallow.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("different depths"), "{err}");
    // The dtype may be spelled the torch way: same verdict as "bf16".
    let bf16 = dump(
        tmp.path(),
        "b.safetensors",
        &[&ids[..], &["--dtype", "bf16"]].concat(),
    );
    let torchy = tmp.path().join("torchy.safetensors");
    rewrite_dump(&bf16, &torchy, |_, m| {
        m.insert("dtype".into(), "torch.bfloat16".into());
    });
    let (code, v, err) = diff(&[&a, torchy.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["lower_dtype"], "bf16");
}

#[test]
fn a_warn_only_run_fails_and_its_summary_names_the_rows_and_the_rule() {
    // Every tensor scaled by 1 + 3e-4: cosine 1 everywhere, rel L2 3e-4 —
    // over f32's pass limit (1e-4), inside its warn limit (1e-2).
    let tmp = tempfile::tempdir().unwrap();
    let a = dump(tmp.path(), "a.safetensors", &["--path", "causal-lm"]);
    let b = tmp.path().join("b.safetensors");
    rewrite_dump(&a, &b, |t, _| {
        for v in t.values_mut() {
            if v.dtype() == candle_core::DType::F32 {
                *v = v.affine(1.0 + 3e-4, 0.0).unwrap();
            }
        }
    });
    let (code, v, err) = diff(&[&a, b.to_str().unwrap()]);
    assert_eq!(code, 1, "{err} {v}");
    let rows = v["pairs"][0]["hidden_states"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["verdict"] == "warn"), "{rows:?}");
    let summary = v["summary"].as_str().unwrap();
    assert!(summary.starts_with("FAIL: "), "{summary}");
    let last = rows.len() - 1;
    for want in [
        format!("hs 0–{last} WARN, logits WARN under the f32 tolerance"),
        "pass cos_min ≥ 0.99999 and rel L2 ≤ 1e-4".to_string(),
        "a WARN row fails the run".to_string(),
    ] {
        assert!(summary.contains(&want), "{want:?} not in {summary}");
    }
    assert_eq!(v["pairs"][0]["tolerance_rule"], "f32 tolerance");
}

/// Logits of different vocabularies are named as such (the two widths and
/// what to do), not as tensors of two shapes.
#[test]
fn logits_of_different_vocabularies_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let a = dump(tmp.path(), "a.safetensors", &["--path", "causal-lm"]);
    let b = tmp.path().join("b.safetensors");
    let mut width = 0;
    rewrite_dump(&a, &b, |t, _| {
        for (k, v) in t.iter_mut() {
            if k.ends_with(".logits") {
                width = v.dims()[1];
                *v = v.narrow(1, 0, 100).unwrap();
            }
        }
    });
    assert!(width > 100);
    let o = hsparity()
        .args(["diff", &a, b.to_str().unwrap(), "--no-report"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("vocabularies of {width} and 100 entries")),
        "{err}"
    );
    assert!(err.contains(".logits are"), "{err}");
}
