//! Hidden states from other engines, end to end through the binary:
//! `hsparity import` writes a (partial) dump whose mapped indices equal
//! transformers' own states (the goldens of `fixtures/tiny-qwen3_5`);
//! `diff --align` names the offset of a vLLM capture read with the wrong
//! layer ids; `drafter --features` on the toy pair's SpecForge training
//! records reproduces the τ the generator computed with the `dflash` 0.1.0
//! drafter on the same records, which equals the `causal-lm` path's golden τ;
//! bad input exits 2 with one line naming the file and the key. Every count
//! comes from `fixtures/engine-captures/manifest.json`.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::captures::{
    assert_bf16_of, caps, file, files, i64s, manifest, n_tiny, num, stored_indices, tolerance_of,
    usizes, UNPADDED,
};
use common::{hsparity, repo_root, same_len};
use hsparity::dump::Dump;
use hsparity::import::StateIndex;
use serde_json::Value;

const GOLDEN: &str = "fixtures/tiny-qwen3_5/golden/causal-lm.safetensors";
const TOY_TARGET: &str = "fixtures/toy-pair/target";
const TOY_DRAFTER: &str = "fixtures/toy-pair/drafter";

/// Runs the binary; returns exit code, stdout, stderr.
fn run(args: &[&str]) -> (i32, String, String) {
    let o = hsparity().args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn json(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

fn list(v: &[usize]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// `hsparity import` of `rel` with `args` into `out`; returns the report.
fn import(rel: &str, args: &[String], out: &Path) -> Value {
    let path = caps(rel);
    let mut a = vec![
        "import".to_string(),
        path.to_str().unwrap().into(),
        "--out".into(),
        out.to_str().unwrap().into(),
        "--force".into(),
        "--json".into(),
    ];
    a.extend(args.iter().cloned());
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let (code, stdout, err) = run(&a);
    assert_eq!(code, 0, "import {rel}: {err}");
    json(&stdout)
}

/// The golden state `i` of prompt k.
fn golden_state(g: &Dump, k: usize, i: StateIndex) -> &candle_core::Tensor {
    match i {
        StateIndex::Hidden(j) => &g.prompts[k].hidden_states[&j],
        StateIndex::LastLayerOutput => g.prompts[k].last_layer_output.as_ref().unwrap(),
    }
}

/// The state `i` of prompt k of a written dump.
fn dump_state(d: &Dump, k: usize, i: StateIndex) -> &candle_core::Tensor {
    match i {
        StateIndex::Hidden(j) => d.prompts[k]
            .hidden_states
            .get(&j)
            .unwrap_or_else(|| panic!("p{k} has no hidden_states.{j}")),
        StateIndex::LastLayerOutput => d.prompts[k].last_layer_output.as_ref().unwrap(),
    }
}

#[test]
fn every_engine_file_imports_to_a_dump_whose_mapped_indices_equal_transformers() {
    let m = manifest();
    let g = Dump::read(&repo_root().join(GOLDEN)).unwrap();
    let n = n_tiny(&m).to_string();
    let taps = list(&usizes(&m["specforge"]["target_layer_ids"]));
    let aux = list(&usizes(&m["specforge"]["eagle3_aux_hidden_states_layers"]));
    let ids = list(&usizes(&m["vllm"]["eagle_aux_hidden_state_layer_ids"]));
    let sent = file(&m, "sglang-json/response.json");
    let sent_ids = i64s(&sent["input_ids"])[..num(&sent["prompt_tokens"])]
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let cases: Vec<(&str, &str, Vec<String>)> = vec![
        (
            "specforge-dflash",
            "specforge-dflash/",
            s(&["--target-layer-ids", &taps, "--num-layers", &n]),
        ),
        (
            "specforge-dflash-compressed",
            "specforge-dflash-compressed/",
            s(&[
                "--format",
                "specforge",
                "--target-layer-ids",
                &taps,
                "--num-layers",
                &n,
            ]),
        ),
        (
            "specforge-eagle3",
            "specforge-eagle3/",
            s(&["--target-layer-ids", &aux, "--num-layers", &n]),
        ),
        (
            "vllm",
            "vllm/",
            s(&["--layer-ids", &ids, "--num-layers", &n]),
        ),
        (
            "vllm-legacy-layout",
            "vllm-legacy-layout/",
            s(&["--layer-ids", &ids, "--num-layers", &n]),
        ),
        ("sglang-dump", "sglang-dump/", s(&["--num-layers", &n])),
        (
            "sglang-json/response.json",
            "sglang-json/",
            s(&["--num-layers", &n, "--prompt-ids", &sent_ids]),
        ),
    ];
    let tmp = tempfile::tempdir().unwrap();
    for (rel, part, args) in cases {
        let out = tmp.path().join("out.safetensors");
        let rep = import(rel, &args, &out);
        let d = Dump::read(&out).unwrap();
        let entries: Vec<&Value> = files(&m, part)
            .into_iter()
            .filter(|f| f.get("stored_layers").is_some())
            .collect();
        let want: BTreeSet<StateIndex> = entries.iter().flat_map(|f| stored_indices(f)).collect();
        // the mapping, stated in the report and in the dump's metadata
        let got: BTreeSet<StateIndex> = rep["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| common::captures::index(&l["index"]))
            .collect();
        assert_eq!(got, want, "{rel}: report");
        let meta_map: Value = serde_json::from_str(&d.metadata["layer_mapping"]).unwrap();
        assert_eq!(
            meta_map, rep["layers"],
            "{rel}: metadata states the mapping"
        );
        assert_eq!(d.metadata["source_format"], rep["format"].as_str().unwrap());
        assert_eq!(d.metadata["dtype"], "bf16", "{rel}");
        let hidden: Vec<usize> = want
            .iter()
            .filter_map(|i| match i {
                StateIndex::Hidden(j) => Some(*j),
                StateIndex::LastLayerOutput => None,
            })
            .collect();
        assert_eq!(
            d.indices(),
            hidden,
            "{rel}: a partial dump of those indices"
        );
        // the values: transformers' own, within the file's tolerance
        for (k, p) in d.prompts.iter().enumerate() {
            let gold_ids = g.prompts[k].input_ids.as_ref().unwrap();
            let ids = p.input_ids.as_ref().unwrap();
            let t = gold_ids.len().min(ids.len());
            assert_eq!(ids[..t], gold_ids[..t], "{rel} p{k}");
            // the prompt's own rows (an SGLang sequence carries decode rows past them)
            let tol = entries
                .iter()
                .find(|f| f.get("prompt").map_or(0, num) == k)
                .map(|f| tolerance_of(f))
                .unwrap_or(UNPADDED);
            for &i in &want {
                let x = dump_state(&d, k, i).narrow(0, 0, t).unwrap();
                assert_bf16_of(&x, golden_state(&g, k, i), &tol, &format!("{rel} p{k} {i}"));
            }
        }
    }
}

/// The golden's prompt 0 alone, as a dump (the misindexed capture holds that prompt only).
fn golden_p0(dir: &Path) -> PathBuf {
    let mut g = Dump::read(&repo_root().join(GOLDEN)).unwrap();
    g.prompts.truncate(1);
    let p = dir.join("golden-p0.safetensors");
    g.write(&p, true).unwrap();
    p
}

#[test]
fn a_vllm_capture_read_with_the_wrong_layer_ids_is_caught_by_diff_align() {
    let m = manifest();
    let n = n_tiny(&m).to_string();
    let declared = usizes(&m["vllm"]["misindexed_declared"]);
    let captured = usizes(&m["vllm"]["misindexed_captured"]);
    let shift = captured[0] as i64 - declared[0] as i64;
    let tmp = tempfile::tempdir().unwrap();
    let reference = golden_p0(tmp.path());
    let wrong = tmp.path().join("wrong.safetensors");
    let args = |ids: &[usize]| {
        vec![
            "--layer-ids".to_string(),
            list(ids),
            "--num-layers".into(),
            n.clone(),
        ]
    };
    import("vllm-misindexed", &args(&declared), &wrong);
    let (code, out, err) = run(&[
        "diff",
        reference.to_str().unwrap(),
        wrong.to_str().unwrap(),
        "--align",
        "--json",
        "--no-report",
    ]);
    assert_eq!(code, 1, "{err}");
    let v = json(&out);
    let a = &v["alignment"];
    assert_eq!(a["offset"], shift, "{a}");
    same_len("rows", a["rows"].as_array().unwrap(), &declared);
    for (r, c) in a["rows"].as_array().unwrap().iter().zip(&captured) {
        assert_eq!(r["best"].as_u64().unwrap() as usize, *c);
    }
    let d = a["diagnosis"].as_str().unwrap();
    assert!(
        d.starts_with(&format!(
            "offset {shift:+} on all {} indices",
            declared.len()
        )),
        "{d}"
    );
    assert!(v["summary"].as_str().unwrap().contains(d));
    assert!(
        v["notes"]
            .to_string()
            .contains("re-import it with every --layer-ids value shifted by +1"),
        "{}",
        v["notes"]
    );
    // re-imported with the ids the run really captured, it aligns at 0 and passes
    let right = tmp.path().join("right.safetensors");
    import("vllm-misindexed", &args(&captured), &right);
    let (code, out, err) = run(&[
        "diff",
        reference.to_str().unwrap(),
        right.to_str().unwrap(),
        "--align",
        "--json",
        "--no-report",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["alignment"]["offset"], 0);
}

#[test]
fn drafter_features_on_the_toy_training_records_reproduce_the_causal_lm_tau() {
    let m = manifest();
    let toy = files(&m, "toy-pair-specforge");
    assert_eq!(m["toy_pair"]["records_equal_golden_causal_lm_rounds"], true);
    let max_new = num(&m["toy_pair"]["replay_max_new_tokens"]).to_string();
    let check = |features: &str| {
        let (code, out, err) = run(&[
            "drafter",
            TOY_TARGET,
            "--drafter",
            TOY_DRAFTER,
            "--features",
            features,
            "--max-new-tokens",
            &max_new,
            "--json",
            "--quiet",
        ]);
        assert_eq!(code, 0, "{err}");
        let v = json(&out);
        let f = &v["features"];
        let per = f["tau"]["per_prompt"].as_array().unwrap();
        same_len("records", per, &toy);
        for (p, e) in per.iter().zip(&toy) {
            assert_eq!(
                usizes(&p["acceptance_lengths"]),
                usizes(&e["acceptance_lengths_on_record"]),
                "{}: the dflash drafter's rounds on the record",
                e["path"]
            );
            assert_eq!(
                usizes(&p["acceptance_lengths"]),
                usizes(&e["golden_causal_lm_acceptance_lengths"]),
                "{}: the causal-lm path's golden rounds",
                e["path"]
            );
        }
        let tau = f["tau"]["tau_macro"].as_f64().unwrap();
        let want = m["toy_pair"]["tau_on_record_macro"].as_f64().unwrap();
        assert!((tau - want).abs() < 1e-12, "{tau} vs {want}");
        // each loading path's own taps over the same tokens: the same τ here
        assert_eq!(v["paths"][0]["name"], "causal-lm");
        assert_eq!(v["paths"][0]["tau_macro"], f["tau"]["tau_macro"]);
        assert_eq!(v["tau_gap"], 0.0);
        // The gap's interval, with the file as the reference: per-prompt τ
        // equal on every prompt, so the interval is [0, 0].
        let g = &v["tau_gap_interval"];
        assert_eq!(g["reference"], f["tau"]["name"]);
        assert_eq!(
            (&g["interval"]["low"], &g["interval"]["high"]),
            (&0.0.into(), &0.0.into())
        );
        for (p, e) in f["prompts"].as_array().unwrap().iter().zip(&toy) {
            assert_eq!(num(&p["prompt_tokens"]), num(&e["prompt_tokens"]));
            assert_eq!(num(&p["tokens"]), num(&e["tokens"]));
        }
        v
    };
    let v = check(caps("toy-pair-specforge").to_str().unwrap());
    assert_eq!(v["features"]["format"], "specforge");
    assert_eq!(v["kind"], "drafter");
    // the same records imported first: a dump gives the same replay
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("toy.safetensors");
    import(
        "toy-pair-specforge",
        &["--drafter".to_string(), TOY_DRAFTER.into()],
        &out,
    );
    let w = check(out.to_str().unwrap());
    assert_eq!(w["features"]["format"], "dump");
    assert_eq!(
        w["features"]["tau"]["per_prompt"],
        v["features"]["tau"]["per_prompt"]
    );
}

/// The one `error:` line of a refused run.
fn refused(args: &[&str]) -> String {
    let (code, out, err) = run(args);
    assert_eq!(code, 2, "{args:?}: {out} {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: {err}");
    lines[0].to_string()
}

#[test]
fn bad_engine_input_exits_2_with_one_line_naming_the_file_and_the_key() {
    let m = manifest();
    let taps = list(&usizes(&m["specforge"]["target_layer_ids"]));
    for (name, key) in [
        ("specforge-missing-hidden-states.ckpt", "`hidden_states`"),
        ("specforge-bool-hidden-states.ckpt", "`hidden_states`"),
        ("specforge-int32-hidden-states.ckpt", "`hidden_states`"),
        ("specforge-indivisible.ckpt", "`hidden_states`"),
        ("specforge-rows-mismatch.ckpt", "`hidden_states`"),
    ] {
        let p = caps(&format!("bad/{name}"));
        let e = refused(&["import", p.to_str().unwrap(), "--target-layer-ids", &taps]);
        assert!(
            e.starts_with("error: ") && e.contains(name) && e.contains(key),
            "{e}"
        );
    }
    // an unknown format is a usage error listing the choices
    let v = caps("vllm");
    let e = refused(&["import", v.to_str().unwrap(), "--format", "gguf"]);
    assert!(e.contains("gguf") && e.contains("sglang-json"), "{e}");
    // a file that is no engine capture: the choices
    let e = refused(&["import", GOLDEN]);
    assert!(
        e.contains("causal-lm.safetensors") && e.contains("specforge, vllm"),
        "{e}"
    );
    // drafter --features: a dump of another target, a dump without the drafter's taps, prompts given
    let e = refused(&[
        "drafter",
        TOY_TARGET,
        "--drafter",
        TOY_DRAFTER,
        "--features",
        GOLDEN,
    ]);
    assert!(
        e.contains("causal-lm.safetensors") && e.contains("-layer target"),
        "{e}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let partial = tmp.path().join("partial.safetensors");
    let toy_out = tmp.path().join("toy.safetensors");
    import(
        "toy-pair-specforge",
        &["--drafter".into(), TOY_DRAFTER.into()],
        &toy_out,
    );
    let mut d = Dump::read(&toy_out).unwrap();
    let cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join(TOY_DRAFTER).join("config.json")).unwrap(),
    )
    .unwrap();
    let tap = usizes(&cfg["dflash_config"]["target_layer_ids"])[1];
    for p in &mut d.prompts {
        p.hidden_states.remove(&(tap + 1));
    }
    d.write(&partial, true).unwrap();
    let e = refused(&[
        "drafter",
        TOY_TARGET,
        "--drafter",
        TOY_DRAFTER,
        "--features",
        partial.to_str().unwrap(),
    ]);
    assert!(
        e.contains("partial.safetensors") && e.contains(&format!("p0.hidden_states.{}", tap + 1)),
        "{e}"
    );
    let e = refused(&[
        "drafter",
        TOY_TARGET,
        "--drafter",
        TOY_DRAFTER,
        "--features",
        toy_out.to_str().unwrap(),
        "--prompt-ids",
        "3,4",
    ]);
    assert!(
        e.contains("--features") && e.contains("--prompt-ids"),
        "{e}"
    );
    // reading flags without --features
    let e = refused(&[
        "drafter",
        TOY_TARGET,
        "--drafter",
        TOY_DRAFTER,
        "--layer-ids",
        "1",
    ]);
    assert!(e.contains("give --features"), "{e}");
}

#[test]
fn diff_accepts_a_dump_without_input_ids_with_a_warning_and_requires_equal_lengths() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = Dump::read(&repo_root().join(GOLDEN)).unwrap();
    for p in &mut d.prompts {
        p.input_ids = None;
    }
    let no_ids = tmp.path().join("no-ids.safetensors");
    d.write(&no_ids, true).unwrap();
    let (code, out, err) = run(&[
        "diff",
        GOLDEN,
        no_ids.to_str().unwrap(),
        "--json",
        "--no-report",
    ]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["inputs_verified"], false);
    assert!(
        v["notes"].to_string().contains("could not be verified"),
        "{}",
        v["notes"]
    );
    assert!(v["summary"]
        .as_str()
        .unwrap()
        .contains("inputs not verified"));
    // with a different number of tokens the states cannot be lined up: refused
    for p in &mut d.prompts {
        for t in p.hidden_states.values_mut() {
            *t = t.narrow(0, 1, t.dim(0).unwrap() - 1).unwrap();
        }
        p.last_layer_output = None;
        p.logits = None;
    }
    let shorter = tmp.path().join("shorter.safetensors");
    d.write(&shorter, true).unwrap();
    let e = refused(&["diff", GOLDEN, shorter.to_str().unwrap(), "--no-report"]);
    assert!(
        e.contains("no input_ids") && e.contains("cannot be verified"),
        "{e}"
    );
}
