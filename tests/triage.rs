//! `hsparity triage` on the toy pair: the suspects are ranked by the τ they
//! cost, reproducibly, and the ranking is the sensible one (misread taps and
//! a random lm_head cost far more than the delta-rule form); every Δτ
//! carries its bootstrap interval, computed from the per-prompt τ the JSON
//! records; the harness and engine suspects run where they apply (the
//! `dflash_generate` crop on the same tokens as z-lab's package, fp8 K/V
//! changing nothing before the first attention layer), the others are
//! listed with the reason; thinking-flipped feeds exactly the other
//! rendering and drafter-swa-as-full exactly the drafter's full-attention
//! form.

use crate::common;

use common::same_len;
use hsparity::commands::drafter::{self as drafter_verb, DrafterOptions};
use hsparity::commands::triage::{self, TriageOptions};
use hsparity::drafter::bootstrap::Bootstrap;
use hsparity::drafter::eval::EndRule;
use hsparity::loading::LoadingPath;
use hsparity::report::TriageReport;
use hsparity::session::Target;
use hsparity::triage::{Presence, SuspectGroup, TriageSettings, VariantResult};
use serde_json::Value;

fn run() -> TriageReport {
    let tmp = tempfile::tempdir().unwrap();
    // Five of the fifteen held-out prompts, 32 new tokens: enough rounds, quick.
    let f = common::five_prompts(tmp.path());
    run_on(
        common::target("fixtures/toy-pair/target", f.to_str()),
        "fixtures/toy-pair/drafter",
        32,
    )
}

fn run_on(target: Target, drafter: &str, max_new: usize) -> TriageReport {
    triage::run(&TriageOptions {
        target,
        settings: TriageSettings {
            observed_tau: Some(1.2),
            ..common::triage_settings(drafter, max_new, EndRule::GithubMain)
        },
        command_line: String::new(),
    })
    .unwrap()
}

#[test]
fn ranking_is_sensible_and_reproducible() {
    let r = run();
    let d = |name: &str| {
        r.variants
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| {
                panic!(
                    "variant {name} missing: {:?}",
                    r.variants.iter().map(|v| &v.name).collect::<Vec<_>>()
                )
            })
            .delta_tau
            .abs()
    };
    crate::terminal_layout::assert_triage_fits(&r);
    assert!(r.baseline.tau_macro >= 3.0);
    let recurrent = d("gdn-recurrent");
    assert!(recurrent <= 0.1, "chunked vs recurrent costs {recurrent}");
    for costly in ["tap-offset-1", "tap-offset+1", "missing-lm_head"] {
        assert!(
            d(costly) > recurrent + 1.0,
            "{costly} costs only {}",
            d(costly)
        );
    }
    // Ranked by what the inputs show (present, possible, hypothetical), then
    // by |Δτ|, largest first.
    // In each, the suspects that lower τ first.
    let key = |v: &VariantResult| (v.evidence.presence, v.delta_tau >= 0.0);
    assert!(r.variants.windows(2).all(|w| {
        let (a, b) = (&w[0], &w[1]);
        key(a) < key(b) || (key(a) == key(b) && a.delta_tau.abs() >= b.delta_tau.abs())
    }));
    // The toy pair loads bitwise the same on every path and has its lm_head:
    // those suspects cannot occur here, and rank after the harness ones.
    for name in ["vlm", "missing-lm_head"] {
        assert_eq!(
            variant(&r, name).evidence.presence,
            Presence::Hypothetical,
            "{name}"
        );
    }
    assert_eq!(
        variant(&r, "tap-offset+1").evidence.presence,
        Presence::Possible
    );
    assert!(
        r.summary.contains("costliest suspects: tap-offset+1"),
        "the costliest possible suspect leads, not the hypothetical random head: {}",
        r.summary
    );
    // Tap offsets misread the features (low cosine) but need no target forward.
    let off = r
        .variants
        .iter()
        .find(|v| v.name == "tap-offset+1")
        .unwrap();
    assert!(off.cos_min_at_taps < 0.9 && off.wall_s == 0.0);
    // Where the taps part: a misread tap at every row; a state dropped in
    // the middle of each prompt only from there on; the recurrent form
    // nowhere.
    let departs = |name: &str| variant(&r, name).taps_depart.clone().unwrap_or_default();
    assert!(
        departs("tap-offset+1").contains("at every position"),
        "{}",
        departs("tap-offset+1")
    );
    let reset = departs("gdn-state-reset@mid");
    assert!(
        reset.starts_with("tap 1 (hidden_states[2]): ") && reset.contains(", first at p0 at "),
        "{reset}"
    );
    assert!(variant(&r, "gdn-recurrent").taps_depart.is_none());
    // Consistent with the observed τ: observed − baseline τ inside the Δτ interval.
    for v in &r.variants {
        let inside = v
            .delta_tau_interval
            .unwrap()
            .contains(1.2 - r.baseline.tau_macro);
        assert_eq!(v.consistent_with_observed, Some(inside), "{}", v.name);
    }
    intervals_are_the_bootstrap_of_the_per_prompt_taus(&r);
    new_suspects_run_where_they_apply(&r);
    left_pad_is_the_padded_prompt_unmasked(&r);
    // Same inputs, same numbers, intervals included.
    let again = run();
    same_len("variants", &r.variants, &again.variants);
    for (a, b) in r.variants.iter().zip(&again.variants) {
        assert_eq!(
            (
                &a.name,
                a.tau_macro,
                a.ddtree_tau_macro,
                a.delta_tau_interval
            ),
            (
                &b.name,
                b.tau_macro,
                b.ddtree_tau_macro,
                b.delta_tau_interval
            )
        );
    }
}

