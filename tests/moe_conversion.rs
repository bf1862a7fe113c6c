//! The expert-fusion plan (`hsparity::loading::experts`) against what
//! transformers 5.23.0 does: the tiny `qwen3_5_moe` layouts' load reports
//! (`fixtures/moe/<layout>/golden/load_report.json`, a real `from_pretrained`
//! with transformers' own key routing recorded), the broken layouts
//! (`fixtures/moe/errors/`), and the Qwen3.5-35B-A3B counts computed on the
//! meta device (`fixtures/qwen3.5-35b-a3b/expected_counts.json`). All written
//! by `tools/make_moe_fixtures.py`.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hsparity::checkpoint::{HeaderIndex, TensorHeader, Weights};
use hsparity::loading::experts::{
    self, dot_natural_cmp, ConversionPlan, ConversionScope, FusionRule,
};
use hsparity::precision::Precision;
use serde_json::Value;

const LAYOUTS: [&str; 3] = ["qwen3.5-fused", "qwen3.6-fused", "per-expert"];
const PATHS: [(&str, ConversionScope); 3] = [
    ("causal-lm", ConversionScope::Unscoped),
    ("vlm", ConversionScope::LanguageModel),
    ("image-text-to-text", ConversionScope::LanguageModel),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

fn num_experts(config: &Value) -> usize {
    config["text_config"]["num_experts"].as_u64().unwrap() as usize
}

fn headers_from_json(list: &Value) -> Vec<TensorHeader> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| TensorHeader {
            name: e["name"].as_str().unwrap().to_string(),
            dtype: e["dtype"].as_str().unwrap().to_string(),
            shape: e["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect(),
            data_offsets: (0, 0),
            shard: 0,
        })
        .collect()
}

fn rule_by_name(name: &str) -> FusionRule {
    [FusionRule::GateUp, FusionRule::Down]
        .into_iter()
        .find(|r| r.name() == name)
        .unwrap_or_else(|| panic!("unknown rule {name}"))
}

/// `{rule name: (checkpoint keys, parameters)}` of a report's `converted_by_rule`.
fn report_by_rule(v: &Value) -> BTreeMap<FusionRule, (usize, usize)> {
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, c)| {
            (
                rule_by_name(k),
                (
                    c["checkpoint_keys"].as_u64().unwrap() as usize,
                    c["parameters"].as_u64().unwrap() as usize,
                ),
            )
        })
        .collect()
}

fn plan_by_rule<'a>(
    fused: impl Iterator<Item = &'a experts::FusedParam>,
) -> BTreeMap<FusionRule, (usize, usize)> {
    let mut m = BTreeMap::new();
    for f in fused {
        let e = m.entry(f.rule).or_insert((0, 0));
        e.0 += f.sources.len();
        e.1 += 1;
    }
    m
}

