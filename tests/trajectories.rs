//! The drafter evaluation's three modes agree — resident weights, weights
//! streamed layer by layer, and τ measured on supplied trajectories
//! (`--trajectories`) — and supplied trajectories are checked: z-lab's own
//! `dflash_generate` output (fixtures/toy-pair-qwen3/golden, written by
//! tools/train_toy_pair.py with the dflash 0.1.0 package) reproduces its τ
//! round for round, a tampered token is caught at its position, and bad
//! files are refused with the line.

use crate::common;

use std::path::{Path, PathBuf};

use candle_core::Device;
use common::hsparity;
use hsparity::commands::drafter::{self, DrafterOptions};
use hsparity::commands::triage::{self, TriageOptions};
use hsparity::drafter::eval::{EndRule, PathTau};
use hsparity::drafter::plan::Residency;
use hsparity::drafter::trajectories::GivenFile;
use hsparity::loading::LoadingPath;
use hsparity::report::DrafterReport;
use serde_json::{json, Value};

const PAIR: &str = "fixtures/toy-pair";
const QPAIR: &str = "fixtures/toy-pair-qwen3";

/// A drafter run on `dir`'s pair: both paths (or `paths`), the pair's
/// prompts, `max_new` new tokens, DDTree-8.
fn options(target: &str, drafter: &str, prompts: &str, max_new: usize) -> DrafterOptions {
    common::drafter_options(
        common::target(target, Some(prompts)),
        &[LoadingPath::CausalLm, LoadingPath::Vlm],
        drafter,
        max_new,
    )
}

fn pair(dir: &str, max_new: usize) -> DrafterOptions {
    options(
        &format!("{dir}/target"),
        &format!("{dir}/drafter"),
        &format!("{dir}/prompts.jsonl"),
        max_new,
    )
}

/// The per-path results that must not depend on how the weights were held.
fn results(r: &DrafterReport) -> Value {
    json!({"paths": r.paths, "cross": r.cross, "tau_gap": r.tau_gap})
}

/// Writes `{"prompt_ids", "output_ids"}` lines: each prompt with
/// the first `n` tokens of path `path`'s continuation.
fn write_trajectories(
    dir: &Path,
    name: &str,
    prompts: &[Vec<u32>],
    p: &PathTau,
    n: usize,
) -> PathBuf {
    let f = dir.join(name);
    let lines: Vec<String> = prompts
        .iter()
        .zip(&p.per_prompt)
        .map(|(ids, r)| json!({"prompt_ids": ids, "output_ids": r.tokens[..n]}).to_string())
        .collect();
    std::fs::write(&f, lines.join("\n") + "\n").unwrap();
    f
}

/// Five of the pair's fifteen held-out prompts (as tests/triage.rs uses).
fn every_third_prompt(dir: &str) -> String {
    let lines: Vec<String> = std::fs::read_to_string(format!("{dir}/prompts.jsonl"))
        .unwrap()
        .lines()
        .step_by(3)
        .map(str::to_string)
        .collect();
    lines.join("\n")
}

/// The tied-top-level variant of the toy pair (written into `dir`): causal-lm
/// gets a random lm_head, image-text-to-text ties it, so the paths diverge.
fn tied_top_level(dir: &Path) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(PAIR)
        .join("target");
    let mut t =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    t.remove("lm_head.weight");
    candle_core::safetensors::save(&t, dir.join("model.safetensors")).unwrap();
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["tie_word_embeddings"] = json!(true);
    cfg["text_config"]["tie_word_embeddings"] = json!(false);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(src.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    dir.to_str().unwrap().to_string()
}

/// Resident and streamed runs are the same computation (the same kernels on
/// the same stored bytes, widened at the same point): every trajectory,
/// acceptance length, τ, DDTree τ and cross run is equal, and so are the
/// sweeps; only the plan differs.
fn resident_equals_streamed(o: DrafterOptions, what: &str) -> DrafterReport {
    let resident = drafter::run(&o).unwrap();
    let mut s = o.clone();
    s.drafter.memory_budget = Some(1);
    let streamed = drafter::run(&s).unwrap();
    assert_eq!(resident.plan.mode, Residency::Resident, "{what}");
    assert_eq!(streamed.plan.mode, Residency::Streamed, "{what}");
    assert_eq!(results(&resident), results(&streamed), "{what}");
    resident
}

