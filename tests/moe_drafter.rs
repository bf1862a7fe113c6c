//! DFlash evaluation, `compare --drafter` and `triage` on MoE targets, with
//! a random-weight drafter (`fixtures/moe/drafter-random`, written by
//! `tools/make_moe_fixtures.py`): the code paths run on every layout, the
//! paths that load the same bytes give the same τ, and triage runs the
//! `router-dtype` suspect (the router's softmax in the model dtype), which
//! changes the taps from the first MoE layer whose routing it alters.

use crate::common;

use serde_json::Value;

const DRAFTER: &str = "fixtures/moe/drafter-random";

fn run_json(args: &[&str]) -> (i32, Value) {
    let out = common::hsparity().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = out.status.code().unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: exit {code}: {e}: {err}"));
    (code, v)
}

#[test]
fn drafter_runs_on_every_layout_with_equal_tau_per_path() {
    let mut taus = Vec::new();
    for layout in common::moe::LAYOUTS {
        let ckpt = format!("fixtures/moe/{layout}");
        let prompts = format!("{ckpt}/prompts.jsonl");
        let (code, r) = run_json(&[
            "drafter",
            &ckpt,
            "--drafter",
            DRAFTER,
            "--prompts",
            &prompts,
            "--paths",
            "causal-lm,vlm,image-text-to-text",
            "--max-new-tokens",
            "12",
            "--json",
            "--quiet",
        ]);
        assert_eq!(code, 0, "{layout}: {r}");
        let paths = r["paths"].as_array().unwrap();
        assert_eq!(paths.len(), 3, "{layout}");
        let t: Vec<f64> = paths
            .iter()
            .map(|p| p["tau_macro"].as_f64().unwrap())
            .collect();
        assert!(t.iter().all(|x| *x == t[0] && *x >= 1.0), "{layout}: {t:?}");
        let tokens: Vec<&Value> = paths
            .iter()
            .flat_map(|p| {
                p["per_prompt"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|q| &q["tokens"])
            })
            .collect();
        taus.push((t[0], tokens[0].clone()));
    }
    // The layouts hold the same weights: the same trajectories and τ.
    assert!(taus.iter().all(|t| *t == taus[0]), "{taus:?}");
}

#[test]
fn compare_with_drafter_on_an_moe_target() {
    let ckpt = "fixtures/moe/per-expert";
    let prompts = format!("{ckpt}/prompts.jsonl");
    let (code, r) = run_json(&[
        "compare",
        ckpt,
        "--drafter",
        DRAFTER,
        "--prompts",
        &prompts,
        "--max-new-tokens",
        "8",
        "--json",
        "--no-report",
        "--quiet",
    ]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["taps"], serde_json::json!([1, 3]));
    assert!(r["drafter"]["paths"].as_array().unwrap().len() >= 2);
    assert!(r["summary"].as_str().unwrap().contains("drafter τ"));
}

#[test]
fn triage_on_an_moe_target_runs_the_router_dtype_suspect() {
    let ckpt = "fixtures/moe/qwen3.5-fused";
    let prompts = format!("{ckpt}/prompts.jsonl");
    let (code, r) = run_json(&[
        "triage",
        ckpt,
        "--drafter",
        DRAFTER,
        "--prompts",
        &prompts,
        "--max-new-tokens",
        "8",
        "--json",
        "--no-report",
        "--quiet",
    ]);
    assert_eq!(code, 0, "{r}");
    let v = r["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "router-dtype")
        .expect("router-dtype suspect on a bf16 MoE target");
    assert!(v["description"]
        .as_str()
        .unwrap()
        .contains("softmax in the model dtype"));
    // It changes the routing weights, so the taps differ from the baseline.
    assert!(v["cos_min_at_taps"].as_f64().unwrap() < 1.0, "{v}");
    assert!(v["first_divergent"].is_u64(), "{v}");
    // Its numerics are its own: it shares no sweeps. The harness and engine
    // suspects act on the Gated DeltaNet and attention layers and share the
    // baseline's.
    assert!(v.get("shared_sweeps_with").is_none(), "{v}");
    let variants = r["variants"].as_array().unwrap();
    for name in ["harness-gdn-crop", "gdn-state-reset@mid", "kv-fp8"] {
        let h = variants
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("{name} on an MoE target"));
        let shared = h["shared_sweeps_with"].as_array().unwrap();
        assert!(shared.iter().any(|n| n == "baseline"), "{name}: {h}");
    }
    // In f32 the suspect changes nothing and is not run.
    let (_, f) = run_json(&[
        "triage",
        "fixtures/toy-pair/target",
        "--drafter",
        "fixtures/toy-pair/drafter",
        "--max-new-tokens",
        "4",
        "--json",
        "--no-report",
        "--quiet",
    ]);
    assert!(
        f["variants"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["name"] != "router-dtype"),
        "dense targets have no router"
    );
    let na = f["not_applicable"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "router-dtype")
        .expect("router-dtype listed as not applicable on a dense target");
    assert!(na["reason"].as_str().unwrap().contains("dense"), "{na}");
}
