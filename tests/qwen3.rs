//! The Qwen3 dense family (`qwen3`: `Qwen3ForCausalLM` / `Qwen3Model`) against
//! transformers 5.23.0 (fixtures/tiny-qwen3, tools/make_fixtures.py: random
//! weights incl. norms, head_dim 24 ≠ hidden/heads, rope_theta 1e6, tied
//! embeddings with no `lm_head.weight` on disk).

use crate::common;

use std::path::Path;

use common::{assert_close, relative_max_abs, same_len, F32_KERNEL};
use hsparity::checkpoint::Checkpoint;
use hsparity::commands::dump::{self, DumpOptions};
use hsparity::dump::Dump;
use hsparity::loading::{self, LoadingPath};
use serde_json::Value;

const CKPT: &str = "fixtures/tiny-qwen3";

fn report() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(format!("{CKPT}/golden/load_report.json")).unwrap(),
    )
    .unwrap()
}

#[test]
fn inventory_matches_transformers() {
    let ckpt = Checkpoint::open(CKPT).unwrap();
    for p in report()["paths"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let path: LoadingPath = name.parse().unwrap();
        let ours = loading::resolve(&ckpt, path);
        if p["loaded"] == false {
            assert!(ours.is_err(), "{name}: transformers raises");
            continue;
        }
        let inv = ours.unwrap().inventory;
        assert_eq!(inv.class, p["class"].as_str().unwrap(), "{name}");
        assert_eq!(
            inv.tensors as u64,
            p["state_dict_tensors"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(inv.params, p["numel"].as_u64().unwrap(), "{name}");
        assert_eq!(inv.missing, 0);
        assert_eq!(inv.unexpected, 0);
        assert_eq!(inv.dropped_by_rule, 0);
        if let Some(tied) = p["tied"].as_bool() {
            assert_eq!(inv.tied_lm_head, tied, "{name}");
        }
    }
}

#[test]
fn hidden_states_and_tied_logits_match_transformers() {
    for path in ["causal-lm", "vlm"] {
        let gold = Dump::read(Path::new(&format!("{CKPT}/golden/{path}.safetensors"))).unwrap();
        let ours = dump::run(
            &common::target(CKPT, Some(&format!("{CKPT}/prompts.jsonl"))),
            path.parse().unwrap(),
            &DumpOptions {
                logits: true,
                quiet: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(ours.metadata["class"], gold.metadata["class"]);
        let mut worst = 0f64;
        same_len(path, &ours.prompts, &gold.prompts);
        for (o, g) in ours.prompts.iter().zip(&gold.prompts) {
            assert_eq!(o.input_ids, g.input_ids);
            let mut pairs: Vec<(&candle_core::Tensor, &candle_core::Tensor)> =
                common::paired_states(path, &o.hidden_states, &g.hidden_states)
                    .into_iter()
                    .map(|(_, a, b)| (a, b))
                    .collect();
            pairs.push((
                o.last_layer_output.as_ref().unwrap(),
                g.last_layer_output.as_ref().unwrap(),
            ));
            if let (Some(a), Some(b)) = (&o.logits, &g.logits) {
                pairs.push((a, b));
            }
            assert_eq!(
                o.logits.is_some(),
                g.logits.is_some(),
                "{path}: logits presence"
            );
            for (a, b) in pairs {
                let m = assert_close(path, a, b, &F32_KERNEL);
                worst = worst.max(relative_max_abs(&m));
            }
        }
        println!("qwen3 {path}: worst max_abs / max(1, max|golden|) = {worst:.3e}");
    }
}