/// Generation mode against trajectory mode on the same tokens: path 0's own
/// continuation, N + B − 1 tokens (what GitHub main's rule reads for N new
/// tokens), replayed over N. Path 0's τ and acceptance lengths are its generated
/// run's, and every other path's are its cross run's (its features on path
/// 0's trajectory). The features differ in how they were computed — the
/// loop's verification blocks against one teacher-forced sweep — so
/// equality is at the level of the accepted drafts, which these fixtures
/// reach in every round (a near-tie could change a draft's argmax; none
/// does here).
fn trajectory_mode_equals_generation(o: DrafterOptions, what: &str, expect_exit: i32) {
    let (b, n) = (8, o.drafter.replay.max_new);
    let gen = drafter::run(&o).unwrap();
    let mut longer = o.clone();
    longer.drafter.replay.max_new = n + b - 1;
    longer.paths = vec![o.paths[0]];
    let long = drafter::run(&longer).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let ids = session_prompts(&o);
    let f = write_trajectories(tmp.path(), "t.jsonl", &ids, &long.paths[0], n + b - 1);
    let mut t = o.clone();
    t.drafter.trajectories = Some(GivenFile {
        file: f,
        max_new: None,
    });
    let given = drafter::run(&t).unwrap();
    let tr = given.trajectories.as_ref().expect("trajectory mode");
    assert_eq!(tr.replayed_tokens, vec![n; ids.len()], "{what}");
    assert!(given.cross.is_empty(), "{what}: no cross runs");
    let own = &gen.paths[0];
    let on_given = &given.paths[0];
    for (k, (a, b)) in own.per_prompt.iter().zip(&on_given.per_prompt).enumerate() {
        assert_eq!(a.tokens, b.tokens, "{what} prompt {k}");
        assert_eq!(
            a.acceptance_lengths, b.acceptance_lengths,
            "{what} prompt {k}"
        );
    }
    assert_eq!(own.summary.tau_macro, on_given.summary.tau_macro, "{what}");
    assert_eq!(own.ddtree.tau_macro, on_given.ddtree.tau_macro, "{what}");
    assert_eq!(on_given.sweeps, 1, "{what}: one teacher-forced sweep");
    assert!(
        tr.paths[0].first_failure.is_none(),
        "{what}: path 0 on its own tokens: {:?}",
        tr.paths[0]
    );
    for (j, c) in gen.cross.iter().enumerate() {
        assert_eq!(
            c.tau_macro,
            given.paths[j + 1].summary.tau_macro,
            "{what}: {} on {}'s tokens",
            c.features,
            c.trajectory
        );
        assert_eq!(c.ddtree_tau_macro, given.paths[j + 1].ddtree.tau_macro);
    }
    assert_eq!(
        given.exit_code as i32, expect_exit,
        "{what}: {}",
        given.summary
    );
}

/// The token ids a run's prompts encode to (what `hsparity prompts` shows).
fn session_prompts(o: &DrafterOptions) -> Vec<Vec<u32>> {
    hsparity::session::Session::open(&o.target, &[LoadingPath::CausalLm])
        .unwrap()
        .prompt_ids()
}

#[test]
fn resident_streamed_and_trajectory_modes_agree_on_the_toy_pairs() {
    for (dir, what) in [(PAIR, "qwen3_5 toy pair"), (QPAIR, "qwen3 toy pair")] {
        let o = pair(dir, 64);
        resident_equals_streamed(o.clone(), what);
        trajectory_mode_equals_generation(o, what, 0);
    }
}

