//! hsparity's hidden states of each loading path against transformers 5.23.0
//! on the same path (fixtures/tiny-qwen3_5/golden/*.safetensors, written by
//! tools/make_fixtures.py: output_hidden_states=True, eager attention,
//! use_cache=False, fp32, every weight randomised, norms included).

use crate::common;

use std::path::Path;

use common::{assert_close, relative_max_abs, same_len, F32_HYBRID};
use hsparity::commands::dump::{self, DumpOptions};
use hsparity::dump::Dump;
use hsparity::loading::LoadingPath;
use hsparity::models::GdnForm;
use hsparity::parity::Accumulator;
use hsparity::session::Target;

const CKPT: &str = "fixtures/tiny-qwen3_5";

fn target() -> Target {
    common::target(CKPT, Some(&format!("{CKPT}/prompts.jsonl")))
}

fn opts(form: GdnForm, logits: bool) -> DumpOptions {
    DumpOptions {
        logits,
        form,
        quiet: true,
        ..Default::default()
    }
}

fn run(path: LoadingPath, form: GdnForm, logits: bool) -> Dump {
    dump::run(&target(), path, &opts(form, logits)).unwrap()
}

fn golden(path: &str) -> Dump {
    Dump::read(Path::new(&format!("{CKPT}/golden/{path}.safetensors"))).expect("golden dump")
}

/// [`F32_HYBRID`]: per-token cosine ≥ 0.99999 and max abs ≤ 1e-3 ·
/// max(1, max|golden|); returns the relative max abs (printed).
fn close(what: &str, ours: &candle_core::Tensor, want: &candle_core::Tensor) -> f64 {
    relative_max_abs(&assert_close(what, ours, want, &F32_HYBRID))
}

/// `logits_from`: the golden holding this path's reference logits (the
/// image-text-to-text golden omits them: transformers' are bitwise equal to
/// causal-lm's, asserted by the generator), `None` for a path without lm_head.
fn check_path(path: LoadingPath, gold_name: &str, logits_from: Option<&str>) {
    let ours = run(path, GdnForm::Chunked, true);
    let gold = golden(gold_name);
    let logits_gold = logits_from.map(golden);
    let with_logits = logits_from.is_some();
    same_len("prompts", &ours.prompts, &gold.prompts);
    let mut worst = 0f64;
    for (k, (o, g)) in ours.prompts.iter().zip(&gold.prompts).enumerate() {
        let want_logits = logits_gold
            .as_ref()
            .and_then(|l| l.prompts[k].logits.as_ref());
        assert_eq!(
            o.input_ids, g.input_ids,
            "p{k}: tokenisation differs from Python's"
        );
        let what = format!("p{k}");
        for (i, a, b) in common::paired_states(&what, &o.hidden_states, &g.hidden_states) {
            worst = worst.max(close(&format!("{gold_name} p{k} hidden_states[{i}]"), a, b));
        }
        worst = worst.max(close(
            &format!("{gold_name} p{k} last_layer_output"),
            o.last_layer_output.as_ref().unwrap(),
            g.last_layer_output.as_ref().unwrap(),
        ));
        match (with_logits, &o.logits, want_logits) {
            (true, Some(a), Some(b)) => {
                worst = worst.max(close(&format!("{gold_name} p{k} logits"), a, b));
            }
            (false, None, None) => {}
            other => panic!(
                "{gold_name} p{k}: logits presence differs: {:?}",
                (other.0, other.1.is_some(), other.2.is_some())
            ),
        }
    }
    println!("{gold_name}: worst max_abs / max(1, max|golden|) = {worst:.3e}");
}

#[test]
fn causal_lm_matches_transformers() {
    check_path(LoadingPath::CausalLm, "causal-lm", Some("causal-lm"));
}

#[test]
fn vlm_matches_transformers() {
    check_path(LoadingPath::Vlm, "vlm", None);
}

#[test]
fn image_text_to_text_matches_transformers() {
    check_path(
        LoadingPath::ImageTextToText,
        "image-text-to-text",
        Some("causal-lm"),
    );
}

#[test]
fn chunked_and_recurrent_forms_agree_within_1e3_relative() {
    let c = run(LoadingPath::CausalLm, GdnForm::Chunked, false);
    let r = run(LoadingPath::CausalLm, GdnForm::Recurrent, false);
    let mut worst = 0f64;
    same_len("prompts", &c.prompts, &r.prompts);
    for (a, b) in c.prompts.iter().zip(&r.prompts) {
        for (_, x, y) in common::paired_states("hidden states", &a.hidden_states, &b.hidden_states)
        {
            let mut acc = Accumulator::default();
            acc.add(0, x, y).unwrap();
            let m = acc.finish();
            assert!(m.rel_l2 <= 1e-3, "rel_l2 {}", m.rel_l2);
            worst = worst.max(m.max_abs / m.max_ref_abs.max(1.0));
        }
    }
    println!("chunked vs recurrent: worst max_abs / max(1, max|h|) = {worst:.3e}");
}

/// The reference fact the tool must reproduce: with text-only prompts the
/// paths agree bitwise in transformers 5.23.0 — and in hsparity.
#[test]
fn paths_are_bitwise_identical_in_transformers_and_in_hsparity() {
    let bitwise = |what: &str, a: &Dump, b: &Dump| {
        same_len(what, &a.prompts, &b.prompts);
        for (k, (p, q)) in a.prompts.iter().zip(&b.prompts).enumerate() {
            for (i, x, y) in common::paired_states(what, &p.hidden_states, &q.hidden_states) {
                let mut acc = Accumulator::default();
                acc.add(0, x, y).unwrap();
                assert!(acc.finish().bitwise, "{what}: p{k} hidden_states[{i}]");
            }
        }
    };
    bitwise("transformers", &golden("causal-lm"), &golden("vlm"));
    let ours = |p| run(p, GdnForm::Chunked, false);
    bitwise(
        "hsparity",
        &ours(LoadingPath::CausalLm),
        &ours(LoadingPath::Vlm),
    );
}
