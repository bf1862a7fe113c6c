//! The harness and engine faults triage emulates, checked at the engine level:
//! z-lab's own `dflash_generate` (dflash 0.1.0 on transformers 5.23.0) on the
//! Qwen3.5 toy pair, whose cache crop rolls the Gated DeltaNet conv state
//! back but not the recurrent state, reproduced round for round from the
//! package's golden (`tools/train_toy_pair.py`); the correct crop gives
//! the greedy continuation instead, so the comparison can fail.

use hsparity::checkpoint::Checkpoint;
use hsparity::drafter::eval::EndRule;
use hsparity::drafter::faults::Faults;
use hsparity::drafter::generate::{dflash_loop_with, Lane};
use hsparity::drafter::target::TargetModel;
use hsparity::loading::{self, LoadingPath};
use hsparity::models::dflash::Drafter;
use hsparity::models::{CacheCrop, TextModelSpec};
use hsparity::precision::Precision;
use serde_json::Value;
use std::path::Path;

const T: &str = "fixtures/toy-pair";

fn golden() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(format!("{T}/golden/reference_generate_gdn_crop.json")).unwrap(),
    )
    .unwrap()
}

/// A JSON array of non-negative integers.
fn nums<T: TryFrom<u64>>(v: &Value) -> Vec<T> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| T::try_from(x.as_u64().unwrap()).ok().unwrap())
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    nums(v)
}

/// Runs the wheel's loop on every prompt of a golden set with `crop`:
/// per prompt (new tokens, acceptance lengths).
fn run(set: &Value, crop: CacheCrop) -> Vec<(Vec<u32>, Vec<usize>)> {
    let c = Checkpoint::open(&format!("{T}/target")).unwrap();
    let p = loading::resolve(&c, LoadingPath::CausalLm).unwrap();
    let spec = TextModelSpec::new(&p.text_config).unwrap();
    // The set's drafter dtype (the noise set runs it in f32, see the generator).
    let dprec = Precision::from_name(set["drafter_dtype"].as_str().unwrap()).unwrap();
    let dir = format!("{T}/drafter");
    let drafter = Drafter::load_dir(Path::new(&dir), p.text_config.hidden_size, dprec).unwrap();
    let target = TargetModel {
        spec: &spec,
        weights: &p.view,
        head: &p.view,
        prec: p.dtype,
    };
    let prompts: Vec<Vec<u32>> = set["per_prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| ids(&q["input_ids"]))
        .collect();
    let lanes: Vec<Lane> = prompts
        .iter()
        .map(|q| Lane {
            faults: Faults {
                crop,
                ..Faults::default()
            },
            ..Lane::plain(q)
        })
        .collect();
    let max_new = set["max_new_tokens"].as_u64().unwrap() as usize;
    let g = dflash_loop_with(&target, &drafter, &lanes, max_new, EndRule::Wheel, &|_| {}).unwrap();
    g.tokens
        .iter()
        .zip(&prompts)
        .map(|(t, q)| t[q.len()..].to_vec())
        .zip(g.acceptance_lengths)
        .collect()
}

/// Every round and every token of `dflash_generate` on the toy pair, with
/// the crop that leaves the recurrent state behind: the 15 held-out prompts
/// (64 new tokens; the trained drafter accepts most blocks, τ as the
/// package's) and 6 off-distribution prompts (32 new tokens; rejected drafts
/// every round, and the package's output leaves greedy on some of them at
/// the same position as ours).
#[test]
fn conv_only_crop_reproduces_dflash_generate() {
    let g = golden();
    for name in ["held_out", "noise"] {
        let set = &g["sets"][name];
        let ours = run(set, CacheCrop::ConvOnly);
        let mut tau_sum = 0.0;
        for (q, (toks, acc)) in set["per_prompt"].as_array().unwrap().iter().zip(&ours) {
            let k = &q["prompt"];
            assert_eq!(*toks, ids(&q["output_ids"]), "{name} prompt {k}: tokens");
            assert_eq!(
                *acc,
                nums::<usize>(&q["acceptance_lengths"]),
                "{name} prompt {k}: rounds"
            );
            let greedy = ids(&q["greedy_ids"]);
            let dep = toks.iter().zip(&greedy).position(|(a, b)| a != b);
            assert_eq!(
                dep.map(|d| d as u64),
                q["first_departure"].as_u64(),
                "{name} prompt {k}: first departure from greedy"
            );
            tau_sum += acc.iter().sum::<usize>() as f64 / acc.len() as f64;
        }
        let tau = tau_sum / ours.len() as f64;
        let want = set["tau_macro"].as_f64().unwrap();
        assert!((tau - want).abs() < 1e-4, "{name}: τ {tau} vs {want}");
    }
    assert!(g["sets"]["noise"]["departing_prompts"].as_u64().unwrap() >= 2);
}

/// The correct crop (conv and recurrent state committed to the accepted
/// prefix) gives the greedy continuation on the same prompts, so it does
/// not reproduce the package where the package leaves greedy.
#[test]
fn exact_crop_is_greedy_where_dflash_generate_is_not() {
    let g = golden();
    let set = &g["sets"]["noise"];
    let ours = run(set, CacheCrop::Exact);
    let mut differs = 0;
    for (q, (toks, _)) in set["per_prompt"].as_array().unwrap().iter().zip(&ours) {
        assert_eq!(
            *toks,
            ids(&q["greedy_ids"]),
            "prompt {}: greedy",
            q["prompt"]
        );
        differs += usize::from(*toks != ids(&q["output_ids"]));
    }
    assert!(differs >= 2, "only {differs} prompts tell the crops apart");
}