fn variant<'a>(r: &'a TriageReport, name: &str) -> &'a VariantResult {
    r.variants
        .iter()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("{name} did not run"))
}

/// Each interval is `Bootstrap::seeded(--seed)` of the per-prompt τ the
/// report records (the variant's and the baseline's, paired); one holding
/// 0 is what the Markdown calls "not distinguishable with 5 prompts".
fn intervals_are_the_bootstrap_of_the_per_prompt_taus(r: &TriageReport) {
    let base: Vec<f64> = r.baseline.per_prompt.iter().map(|p| p.tau).collect();
    assert_eq!(base.len(), 5);
    assert_eq!(r.uncertainty, Bootstrap::seeded(0));
    for v in &r.variants {
        let taus: Vec<f64> = v.per_prompt.iter().map(|p| p.tau).collect();
        let mean = taus.iter().sum::<f64>() / taus.len() as f64;
        assert!((mean - v.tau_macro).abs() < 1e-12, "{}", v.name);
        assert_eq!(
            v.delta_tau_interval,
            Bootstrap::seeded(0).delta(&taus, &base)
        );
        let i = v.delta_tau_interval.unwrap();
        assert_eq!(i.contains_zero, i.low <= 0.0 && i.high >= 0.0);
    }
    let md = hsparity::report::triage::markdown(r);
    assert!(md.contains("not distinguishable from the baseline's with 5 prompts"));
    assert!(md.contains("holds 0 |"), "{md}");
    for g in [
        "## Loading suspects",
        "## Numerics suspects",
        "## Harness suspects",
        "## Engine suspects",
        "## Not applicable",
        "**Next check:**",
    ] {
        assert!(md.contains(g), "{g} missing from the Markdown");
    }
}

