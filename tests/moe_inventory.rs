//! The inventory of `qwen3_5_moe` checkpoints against transformers 5.23.0:
//! the three tiny layouts against their load reports (a real
//! `from_pretrained` per Auto class, `fixtures/moe/<layout>/golden/load_report.json`),
//! the three Qwen3.5-35B-A3B layouts written as sparse shards from the
//! published config and tensor list against the counts computed on the meta
//! device (`fixtures/qwen3.5-35b-a3b/expected_counts.json`), every path; and
//! the broken layouts refused with exit 2 naming the expert. All expected
//! numbers come from `tools/make_moe_fixtures.py`.

use crate::common;

use common::moe::{derive_35b, json, load_35b, write_error_layout, LAYOUTS};
use hsparity::checkpoint::Checkpoint;
use hsparity::loading::{self, PathInventory};
use hsparity::precision::Precision;
use serde_json::Value;

fn u(v: &Value, k: &str, what: &str) -> usize {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{what}: no {k} in the reference")) as usize
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// One path's inventory against transformers' counts for it (a load-report
/// path entry or an `expected_counts.json` path entry: the same fields).
fn check_path(p: &PathInventory, want: &Value, what: &str) {
    assert_eq!(p.class, want["class"].as_str().unwrap(), "{what}");
    assert_eq!(
        p.tensors,
        u(want, "state_dict_tensors", what),
        "{what}: tensors"
    );
    assert_eq!(p.consumed + p.missing, p.tensors, "{what}: invariant");
    assert_eq!(p.params, want["numel"].as_u64().unwrap(), "{what}: params");
    let c = p
        .converted
        .as_ref()
        .expect("an MoE path has a converted category");
    assert_eq!(
        c.checkpoint_keys,
        u(want, "checkpoint_keys_converted", what),
        "{what}"
    );
    assert_eq!(
        c.parameters,
        u(want, "parameters_converted", what),
        "{what}"
    );
    assert_eq!(
        p.consumed - c.parameters + c.checkpoint_keys,
        u(want, "checkpoint_keys_consumed", what),
        "{what}: checkpoint keys consumed"
    );
    let by_rule = want["converted_by_rule"].as_object().unwrap();
    assert_eq!(c.rules.len(), by_rule.len(), "{what}: rules");
    for r in &c.rules {
        let w = &by_rule[&r.rule];
        assert_eq!(
            r.checkpoint_keys,
            u(w, "checkpoint_keys", what),
            "{what}: {}",
            r.rule
        );
        assert_eq!(r.parameters, u(w, "parameters", what), "{what}: {}", r.rule);
    }
    let dropped = want["converted_then_dropped_by_rule"].as_object().unwrap();
    assert_eq!(c.then_dropped.len(), dropped.len(), "{what}: then dropped");
    for d in &c.then_dropped {
        let w = &dropped[&d.rule];
        assert_eq!(d.checkpoint_keys, u(w, "checkpoint_keys", what), "{what}");
        assert_eq!(d.reported_as, strings(&w["reported_as"]), "{what}");
    }
    let then_dropped: usize = c.then_dropped.iter().map(|d| d.checkpoint_keys).sum();
    assert_eq!(
        then_dropped,
        u(want, "checkpoint_keys_converted_then_dropped", what)
    );
    assert_eq!(
        p.dropped_by_rule,
        u(want, "checkpoint_keys_dropped_by_rule", what),
        "{what}"
    );
    assert_eq!(p.dropped_names.len(), p.dropped_by_rule, "{what}");
    for (prefix, n) in want["dropped_keys_by_prefix"].as_object().unwrap() {
        let ours = p
            .dropped_names
            .iter()
            .filter(|k| k.starts_with(prefix.as_str()))
            .count();
        assert_eq!(
            ours as u64,
            n.as_u64().unwrap(),
            "{what}: dropped under {prefix}"
        );
    }
    assert_eq!(
        p.unexpected,
        u(want, "checkpoint_keys_unexpected", what),
        "{what}"
    );
    assert_eq!(
        p.unexpected_names,
        strings(&want["unexpected_keys"]),
        "{what}"
    );
    assert_eq!(p.missing_names, strings(&want["missing_keys"]), "{what}");
}

#[test]
fn tiny_layouts_match_transformers_load_reports() {
    for layout in LAYOUTS {
        let dir = common::repo_root().join("fixtures/moe").join(layout);
        let report = json(&dir.join("golden/load_report.json"));
        let ckpt = Checkpoint::open(dir.to_str().unwrap()).unwrap();
        let inv = loading::inventory(&ckpt, &[]).unwrap();
        assert_eq!(ckpt.weights.mapped_shards(), 0, "header-only");
        assert_eq!(
            inv.checkpoint_tensors,
            u(&report, "checkpoint_tensors", layout)
        );
        let names: Vec<&str> = inv.paths.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["causal-lm", "vlm", "image-text-to-text"]);
        for p in &inv.paths {
            let what = format!("{layout} {}", p.name);
            let want = report["paths"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == p.name.as_str())
                .unwrap();
            assert_eq!(want["loaded"], true, "{what}");
            check_path(p, want, &what);
            assert_eq!(
                p.consumed,
                u(want, "parameters_from_checkpoint", &what),
                "{what}"
            );
            assert_eq!(want["dtype"], "bfloat16", "{what}");
            assert_eq!(p.dtype, Precision::Bf16, "{what}");
        }
    }
}