#[test]
fn modes_agree_when_the_paths_diverge() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tied_top_level(tmp.path());
    // A random lm_head accepts ~nothing: one round per token, so five
    // prompts and 32 tokens keep this quick.
    let pf = tmp.path().join("p.jsonl");
    std::fs::write(&pf, every_third_prompt(PAIR)).unwrap();
    let mut o = options(&t, &format!("{PAIR}/drafter"), pf.to_str().unwrap(), 32);
    o.paths = vec![LoadingPath::ImageTextToText, LoadingPath::CausalLm];
    let r = resident_equals_streamed(o.clone(), "tied-top-level");
    assert!(r.tau_gap > 0.05, "the paths diverge: gap {}", r.tau_gap);
    // causal-lm's random lm_head does not decode image-text-to-text's
    // trajectory: it departs (exit 1), and its τ there is its cross run's.
    trajectory_mode_equals_generation(o, "tied-top-level", 1);
}

/// z-lab's `dflash_generate` (dflash 0.1.0 wheel, bf16 Qwen3 target) output
/// given as trajectories (prompt as text, output as ids): every path agrees
/// with it at every position, and τ under the wheel's rule is the package's,
/// every round identical.
#[test]
fn dflash_generate_output_as_trajectories_reproduces_its_tau() {
    let g: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{QPAIR}/golden/reference_generate.json")).unwrap(),
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("dflash_generate.jsonl");
    let per = g["per_prompt"].as_array().unwrap();
    let lines: Vec<String> = g["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .zip(per)
        .map(|(p, r)| json!({"prompt": p["text"], "output_ids": r["output_ids"]}).to_string())
        .collect();
    std::fs::write(&f, lines.join("\n")).unwrap();
    let out = hsparity()
        .args(["drafter", &format!("{QPAIR}/target"), "--drafter"])
        .arg(format!("{QPAIR}/drafter"))
        .args(["--end-rule", "wheel", "--json", "-q", "--trajectories"])
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let want = g["tau_macro"].as_f64().unwrap();
    for p in v["paths"].as_array().unwrap() {
        let tau = p["tau_macro"].as_f64().unwrap();
        assert!(
            (tau - want).abs() <= 5e-5,
            "{}: τ {tau} vs {want}",
            p["name"]
        );
        for (ours, theirs) in p["per_prompt"].as_array().unwrap().iter().zip(per) {
            assert_eq!(ours["acceptance_lengths"], theirs["acceptance_lengths"]);
            assert_eq!(ours["tokens"], theirs["output_ids"]);
        }
    }
    let t = &v["trajectories"];
    assert_eq!(t["replayed_tokens"], json!(vec![64; per.len()]));
    for p in t["paths"].as_array().unwrap() {
        assert_eq!(p["departures"], 0, "{p}");
        assert_eq!(p["checked"], 64 * per.len());
    }
    assert_eq!(v["verdict"], "pass");
}

/// One changed output token (prompt 3, output position 10) is caught there:
/// exit 1, the summary and `first_failure` name prompt 3 position 10 with
/// the given token and this path's argmax; later positions of that prompt
/// (whose context now differs) may depart too, nothing before it or in
/// another prompt does.
#[test]
fn a_tampered_trajectory_is_caught_at_its_position() {
    let g: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{QPAIR}/golden/reference_generate.json")).unwrap(),
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("tampered.jsonl");
    let mut lines = Vec::new();
    let mut was = 0;
    for (k, (p, r)) in g["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .zip(g["per_prompt"].as_array().unwrap())
        .enumerate()
    {
        let mut out: Vec<u64> = serde_json::from_value(r["output_ids"].clone()).unwrap();
        if k == 3 {
            was = out[10];
            out[10] = if out[10] == 5 { 6 } else { 5 };
        }
        lines.push(json!({"prompt": p["text"], "output_ids": out}).to_string());
    }
    std::fs::write(&f, lines.join("\n")).unwrap();
    let out = hsparity()
        .args(["drafter", &format!("{QPAIR}/target"), "--drafter"])
        .arg(format!("{QPAIR}/drafter"))
        .args([
            "--paths",
            "causal-lm",
            "--end-rule",
            "wheel",
            "--json",
            "-q",
        ])
        .arg("--trajectories")
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &v["trajectories"]["paths"][0];
    let first = &p["first_failure"];
    assert_eq!(first["prompt"], 3, "{p}");
    assert_eq!(first["position"], 10, "{p}");
    assert_eq!(
        first["argmax"], was,
        "the path's argmax is the original token"
    );
    assert_ne!(first["given"], was);
    assert!(first["margin"].as_f64().unwrap() > 0.0);
    assert_eq!(first["near_tie"], false);
    for d in p["listed"].as_array().unwrap() {
        assert_eq!(d["prompt"], 3, "{d}");
        assert!(d["position"].as_u64().unwrap() >= 10, "{d}");
    }
    let s = v["summary"].as_str().unwrap();
    assert!(s.contains("prompt 3 output position 10"), "{s}");
}

/// Bad trajectory files: exit 2, one line naming the file and line.
#[test]
fn bad_trajectory_files_are_refused_with_the_line() {
    let tmp = tempfile::tempdir().unwrap();
    let good = r#"{"prompt_ids": [3, 4, 5], "output_ids": [6, 7, 8, 9, 10, 11, 12, 13, 14]}"#;
    let cases: &[(&str, String, &str)] = &[
        ("not-json", format!("{good}\n{{oops"), ":2: not valid JSON"),
        (
            "out-of-vocab",
            format!("{good}\n{{\"prompt_ids\": [3], \"output_ids\": [1, 99999]}}"),
            ":2: output_ids[1] = 99999 is out of the target's vocabulary",
        ),
        (
            "empty-output",
            r#"{"prompt_ids": [3, 4], "output_ids": []}"#.into(),
            ":1: the output is empty",
        ),
        (
            "no-output",
            r#"{"prompt_ids": [3, 4]}"#.into(),
            ":1: no \"output_ids\"",
        ),
        (
            "both-forms",
            r#"{"prompt_ids": [3], "prompt": "x", "output_ids": [4, 5]}"#.into(),
            "not both",
        ),
        (
            "too-short",
            r#"{"prompt_ids": [3, 4], "output_ids": [5, 6, 7]}"#.into(),
            ":1: 3 output tokens; --end-rule main needs at least 8",
        ),
        ("empty-file", "\n\n".into(), "no trajectories"),
        ("array", "[1, 2]".into(), ":1: expected an object"),
    ];
    for (name, text, needle) in cases {
        let f = tmp.path().join(format!("{name}.jsonl"));
        std::fs::write(&f, text).unwrap();
        let out = hsparity()
            .args(["drafter", &format!("{PAIR}/target"), "--drafter"])
            .arg(format!("{PAIR}/drafter"))
            .arg("--trajectories")
            .arg(&f)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{name}: {err}");
        assert!(err.contains(needle), "{name}: {err}");
        assert!(err.contains(&format!("{name}.jsonl")), "{name}: {err}");
    }
    // Prompts given as options must be the trajectories' prompts.
    let f = tmp.path().join("mismatch.jsonl");
    std::fs::write(&f, good).unwrap();
    for args in [
        vec!["--prompt-ids", "3,4,6"],
        vec!["--prompt-ids", "3,4,5", "--prompt-ids", "3"],
    ] {
        let out = hsparity()
            .args(["drafter", &format!("{PAIR}/target"), "--drafter"])
            .arg(format!("{PAIR}/drafter"))
            .args(&args)
            .arg("--trajectories")
            .arg(&f)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let out = hsparity()
        .args(["drafter", &format!("{PAIR}/target"), "--drafter"])
        .arg(format!("{PAIR}/drafter"))
        .args(["--prompt-ids", "3,4,5", "--trajectories"])
        .arg(&f)
        .args(["--json", "-q"])
        .output()
        .unwrap();
    assert_ne!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Triage on supplied trajectories: the baseline's own continuation given
/// back gives the generated run's baseline τ and the tap suspects' τ (they
/// read the baseline's forward on the same tokens), one sweep per group, and
/// every model suspect's departures from the given tokens.
#[test]
fn triage_on_the_baselines_own_trajectory_matches_the_generated_run() {
    let tmp = tempfile::tempdir().unwrap();
    let pf = tmp.path().join("p.jsonl");
    let lines = every_third_prompt(PAIR);
    std::fs::write(&pf, &lines).unwrap();
    let n_prompts = lines.lines().count();
    let settings = common::triage_settings(&format!("{PAIR}/drafter"), 32, EndRule::GithubMain);
    let opts = TriageOptions {
        target: common::target(&format!("{PAIR}/target"), pf.to_str()),
        settings,
        command_line: String::new(),
    };
    let gen = triage::run(&opts).unwrap();
    // The baseline's continuation, 32 + 7 tokens.
    let mut o = options(
        &format!("{PAIR}/target"),
        &format!("{PAIR}/drafter"),
        pf.to_str().unwrap(),
        39,
    );
    o.paths = vec![LoadingPath::CausalLm];
    let base = drafter::run(&o).unwrap();
    let f = write_trajectories(
        tmp.path(),
        "t.jsonl",
        &session_prompts(&o),
        &base.paths[0],
        39,
    );
    let mut t = opts.clone();
    t.settings.trajectories = Some(GivenFile {
        file: f,
        max_new: Some(32),
    });
    let given = triage::run(&t).unwrap();
    assert_eq!(given.baseline.tau_macro, gen.baseline.tau_macro);
    assert_eq!(given.baseline.sweeps, 1);
    let tr = given.trajectories.as_ref().unwrap();
    assert!(tr.paths[0].first_failure.is_none(), "{:?}", tr.paths[0]);
    for v in &given.variants {
        let g = gen.variants.iter().find(|x| x.name == v.name).unwrap();
        if v.name.starts_with("tap-offset") {
            assert_eq!(v.tau_macro, g.tau_macro, "{}", v.name);
            assert!(v.departures.is_none());
        } else {
            let d = v
                .departures
                .as_ref()
                .unwrap_or_else(|| panic!("{}", v.name));
            assert_eq!(d.checked, 39 * n_prompts, "{}", v.name);
            assert!(v.sweeps <= 1, "{}: {} sweeps", v.name, v.sweeps);
        }
    }
    // The harness and engine faults that act on a sequence run in the same
    // sweep over the given tokens: their τ is replayed on those tokens (the
    // pads before them are not output), and the fault moves the taps.
    for name in ["gdn-state-reset@mid", "left-pad-unmasked:8", "kv-fp8"] {
        let v = given.variants.iter().find(|v| v.name == name).unwrap();
        assert!(v.departs_from_greedy_at.is_none(), "{name}");
        assert!(
            v.shared_sweeps_with.iter().any(|n| n == "baseline"),
            "{name}"
        );
        for (p, b) in v.per_prompt.iter().zip(&given.baseline.per_prompt) {
            assert_eq!(p.tokens, b.tokens, "{name}");
        }
        assert!(v.cos_min_at_taps < 1.0, "{name}");
        // fp8 K/V stay within bf16's tolerance here; the state faults do not.
        if name != "kv-fp8" {
            assert!(v.first_divergent.is_some(), "{name}: {v:?}");
        }
    }
    // The suspects that need their own decode loop or prompts are listed,
    // with the reason, instead of measured on tokens they did not produce.
    assert!(gen.variants.iter().any(|v| v.name == "harness-gdn-crop"));
    for name in ["harness-gdn-crop", "thinking-flipped"] {
        assert!(given.variants.iter().all(|v| v.name != name), "{name}");
        let na = given.not_applicable.iter().find(|n| n.name == name);
        let reason = &na.unwrap_or_else(|| panic!("{name}")).reason;
        assert!(
            reason.starts_with("with --trajectories"),
            "{name}: {reason}"
        );
    }
    let lm = given
        .variants
        .iter()
        .find(|v| v.name.contains("lm_head"))
        .unwrap();
    assert!(
        lm.departures.as_ref().unwrap().first_failure.is_some(),
        "a random lm_head does not decode the baseline's tokens"
    );
    // It differs from the baseline in its head alone: on the given tokens
    // it rides the baseline's sweep (its hidden states are the baseline's)
    // and only its logits and drafts go through its own head.
    assert!(
        lm.shared_sweeps_with.iter().any(|n| n == "baseline"),
        "{:?}",
        lm.shared_sweeps_with
    );
    assert!(lm.cos_min_at_taps > 1.0 - 1e-12, "{}", lm.cos_min_at_taps);
    assert!(lm.first_divergent.is_none());
    assert!(lm.tau_macro < given.baseline.tau_macro);
}