/// The harness and engine suspects on the toy pair's raw prompts.
fn new_suspects_run_where_they_apply(r: &TriageReport) {
    for (name, group) in [
        ("harness-gdn-crop", SuspectGroup::Harness),
        ("left-pad-unmasked:8", SuspectGroup::Harness),
        ("gdn-state-reset@mid", SuspectGroup::Engine),
        ("kv-fp8", SuspectGroup::Engine),
        ("vlm", SuspectGroup::Loading),
        ("gdn-recurrent", SuspectGroup::Numerics),
        ("tap-offset-1", SuspectGroup::Harness),
    ] {
        assert_eq!(variant(r, name).group, group, "{name}");
    }
    let na: Vec<&str> = r.not_applicable.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        na,
        [
            "router-dtype",
            "normed-last-tap",
            "thinking-flipped",
            "drafter-swa-as-full"
        ]
    );
    assert!(r.not_applicable.iter().all(|n| !n.reason.is_empty()));
    // fp8 K/V move the taps a little (tests/faults.rs: nothing before the
    // first attention layer).
    let fp8 = variant(r, "kv-fp8").cos_min_at_taps;
    assert!(fp8 < 1.0 && fp8 > 0.99, "kv-fp8 cos {fp8}");
    // The dflash_generate crop, measured on its own trajectory: the same
    // tokens and rounds as z-lab's package (its golden's first 32 tokens
    // and rounds of the same prompts; the wheel's rule only differs at the
    // end), and on these prompts it never leaves greedy, as the package.
    let crop = variant(r, "harness-gdn-crop");
    assert_eq!(
        crop.divergence_on,
        hsparity::triage::DivergenceOn::OwnTrajectory
    );
    let g: Value = serde_json::from_str(
        &std::fs::read_to_string("fixtures/toy-pair/golden/reference_generate_gdn_crop.json")
            .unwrap(),
    )
    .unwrap();
    for (k, p) in crop.per_prompt.iter().enumerate() {
        let q = &g["sets"]["held_out"]["per_prompt"][3 * k];
        let out: Vec<u32> = q["output_ids"].as_array().unwrap()[..32]
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(p.tokens, out, "prompt {}", 3 * k);
        let rounds: Vec<usize> = q["acceptance_lengths"].as_array().unwrap()
            [..p.acceptance_lengths.len()]
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(p.acceptance_lengths, rounds, "prompt {}", 3 * k);
    }
    assert_eq!(crop.departs_from_greedy_at, Some(vec![None; 5]));
    // Tap suspects read the baseline's trajectory: no departure to report.
    assert!(variant(r, "tap-offset-1").departs_from_greedy_at.is_none());
}

/// left-pad-unmasked is exactly the baseline on the prompts with 8 pad
/// tokens (the toy tokenizer's eos, id 0, as `pad_token = eos_token`) before
/// them and no mask: its continuation and rounds are `drafter`'s on those
/// prompt ids, and the pads, flowing into the Gated DeltaNet state, move the
/// taps of the prompt itself.
fn left_pad_is_the_padded_prompt_unmasked(r: &TriageReport) {
    let tmp = tempfile::tempdir().unwrap();
    let f = common::five_prompts(tmp.path());
    let plain = common::target("fixtures/toy-pair/target", f.to_str());
    let session = hsparity::session::Session::open(&plain, &[LoadingPath::CausalLm]).unwrap();
    let mut padded = common::target("fixtures/toy-pair/target", None);
    padded.prompts.ids = session
        .prompt_ids()
        .iter()
        .map(|p| [vec![0; 8], p.clone()].concat())
        .collect();
    let other =
        drafter_verb::run(&drafter_options(padded, "fixtures/toy-pair/drafter", 32)).unwrap();
    let pad = variant(r, "left-pad-unmasked:8");
    same_len("prompts", &pad.per_prompt, &other.paths[0].per_prompt);
    for (a, b) in pad.per_prompt.iter().zip(&other.paths[0].per_prompt) {
        assert_eq!(a.tokens, b.tokens, "left-pad continues the padded prompt");
        assert_eq!(a.acceptance_lengths, b.acceptance_lengths);
    }
    assert_eq!(pad.tau_macro, other.paths[0].summary.tau_macro);
    assert!(pad.first_divergent.is_some() && pad.cos_min_at_taps < 0.999);
}

/// `drafter` on `target`'s causal-lm path.
fn drafter_options(target: Target, drafter: &str, max_new: usize) -> DrafterOptions {
    common::drafter_options(target, &[LoadingPath::CausalLm], drafter, max_new)
}

