//! Router choices in dumps (`p{k}.router.{l}.indices` / `.weights`,
//! docs/dump-format.md): `hsparity dump` records them on MoE targets as
//! transformers' `Qwen3_5MoeTopKRouter.forward` returns them, and `diff`
//! counts the choices two dumps disagree on, layer by layer. The expected
//! choices and counts are transformers 5.23.0's, written by
//! `tools/make_moe_fixtures.py` (`golden/*.safetensors`, `load_report.json`).

use crate::common;
use crate::diff::rewrite_dump;

use candle_core::{DType, Tensor};
use common::hsparity;
use hsparity::dump::Dump;
use serde_json::Value;

const LAYOUT: &str = "fixtures/moe/per-expert";

/// `hsparity dump` of the per-expert layout in bf16 (the dtype transformers
/// loads it in) into `dir/name`.
fn dump_moe(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let out = dir.join(name);
    let prompts = format!("{LAYOUT}/prompts.jsonl");
    let o = hsparity()
        .args(["dump", LAYOUT, "--path", "causal-lm", "--prompts", &prompts])
        .args(["--quiet", "--force", "--no-noise-floor", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn diff_json(a: &std::path::Path, b: &std::path::Path) -> (i32, Value, String) {
    crate::diff::diff(&[a.to_str().unwrap(), b.to_str().unwrap()])
}

/// The router cells of a diff's rows, by `hidden_states` index.
fn router_cells(v: &Value) -> Vec<(u64, Value)> {
    v["pairs"][0]["hidden_states"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["router"].is_null())
        .map(|r| (r["index"].as_u64().unwrap(), r["router"].clone()))
        .collect()
}

#[test]
fn dump_records_the_routers_choices_as_transformers_makes_them() {
    let tmp = tempfile::tempdir().unwrap();
    let ours = dump_moe(tmp.path(), "ours.safetensors");
    let golden = common::repo_root().join(format!("{LAYOUT}/golden/causal-lm.bf16.safetensors"));
    let (a, b) = (Dump::read(&ours).unwrap(), Dump::read(&golden).unwrap());
    let layers = 4;
    for (k, (p, q)) in a.prompts.iter().zip(&b.prompts).enumerate() {
        assert_eq!(p.routing.len(), layers, "p{k}: one choice per MoE layer");
        for (l, r) in &p.routing {
            let g = &q.routing[l];
            assert_eq!(r.top_k, 3, "num_experts_per_tok");
            assert_eq!(
                r.indices, g.indices,
                "p{k} layer {l}: experts and slot order"
            );
            assert_eq!(r.weights, g.weights, "p{k} layer {l}: bf16 routing weights");
        }
    }
    let (code, v, err) = diff_json(&ours, &golden);
    assert_eq!(code, 0, "{err}");
    let cells = router_cells(&v);
    assert_eq!(
        cells.iter().map(|c| c.0).collect::<Vec<_>>(),
        [1, 2, 3, 4],
        "layer l's choice sits on hidden_states[l + 1]"
    );
    let tokens: usize = a.prompts.iter().map(|p| p.rows()).sum();
    for (i, c) in &cells {
        assert_eq!(c["slots"], tokens * 3, "hs[{i}]: every token × slot");
        assert_eq!(c["slots_differing"], 0, "hs[{i}]");
    }
    assert!(
        v["notes"].as_array().unwrap().iter().any(|n| n
            .as_str()
            .unwrap()
            .starts_with("router: every top-k choice agrees")),
        "{}",
        v["notes"]
    );
}

/// transformers' own two paths of `fp16-disk` (bf16 and f16) choose other
/// experts; `diff` of their goldens counts what the generator counted.
#[test]
fn diff_counts_the_router_flips_transformers_counted() {
    let dir = common::repo_root().join("fixtures/moe/divergence/fp16-disk/golden");
    let report = common::moe::json(&dir.join("load_report.json"));
    for other in ["vlm", "image-text-to-text"] {
        let (code, v, err) = diff_json(
            &dir.join("causal-lm.safetensors"),
            &dir.join(format!("{other}.safetensors")),
        );
        assert!(code == 0 || code == 1, "{err}");
        let want = report["router_agreement_vs_causal_lm"][other]["per_layer"]
            .as_array()
            .unwrap();
        let cells = router_cells(&v);
        assert_eq!(cells.len(), want.len(), "{other}");
        for ((i, got), w) in cells.iter().zip(want) {
            assert_eq!(got["slots"], w["slots"], "{other} hs[{i}]");
            assert_eq!(
                got["slots_differing"], w["slots_differing"],
                "{other} hs[{i}]"
            );
            assert_eq!(
                got["tokens_with_other_experts"], w["tokens_with_other_expert_set"],
                "{other} hs[{i}]"
            );
        }
        let flips: u64 = want
            .iter()
            .map(|w| w["slots_differing"].as_u64().unwrap())
            .sum();
        assert!(flips > 0, "the fixture's paths flip");
        let first = want.iter().position(|w| w["slots_differing"] != 0).unwrap();
        let note = format!(", first at layer {first} (hs {})", first + 1);
        assert!(
            v["notes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n.as_str().unwrap().contains(&note)),
            "{other}: {}",
            v["notes"]
        );
    }
}

/// One expert swapped in one slot of hsparity's dump: `diff` counts it at
/// that layer's row and names the layer.
#[test]
fn a_changed_choice_is_counted_where_it_is() {
    let tmp = tempfile::tempdir().unwrap();
    let ours = dump_moe(tmp.path(), "ours.safetensors");
    let edited = tmp.path().join("edited.safetensors");
    rewrite_dump(ours.to_str().unwrap(), &edited, |t, _| {
        let ids = &t["p1.router.2.indices"];
        let mut v: Vec<i64> = ids.flatten_all().unwrap().to_vec1().unwrap();
        // Token 1's second slot gets an expert the token does not use.
        v[4] = (0..8).find(|e| !v[3..6].contains(e)).unwrap();
        let (r, c) = ids.dims2().unwrap();
        t.insert(
            "p1.router.2.indices".into(),
            Tensor::from_vec(v, (r, c), &candle_core::Device::Cpu).unwrap(),
        );
    });
    let (code, v, err) = diff_json(&ours, &edited);
    assert_eq!(code, 0, "the hidden states agree bitwise: {err}");
    let tokens: usize = Dump::read(&ours)
        .unwrap()
        .prompts
        .iter()
        .map(|p| p.rows())
        .sum();
    let total = tokens * 3 * 4;
    let cells = router_cells(&v);
    for (i, c) in &cells {
        let want = u64::from(*i == 3);
        assert_eq!(c["slots_differing"], want, "hs[{i}]");
    }
    assert!(v["notes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n.as_str().unwrap().contains(&format!(
            "in 1 of {total} token×slot choices over 4 MoE layers"
        )) && n.as_str().unwrap().contains("first at layer 2 (hs 3)")));
}

/// Router tensors that are not a router's choice are refused with one line
/// and exit 2, naming the tensor.
#[test]
fn malformed_router_tensors_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let ours = dump_moe(tmp.path(), "ours.safetensors");
    type Edit = Box<dyn Fn(&mut std::collections::HashMap<String, Tensor>)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "float ids",
            Box::new(|t| {
                let x = t["p0.router.0.indices"].to_dtype(DType::F32).unwrap();
                t.insert("p0.router.0.indices".into(), x);
            }),
            "p0.router.0.indices is F32",
        ),
        (
            "weights without ids",
            Box::new(|t| {
                t.remove("p0.router.1.indices");
            }),
            "p0.router.1.weights without p0.router.1.indices",
        ),
        (
            "weights of another shape",
            Box::new(move |t| {
                let w = t["p0.router.0.weights"].narrow(1, 0, 2).unwrap();
                t.insert("p0.router.0.weights".into(), w);
            }),
            "p0.router.0.weights is F32 [11, 2] but",
        ),
        (
            "rows of another prompt",
            Box::new(move |t| {
                let x = t["p0.router.0.indices"].narrow(0, 0, 3).unwrap();
                let w = t["p0.router.0.weights"].narrow(0, 0, 3).unwrap();
                t.insert("p0.router.0.indices".into(), x);
                t.insert("p0.router.0.weights".into(), w);
            }),
            "p0.router.0.indices has 3 rows",
        ),
        (
            "a negative expert id",
            Box::new(|t| {
                let x = (t["p0.router.0.indices"].clone() - 100.0).unwrap();
                t.insert("p0.router.0.indices".into(), x);
            }),
            "expert id outside",
        ),
        (
            "integer weights",
            Box::new(|t| {
                let w = t["p0.router.0.indices"].clone();
                t.insert("p0.router.0.weights".into(), w);
            }),
            "routing weights are floats",
        ),
        (
            "one expert twice for a token",
            Box::new(|t| {
                let ids = &t["p0.router.0.indices"];
                let mut v: Vec<i64> = ids.flatten_all().unwrap().to_vec1().unwrap();
                v[1] = v[0];
                let dims = ids.dims2().unwrap();
                let x = Tensor::from_vec(v, dims, &candle_core::Device::Cpu).unwrap();
                t.insert("p0.router.0.indices".into(), x);
            }),
            "names one expert twice for token 0",
        ),
        (
            "an expert beyond num_experts",
            Box::new(|t| {
                let x = (t["p0.router.0.indices"].clone() + 8.0).unwrap();
                t.insert("p0.router.0.indices".into(), x);
            }),
            "but __metadata__ num_experts is 8",
        ),
        (
            "a layer beyond the model",
            Box::new(|t| {
                for k in 0..2 {
                    for f in ["indices", "weights"] {
                        let x = t[&format!("p{k}.router.0.{f}")].clone();
                        t.insert(format!("p{k}.router.4.{f}"), x);
                    }
                }
            }),
            "p0.router.4: the dump holds a 4-layer model's states",
        ),
        (
            "a layer written 01",
            Box::new(|t| {
                for k in 0..2 {
                    for f in ["indices", "weights"] {
                        let x = t.remove(&format!("p{k}.router.1.{f}")).unwrap();
                        t.insert(format!("p{k}.router.01.{f}"), x);
                    }
                }
            }),
            "router.01.",
        ),
        (
            "a field that is not one",
            Box::new(|t| {
                let x = t.remove("p0.router.1.indices").unwrap();
                t.insert("p0.router.1.index".into(), x);
            }),
            "p0.router.1.index: router choices are",
        ),
        (
            "layers in one prompt only",
            Box::new(|t| {
                t.remove("p1.router.3.indices");
                t.remove("p1.router.3.weights");
            }),
            "p1 holds router choices at",
        ),
    ];
    for (what, edit, says) in cases {
        let bad = tmp.path().join("bad.safetensors");
        rewrite_dump(ours.to_str().unwrap(), &bad, |t, _| edit(t));
        let (code, _, err) = diff_json(&ours, &bad);
        assert_eq!(code, 2, "{what}: {err}");
        assert!(err.contains(says), "{what}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{what}: one line: {err}");
    }
    // A valid dump whose router chose two experts per token: not comparable.
    let top2 = tmp.path().join("top2.safetensors");
    rewrite_dump(ours.to_str().unwrap(), &top2, |t, m| {
        // Refused by its own metadata first; without it, by the comparison.
        m.remove("top_k");
        for k in 0..2 {
            for f in ["indices", "weights"] {
                let name = format!("p{k}.router.0.{f}");
                let x = t[&name].narrow(1, 0, 2).unwrap();
                t.insert(name, x);
            }
        }
    });
    let (code, _, err) = diff_json(&ours, &top2);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("top-3 in /")
            && err.contains("top-2 in /")
            && err.contains("top2.safetensors"),
        "{err}"
    );
}

