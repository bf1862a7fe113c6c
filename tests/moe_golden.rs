//! hsparity's forward of the tiny `qwen3_5_moe` checkpoint against
//! transformers 5.23.0 (`fixtures/moe/<layout>/golden/<path>.<dtype>.safetensors`,
//! written by `tools/make_moe_fixtures.py`: `output_hidden_states=True`,
//! eager attention, the default `grouped_mm` experts, every weight random),
//! on all three layouts (fused, fused MTP, per expert), all three loading
//! paths, in f32 and in the dtype the paths load with (bf16): hidden states,
//! the raw last layer, logits and, per layer, the router's choice.
//! Tolerances are the dense family's ([`F32_HYBRID`], [`HALF`]).

use crate::common;

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use common::{assert_close, relative_max_abs, same_len, Closeness, F32_HYBRID, HALF};
use hsparity::capture::{self, CaptureOptions, HiddenKind, Observer, PathModel};
use hsparity::error::Result;
use hsparity::loading::{LoadingPath, WeightSource};
use hsparity::models::moe::Routing;
use hsparity::models::GdnForm;
use hsparity::precision::Precision;
use hsparity::progress::RunProgress;
use hsparity::session::Session;

/// Everything the capture shows of one path.
#[derive(Default)]
struct Captured {
    hidden: Vec<Vec<Tensor>>,
    last: Vec<Tensor>,
    logits: Option<Vec<Tensor>>,
    /// `routing[layer][prompt]`.
    routing: Vec<Vec<Routing>>,
}

impl Observer for Captured {
    fn hidden_states(
        &mut self,
        _: usize,
        _: HiddenKind,
        states: &[Vec<Tensor>],
        _: &[Option<Vec<Tensor>>],
    ) -> Result<()> {
        self.hidden.push(states[0].clone());
        Ok(())
    }
    fn last_layer_output(&mut self, states: &[Vec<Tensor>]) -> Result<()> {
        self.last = states[0].clone();
        Ok(())
    }
    fn logits(&mut self, logits: &[Option<Vec<Tensor>>]) -> Result<()> {
        self.logits = logits[0].clone();
        Ok(())
    }
    fn routing(
        &mut self,
        layer: usize,
        routing: &[Vec<Routing>],
        _: &[Option<Vec<Routing>>],
    ) -> Result<()> {
        assert_eq!(layer, self.routing.len());
        self.routing.push(routing[0].clone());
        Ok(())
    }
}

fn capture(layout: &str, path: LoadingPath, prec: Precision) -> (Captured, Vec<Vec<u32>>) {
    let ckpt = format!("fixtures/moe/{layout}");
    capture_dir(&ckpt, path, prec)
}

fn capture_dir(ckpt: &str, path: LoadingPath, prec: Precision) -> (Captured, Vec<Vec<u32>>) {
    let target = common::target(ckpt, Some(&format!("{ckpt}/prompts.jsonl")));
    let session = Session::open(&target, &[path]).unwrap();
    let p = &session.paths[0];
    let mut obs = Captured::default();
    let ids = session.prompt_ids();
    capture::run(
        &session.spec,
        &[PathModel {
            name: path.name().into(),
            source: &p.view as &dyn WeightSource,
            has_lm_head: p.view.has_lm_head(),
            precision: prec,
            noise_shadow: false,
        }],
        &ids,
        CaptureOptions {
            form: GdnForm::Chunked,
            local: false,
            cached_decode: None,
        },
        &mut obs,
        &RunProgress::new(session.spec.num_layers(), ids.len(), true),
    )
    .unwrap();
    (obs, ids)
}

