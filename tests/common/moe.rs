//! MoE fixtures shared by the tests: the Qwen3.5-35B-A3B layouts derived
//! from the published tensor list by the rules `expected_counts.json` states
//! (`tools/make_moe_fixtures.py::derive_35b_layout`), JSON readers, the
//! broken layouts as sparse checkpoints, and a random-weight DFlash drafter.

use std::path::Path;

use serde_json::Value;

use super::{repo_root, write_sparse_checkpoint, Spec};

/// The three published layouts.
pub const LAYOUTS: [&str; 3] = ["qwen3.5-fused", "qwen3.6-fused", "per-expert"];

/// Reads a JSON file (panics naming it).
pub fn json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `(name, dtype, shape)` of a `tensors.json` list (each entry with its dtype).
pub fn specs_of(list: &Value) -> Vec<Spec> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["dtype"].as_str().unwrap().to_string(),
                e["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize)
                    .collect(),
            )
        })
        .collect()
}

/// The published 35B-A3B `config.json` and tensor list.
pub fn load_35b() -> (Value, Vec<Spec>) {
    let d = repo_root().join("fixtures/qwen3.5-35b-a3b");
    let cfg = json(&d.join("config.json"));
    let specs = specs_of(&json(&d.join("tensors.json"))["tensors"]);
    (cfg, specs)
}

fn is_per_expert_mtp(n: &str) -> bool {
    n.starts_with("mtp.")
        && n.contains(".mlp.experts.")
        && n.split('.')
            .rev()
            .nth(2)
            .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))
}

/// The published list with its per-expert MTP experts fused in place (the
/// Qwen3.6-35B-A3B layout).
fn fuse_mtp(specs: &[Spec]) -> Vec<Spec> {
    let per: Vec<&Spec> = specs.iter().filter(|t| is_per_expert_mtp(&t.0)).collect();
    let e = per.len() / 3;
    let g0 = per
        .iter()
        .find(|t| t.0.ends_with("experts.0.gate_proj.weight"))
        .unwrap();
    let (i, h) = (g0.2[0], g0.2[1]);
    let base = g0.0.trim_end_matches("0.gate_proj.weight").to_string();
    let mut out = Vec::new();
    for t in specs {
        if is_per_expert_mtp(&t.0) {
            if t.0 == g0.0 {
                out.push((
                    format!("{base}gate_up_proj"),
                    t.1.clone(),
                    vec![e, 2 * i, h],
                ));
                out.push((format!("{base}down_proj"), t.1.clone(), vec![e, h, i]));
            }
            continue;
        }
        out.push(t.clone());
    }
    out
}

/// The published list with every main fused expert parameter replaced (in
/// place) by its per-expert keys.
fn unfuse_main(specs: &[Spec]) -> Vec<Spec> {
    let mut out = Vec::new();
    for t in specs {
        let main = t.0.starts_with("model.language_model.");
        if main && t.0.ends_with("mlp.experts.gate_up_proj") {
            let base = t.0.trim_end_matches("gate_up_proj");
            let (e, i2, h) = (t.2[0], t.2[1], t.2[2]);
            for x in 0..e {
                out.push((
                    format!("{base}{x}.gate_proj.weight"),
                    t.1.clone(),
                    vec![i2 / 2, h],
                ));
                out.push((
                    format!("{base}{x}.up_proj.weight"),
                    t.1.clone(),
                    vec![i2 / 2, h],
                ));
            }
        } else if main && t.0.ends_with("mlp.experts.down_proj") {
            let base = t.0.trim_end_matches("down_proj");
            let (e, h, i) = (t.2[0], t.2[1], t.2[2]);
            for x in 0..e {
                out.push((
                    format!("{base}{x}.down_proj.weight"),
                    t.1.clone(),
                    vec![h, i],
                ));
            }
        } else {
            out.push(t.clone());
        }
    }
    out
}

/// One of [`LAYOUTS`] derived from the published list.
pub fn derive_35b(specs: &[Spec], layout: &str) -> Vec<Spec> {
    match layout {
        "qwen3.5-fused" => specs.to_vec(),
        "qwen3.6-fused" => fuse_mtp(specs),
        "per-expert" => unfuse_main(specs),
        other => panic!("layout {other}"),
    }
}

/// Writes a broken layout of `fixtures/moe/errors/<name>` (headers only) as
/// a sparse one-shard checkpoint in `dir`.
pub fn write_error_layout(name: &str, dir: &Path) {
    let src = repo_root().join("fixtures/moe/errors").join(name);
    let cfg = json(&src.join("config.json"));
    let specs = specs_of(&json(&src.join("tensors.json"))["tensors"]);
    write_sparse_checkpoint(dir, &cfg, &specs, 1);
}
