//! Inventory of the tiny fixture against transformers' own load report
//! (`fixtures/tiny-qwen3_5/golden/load_report.json`, transformers 5.23.0),
//! plus the loading-path rules on edited copies (ties, text-only saves,
//! dtype sniffing, duplicate tensors).

use crate::common;

use std::collections::HashMap;

use hsparity::checkpoint::Checkpoint;
use hsparity::error::Error;
use hsparity::loading::WeightSource;
use hsparity::loading::{self, LoadingPath, WeightOrigin};
use hsparity::precision::Precision;
use serde_json::Value;

fn golden() -> Value {
    let p = common::repo_root().join("fixtures/tiny-qwen3_5/golden/load_report.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn tiny_inventory_matches_transformers_load_report() {
    let dir = common::repo_root().join("fixtures/tiny-qwen3_5");
    let ckpt = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let inv = loading::inventory(&ckpt, &[]).unwrap();
    let g = golden();
    assert_eq!(
        inv.checkpoint_tensors as u64,
        g["checkpoint_tensors"].as_u64().unwrap()
    );
    let gpaths: HashMap<&str, &Value> = g["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p))
        .collect();
    assert_eq!(inv.paths.len(), 3);
    for p in &inv.paths {
        let gp = gpaths[p.name.as_str()];
        assert_eq!(p.class, gp["class"].as_str().unwrap(), "{}", p.name);
        assert_eq!(p.auto_class, gp["auto_class"].as_str().unwrap());
        assert_eq!(
            p.tensors as u64,
            gp["state_dict_tensors"].as_u64().unwrap(),
            "{}",
            p.name
        );
        assert_eq!(p.params, gp["numel"].as_u64().unwrap(), "{}", p.name);
        let strs = |v: &Value| -> Vec<String> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(p.missing_names, strs(&gp["missing_keys"]), "{}", p.name);
        assert_eq!(
            p.unexpected_names,
            strs(&gp["unexpected_keys"]),
            "{}",
            p.name
        );
        assert_eq!(
            p.dropped_by_rule as u64,
            gp["derived_dropped_silently"].as_u64().unwrap(),
            "{}",
            p.name
        );
        assert_eq!(gp["dtype"], "float32");
        assert_eq!(p.dtype, Precision::F32);
        assert_eq!(p.tensors, p.consumed + p.missing);
    }
    // causal-lm: config.json has a top-level dtype but text_config has none:
    // the CausalLM sees text_config only and sniffs the weights.
    assert!(inv.paths[0]
        .dtype_reason
        .starts_with("first weight on disk"));
    assert_eq!(inv.paths[1].dtype_reason, "config.dtype");
}

#[test]
fn tiny_weights_load_f32_lazily_and_match_native() {
    let dir = common::repo_root().join("fixtures/tiny-qwen3_5");
    let ckpt = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let r = loading::resolve(&ckpt, LoadingPath::Vlm).unwrap();
    assert_eq!(ckpt.weights.mapped_shards(), 0);
    let t = r.view.tensor("embed_tokens.weight").unwrap();
    assert_eq!(t.dims(), &[384, 64]);
    assert_eq!(ckpt.weights.mapped_shards(), 1);
    let key = "model.language_model.embed_tokens.weight";
    let native = ckpt.weights.load_native(key).unwrap();
    let a: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    let b: Vec<f32> = native.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(a, b);
    // The same bytes through candle's own safetensors reader.
    let shard = ckpt
        .headers
        .shard_of(ckpt.headers.get(key).unwrap())
        .path
        .clone();
    let all = candle_core::safetensors::load(&shard, &candle_core::Device::Cpu).unwrap();
    let c: Vec<f32> = all[key].flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(a, c);
    assert!(r.view.tensor("lm_head.weight").is_err());
}

fn tiny_copy() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    common::copy_tiny(&dir);
    (tmp, dir)
}

/// Rewrites the checkpoint as sparse shards with `rename` applied to names
/// and `keep` filtering; config edited by `cfg`.
fn rewrite(
    dir: &std::path::Path,
    out: &std::path::Path,
    dtype: &str,
    keep: impl Fn(&str) -> bool,
    rename: impl Fn(&str) -> String,
    cfg: impl FnOnce(&mut Value),
) {
    let ckpt = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let specs: Vec<common::Spec> = ckpt
        .headers
        .tensors
        .iter()
        .filter(|t| keep(&t.name))
        .map(|t| (rename(&t.name), dtype.to_string(), t.shape.clone()))
        .collect();
    let mut c = ckpt.config.raw.clone();
    cfg(&mut c);
    common::write_sparse_checkpoint(out, &c, &specs, 2);
}

#[test]
fn tie_only_at_top_level_gives_missing_lm_head_on_causal_lm() {
    // transformers 5.23.0 (measured; fixtures/divergence/tied-top-level):
    // top-level tie_word_embeddings=true, text_config without it,
    // lm_head.weight removed.
    let (t, dir) = tiny_copy();
    let out = t.path().join("tied");
    rewrite(
        &dir,
        &out,
        "F32",
        |n| n != "lm_head.weight",
        |n| n.to_string(),
        |c| {
            c["tie_word_embeddings"] = true.into();
            c["text_config"]
                .as_object_mut()
                .unwrap()
                .remove("tie_word_embeddings");
        },
    );
    let ckpt = Checkpoint::open(out.to_str().unwrap()).unwrap();
    let c = loading::resolve(&ckpt, LoadingPath::CausalLm).unwrap();
    assert_eq!(c.inventory.missing_names, ["lm_head.weight"]);
    assert_eq!(
        c.inventory.missing_init["lm_head.weight"],
        "normal(0, 0.02)"
    );
    assert!(!c.inventory.tied_lm_head);
    assert!(c.view.tensor("lm_head.weight").is_err(), "no seed → error");
    let seeded = c.view.clone().with_seed(7);
    let w = seeded.tensor("lm_head.weight").unwrap();
    assert_eq!(w.dims(), &[384, 64]);
    let w2 = c
        .view
        .clone()
        .with_seed(7)
        .tensor("lm_head.weight")
        .unwrap();
    let (a, b): (Vec<f32>, Vec<f32>) = (
        w.flatten_all().unwrap().to_vec1().unwrap(),
        w2.flatten_all().unwrap().to_vec1().unwrap(),
    );
    assert_eq!(a, b, "seeded init is deterministic");
    let std = (a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / a.len() as f64).sqrt();
    assert!((std - 0.02).abs() < 0.002, "std {std}");

    let i = loading::resolve(&ckpt, LoadingPath::ImageTextToText).unwrap();
    assert_eq!(i.inventory.missing, 0);
    assert!(i.inventory.tied_lm_head);
    assert_eq!(i.inventory.consumed, i.inventory.tensors);
    assert_eq!(
        i.view.origin("lm_head.weight"),
        Some(&WeightOrigin::Tied {
            key: "model.language_model.embed_tokens.weight".into()
        })
    );
    assert_eq!(
        i.view.identity("lm_head.weight"),
        i.view.identity("embed_tokens.weight")
    );
}

#[test]
fn text_only_save_loads_on_causal_lm_and_vlm() {
    // A freshly constructed Qwen3_5ForCausalLM saves model.* keys and a
    // qwen3_5_text config (transformers 5.23.0 `Qwen3_5TextConfig`: saving reverses the VLM's key mapping).
    let (t, dir) = tiny_copy();
    let out = t.path().join("text");
    rewrite(
        &dir,
        &out,
        "BF16",
        |n| n.starts_with("model.language_model.") || n == "lm_head.weight",
        |n| n.replace("model.language_model.", "model."),
        |c| {
            let mut tc = c["text_config"].clone();
            tc["dtype"] = "bfloat16".into();
            *c = tc;
        },
    );
    let ckpt = Checkpoint::open(out.to_str().unwrap()).unwrap();
    assert_eq!(
        LoadingPath::applicable(&ckpt.config),
        [LoadingPath::CausalLm, LoadingPath::Vlm]
    );
    let c = loading::resolve(&ckpt, LoadingPath::CausalLm).unwrap();
    assert_eq!(
        (
            c.inventory.tensors,
            c.inventory.consumed,
            c.inventory.missing
        ),
        (81, 81, 0)
    );
    assert_eq!(c.inventory.unexpected, 0);
    assert_eq!(c.inventory.dtype, Precision::Bf16);
    assert_eq!(c.inventory.dtype_reason, "config.dtype");
    let v = loading::resolve(&ckpt, LoadingPath::Vlm).unwrap();
    assert_eq!(v.inventory.class, "Qwen3_5TextModel");
    assert_eq!((v.inventory.tensors, v.inventory.consumed), (80, 80));
    assert_eq!(v.inventory.unexpected_names, ["lm_head.weight"]);
    assert_eq!(
        v.view.origin("norm.weight"),
        Some(&WeightOrigin::Checkpoint {
            key: "model.norm.weight".into()
        })
    );
}

#[test]
fn legacy_double_model_prefix_is_renamed() {
    let (t, dir) = tiny_copy();
    let out = t.path().join("legacy");
    rewrite(
        &dir,
        &out,
        "F16",
        |_| true,
        |n| n.replace("model.language_model.", "model.language_model.model."),
        |c| {
            c.as_object_mut().unwrap().remove("dtype");
        },
    );
    let ckpt = Checkpoint::open(out.to_str().unwrap()).unwrap();
    for p in LoadingPath::ALL {
        let r = loading::resolve(&ckpt, p).unwrap();
        assert_eq!(r.inventory.missing, 0, "{p}");
        assert!(
            r.inventory.rules[0].contains("legacy"),
            "{p}: {:?}",
            r.inventory.rules
        );
        assert_eq!(r.inventory.dtype, Precision::F16, "{p}");
    }
}

#[test]
fn duplicate_tensor_across_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::copy(
        common::repo_root().join("fixtures/tiny-qwen3_5/config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    let spec = vec![(
        "lm_head.weight".to_string(),
        "F32".to_string(),
        vec![384, 64],
    )];
    common::write_sparse_shard(&dir.join("a.safetensors"), &spec);
    let mut b = spec.clone();
    b.push((
        "model.language_model.norm.weight".into(),
        "F32".into(),
        vec![64],
    ));
    common::write_sparse_shard(&dir.join("b.safetensors"), &b);
    // Both shards are read through the index (as transformers reads them).
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        r#"{"weight_map": {"lm_head.weight": "a.safetensors", "model.language_model.norm.weight": "b.safetensors"}}"#,
    )
    .unwrap();
    let e = Checkpoint::open(dir.to_str().unwrap()).expect_err("must fail");
    assert!(matches!(e, Error::Checkpoint(_)), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains("lm_head.weight") && m.contains("a.safetensors") && m.contains("b.safetensors"),
        "{m}"
    );
}