/// Chat-rendered prompts and a drafter whose first layer is a sliding-window
/// layer: thinking-flipped feeds exactly the prompts `--enable-thinking`
/// with the other value renders (its continuation is the target's greedy
/// one on them), and drafter-swa-as-full is exactly the drafter with that
/// layer as full attention (the toy drafter as trained: the same rounds as
/// `drafter` with it).
#[test]
fn thinking_flipped_and_swa_as_full_are_the_other_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let f = common::five_prompts(tmp.path());
    let chat = |thinking: Option<bool>| {
        let mut t = common::target("fixtures/toy-pair/target", f.to_str());
        t.prompts.chat = true;
        t.prompts.enable_thinking = thinking;
        t
    };
    let swa = tmp.path().join("swa-drafter");
    std::fs::create_dir(&swa).unwrap();
    std::fs::copy(
        "fixtures/toy-pair/drafter/model.safetensors",
        swa.join("model.safetensors"),
    )
    .unwrap();
    let mut cfg: Value = serde_json::from_str(
        &std::fs::read_to_string("fixtures/toy-pair/drafter/config.json").unwrap(),
    )
    .unwrap();
    cfg["layer_types"] = serde_json::json!(["sliding_attention", "full_attention"]);
    cfg["sliding_window"] = serde_json::json!(6);
    cfg["use_sliding_window"] = serde_json::json!(true);
    std::fs::write(swa.join("config.json"), cfg.to_string()).unwrap();
    // enable_thinking not passed: the template's default (thinking on)
    // renders the prompts, and the flipped run is the `false` rendering.
    let r = run_on(chat(None), swa.to_str().unwrap(), 24);
    assert!(!r
        .not_applicable
        .iter()
        .any(|n| n.name == "thinking-flipped" || n.name == "drafter-swa-as-full"));
    let flipped = variant(&r, "thinking-flipped");
    assert!(flipped.description.contains("enable_thinking=false"));
    // Both are present in the inputs (a flag left to the template, a drafter
    // with sliding-window layers) and lead the ranking, before every
    // suspect the inputs do not show.
    for name in ["thinking-flipped", "drafter-swa-as-full"] {
        let v = variant(&r, name);
        assert_eq!(v.evidence.presence, Presence::Present, "{name}");
        let rank = r.variants.iter().position(|x| x.name == name).unwrap();
        assert!(rank < 2, "{name} ranks {rank}");
        assert!(
            r.summary.contains("present in the inputs: ") && r.summary.contains(name),
            "{}",
            r.summary
        );
    }
    let swa_reason = &variant(&r, "drafter-swa-as-full").evidence.reason;
    assert!(
        swa_reason.contains("1 of its 2 layers sliding-window (window 6)"),
        "{swa_reason}"
    );
    assert!(
        !swa_reason.contains("costs nothing here"),
        "contexts pass the window of 6: {swa_reason}"
    );
    assert!(flipped.departs_from_greedy_at.is_none());
    let other = drafter_verb::run(&drafter_options(
        chat(Some(false)),
        "fixtures/toy-pair/drafter",
        24,
    ))
    .unwrap();
    for (a, b) in flipped.per_prompt.iter().zip(&other.paths[0].per_prompt) {
        assert_eq!(
            a.tokens, b.tokens,
            "thinking-flipped continues the other rendering"
        );
    }
    let full = variant(&r, "drafter-swa-as-full");
    assert_eq!(full.group, SuspectGroup::Engine);
    let trained = drafter_verb::run(&drafter_options(
        chat(Some(true)),
        "fixtures/toy-pair/drafter",
        24,
    ))
    .unwrap();
    for (a, b) in full.per_prompt.iter().zip(&trained.paths[0].per_prompt) {
        assert_eq!(a.acceptance_lengths, b.acceptance_lengths);
    }
    assert!(full.delta_tau != 0.0, "the window changes the drafts");
}