/// The plan against one path entry of a load report / the 35B counts:
/// converted keys and parameters per rule, and (for the unscoped causal-lm
/// conversion) the `mtp.*` keys it fuses before `^mtp.*` drops them.
fn check_plan_against(plan: &ConversionPlan, entry: &Value, what: &str) {
    let main: Vec<_> = plan
        .fused
        .iter()
        .filter(|f| !f.name.starts_with("mtp."))
        .collect();
    let mtp: Vec<_> = plan.under("mtp.").collect();
    let u = |k: &str| entry[k].as_u64().unwrap_or_else(|| panic!("{what}: {k}")) as usize;
    assert_eq!(
        main.iter().map(|f| f.sources.len()).sum::<usize>(),
        u("checkpoint_keys_converted"),
        "{what}: converted keys"
    );
    assert_eq!(main.len(), u("parameters_converted"), "{what}: parameters");
    assert_eq!(
        plan_by_rule(main.iter().copied()),
        report_by_rule(&entry["converted_by_rule"]),
        "{what}: by rule"
    );
    assert_eq!(
        mtp.iter().map(|f| f.sources.len()).sum::<usize>(),
        u("checkpoint_keys_converted_then_dropped"),
        "{what}: converted then dropped"
    );
    let dropped = entry["converted_then_dropped_by_rule"].as_object().unwrap();
    assert_eq!(
        dropped.len(),
        plan_by_rule(mtp.iter().copied()).len(),
        "{what}"
    );
    for (rule, c) in dropped {
        let r = rule_by_name(rule);
        let ours: Vec<&str> = mtp
            .iter()
            .filter(|f| f.rule == r)
            .map(|f| f.name.as_str())
            .collect();
        let theirs: Vec<&str> = c["reported_as"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(ours, theirs, "{what}: {rule}");
        assert_eq!(
            mtp.iter()
                .filter(|f| f.rule == r)
                .map(|f| f.sources.len())
                .sum::<usize>(),
            c["checkpoint_keys"].as_u64().unwrap() as usize,
            "{what}: {rule}"
        );
    }
}

#[test]
fn tiny_layouts_plan_matches_transformers_load_reports() {
    for layout in LAYOUTS {
        let dir = root().join("fixtures/moe").join(layout);
        let index = HeaderIndex::read_dir(&dir).unwrap();
        let e = num_experts(&json(&dir.join("config.json")));
        let report = json(&dir.join("golden/load_report.json"));
        for (path, scope) in PATHS {
            let what = format!("{layout} {path}");
            let entry = report["paths"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == path)
                .unwrap();
            let plan = experts::plan(&index.tensors, scope, e).unwrap();
            check_plan_against(&plan, entry, &what);
            // every fused parameter: its name in checkpoint naming and its
            // sources in transformers' order (gate experts 0..E, then up)
            let want = entry["fused_parameters"].as_array().unwrap();
            let ours: Vec<_> = plan
                .fused
                .iter()
                .filter(|f| !f.name.starts_with("mtp."))
                .collect();
            assert_eq!(ours.len(), want.len(), "{what}");
            for (f, w) in ours.iter().zip(want) {
                assert_eq!(f.name, w["as_checkpoint_key"].as_str().unwrap(), "{what}");
                assert_eq!(f.rule.name(), w["rule"].as_str().unwrap(), "{what}");
                let srcs: Vec<&str> = w["sources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap())
                    .collect();
                assert_eq!(f.sources, srcs, "{what}: {}", f.name);
            }
        }
    }
}

/// Materialising the per-expert layout's fused parameters gives, bit for
/// bit, the tensors the fused layout stores (whose transformers goldens are
/// bitwise equal to the per-expert layout's: asserted by the generator), in
/// f32 and rounded to bf16; one expert at a time too.
#[test]
fn materialised_experts_equal_the_fused_layout() {
    let open = |layout: &str| {
        let index =
            Arc::new(HeaderIndex::read_dir(&root().join("fixtures/moe").join(layout)).unwrap());
        (index.clone(), Weights::new(index))
    };
    let (per_idx, per) = open("per-expert");
    let (_, fused) = open("qwen3.6-fused");
    let plan = experts::plan(&per_idx.tensors, ConversionScope::Unscoped, 8).unwrap();
    assert_eq!(plan.fused.len(), 10); // 4 layers + MTP, gate_up and down each
    for f in &plan.fused {
        for prec in [Precision::F32, Precision::Bf16] {
            let ours = experts::materialize(&per, f, prec).unwrap();
            assert_eq!(ours.dims(), &f.shape[..]);
            let want = fused.load_f32_rounded(&f.name, prec).unwrap();
            let (a, b) = (
                ours.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                want.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{} {prec:?}",
                f.name
            );
        }
        for e in [0, 3, 7] {
            let one = experts::materialize_expert(&per, f, e, Precision::F32).unwrap();
            let slice = experts::fused_expert(&fused, &f.name, e, Precision::F32).unwrap();
            assert_eq!(
                one.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                slice.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                "{} expert {e}",
                f.name
            );
        }
    }
    assert!(experts::materialize_expert(&per, &plan.fused[0], 8, Precision::F32).is_err());
}

/// The broken layouts: hsparity refuses each one with a one-line message
/// naming the expert, on every path; transformers raises for three of them
/// and silently loads the index gap with experts shifted (recorded).
#[test]
fn broken_layouts_are_refused_naming_the_expert() {
    let cases = [
        (
            "missing-expert",
            "model.language_model.layers.1.mlp.experts: expert 7 is missing (7 of 8 experts on disk: 0-6)",
            Some("ignore_mismatched_sizes"),
        ),
        (
            "missing-projection",
            "model.language_model.layers.1.mlp.experts: expert 5 has gate_proj and down_proj but no up_proj",
            Some("conversion of the weights"),
        ),
        (
            "index-gap",
            "expert index gap: expert 5 is missing and expert 8 is present",
            None,
        ),
        (
            "unequal-shapes",
            "expert 5's gate_proj.weight has shape [8, 32]",
            Some("conversion of the weights"),
        ),
    ];
    for (name, want, transformers_error) in cases {
        let dir = root().join("fixtures/moe/errors").join(name);
        let headers = headers_from_json(&json(&dir.join("tensors.json"))["tensors"]);
        let e = num_experts(&json(&dir.join("config.json")));
        let report = json(&dir.join("load_report.json"));
        for (path, scope) in PATHS {
            let err = experts::plan(&headers, scope, e).unwrap_err();
            let msg = err.to_string();
            assert!(msg.starts_with("checkpoint "), "{name}: {msg}");
            assert!(msg.contains(want), "{name} {path}: {msg}");
            assert!(!msg.contains('\n'), "{name}: one line: {msg}");
            let entry = report["paths"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == path)
                .unwrap();
            match transformers_error {
                Some(t) => {
                    assert_eq!(entry["loaded"], false, "{name} {path}");
                    assert!(
                        entry["error"].as_str().unwrap().contains(t),
                        "{name} {path}"
                    );
                }
                None => {
                    assert_eq!(entry["loaded"], true, "{name} {path}");
                    assert_eq!(
                        entry["silently_loaded"]["slot_holds_original_expert"],
                        serde_json::json!([0, 1, 2, 3, 4, 6, 7, 5])
                    );
                }
            }
        }
    }
}

/// One of the three Qwen3.5-35B-A3B layouts as headers
/// ([`common::moe::derive_35b`]).
fn derive_35b(specs: &[common::Spec], layout: &str) -> Vec<TensorHeader> {
    common::moe::derive_35b(specs, layout)
        .into_iter()
        .map(|(name, dtype, shape)| TensorHeader {
            name,
            dtype,
            shape,
            data_offsets: (0, 0),
            shard: 0,
        })
        .collect()
}

/// The 35B-A3B counts per layout and path: the conversion plan gives
/// transformers' converted / converted-then-dropped keys and parameters; with
/// the dense family's ignore rules (`^mtp.*`, and `^model.visual.*` on
/// causal-lm) and `lm_head.weight` UNEXPECTED on vlm, the consumed, dropped
/// and unexpected counts and the state-dict size follow.
#[test]
fn qwen3_5_35b_a3b_plan_matches_meta_device_counts() {
    let d = root().join("fixtures/qwen3.5-35b-a3b");
    let cfg = json(&d.join("config.json"));
    let (_, published) = common::moe::load_35b();
    assert_eq!(published.len(), 1811);
    let counts = json(&d.join("expected_counts.json"));
    let e = num_experts(&cfg);
    assert_eq!(e, 256);
    for layout in LAYOUTS {
        let want = &counts["layouts"][layout];
        let headers = derive_35b(&published, layout);
        assert_eq!(
            headers.len() as u64,
            want["checkpoint_tensors"].as_u64().unwrap(),
            "{layout}"
        );
        let params: u64 = headers
            .iter()
            .map(|t| t.shape.iter().map(|&x| x as u64).product::<u64>())
            .sum();
        assert_eq!(
            params,
            want["checkpoint_params"].as_u64().unwrap(),
            "{layout}"
        );
        for (path, scope) in PATHS {
            let what = format!("35B {layout} {path}");
            let entry = &want["paths"][path];
            let plan = experts::plan(&headers, scope, e).unwrap();
            check_plan_against(&plan, entry, &what);
            for f in &plan.fused {
                let w = if f.rule == FusionRule::GateUp {
                    2 * e
                } else {
                    e
                };
                assert_eq!(f.sources.len(), w, "{what}: {}", f.name);
                assert_eq!(f.dtypes, ["BF16"], "{what}");
            }
            let ignored = |n: &str| {
                n.starts_with("mtp.") || (path == "causal-lm" && n.starts_with("model.visual."))
            };
            let dropped = headers.iter().filter(|t| ignored(&t.name)).count();
            let unexpected = usize::from(path == "vlm");
            let u = |k: &str| entry[k].as_u64().unwrap() as usize;
            assert_eq!(dropped, u("checkpoint_keys_dropped_by_rule"), "{what}");
            assert_eq!(unexpected, u("checkpoint_keys_unexpected"), "{what}");
            let consumed = headers.len() - dropped - unexpected;
            assert_eq!(consumed, u("checkpoint_keys_consumed"), "{what}");
            assert!(
                entry["missing_keys"].as_array().unwrap().is_empty(),
                "{what}"
            );
            // after fusion: one parameter per consumed unfused key, plus one per fused parameter
            let main_fused = plan
                .fused
                .iter()
                .filter(|f| !f.name.starts_with("mtp."))
                .count();
            let main_sources: usize = plan
                .fused
                .iter()
                .filter(|f| !f.name.starts_with("mtp."))
                .map(|f| f.sources.len())
                .sum();
            assert_eq!(
                consumed - main_sources + main_fused,
                u("state_dict_tensors"),
                "{what}"
            );
        }
    }
}

#[test]
fn plan_order_is_transformers_natural_order() {
    let d = root().join("fixtures/moe/per-expert");
    let index = HeaderIndex::read_dir(&d).unwrap();
    let plan = experts::plan(&index.tensors, ConversionScope::Unscoped, 8).unwrap();
    let names: Vec<&str> = plan.fused.iter().map(|f| f.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_by(|a, b| dot_natural_cmp(a, b));
    assert_eq!(names, sorted);
    assert_eq!(
        names[0],
        "model.language_model.layers.0.mlp.experts.down_proj"
    );
    assert_eq!(plan.converted_keys(), 5 * 3 * 8);
    assert_eq!(
        plan.by_rule(),
        BTreeMap::from([(FusionRule::GateUp, (80, 5)), (FusionRule::Down, (40, 5))])
    );
    // a fused checkpoint needs no conversion on the language-model paths
    let fused = HeaderIndex::read_dir(&root().join("fixtures/moe/qwen3.6-fused")).unwrap();
    assert!(
        experts::plan(&fused.tensors, ConversionScope::LanguageModel, 8)
            .unwrap()
            .is_empty()
    );
}