fn golden(layout: &str, path: &str, d: &str) -> HashMap<String, Tensor> {
    let f = common::repo_root().join(format!(
        "fixtures/moe/{layout}/golden/{path}.{d}.safetensors"
    ));
    candle_core::safetensors::load(&f, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// One layout × path × dtype against its golden; returns the worst relative
/// max abs diff and the router slots compared.
fn check(layout: &str, path: LoadingPath, d: &str) -> (f64, usize) {
    let (prec, tol): (Precision, &Closeness) = match d {
        "f32" => (Precision::F32, &F32_HYBRID),
        _ => (Precision::Bf16, &HALF),
    };
    let (ours, ids) = capture(layout, path, prec);
    let gold = golden(layout, path.name(), d);
    // image-text-to-text's logits are causal-lm's (bitwise, asserted by the generator).
    let logits_gold = match path {
        LoadingPath::Vlm => None,
        _ => Some(golden(layout, "causal-lm", d)),
    };
    let what = format!("{layout} {path} {d}");
    let mut worst = 0f64;
    let mut slots = 0;
    for (k, p) in ids.iter().enumerate() {
        let want_ids: Vec<u32> = f32s(&gold[&format!("p{k}.input_ids")])
            .iter()
            .map(|&x| x as u32)
            .collect();
        assert_eq!(*p, want_ids, "{what} p{k}: tokenisation");
        let n = ours.hidden.len();
        assert!(
            gold.contains_key(&format!("p{k}.hidden_states.{}", n - 1)),
            "{what}"
        );
        assert!(
            !gold.contains_key(&format!("p{k}.hidden_states.{n}")),
            "{what}: count"
        );
        for (i, h) in ours.hidden.iter().enumerate() {
            let m = assert_close(
                &format!("{what} p{k} hs[{i}]"),
                &h[k],
                &gold[&format!("p{k}.hidden_states.{i}")],
                tol,
            );
            worst = worst.max(relative_max_abs(&m));
        }
        let m = assert_close(
            &format!("{what} p{k} last"),
            &ours.last[k],
            &gold[&format!("p{k}.last_layer_output")],
            tol,
        );
        worst = worst.max(relative_max_abs(&m));
        match (&ours.logits, &logits_gold) {
            (Some(l), Some(g)) => {
                let m = assert_close(
                    &format!("{what} p{k} logits"),
                    &l[k],
                    &g[&format!("p{k}.logits")],
                    tol,
                );
                worst = worst.max(relative_max_abs(&m));
            }
            (None, None) => {}
            _ => panic!("{what}: logits presence"),
        }
        same_len(&what, &ours.routing, &ours.hidden[1..]);
        for (l, r) in ours.routing.iter().enumerate() {
            let key = |s: &str| format!("p{k}.router.{l}.{s}");
            let want: Vec<u32> = f32s(&gold[&key("indices")])
                .iter()
                .map(|&x| x as u32)
                .collect();
            assert_eq!(r[k].indices, want, "{what} p{k} layer {l}: top-k choice");
            let w = f32s(&gold[&key("weights")]);
            let max = r[k]
                .weights
                .iter()
                .zip(&w)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            // bf16: the weights are rounded to bf16 from the same logits (exact
            // here); f32: softmax's exp differs from torch's in the last bits.
            let bound = if prec == Precision::F32 { 1e-6 } else { 0.0 };
            assert!(
                max <= bound,
                "{what} p{k} layer {l}: routing weights off by {max}"
            );
            slots += want.len();
        }
    }
    (worst, slots)
}

#[test]
fn every_layout_and_path_matches_transformers_in_f32() {
    for layout in common::moe::LAYOUTS {
        for path in LoadingPath::ALL {
            let (worst, slots) = check(layout, path, "f32");
            println!("{layout} {path} f32: worst max_abs / max(1, max|golden|) = {worst:.3e}, {slots} router slots equal");
        }
    }
}

#[test]
fn every_layout_and_path_matches_transformers_in_bf16() {
    for layout in common::moe::LAYOUTS {
        for path in LoadingPath::ALL {
            let (worst, slots) = check(layout, path, "bf16");
            println!("{layout} {path} bf16: worst max_abs / max(1, max|golden|) = {worst:.3e}, {slots} router slots equal");
        }
    }
}

/// The paths load bitwise-identical models in transformers (asserted by the
/// generator) and compute bitwise-identical hidden states in hsparity too,
/// across layouts (a converted parameter equals the fused one bit for bit).
#[test]
fn layouts_and_paths_are_bitwise_identical() {
    let (base, _) = capture("qwen3.5-fused", LoadingPath::CausalLm, Precision::Bf16);
    for layout in common::moe::LAYOUTS {
        for path in LoadingPath::ALL {
            let (o, _) = capture(layout, path, Precision::Bf16);
            for (i, (a, b)) in base.hidden.iter().zip(&o.hidden).enumerate() {
                for (x, y) in a.iter().zip(b) {
                    assert_eq!(f32s(x), f32s(y), "{layout} {path} hs[{i}]");
                }
            }
            assert_eq!(base.routing, o.routing, "{layout} {path}");
        }
    }
}

/// `fixtures/moe/divergence/fp16-disk`: F16 weights on disk with
/// `text_config.dtype = bfloat16`, so `causal-lm` computes in bf16 and the
/// VLM classes in f16. Each path matches transformers in its own dtype, and
/// `compare` counts, layer by layer, exactly the router flips transformers'
/// two paths make (`load_report.json`, `router_agreement_vs_causal_lm`).
#[test]
fn fp16_disk_paths_part_by_their_routers_as_in_transformers() {
    let ckpt = "fixtures/moe/divergence/fp16-disk";
    let dir = common::repo_root().join(ckpt);
    let report = common::moe::json(&dir.join("golden/load_report.json"));
    for p in report["paths"].as_array().unwrap() {
        let path: LoadingPath = p["name"].as_str().unwrap().parse().unwrap();
        let prec = match p["dtype"].as_str().unwrap() {
            "bf16" => Precision::Bf16,
            _ => Precision::F16,
        };
        let session = Session::open(&common::target(ckpt, None), &[path]).unwrap();
        assert_eq!(
            session.paths[0].dtype, prec,
            "{path}: the dtype transformers loads"
        );
        let (ours, _) = capture_dir(ckpt, path, prec);
        let gold = candle_core::safetensors::load(
            dir.join(format!("golden/{path}.safetensors")),
            &Device::Cpu,
        )
        .unwrap();
        for (i, h) in ours.hidden.iter().enumerate() {
            for (k, x) in h.iter().enumerate() {
                assert_close(
                    &format!("fp16-disk {path} p{k} hs[{i}]"),
                    x,
                    &gold[&format!("p{k}.hidden_states.{i}")],
                    &HALF,
                );
            }
        }
        for (l, r) in ours.routing.iter().enumerate() {
            for (k, x) in r.iter().enumerate() {
                let want: Vec<u32> = f32s(&gold[&format!("p{k}.router.{l}.indices")])
                    .iter()
                    .map(|&v| v as u32)
                    .collect();
                assert_eq!(x.indices, want, "fp16-disk {path} p{k} layer {l}");
            }
        }
    }
    let prompts = format!("{ckpt}/prompts.jsonl");
    let out = common::hsparity()
        .args([
            "compare",
            ckpt,
            "--prompts",
            &prompts,
            "--paths",
            "causal-lm,vlm,image-text-to-text",
            "--json",
            "--no-report",
            "--quiet",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "dtype bf16 vs f16 fails the f32 tolerances"
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut flips = 0;
    for pair in r["pairs"].as_array().unwrap() {
        let b = pair["b"].as_str().unwrap();
        let want = &report["router_agreement_vs_causal_lm"][b]["per_layer"];
        for (l, w) in want.as_array().unwrap().iter().enumerate() {
            let row = pair["hidden_states"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["index"] == l + 1)
                .unwrap();
            let got = &row["router"];
            assert_eq!(got["slots"], w["slots"], "{b} layer {l}");
            assert_eq!(
                got["slots_differing"], w["slots_differing"],
                "{b} layer {l}"
            );
            assert_eq!(
                got["tokens_with_other_experts"], w["tokens_with_other_expert_set"],
                "{b} layer {l}"
            );
            flips += got["slots_differing"].as_u64().unwrap();
        }
    }
    assert!(flips > 0, "the fixture shows routing flips");
    assert!(
        r["summary"].as_str().unwrap().contains("router"),
        "{}",
        r["summary"]
    );
}

/// Streaming: a layer loaded from the checkpoint widens only the experts its
/// tokens route to (one token: its k experts), on a fused and on a
/// per-expert layout, and the output equals the resident block's.
#[test]
fn only_routed_experts_are_widened() {
    use hsparity::models::{DecoderLayer, FeedForward};
    for layout in ["qwen3.6-fused", "per-expert"] {
        let ckpt = format!("fixtures/moe/{layout}");
        let session =
            Session::open(&common::target(&ckpt, None), &[LoadingPath::CausalLm]).unwrap();
        let view = &session.paths[0].view;
        let layer = DecoderLayer::load(&session.spec, view, 0, Precision::Bf16).unwrap();
        let FeedForward::SparseMoe(block) = &layer.mlp else {
            panic!("{layout}: an MoE layer");
        };
        assert_eq!(
            block.experts_widened(),
            0,
            "{layout}: nothing widened at load"
        );
        let h = Tensor::randn(0f32, 1.0, (1, 32), &Device::Cpu).unwrap();
        let one = block.forward(&h).unwrap();
        assert_eq!(block.experts_widened(), 3, "{layout}: one token, top-3");
        let hs = Tensor::randn(0f32, 1.0, (16, 32), &Device::Cpu).unwrap();
        let many = block.forward(&hs).unwrap();
        let mut used = one.routing.experts_used();
        used.extend(many.routing.experts_used());
        used.sort_unstable();
        used.dedup();
        assert_eq!(block.experts_widened(), used.len(), "{layout}");
        // The same block with every expert resident computes the same output.
        let p = |n: &str| {
            view.tensor_in(&format!("layers.0.mlp.{n}"), Precision::Bf16)
                .unwrap()
        };
        let resident = hsparity::models::moe::SparseMoeBlock::new(
            p("gate.weight"),
            p("experts.gate_up_proj"),
            p("experts.down_proj"),
            p("shared_expert.gate_proj.weight"),
            p("shared_expert.up_proj.weight"),
            p("shared_expert.down_proj.weight"),
            p("shared_expert_gate.weight"),
            3,
            Precision::Bf16,
        )
        .unwrap();
        assert_eq!(
            f32s(&resident.forward(&hs).unwrap().output),
            f32s(&many.output),
            "{layout}"
        );
    }
}