/// A target whose causal-lm path is clean but whose other paths miss every
/// text tensor (keys saved under `model.`, as a causal LM writes them, with
/// the VLM's config): triage ranks on causal-lm, and still names each path's
/// MISSING tensors with the cause and the fix, and exits 1 as every verb does.
#[test]
fn missing_tensors_on_paths_triage_does_not_run_fail_it_with_the_fix() {
    use crate::common::bad_inputs::edit_shard;
    let tmp = tempfile::tempdir().unwrap();
    let dir = toy_target_copy(tmp.path());
    edit_shard(&dir, "model.safetensors", |s| {
        s.header = std::mem::take(&mut s.header)
            .into_iter()
            .map(|(k, v)| (k.replace("model.language_model.", "model."), v))
            .collect();
    });
    let out = crate::common::hsparity()
        .arg("triage")
        .arg(&dir)
        .args(["--drafter", "fixtures/toy-pair/drafter"])
        .args(["--prompt", "count 347: 347 348", "--max-new-tokens", "8"])
        .args(["--quiet", "--json", "--no-report"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let summary = v["summary"].as_str().unwrap();
    assert!(summary.starts_with("FAIL: "), "{summary}");
    // The counts are the inventory's (the same rules as compare's).
    let inv = crate::common::hsparity()
        .arg("inventory")
        .arg(&dir)
        .arg("--json")
        .output()
        .unwrap();
    let inv: serde_json::Value = serde_json::from_slice(&inv.stdout).unwrap();
    let missing = |name: &str| {
        inv["paths"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .map(|p| p["missing"].as_u64().unwrap())
            .unwrap()
    };
    assert_eq!(missing("causal-lm"), 0);
    for (path, class) in [
        ("vlm", "AutoModel"),
        ("image-text-to-text", "AutoModelForImageTextToText"),
    ] {
        let n = missing(path);
        assert!(n > 0, "{path}");
        let want = format!("{path}: {n} MISSING tensors: a harness loading the target with {class} reads random weights");
        assert!(summary.contains(&want), "{want:?} not in {summary}");
    }
    assert!(
        summary.contains("Fix: re-save the weights under `model.language_model.`"),
        "{summary}"
    );
    // The MISSING tensors of vlm are in the inputs: the suspects that read
    // them (`missing-vlm`, and `vlm`, the same weights) lead the ranking with
    // the count, and the next check follows them.
    let n = missing("vlm");
    let mut leading: Vec<&str> = Vec::new();
    for top in &v["variants"].as_array().unwrap()[..2] {
        assert_eq!(top["evidence"]["presence"], "present", "{top}");
        let reason = top["evidence"]["reason"].as_str().unwrap();
        assert!(
            reason.contains(&format!("leaves {n} tensors MISSING")),
            "{reason}"
        );
        leading.push(top["name"].as_str().unwrap());
    }
    leading.sort();
    assert_eq!(leading, ["missing-vlm", "vlm"]);
    assert!(summary.contains("present in the inputs: "), "{summary}");
    assert!(summary.contains("missing-vlm (Δτ "), "{summary}");
    let next = v["next_check"].as_str().unwrap();
    assert!(
        next.contains("hsparity inventory") || next.contains("--paths causal-lm,vlm"),
        "{next}"
    );
}

/// A target whose top-level `dtype` (float16) differs from its
/// `text_config.dtype` (bfloat16): `AutoModel` computes in f16, the causal
/// LM in bf16. Both `dtype-f16` and `vlm` are present in the inputs, say
/// which path loads what and why, and rank before every other suspect.
#[test]
fn a_path_loading_another_dtype_is_a_present_finding() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = toy_target_copy(tmp.path());
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    cfg["dtype"] = serde_json::json!("float16");
    cfg["text_config"]["dtype"] = serde_json::json!("bfloat16");
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let v = toy_triage(
        &dir,
        &["count 347: 347 348 349 350", "count 12: 12 13 14"],
        0,
    );
    let variants = v["variants"].as_array().unwrap();
    let present: Vec<&str> = variants
        .iter()
        .take_while(|x| x["evidence"]["presence"] == "present")
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(present.len(), 2, "{present:?}");
    assert!(
        present.contains(&"dtype-f16") && present.contains(&"vlm"),
        "{present:?}"
    );
    let reason = |name: &str| {
        variants.iter().find(|x| x["name"] == name).unwrap()["evidence"]["reason"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let f16 = reason("dtype-f16");
    assert!(
        f16.contains("vlm (AutoModel) loads f16 (config.dtype)"),
        "{f16}"
    );
    let vlm = reason("vlm");
    assert!(
        vlm.contains("it loads f16 (config.dtype) where causal-lm loads bf16"),
        "{vlm}"
    );
    // f32 is loaded by no path: possible, not present.
    assert_eq!(
        variants.iter().find(|x| x["name"] == "dtype-f32").unwrap()["evidence"]["presence"],
        "possible"
    );
    let summary = v["summary"].as_str().unwrap();
    assert!(summary.contains("present in the inputs: "), "{summary}");
}

/// A Qwen3 dense target has no Gated DeltaNet: the suspects that act on its
/// state (`gdn-recurrent`, `harness-gdn-crop`, `gdn-state-reset`) are listed
/// as not applicable with the reason, and the random-lm_head note does not
/// quote Qwen3.5's two tie flags.
#[test]
fn a_dense_target_runs_no_delta_rule_suspect() {
    let v = crate::common::json_exit(
        crate::common::hsparity()
            .arg("triage")
            .arg("fixtures/toy-pair-qwen3/target")
            .args(["--drafter", "fixtures/toy-pair-qwen3/drafter"])
            .args(["--prompt", "count 347: 347 348", "--max-new-tokens", "8"])
            .args(["--quiet", "--json", "--no-report"]),
        0,
    );
    let ran: Vec<&str> = v["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    let skipped: Vec<&str> = v["not_applicable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    for name in ["gdn-recurrent", "harness-gdn-crop", "gdn-state-reset@mid"] {
        assert!(
            !ran.contains(&name) && skipped.contains(&name),
            "{name}: ran {ran:?}"
        );
    }
    let notes = v["notes"].to_string();
    assert!(!notes.contains("only at the top level"), "{notes}");
    // Nor does its baseline line name a delta-rule form.
    let out = crate::common::hsparity()
        .args(["triage", "fixtures/toy-pair-qwen3/target"])
        .args(["--drafter", "fixtures/toy-pair-qwen3/drafter"])
        .args(["--prompt", "count 347: 347 348", "--max-new-tokens", "8"])
        .args(["--quiet", "--no-report"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("baseline: ")).unwrap();
    assert!(!line.contains("Gated DeltaNet"), "{line}");
}

/// A checkpoint without `lm_head.weight` whose top-level tie flag is false
/// and `text_config`'s true: the causal LM ties its head, the
/// image-text-to-text class does not and leaves it MISSING. Triage runs that
/// path's MISSING suspect as present (it looked at two paths only), and
/// does not call a random head hypothetical.
#[test]
fn missing_tensors_on_any_path_are_a_present_suspect() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = toy_target_copy(tmp.path());
    let st = dir.join("model.safetensors");
    let mut t = candle_core::safetensors::load(&st, &candle_core::Device::Cpu).unwrap();
    t.remove("lm_head.weight").unwrap();
    candle_core::safetensors::save(&t, &st).unwrap();
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    cfg["tie_word_embeddings"] = serde_json::json!(false);
    cfg["text_config"]["tie_word_embeddings"] = serde_json::json!(true);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let v = toy_triage(&dir, &["count 347: 347 348", "count 12: 12 13 14"], 1);
    let variants = v["variants"].as_array().unwrap();
    let itt = variants
        .iter()
        .find(|x| x["name"] == "missing-image-text-to-text")
        .unwrap_or_else(|| panic!("not run: {}", v["variants"]));
    assert_eq!(itt["evidence"]["presence"], "present");
    let reason = itt["evidence"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("leaves 1 tensor MISSING (lm_head.weight)"),
        "{reason}"
    );
    assert!(variants.iter().all(|x| x["name"] != "missing-lm_head"));
}

/// A copy of the toy pair's target under `root` (to edit its files).
fn toy_target_copy(root: &std::path::Path) -> std::path::PathBuf {
    let dir = root.join("target");
    std::fs::create_dir(&dir).unwrap();
    let src = crate::common::bad_inputs::repo_root().join("fixtures/toy-pair/target");
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    dir
}

/// `triage` of `dir` with the toy drafter on `prompts`, 8 new tokens, which
/// must exit `code`: its JSON.
fn toy_triage(dir: &std::path::Path, prompts: &[&str], code: i32) -> Value {
    let mut cmd = crate::common::hsparity();
    cmd.arg("triage")
        .arg(dir)
        .args(["--drafter", "fixtures/toy-pair/drafter"]);
    for p in prompts {
        cmd.args(["--prompt", p]);
    }
    cmd.args(["--max-new-tokens", "8", "--quiet", "--json", "--no-report"]);
    crate::common::json_exit(&mut cmd, code)
}

/// In bf16 the baseline's taps carry their noise floor (its shadow over its
/// own tokens, one band per tap) and every suspect in the baseline's dtype
/// is read against it: the recurrent delta-rule form is numerics noise, a
/// tap offset far beyond it; a suspect in another dtype, or compared on its
/// own trajectory, is judged by the tolerance alone.
#[test]
fn taps_are_read_against_the_baselines_noise_floor() {
    let r = run();
    assert_eq!(r.baseline.dtype, hsparity::precision::Precision::Bf16);
    let floor = r
        .baseline
        .tap_noise_floor
        .as_ref()
        .expect("a bf16 baseline measures it");
    let want: Vec<usize> = r.baseline.taps.iter().map(|l| l + 1).collect();
    assert_eq!(floor.rows.iter().map(|x| x.index).collect::<Vec<_>>(), want);
    assert!(floor.rows.iter().all(|x| x.rel_l2 > 0.0), "{floor:?}");
    let v = |name: &str| r.variants.iter().find(|v| v.name == name).unwrap();
    let recurrent = v("gdn-recurrent");
    let ratio = recurrent.tap_noise_ratio.flatten().unwrap();
    assert!(
        ratio <= 1.0 && recurrent.first_divergent.is_none(),
        "{ratio}"
    );
    assert!(recurrent.cos_min_at_taps < 1.0, "the form changes the bits");
    let offset = v("tap-offset+1").tap_noise_ratio.unwrap();
    assert!(offset.is_none_or(|x| x > 10.0), "{offset:?}");
    assert!(v("dtype-f16").tap_noise_ratio.is_none());
    // Compared on its own trajectory: the band (measured on the baseline's
    // tokens) does not apply.
    assert!(v("harness-gdn-crop").tap_noise_ratio.is_none());
}

/// triage on a prompt long enough for resume points (the toy pair's target
/// with positions up to 1024, 700 tokens: every lane's teacher-forced sweep
/// but the noise shadow's starts at its loop's prefill,
/// `drafter::target::Resume`) gives the report of the run with
/// `HSPARITY_NO_RESUME` (every sweep from token 0), field for field, wall
/// times aside; the split prefills show as one more sweep.
#[test]
fn resume_points_leave_the_triage_report_as_it_is() {
    let ids: Vec<String> = common::toy_pair_text(700, 0)
        .iter()
        .map(u32::to_string)
        .collect();
    // The toy's positions stop at 512: a copy that takes 1024.
    let tmp = tempfile::tempdir().unwrap();
    let dir = toy_target_copy(tmp.path());
    let cfg_path = dir.join("config.json");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["text_config"]["max_position_embeddings"] = 1024.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let run = |off: bool| -> Value {
        let mut c = common::hsparity();
        c.arg("triage")
            .arg(&dir)
            .args(["--drafter", "fixtures/toy-pair/drafter"])
            .args(["--prompt-ids", &ids.join(","), "--max-new-tokens", "8"])
            .args(["--json", "-q", "--no-report"]);
        if off {
            c.env("HSPARITY_NO_RESUME", "1");
        }
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(matches!(out.status.code(), Some(0 | 1)), "{err}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let (on, off) = (run(false), run(true));
    fn strip(v: &Value, sweeps: &mut Vec<u64>) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| {
                        !["wall_s", "wall_time_s", "environment", "command"].contains(&k.as_str())
                    })
                    .filter_map(|(k, x)| match (k.as_str(), x.as_u64()) {
                        ("sweeps", Some(n)) => {
                            sweeps.push(n);
                            None
                        }
                        _ => Some((k.clone(), strip(x, sweeps))),
                    })
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(|x| strip(x, sweeps)).collect()),
            _ => v.clone(),
        }
    }
    let (mut s_on, mut s_off) = (Vec::new(), Vec::new());
    assert_eq!(strip(&on, &mut s_on), strip(&off, &mut s_off));
    // Every run that generated split its prefill; the tap variants ran none.
    assert_eq!(s_on.len(), s_off.len());
    assert!(s_on.iter().any(|&n| n > 0), "{s_on:?}");
    for (a, b) in s_on.iter().zip(&s_off) {
        assert_eq!(
            *a,
            if *b > 0 { b + 1 } else { 0 },
            "{s_on:?} against {s_off:?}"
        );
    }
}
