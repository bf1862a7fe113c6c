//! Diagnosis: where in the tokens two runs part, and which convention a
//! failing state follows. Each case in fixtures/diagnosis/ was made by
//! tools/make_diagnosis_fixtures.py with transformers 5.23.0 itself (the
//! reference a, and a run b that parts from it in a way public reports
//! describe); facts.json says what the generator did, and `diff` must name it.

use crate::common;

use common::{hsparity, repo_root};
use serde_json::Value;

fn facts(case: &str) -> Value {
    let p = repo_root().join(format!("fixtures/diagnosis/{case}/facts.json"));
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn diff(case: &str, extra: &[&str]) -> (i32, Value) {
    let dir = repo_root().join(format!("fixtures/diagnosis/{case}"));
    let o = hsparity()
        .arg("diff")
        .arg(dir.join("a.safetensors"))
        .arg(dir.join("b.safetensors"))
        .args(extra)
        .args(["--json", "--no-report"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&o.stderr)));
    (o.status.code().unwrap(), v)
}

fn localisation(v: &Value) -> &Value {
    &v["pairs"][0]["localisation"]
}

/// `diff` of case `case`: it fails (exit 1) naming a boundary of `kind`;
/// the case's facts and the report.
fn parted(case: &str, kind: &str) -> (Value, Value) {
    let (code, v) = diff(case, &[]);
    assert_eq!(code, 1, "{case}: {v}");
    let b = &localisation(&v)["boundary"];
    assert_eq!(b["kind"], kind, "{case}: {b}");
    (facts(case), v)
}

#[test]
fn a_state_lost_at_a_prefill_chunk_is_named_with_its_chunk() {
    let (f, v) = parted("chunk-state-lost", "prefill_chunk");
    let l = localisation(&v);
    assert_eq!(l["boundary"]["chunk"], f["chunk"]);
    assert_eq!(l["boundary"]["positions"], f["departs_at"]);
    // Every failing row says where each prompt departs; rows before agree.
    for row in v["pairs"][0]["hidden_states"].as_array().unwrap() {
        if row["verdict"] == "pass" {
            continue;
        }
        for (p, at) in row["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .zip(f["departs_at"].as_array().unwrap())
        {
            assert_eq!(&p["first_departing"], at, "{row}");
            assert_eq!(
                p["agreeing"][0],
                serde_json::json!([0, at.as_u64().unwrap() - 1])
            );
        }
    }
    let summary = v["summary"].as_str().unwrap();
    assert!(
        summary.contains("departure starts at position 64"),
        "{summary}"
    );
    assert!(
        v["notes"][0]
            .as_str()
            .unwrap()
            .contains("prefill chunk boundary"),
        "{}",
        v["notes"]
    );
}

#[test]
fn a_cached_decode_departing_after_the_prompt_is_named() {
    let (f, v) = parted("decode-departs", "prompt_end");
    let l = localisation(&v);
    assert_eq!(l["boundary"]["position"], f["departs_at"][0]);
    assert!(
        l["cause"].as_str().unwrap().contains("cached decode"),
        "{l}"
    );
}

#[test]
fn state_leaking_into_the_next_request_is_named_per_prompt() {
    let (f, v) = parted("request-leak", "request_boundary");
    let l = localisation(&v);
    assert_eq!(l["boundary"]["clean"], f["clean"]);
    assert_eq!(l["boundary"]["departing"], f["departing"]);
    assert_eq!(l["prompts_agreeing"], f["clean"]);
    // Per-prompt verdicts: p0 passes at every state.
    for row in v["pairs"][0]["hidden_states"].as_array().unwrap() {
        assert_eq!(row["prompts"][0]["verdict"], "pass", "{row}");
    }
}

#[test]
fn pads_fed_without_the_mask_are_named_from_the_recorded_masks() {
    let (f, v) = parted("pads-unmasked", "pad_run");
    let b = &localisation(&v)["boundary"];
    assert_eq!(b["start"], f["start"]);
    assert_eq!(b["end"], f["end"]);
    assert_eq!(b["masked_by"], f["masked_by"]);
    // The masked run is the pad token's (the generator's pads are token 0).
    assert_eq!(b["token"], 0);
    let notes = v["notes"].to_string();
    assert!(notes.contains("has attention_mask"), "{notes}");
}

#[test]
fn a_pre_norm_last_state_is_named_and_the_option_aligns_it() {
    let f = facts("pre-norm-last");
    let (code, v) = diff("pre-norm-last", &[]);
    assert_eq!(code, 1);
    assert_eq!(
        v["convention"]["convention"], f["convention"],
        "{}",
        v["convention"]
    );
    assert_eq!(v["convention"]["index"], f["index"]);
    assert_eq!(v["convention"]["side"], "b");
    assert!(v["notes"][0]
        .as_str()
        .unwrap()
        .contains("--b-last-pre-norm"));
    let (code, v) = diff("pre-norm-last", &["--b-last-pre-norm"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["verdict"], "pass");
    assert!(v["convention"].is_null());
}

#[test]
fn identical_dumps_have_no_localisation() {
    let dir = repo_root().join("fixtures/diagnosis/chunk-state-lost");
    let a = dir.join("a.safetensors");
    let v = common::json_of(
        hsparity()
            .arg("diff")
            .arg(&a)
            .arg(&a)
            .args(["--json", "--no-report"]),
    );
    assert!(v["pairs"][0]["localisation"].is_null());
    assert_eq!(
        v["pairs"][0]["hidden_states"][1]["prompts"][1]["first_departing"],
        Value::Null
    );
}

#[test]
fn the_table_says_which_prompts_depart_where() {
    let o = hsparity()
        .arg("diff")
        .arg(repo_root().join("fixtures/diagnosis/request-leak/a.safetensors"))
        .arg(repo_root().join("fixtures/diagnosis/request-leak/b.safetensors"))
        .arg("--no-report")
        .env("COLUMNS", "200")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("departs at"), "{out}");
    assert!(out.contains("p1–2 t0; p0 agrees"), "{out}");
}

#[test]
fn recorded_inputs_of_the_wrong_length_are_refused_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let a = repo_root().join("fixtures/diagnosis/decode-departs/a.safetensors");
    for (field, bad) in [("attention_mask", 0), ("prompt_length", 1)] {
        let mut d = hsparity::dump::Dump::read(&a).unwrap();
        let rows = d.prompts[0].rows();
        if bad == 0 {
            d.prompts[0].attention_mask = Some(vec![1; rows + 1]);
        } else {
            d.prompts[0].prompt_length = Some(rows + 5);
        }
        let out = tmp.path().join(format!("{field}.safetensors"));
        d.write(&out, true).unwrap();
        let err = refused(&a, &out);
        assert!(err.contains(&format!("p0.{field}")), "{err}");
    }
}

