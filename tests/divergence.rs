//! Loading-path fidelity against transformers 5.23.0, one fixture per
//! divergence source (fixtures/divergence/*, written by tools/make_fixtures.py
//! with the real library): per path the class, dtype, tensor counts per
//! category, tie, missing/unexpected names, and hidden states computed in the
//! dtype transformers picked; between paths the same bitwise verdict.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;

use common::{assert_close, same_len, F32_HYBRID, HALF};
use hsparity::checkpoint::Checkpoint;
use hsparity::commands::compare::{self, CompareOptions};
use hsparity::commands::dump::{self, DumpOptions};
use hsparity::dump::Dump;
use hsparity::loading::{self, LoadingPath};
use serde_json::Value;

const FIXTURES: &[&str] = &[
    "fp16-disk",
    "tied-top-level",
    "nested-prefix",
    "legacy-duplicated-prefix",
    "text-only-causal",
    "bf16-auto",
];

fn dir(f: &str) -> String {
    format!("fixtures/divergence/{f}")
}

fn load_report(f: &str) -> Value {
    let p = format!("{}/golden/load_report.json", dir(f));
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn short_dtype(torch: &str) -> &'static str {
    match torch {
        "float32" => "f32",
        "bfloat16" => "bf16",
        "float16" => "f16",
        other => panic!("dtype {other}"),
    }
}

