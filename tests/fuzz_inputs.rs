//! Bounded, deterministic property tests of the config and prompts parsers
//! and of sizes read from a config (the header and index parsers are in
//! `tests/fuzz_headers.rs`): random JSON and mutated fixture configs through
//! `ModelConfig::from_value`, random sizes in the tiny fixture's config through
//! `inventory` (every count is checked against the headers before anything is
//! allocated from it), random bytes and random JSON lines as a prompts file.
//! Each must give a clean result or one error line naming the file — never a
//! panic or an abort on allocation.
//!
//! Fixed seed, no failure files; few cases (each inventory case reads the
//! fixture's headers).

use std::path::Path;

use hsparity::checkpoint::config::ModelConfig;
use hsparity::prompts::{resolve, PromptLimits, PromptOptions};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, RngSeed};
use serde_json::{json, Value};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: RngSeed::Fixed(0x6873_7061_7269_7479),
        failure_persistence: None,
        max_shrink_iters: 64,
        ..ProptestConfig::default()
    }
}

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/tiny-qwen3_5");

fn tiny_config() -> Value {
    serde_json::from_slice(&std::fs::read(Path::new(TINY).join("config.json")).unwrap()).unwrap()
}

/// One line naming `file`.
fn clean_error(m: &str, file: &str) {
    assert!(m.contains(file), "error names {file}: {m}");
    assert!(!m.contains('\n'), "one line: {m}");
}

/// Any JSON value, a few levels deep.
fn json_any() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|x| json!(x)),
        "[a-z_]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::from),
            vec(("[a-z_]{1,10}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A size: small, at the edges, or absurd.
fn size() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..16).prop_map(Value::from),
        Just(json!(u32::MAX)),
        Just(json!(1_000_000_000u64)),
        Just(json!(u64::MAX)),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(json!(-1)),
        Just(json!(1.5)),
        Just(json!("6")),
    ]
}

/// Fields of `text_config` (and `vision_config`) that size allocations.
const SIZES: &[&str] = &[
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "full_attention_interval",
    "depth",
];

/// Sets `field` in `text_config`, or in `vision_config` for `depth`; may drop `layer_types`.
fn mutate(cfg: &mut Value, field: &str, v: Value, drop_layer_types: bool) {
    let section = if field == "depth" {
        "vision_config"
    } else {
        "text_config"
    };
    cfg[section][field] = v;
    if drop_layer_types {
        cfg["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("layer_types");
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn random_json_configs_never_panic(v in json_any()) {
        if let Err(e) = ModelConfig::from_value(v) {
            clean_error(&e.to_string(), "config.json");
        }
    }

    #[test]
    fn random_sizes_in_the_fixture_config_never_panic(
        fields in vec((proptest::sample::select(SIZES), size()), 1..4),
        drop_layer_types in any::<bool>(),
        layer_types in prop_oneof![Just(None), (0usize..5000).prop_map(Some)],
    ) {
        let mut cfg = tiny_config();
        for (f, v) in fields {
            mutate(&mut cfg, f, v, drop_layer_types);
        }
        if let Some(n) = layer_types {
            cfg["text_config"]["layer_types"] = json!(vec!["linear_attention"; n]);
        }
        if let Err(e) = ModelConfig::from_value(cfg) {
            clean_error(&e.to_string(), "config.json");
        }
    }

    #[test]
    fn random_lines_as_a_prompts_file(
        lines in vec(prop_oneof![
            json_any().prop_map(|v| v.to_string()),
            vec(any::<u32>(), 0..6).prop_map(|ids| json!({"input_ids": ids}).to_string()),
            vec(any::<i64>(), 0..4).prop_map(|ids| json!({"input_ids": ids}).to_string()),
            "[ -~]{0,40}",
        ], 0..6),
        raw in vec(any::<u8>(), 0..64),
        use_raw in any::<bool>(),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("prompts.jsonl");
        let body = if use_raw { raw } else { lines.join("\n").into_bytes() };
        std::fs::write(&p, &body).unwrap();
        let opts = PromptOptions { file: Some(p), ..Default::default() };
        let limits = PromptLimits { vocab_size: 384, max_tokens: 512 };
        match resolve(&opts, None, limits) {
            Ok(ps) => {
                prop_assert!(!ps.is_empty());
                for q in &ps {
                    prop_assert!(!q.ids.is_empty() && q.ids.len() <= 512);
                    prop_assert!(q.ids.iter().all(|&t| t < 384));
                }
            }
            Err(e) => clean_error(&e.to_string(), "prompts.jsonl"),
        }
    }
}

proptest! {
    #![proptest_config(config(48))]

    /// Sizes read from a config reach the checkpoint's consumers (headers
    /// read, inventory built) only after they are checked against what the
    /// headers back: an absurd count is one error line, never an abort.
    #[test]
    fn random_sizes_through_inventory(
        fields in vec((proptest::sample::select(SIZES), size()), 1..3),
        drop_layer_types in any::<bool>(),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("ckpt");
        std::fs::create_dir(&d).unwrap();
        for e in std::fs::read_dir(TINY).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() && e.file_name() != "config.json" {
                std::os::unix::fs::symlink(e.path(), d.join(e.file_name())).unwrap();
            }
        }
        let mut cfg = tiny_config();
        for (f, v) in fields {
            mutate(&mut cfg, f, v, drop_layer_types);
        }
        std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
        if let Err(e) = hsparity::commands::inventory::run(d.to_str().unwrap(), &[], String::new()) {
            let m = e.to_string();
            prop_assert!(!m.contains('\n'), "one line: {m}");
        }
    }
}