/// Router choices that cannot sit on a compared row are still counted, and
/// what is not compared is said: a layer whose output one dump lacks, choices
/// in one dump only, a tap offset.
#[test]
fn router_choices_not_on_a_row_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let ours = dump_moe(tmp.path(), "ours.safetensors");
    let partial = tmp.path().join("partial.safetensors");
    rewrite_dump(ours.to_str().unwrap(), &partial, |t, m| {
        m.remove("noise_floor");
        for k in 0..2 {
            t.remove(&format!("p{k}.hidden_states.1"));
            let ids = &t[&format!("p{k}.router.0.indices")];
            // Every choice rotated by one slot: the same experts, other slots.
            let x = Tensor::cat(
                &[ids.narrow(1, 1, 2).unwrap(), ids.narrow(1, 0, 1).unwrap()],
                1,
            )
            .unwrap();
            t.insert(format!("p{k}.router.0.indices"), x);
        }
    });
    let (code, v, err) = diff_json(&ours, &partial);
    assert_eq!(code, 0, "{err}");
    let notes = v["notes"].to_string();
    let slots = 3 * Dump::read(&ours)
        .unwrap()
        .prompts
        .iter()
        .map(|p| p.rows())
        .sum::<usize>();
    assert!(
        notes.contains(&format!(
            "layers whose output is not compared (layer 0: {slots} of {slots})"
        )),
        "{notes}"
    );
    let bare = tmp.path().join("bare.safetensors");
    rewrite_dump(ours.to_str().unwrap(), &bare, |t, m| {
        m.remove("noise_floor");
        t.retain(|k, _| !k.contains(".router."));
    });
    let (_, v, _) = diff_json(&ours, &bare);
    assert!(
        v["notes"]
            .to_string()
            .contains("holds router choices, so they are not compared"),
        "{}",
        v["notes"]
    );
    let (_, v, _) = {
        let o = hsparity()
            .arg("diff")
            .args([&ours, &ours])
            .args(["--tap-offset", "1", "--json", "--no-report"])
            .output()
            .unwrap();
        (
            o.status.code(),
            serde_json::from_slice::<Value>(&o.stdout).unwrap(),
            (),
        )
    };
    assert!(
        v["notes"]
            .to_string()
            .contains("choices not compared under --tap-offset 1"),
        "{}",
        v["notes"]
    );
}

/// A floor whose router counts are not the dump's own is refused: the
/// shadow's flips are read against the choices the dump records.
#[test]
fn a_floor_with_other_router_counts_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = std::path::PathBuf::from(crate::noise_floor::dump_entry(tmp.path(), "moe-s0-bf16"));
    let entry = "fixtures/noise-floor/moe-s0-bf16";
    let meta = |p: &std::path::Path| {
        let bytes = std::fs::read(p).unwrap();
        let (_, m) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        m.metadata().clone().unwrap_or_default()
    };
    let floor: Value = serde_json::from_str(&meta(&out)["noise_floor"]).unwrap();
    let slots = floor["routers"][0]["slots"].as_u64().unwrap();
    let bad = tmp.path().join("bad.safetensors");
    rewrite_dump(out.to_str().unwrap(), &bad, |_, m| {
        let f = m["noise_floor"].replace(
            &format!("\"slots\":{slots},"),
            &format!("\"slots\":{},", slots * 1000),
        );
        m.insert("noise_floor".into(), f);
    });
    let theirs = std::path::PathBuf::from(format!("{entry}/transformers.safetensors"));
    let (code, _, err) = diff_json(&bad, &theirs);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("router choices at layer 0, but the dump records"),
        "{err}"
    );
}