#[test]
fn qwen3_5_35b_a3b_layouts_match_meta_device_counts() {
    let (cfg, published) = load_35b();
    let counts = json(&common::repo_root().join("fixtures/qwen3.5-35b-a3b/expected_counts.json"));
    for layout in LAYOUTS {
        let want = &counts["layouts"][layout];
        let specs = derive_35b(&published, layout);
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(layout);
        common::write_sparse_checkpoint(&dir, &cfg, &specs, 14);
        let t0 = std::time::Instant::now();
        let ckpt = Checkpoint::open(dir.to_str().unwrap()).unwrap();
        let inv = loading::inventory(&ckpt, &[]).unwrap();
        println!(
            "35B-A3B {layout}: open + inventory (header-only) {:?}",
            t0.elapsed()
        );
        assert_eq!(ckpt.weights.mapped_shards(), 0, "{layout}: header-only");
        assert_eq!(inv.model_type, "qwen3_5_moe");
        assert_eq!(
            inv.checkpoint_tensors,
            u(want, "checkpoint_tensors", layout)
        );
        assert_eq!(
            inv.checkpoint_params,
            want["checkpoint_params"].as_u64().unwrap()
        );
        assert_eq!(inv.paths.len(), 3, "{layout}");
        for p in &inv.paths {
            let what = format!("35B-A3B {layout} {}", p.name);
            check_path(p, &want["paths"][p.name.as_str()], &what);
            assert_eq!(p.dtype, Precision::Bf16, "{what}");
        }
    }
}

/// A missing expert, a missing projection, an index gap and unequal shapes:
/// exit 2 on every path with one line naming the expert, no report.
#[test]
fn broken_layouts_exit_2_naming_the_expert() {
    let cases = [
        (
            "missing-expert",
            "layers.1.mlp.experts: expert 7 is missing",
        ),
        (
            "missing-projection",
            "expert 5 has gate_proj and down_proj but no up_proj",
        ),
        (
            "index-gap",
            "expert index gap: expert 5 is missing and expert 8 is present",
        ),
        (
            "unequal-shapes",
            "expert 5's gate_proj.weight has shape [8, 32]",
        ),
    ];
    let tmp = tempfile::tempdir().unwrap();
    for (name, want) in cases {
        let dir = tmp.path().join(name);
        write_error_layout(name, &dir);
        for path in ["causal-lm", "vlm", "image-text-to-text"] {
            let out = common::hsparity()
                .args(["inventory", dir.to_str().unwrap(), "--paths", path])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name} {path}: {err}");
            assert!(err.contains(want), "{name} {path}: {err}");
            assert_eq!(
                err.trim_end().lines().count(),
                1,
                "{name} {path}: one line: {err}"
            );
        }
        let out = common::hsparity()
            .args(["compare", dir.to_str().unwrap(), "--no-report", "--quiet"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{name} compare");
    }
}

/// `inventory` renders the converted category (table column, per-path line)
/// only for MoE checkpoints.
#[test]
fn converted_category_is_rendered() {
    let out = common::hsparity()
        .args(["inventory", "fixtures/moe/per-expert"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("converted (keys → params)"), "{text}");
    assert!(text.contains("96 → 8"), "{text}");
    assert!(text.contains("24 keys fused then dropped (mtp.layers.0.mlp.experts.gate_up_proj"));
    let dense = common::hsparity()
        .args(["inventory", "fixtures/tiny-qwen3_5"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&dense.stdout).contains("converted"));
}

/// A text-only `qwen3_5_moe_text` checkpoint (what `Qwen3_5MoeForCausalLM.save_pretrained`
/// writes: `model.layers.*`, experts per expert): `causal-lm` and `vlm`
/// (`Qwen3_5MoeTextModel`, unscoped conversion, `lm_head.weight` UNEXPECTED)
/// as transformers loads it; `image-text-to-text` does not apply.
#[test]
fn text_only_checkpoint_matches_transformers() {
    let src = common::repo_root().join("fixtures/moe/text-only");
    let report = json(&src.join("load_report.json"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("text-only");
    let specs = common::moe::specs_of(&json(&src.join("tensors.json"))["tensors"]);
    common::write_sparse_checkpoint(&dir, &json(&src.join("config.json")), &specs, 1);
    let ckpt = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    assert_eq!(ckpt.config.model_type, "qwen3_5_moe_text");
    let inv = loading::inventory(&ckpt, &[]).unwrap();
    let names: Vec<&str> = inv.paths.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["causal-lm", "vlm"]);
    for p in &inv.paths {
        let want = report["paths"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == p.name.as_str())
            .unwrap();
        check_path(p, want, &format!("text-only {}", p.name));
        assert_eq!(
            p.converted.as_ref().unwrap().scope,
            "unscoped",
            "{}",
            p.name
        );
    }
    let itt = &report["paths"][2];
    assert_eq!(itt["loaded"], false);
    assert!(itt["error"]
        .as_str()
        .unwrap()
        .contains("Unrecognized configuration class"));
    assert_eq!(inv.not_applicable.len(), 1);
    assert!(inv.not_applicable[0].starts_with("image-text-to-text"));
}
