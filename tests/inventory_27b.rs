//! Inventory of the real Qwen3.6-27B layout (1199 tensors in 15 shards),
//! written as sparse safetensors files with the published headers. Expected
//! numbers: transformers 5.23.0 loading the published config on the meta
//! device (`state_dict()` of each Auto class) against the published weight
//! table (`fixtures/qwen3.6-27b/tensors.json`).

use crate::common;

use std::time::Instant;

use hsparity::checkpoint::Checkpoint;
use hsparity::loading::WeightSource;
use hsparity::loading::{self, LoadingPath};
use hsparity::precision::Precision;

#[test]
fn inventory_27b_layout_matches_transformers_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("qwen3.6-27b");
    let (cfg, specs) = common::load_27b();
    assert_eq!(specs.len(), 1199);
    common::write_sparse_checkpoint(&dir, &cfg, &specs, 15);

    let t0 = Instant::now();
    let ckpt = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let inv = loading::inventory(&ckpt, &[]).unwrap();
    let dt = t0.elapsed();
    println!("open + inventory of the 27B layout (15 shards, header-only): {dt:?}");
    assert_eq!(
        ckpt.weights.mapped_shards(),
        0,
        "inventory must not map data"
    );

    assert_eq!(inv.schema_version, 1);
    assert_eq!(inv.checkpoint_tensors, 1199);
    assert_eq!(inv.checkpoint_params, 27_781_427_952);
    assert_eq!(inv.shards, 15);
    let names: Vec<&str> = inv.paths.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["causal-lm", "vlm", "image-text-to-text"]);

    let c = &inv.paths[0];
    assert_eq!(c.class, "Qwen3_5ForCausalLM");
    assert_eq!(c.auto_class, "AutoModelForCausalLM");
    assert_eq!(
        (
            c.tensors,
            c.consumed,
            c.dropped_by_rule,
            c.unexpected,
            c.missing
        ),
        (851, 851, 348, 0, 0)
    );
    assert_eq!(c.params, 26_895_998_464);
    assert_eq!(c.dtype, Precision::Bf16);
    assert_eq!(c.dtype_reason, "text_config.dtype");
    assert!(!c.tied_lm_head);
    assert_eq!(
        c.rules,
        [
            "model.language_model.X -> model.X",
            "ignore ^mtp.*",
            "ignore ^model.visual.*"
        ]
    );
    assert_eq!(
        c.dropped_names
            .iter()
            .filter(|n| n.starts_with("mtp."))
            .count(),
        15
    );
    assert_eq!(
        c.dropped_names
            .iter()
            .filter(|n| n.starts_with("model.visual."))
            .count(),
        333
    );
    assert_eq!(c.components["vision_tower"].tensors, 333);
    assert!(!c.components["vision_tower"].loaded);
    assert_eq!(c.components["mtp"].params, 424_699_392);
    assert!(c.components["lm_head"].loaded);

    let v = &inv.paths[1];
    assert_eq!(v.class, "Qwen3_5Model");
    assert_eq!(
        (
            v.tensors,
            v.consumed,
            v.dropped_by_rule,
            v.unexpected,
            v.missing
        ),
        (1183, 1183, 15, 1, 0)
    );
    assert_eq!(v.unexpected_names, ["lm_head.weight"]);
    assert_eq!(v.params, 26_085_330_160);
    assert_eq!(v.dtype, Precision::Bf16);
    assert_eq!(
        v.dtype_reason,
        "first weight on disk (model-00001-of-00015.safetensors: model.visual.patch_embed.proj.weight)"
    );
    assert_eq!(v.rules, ["model.X -> X", "ignore ^mtp.*"]);
    assert!(!v.components["lm_head"].loaded);

    let i = &inv.paths[2];
    assert_eq!(i.class, "Qwen3_5ForConditionalGeneration");
    assert_eq!(
        (
            i.tensors,
            i.consumed,
            i.dropped_by_rule,
            i.unexpected,
            i.missing
        ),
        (1184, 1184, 15, 0, 0)
    );
    assert_eq!(i.params, 27_356_728_560);
    assert_eq!(i.dtype, Precision::Bf16);
    assert!(i.dtype_reason.starts_with("first weight on disk"));
    assert_eq!(i.rules, ["ignore ^mtp.*"]);

    // JSON contract field names (docs/report-schema.md §2.3).
    let j = serde_json::to_value(&inv).unwrap();
    for k in [
        "schema_version",
        "checkpoint",
        "checkpoint_tensors",
        "paths",
    ] {
        assert!(j.get(k).is_some(), "{k}");
    }
    for k in [
        "name",
        "auto_class",
        "class",
        "dtype",
        "dtype_reason",
        "tensors",
        "consumed",
        "dropped_by_rule",
        "unexpected",
        "missing",
        "tied_lm_head",
        "rules",
        "missing_names",
        "unexpected_names",
    ] {
        assert!(j["paths"][0].get(k).is_some(), "{k}");
    }
    assert_eq!(j["paths"][0]["dtype"], "bf16");

    // The text views of causal-lm and vlm read the same checkpoint bytes.
    let rc = loading::resolve(&ckpt, LoadingPath::CausalLm).unwrap();
    let rv = loading::resolve(&ckpt, LoadingPath::Vlm).unwrap();
    assert_eq!(rc.view.names().len(), 851);
    assert_eq!(rv.view.names().len(), 850);
    assert!(!rv.view.has_lm_head());
    for n in rv.view.names() {
        assert_eq!(rc.view.identity(n), rv.view.identity(n), "{n}");
    }
    assert_eq!(
        rc.view.identity("layers.3.self_attn.q_proj.weight"),
        "ckpt:model.language_model.layers.3.self_attn.q_proj.weight"
    );

    let table = hsparity::report::inventory::render_inventory_table(
        &inv,
        hsparity::width::Width::UNBOUNDED,
    );
    println!("{table}");
    assert!(table.contains("Qwen3_5ForCausalLM"));
    assert!(table.contains("lm_head.weight"));
}