#[test]
fn a_conversion_that_shifted_the_norms_by_one_is_named_with_its_tensors() {
    let f = facts("norm-plus-one");
    let dir = repo_root().join("fixtures/diagnosis/norm-plus-one");
    let o = hsparity()
        .arg("diff")
        .arg(dir.join("a"))
        .arg(dir.join("b"))
        .args(["--json", "--no-report"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["kind"], "weights");
    let findings = v["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(
        findings[0]["relation"],
        format!("off by {:+}", f["offset"].as_f64().unwrap())
    );
    let mut names: Vec<String> = findings[0]["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    names.sort();
    let expected: Vec<String> = f["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, expected);
    assert!(findings[0]["sentence"]
        .as_str()
        .unwrap()
        .contains("zero-centred norm"));
    for d in v["differing"].as_array().unwrap() {
        assert_eq!(d["relation"]["kind"], "offset");
        assert_eq!(d["relation"]["offset"], f["offset"]);
    }
    // A checkpoint against itself: every tensor equal.
    let v = common::json_of(
        hsparity()
            .arg("diff")
            .arg(dir.join("a"))
            .arg(dir.join("a"))
            .args(["--json", "--no-report"]),
    );
    assert_eq!(v["verdict"], "pass");
    assert_eq!(v["equal"], 81);
}

#[test]
fn a_checkpoint_against_a_dump_is_refused_in_one_line() {
    let dir = repo_root().join("fixtures/diagnosis");
    let o = hsparity()
        .arg("diff")
        .arg(dir.join("norm-plus-one/a"))
        .arg(dir.join("decode-departs/a.safetensors"))
        .arg("--no-report")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("not one of each"), "{err}");
}

#[test]
fn drafter_tensors_the_forward_never_reads_are_listed_as_dflash_lists_them() {
    let f = facts("drafter-extra");
    // A finding: the drafter evaluated is not the one trained.
    let v = toy_drafter_run(
        "drafter",
        &repo_root().join("fixtures/diagnosis/drafter-extra"),
        1,
    );
    assert_eq!(
        v["drafter"]["unexpected_tensors"], f["dflash_unexpected_keys"],
        "{}",
        v["drafter"]
    );
    assert!(
        v["notes"][0].as_str().unwrap().contains("UNEXPECTED"),
        "{}",
        v["notes"]
    );
    // The drafter as trained carries none.
    let v = toy_drafter_run("drafter", &repo_root().join("fixtures/toy-pair/drafter"), 0);
    assert_eq!(v["drafter"]["unexpected_tensors"], serde_json::json!([]));
}

#[test]
fn the_pre_norm_option_refuses_a_reference_without_last_layer_output() {
    // The reference must hold last_layer_output, or nothing would compare
    // b's last state and the run would pass without looking at it.
    let dir = repo_root().join("fixtures/diagnosis/pre-norm-last");
    let o = hsparity()
        .arg("diff")
        .arg(dir.join("b.safetensors"))
        .arg(dir.join("a.safetensors"))
        .args(["--b-last-pre-norm", "--no-report"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("holds no last_layer_output"), "{err}");
}

/// Every hidden state agrees and only `last_layer_output` does not: the
/// summary says so plainly (it read "agree bitwise … ; last_layer_output
/// fail"), and names what the tensor is.
#[test]
fn only_the_last_layer_output_departing_is_said_plainly() {
    let a = repo_root().join("fixtures/diagnosis/pre-norm-last/a.safetensors");
    let dev = candle_core::Device::Cpu;
    let mut t = candle_core::safetensors::load(&a, &dev).unwrap();
    let l = t["p0.last_layer_output"].clone();
    t.insert("p0.last_layer_output".into(), (l * -1.0).unwrap());
    let tmp = tempfile::tempdir().unwrap();
    let b = tmp.path().join("b.safetensors");
    let meta = safetensors::SafeTensors::read_metadata(&std::fs::read(&a).unwrap())
        .unwrap()
        .1
        .metadata()
        .clone();
    let data: Vec<(String, candle_core::Tensor)> = t.into_iter().collect();
    safetensors::serialize_to_file(data, meta, &b).unwrap();
    let out = hsparity()
        .arg("diff")
        .arg(&a)
        .arg(&b)
        .args(["--no-report", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let summary = v["summary"].as_str().unwrap();
    assert!(summary.contains("agree bitwise"), "{summary}");
    assert!(
        summary.contains("but last_layer_output (the pre-norm output of the last decoder layer) does not agree: FAIL"),
        "{summary}"
    );
}

/// `fixtures/diagnosis/visual-unprefixed`: a vision tower saved as
/// `visual.*`. transformers adds the base-model prefix key by key, so each
/// loading path's MISSING and UNEXPECTED keys are transformers' own (the
/// image-text-to-text path read 21 MISSING and 21 UNEXPECTED: the prefix was
/// added for a whole checkpoint or not at all).
#[test]
fn the_base_model_prefix_is_added_key_by_key_as_transformers_does() {
    let dir = "fixtures/diagnosis/visual-unprefixed";
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join(dir).join("golden/load_report.json")).unwrap(),
    )
    .unwrap();
    let inv = common::json_of(hsparity().args(["inventory", dir, "--json"]));
    let names = |v: &Value| -> Vec<String> {
        let mut n: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect();
        n.sort();
        n
    };
    for want in report["paths"].as_array().unwrap() {
        let name = want["name"].as_str().unwrap();
        let got = inv["paths"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap();
        assert_eq!(got["class"], want["class"], "{name}");
        assert_eq!(
            names(&got["missing_names"]),
            names(&want["missing_keys"]),
            "{name}"
        );
        assert_eq!(
            names(&got["unexpected_names"]),
            names(&want["unexpected_keys"]),
            "{name}"
        );
    }
    let itt = &report["paths"][2];
    assert_eq!(itt["name"], "image-text-to-text");
    assert!(itt["missing_keys"].as_array().unwrap().is_empty());
}

/// Inputs recorded as floats are refused naming what the field holds (an
/// F32 attention mask was called "token ids").
#[test]
fn recorded_inputs_stored_as_floats_are_named_by_field() {
    let tmp = tempfile::tempdir().unwrap();
    let a = repo_root().join("fixtures/diagnosis/decode-departs/a.safetensors");
    let dev = candle_core::Device::Cpu;
    let t = candle_core::safetensors::load(&a, &dev).unwrap();
    for (field, says) in [
        (
            "attention_mask",
            "an attention mask (1 attended, 0 masked) must be integers",
        ),
        (
            "prompt_length",
            "a prompt length (a token count) must be integers",
        ),
    ] {
        let mut t = t.clone();
        let rows = t["p0.input_ids"].dim(0).unwrap();
        let v = match field {
            "attention_mask" => candle_core::Tensor::ones(rows, candle_core::DType::F32, &dev),
            _ => candle_core::Tensor::new(&[16f32], &dev),
        };
        t.insert(format!("p0.{field}"), v.unwrap());
        let out = tmp.path().join(format!("{field}.safetensors"));
        candle_core::safetensors::save(&t, &out).unwrap();
        let err = refused(&a, &out);
        assert!(
            err.contains(&format!("p0.{field}")) && err.contains(says),
            "{err}"
        );
    }
}

/// Two checkpoints of different models: the summary says so first, with
/// the config facts that differ, and no tensor reads as "scaled ×0" (a
/// tensor zero on one side has no scale). The norm-plus-one pair, one model
/// converted, names no architecture.
#[test]
fn checkpoints_of_two_models_are_named_as_such() {
    let v = common::json_exit(
        hsparity().args([
            "diff",
            "fixtures/tiny-qwen3_5",
            "fixtures/toy-pair/target",
            "--no-report",
            "--json",
        ]),
        1,
    );
    let summary = v["summary"].as_str().unwrap();
    assert!(
        summary.contains("are different architectures (num_hidden_layers 6 vs 4"),
        "{summary}"
    );
    assert!(
        !summary.contains("scaled ×-0") && !summary.contains("scaled ×0 "),
        "{summary}"
    );
    let same = common::json_exit(
        hsparity().args([
            "diff",
            "fixtures/diagnosis/norm-plus-one/a",
            "fixtures/diagnosis/norm-plus-one/b",
            "--no-report",
            "--json",
        ]),
        1,
    );
    assert!(!same["summary"].as_str().unwrap().contains("architectures"));
}

/// `normed-stream`: b holds each layer's input-norm output where a holds the
/// residual stream (transformers' own `input_layernorm` on a's states).
/// `diff` names the convention at every index the generator normed, from
/// the two dumps alone, and says what to capture instead; no other case of
/// the corpus is read as normed.
#[test]
fn a_capture_of_the_normed_stream_is_named() {
    let f = facts("normed-stream");
    let (code, v) = diff("normed-stream", &[]);
    assert_eq!(code, 1);
    let c = &v["convention"];
    assert_eq!(c["convention"], "normed_stream", "{v}");
    assert_eq!(c["side"], "b");
    let n = f["indices"].as_array().unwrap().len();
    let summary = v["summary"].as_str().unwrap();
    assert!(
        summary.contains(&format!(
            "b's hs 0–{} are the RMS-normed residual stream",
            n - 1
        )),
        "{summary}"
    );
    assert!(v["notes"].to_string().contains("input_layernorm.output.1"));
    for other in [
        "chunk-state-lost",
        "decode-departs",
        "request-leak",
        "pads-unmasked",
    ] {
        let (_, v) = diff(other, &[]);
        assert!(!v.to_string().contains("normed_stream"), "{other}");
    }
}

/// A drafter config with `norm_before_fc: true` (an input norm on the taps
/// before `fc`, as SGLang's and speculators' EAGLE-3 drafters read it): the
/// DFlash forward has no such norm, so the run fails naming the flag, with
/// or without the norm's tensor in the file.
#[test]
fn a_config_flag_the_forward_ignores_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    for (case, src) in [
        ("flag-only", "fixtures/toy-pair/drafter"),
        ("flag-and-tensors", "fixtures/diagnosis/drafter-extra"),
    ] {
        let d = tmp.path().join(case);
        std::fs::create_dir(&d).unwrap();
        let src = repo_root().join(src);
        std::fs::copy(src.join("model.safetensors"), d.join("model.safetensors")).unwrap();
        let mut cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap())
                .unwrap();
        cfg["norm_before_fc"] = serde_json::json!(true);
        std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
        let v = toy_drafter_run("drafter", &d, 1);
        assert_eq!(
            v["drafter"]["ignored_flags"],
            serde_json::json!(["norm_before_fc: true"])
        );
        let summary = v["summary"].as_str().unwrap();
        assert!(
            summary.contains("norm_before_fc: true"),
            "{case}: {summary}"
        );
        if case == "flag-only" {
            // Triage ranks on this drafter: its summary says τ is another forward's.
            let ts = toy_drafter_run("triage", &d, 0)["summary"]
                .as_str()
                .unwrap()
                .to_string();
            assert!(
                ts.starts_with("the drafter's config sets norm_before_fc: true"),
                "{ts}"
            );
            // A truthy string is read as the engines read it.
            cfg["norm_before_fc"] = serde_json::json!("true");
            std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
            let v = toy_drafter_run("drafter", &d, 1);
            assert_eq!(
                v["drafter"]["ignored_flags"],
                serde_json::json!(["norm_before_fc: \"true\""])
            );
        }
    }
}

/// What an attack on the diagnoses found, each pinned: a zero capture is
/// not a normed stream; NaN both dumps hold bitwise is said as such, with
/// no boundary blamed; `--align` with `--tap-offset`, and dump options on
/// checkpoints, are usage errors; an offset of 2 is not called a tap
/// convention.
#[test]
fn odd_captures_get_no_false_cause() {
    let tmp = tempfile::tempdir().unwrap();
    let a = repo_root().join("fixtures/diagnosis/decode-departs/a.safetensors");
    let base = hsparity::dump::Dump::read(&a).unwrap();
    let write = |name: &str, edit: &dyn Fn(&mut hsparity::dump::Dump)| {
        let mut d = base.clone();
        edit(&mut d);
        let p = tmp.path().join(name);
        d.write(&p, true).unwrap();
        p
    };
    let run = |b: &std::path::Path, extra: &[&str]| {
        let o = hsparity()
            .arg("diff")
            .arg(&a)
            .arg(b)
            .args(extra)
            .args(["--json", "--no-report"])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
        (
            o.status.code().unwrap(),
            v,
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    // All-zero states: divergent, never "normed".
    let zero = write("zero.safetensors", &|d| {
        for p in &mut d.prompts {
            for t in p.hidden_states.values_mut() {
                *t = t.zeros_like().unwrap();
            }
        }
    });
    let (code, v, _) = run(&zero, &[]);
    assert_eq!(code, 1);
    assert!(v["convention"].is_null(), "{}", v["convention"]);
    // One NaN in both dumps, bitwise: said as such, no request boundary.
    let nan = write("nan.safetensors", &|d| {
        let t = &d.prompts[1].hidden_states[&3];
        let mut x = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        x[5] = f32::NAN;
        let t2 = candle_core::Tensor::from_vec(x, t.dims(), t.device()).unwrap();
        d.prompts[1].hidden_states.insert(3, t2);
    });
    let o = hsparity()
        .arg("diff")
        .arg(&nan)
        .arg(&nan)
        .args(["--json", "--no-report"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let summary = v["summary"].as_str().unwrap();
    assert!(
        summary.contains("agree bitwise, but both hold NaN/Inf from hidden_states[3]"),
        "{summary}"
    );
    assert!(!v.to_string().contains("request"), "{v}");
    let (_, v, _) = run(&nan, &[]);
    let summary = v["summary"].as_str().unwrap();
    assert!(summary.contains("holds 1 NaN/Inf value there"), "{summary}");
    // --align with --tap-offset: one or the other.
    let (code, _, err) = run(&nan, &["--align", "--tap-offset", "1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("pass one of them"), "{err}");
    // Dump options on checkpoints.
    let o = hsparity()
        .args([
            "diff",
            "fixtures/diagnosis/norm-plus-one/a",
            "fixtures/diagnosis/norm-plus-one/b",
        ])
        .args(["--align", "--no-report"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--align compares dumps' hidden states"));
    // States two layers late: not a tap convention.
    let late2 = write("late2.safetensors", &|d| {
        for p in &mut d.prompts {
            let shifted: std::collections::BTreeMap<usize, candle_core::Tensor> = p
                .hidden_states
                .iter()
                .filter_map(|(&i, _)| Some((i, p.hidden_states.get(&(i + 2))?.clone())))
                .collect();
            p.hidden_states = shifted;
        }
    });
    let (_, v, _) = run(&late2, &["--align"]);
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("sit +2 from their indices: more than one layer, so not a tap convention"),
        "{notes}"
    );
}

/// `verb` (`drafter` or `triage`) on the toy target with drafter `d`, 5
/// prompt ids, 8 new tokens, which must exit `code`: its JSON.
fn toy_drafter_run(verb: &str, d: &std::path::Path, code: i32) -> Value {
    let mut cmd = hsparity();
    cmd.args([verb, "fixtures/toy-pair/target", "--drafter"])
        .arg(d)
        .args([
            "--prompt-ids",
            "1,2,3,4,5",
            "--max-new-tokens",
            "8",
            "--json",
            "-q",
        ]);
    if verb == "triage" {
        cmd.arg("--no-report");
    }
    common::json_exit(&mut cmd, code)
}

/// `diff a b`, which must be refused in one line (exit 2): that line.
fn refused(a: &std::path::Path, b: &std::path::Path) -> String {
    let o = hsparity()
        .arg("diff")
        .arg(a)
        .arg(b)
        .arg("--no-report")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    err
}