fn names(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn inventories_match_transformers_load_reports() {
    for f in FIXTURES {
        let ckpt = Checkpoint::open(&dir(f)).unwrap();
        for p in load_report(f)["paths"].as_array().unwrap() {
            let name = p["name"].as_str().unwrap();
            let path: LoadingPath = name.parse().unwrap();
            let ours = loading::resolve(&ckpt, path);
            if p["loaded"] == false {
                let err = ours
                    .err()
                    .unwrap_or_else(|| panic!("{f}/{name}: transformers raises, we resolved"));
                assert_eq!(err.to_string().lines().count(), 1, "{f}/{name}: {err}");
                continue;
            }
            let inv = ours.unwrap_or_else(|e| panic!("{f}/{name}: {e}")).inventory;
            let at = format!("{f}/{name}");
            assert_eq!(inv.class, p["class"].as_str().unwrap(), "{at} class");
            assert_eq!(
                inv.dtype.name(),
                short_dtype(p["dtype"].as_str().unwrap()),
                "{at} dtype ({})",
                inv.dtype_reason
            );
            assert_eq!(
                inv.tensors as u64,
                p["state_dict_tensors"].as_u64().unwrap(),
                "{at} tensors"
            );
            let missing: BTreeSet<String> = inv.missing_names.iter().cloned().collect();
            assert_eq!(missing, names(&p["missing_keys"]), "{at} missing");
            let unexpected: BTreeSet<String> = inv.unexpected_names.iter().cloned().collect();
            assert_eq!(unexpected, names(&p["unexpected_keys"]), "{at} unexpected");
            assert_eq!(inv.consumed + inv.missing, inv.tensors, "{at}");
            assert_eq!(inv.params, p["numel"].as_u64().unwrap(), "{at} params");
            if let Some(tied) = p["tied"].as_bool() {
                assert_eq!(inv.tied_lm_head, tied, "{at} tied");
            }
            // Checkpoint tensors neither loaded nor reported: dropped by an ignore rule.
            let silent = p["derived_dropped_silently"].as_u64().unwrap();
            assert_eq!(inv.dropped_by_rule as u64, silent, "{at} dropped by rule");
        }
    }
}

#[test]
fn broken_nested_prefix_is_named_in_one_line() {
    let inv = loading::inventory(&Checkpoint::open(&dir("nested-prefix")).unwrap(), &[]).unwrap();
    for p in &inv.paths {
        let note = &p.notes[0];
        assert!(
            note.contains("MISSING") && note.contains("language_model.language_model."),
            "{}: {note}",
            p.name
        );
    }
}

/// Hidden states on each path with a golden, in the dtype transformers picked
/// for that path. f32: the issue-2 tolerance; bf16/f16: cosine ≥ 0.999 (we
/// reproduce PyTorch's rounding points; GEMM accumulation order still flips
/// the odd last bit).
#[test]
fn hidden_states_match_goldens_in_the_dtype_transformers_picked() {
    for f in FIXTURES {
        for p in load_report(f)["paths"].as_array().unwrap() {
            let Some(g) = p["golden"].as_str() else {
                continue;
            };
            let name = p["name"].as_str().unwrap();
            let gold = Dump::read(Path::new(g)).unwrap();
            let opts = DumpOptions {
                logits: true,
                quiet: true,
                ..Default::default()
            };
            let target = common::target(&dir(f), Some(&format!("{}/prompts.jsonl", dir(f))));
            let ours = dump::run(&target, name.parse().unwrap(), &opts).unwrap();
            let dtype = &gold.metadata["dtype"];
            assert_eq!(&ours.metadata["dtype"], dtype, "{f}/{name}: computed dtype");
            let random_head = p["missing_keys"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k == "lm_head.weight");
            let mut worst_cos = 1f64;
            same_len(
                &format!("{f}/{name}: prompts"),
                &ours.prompts,
                &gold.prompts,
            );
            for (k, (o, g)) in ours.prompts.iter().zip(&gold.prompts).enumerate() {
                assert_eq!(o.input_ids, g.input_ids);
                // Goldens keep logits only where the fixture budget allows; where
                // they do, ours must be there to be compared.
                assert!(
                    g.logits.is_none() || o.logits.is_some(),
                    "{f}/{name} p{k}: logits"
                );
                let mut pairs: Vec<(String, &candle_core::Tensor, &candle_core::Tensor)> =
                    common::paired_states(
                        &format!("{f}/{name} p{k}"),
                        &o.hidden_states,
                        &g.hidden_states,
                    )
                    .into_iter()
                    .map(|(i, a, b)| (format!("hidden_states[{i}]"), a, b))
                    .collect();
                if let (Some(a), Some(b), false) = (&o.logits, &g.logits, random_head) {
                    pairs.push(("logits".into(), a, b));
                }
                let tol = if dtype == "f32" { &F32_HYBRID } else { &HALF };
                for (what, a, b) in pairs {
                    let m = assert_close(&format!("{f}/{name} p{k} {what}"), a, b, tol);
                    worst_cos = worst_cos.min(m.cos_min);
                }
            }
            println!("{f}/{name} ({dtype}): worst cos {worst_cos:.7}");
        }
    }
}

/// For every pair transformers compared, hsparity's compare gives the same
/// bitwise verdict on the hidden states (and on the logits where recorded).
#[test]
fn cross_path_bitwise_verdicts_match_transformers() {
    for f in FIXTURES {
        let rep = load_report(f);
        for (pair, facts) in rep["cross_path_goldens"].as_object().unwrap() {
            let (a, b) = pair.split_once(" vs ").unwrap();
            let opts = CompareOptions {
                target: common::target(&dir(f), Some(&format!("{}/prompts.jsonl", dir(f)))),
                paths: vec![a.parse().unwrap(), b.parse().unwrap()],
                taps: vec![],
                gdn_form: Default::default(),
                quiet: true,
                command_line: String::new(),
                drafter: None,
                noise_floor: Default::default(),
                incremental: None,
            };
            let r = compare::run(&opts).unwrap();
            let p = &r.pairs[0];
            let want = facts["hidden_states_and_last_layer_output"]["bitwise_equal"]
                .as_bool()
                .unwrap();
            assert_eq!(
                p.first_non_bitwise.is_none(),
                want,
                "{f}: {pair} hidden states bitwise"
            );
            if let Some(lg) = facts["logits"].as_object() {
                let ours = p.logits.as_ref().unwrap().bitwise;
                assert_eq!(
                    ours,
                    lg["bitwise_equal"].as_bool().unwrap(),
                    "{f}: {pair} logits bitwise"
                );
            }
            println!("{f}: {pair}: {}", r.summary);
        }
    }
}

/// `tied-top-level`: `lm_head.weight` is MISSING on causal-lm because the
/// tie flag it reads (`text_config.tie_word_embeddings`) is not the one set
/// (the top-level one): the inventory and compare's causes say so and give
/// the fix, instead of blaming the checkpoint's names.
#[test]
fn a_missing_lm_head_is_blamed_on_the_tie_flag_with_the_fix() {
    let dir = "fixtures/divergence/tied-top-level";
    let out = common::hsparity()
        .args(["inventory", dir, "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let causal = v["paths"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "causal-lm")
        .unwrap();
    let note = causal["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .find(|n| n.starts_with("lm_head.weight MISSING because it is not tied"));
    let note = note.unwrap_or_else(|| panic!("{causal}"));
    assert!(
        note.contains("Fix: set text_config.tie_word_embeddings to true, or save lm_head.weight"),
        "{note}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let out = common::hsparity()
        .args(["compare", dir, "--quiet", "--report-dir"])
        .arg(tmp.path())
        .args(["--name", "t"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let md = std::fs::read_to_string(tmp.path().join("t/report.md")).unwrap();
    let cause = md
        .lines()
        .find(|l| l.starts_with("- missing: causal-lm"))
        .unwrap();
    assert!(
        cause.contains("ties by text_config.tie_word_embeddings"),
        "{cause}"
    );
    assert!(!cause.contains("checkpoint names do not match"), "{cause}");
}

/// `fp16-disk`: causal-lm computes in bf16, vlm in f16; the pair is held to
/// f32's tolerance, and the summary line says so, with the rows it failed.
#[test]
fn a_mixed_dtype_pair_states_its_rule_and_rows_in_the_summary() {
    let out = common::hsparity()
        .args(["compare", &dir("fp16-disk"), "--json", "--no-report"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pair = &v["pairs"][0];
    assert_eq!(
        (pair["dtype_a"].as_str(), pair["dtype_b"].as_str()),
        (Some("bf16"), Some("f16"))
    );
    let rule = pair["tolerance_rule"].as_str().unwrap();
    assert!(rule.starts_with("f32 tolerance (bf16 vs f16"), "{rule}");
    let bad: Vec<String> = pair["hidden_states"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["verdict"] != "pass")
        .map(|r| format!("{} {}", r["index"], r["verdict"]))
        .collect();
    assert!(!bad.is_empty());
    let summary = v["summary"].as_str().unwrap();
    assert!(summary.contains(&format!("under the {rule}")), "{summary}");
    assert!(
        summary.contains("pass cos_min ≥ 0.99999 and rel L2 ≤ 1e-4"),
        "{summary}"
    );
    // every row that did not pass is named, under its verdict
    for r in pair["hidden_states"].as_array().unwrap() {
        if r["verdict"] != "pass" {
            let label = r["verdict"].as_str().unwrap().to_uppercase();
            assert!(
                summary.contains(&label),
                "{label} of {bad:?} not in {summary}"
            );
        }
    }
}

/// Each cause of a divergence fixture names its fix, as the loading-path
/// section of the README explains it: the dtype pair, the key prefix.
#[test]
fn causes_name_their_fix() {
    for (f, want) in [
        ("fp16-disk", "Fix: set the top-level `dtype` in config.json"),
        (
            "nested-prefix",
            "Fix: re-save the weights under `model.language_model.`",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let out = common::hsparity()
            .args(["compare", &dir(f), "--quiet", "--report-dir"])
            .arg(tmp.path())
            .args(["--name", "r"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{f}");
        let md = std::fs::read_to_string(tmp.path().join("r/report.md")).unwrap();
        let (_, causes) = md
            .split_once("Loading differences, ")
            .and_then(|(_, rest)| rest.split_once(":\n\n"))
            .unwrap_or_else(|| panic!("{f}: {md}"));
        let causes = causes.split("\n\n").next().unwrap();
        assert!(causes.contains(want), "{f}: {causes}");
    }
}

/// The terminal says what every FAIL row would need (the rows that decide
/// the run), not only the first three rows that do not pass.
#[test]
fn the_terminal_names_what_each_fail_row_would_need() {
    let run = |json: bool| {
        let mut c = common::hsparity();
        c.args(["compare", &dir("fp16-disk"), "--no-report", "--quiet"]);
        if json {
            c.arg("--json");
        }
        c.output().unwrap()
    };
    let v: Value = serde_json::from_slice(&run(true).stdout).unwrap();
    let text = String::from_utf8(run(false).stdout).unwrap();
    let fails: Vec<u64> = v["pairs"][0]["hidden_states"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["verdict"] == "fail")
        .map(|r| r["index"].as_u64().unwrap())
        .collect();
    assert!(!fails.is_empty());
    for i in fails {
        let want = format!("hidden_states[{i}] (FAIL) would pass with ");
        assert!(text.contains(&want), "{want:?} not in\n{text}");
    }
}
