//! The bad-input corpus, run through the binary: every case is generated at
//! test time into a temporary directory by `tests/common/bad_inputs.rs` and
//! run as `hsparity compare <case> --report-dir <tmp>/reports --name r`.
//!
//! Bad input must exit 2 with exactly one stderr line `error: …` naming the
//! file (or field, or flag) and the problem, never panic, print nothing on
//! stdout and write no report. NaN/Inf weights are a finding (exit 1).

use crate::common;

use common::hsparity;

use crate::common::bad_inputs as corpus;

use std::path::Path;
use std::time::Duration;

use corpus::{Case, Expect};

fn run(name: &str, generate: fn(&Path) -> Case) {
    let tmp = tempfile::tempdir().unwrap();
    let case = generate(tmp.path());
    let mut cmd = hsparity();
    cmd.arg("compare").arg(&case.checkpoint).arg("--quiet");
    match case.expect {
        Expect::BadInput => {
            cmd.arg("--report-dir")
                .arg(&case.report_dir)
                .arg("--name")
                .arg("r");
        }
        Expect::Finding => {
            cmd.args(["--no-report", "--json"]);
        }
    }
    cmd.args(&case.args);
    for (k, v) in &case.env {
        cmd.env(k, v);
    }
    // A hang is a failure: the run is killed (no exit code) after two minutes.
    let out = cmd.timeout(Duration::from_secs(120)).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "[{name}] exit {:?}: {}",
        out.status.code(),
        stderr.trim_end()
    );
    assert!(!stderr.contains("panicked"), "{name}: panicked: {stderr}");
    match case.expect {
        Expect::BadInput => {
            assert_eq!(
                out.status.code(),
                Some(2),
                "{name}: expected exit 2\nstderr: {stderr}\nstdout: {stdout}"
            );
            let lines: Vec<&str> = stderr.lines().collect();
            assert_eq!(
                lines.len(),
                1,
                "{name}: stderr must be one line: {stderr:?}"
            );
            assert!(lines[0].starts_with("error: "), "{name}: {stderr:?}");
            for n in &case.needles {
                assert!(
                    lines[0].contains(n.as_str()),
                    "{name}: expected {n:?} in {stderr:?}"
                );
            }
            assert!(stdout.is_empty(), "{name}: nothing on stdout: {stdout:?}");
            let report = case.report_dir.join("r");
            if case.unchanged.is_empty() {
                // A failed run leaves no report folder behind.
                assert!(!report.exists(), "{name}: {report:?} was created");
            } else {
                assert!(
                    !report.join("report.json").exists(),
                    "{name}: report.json was written"
                );
            }
            for (p, before) in &case.unchanged {
                assert_eq!(&std::fs::read(p).unwrap(), before, "{name}: {p:?} changed");
            }
        }
        Expect::Finding => {
            assert_eq!(
                out.status.code(),
                Some(1),
                "{name}: expected exit 1: {stderr}"
            );
            let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            let summary = v["summary"].as_str().unwrap_or_default();
            for n in &case.needles {
                assert!(
                    summary.contains(n.as_str()),
                    "{name}: expected {n:?} in {summary:?}"
                );
            }
        }
    }
}

macro_rules! corpus {
    ($( $(#[$m:meta])* $case:ident ),* $(,)?) => {
        /// Every case of the corpus, by name.
        const CASES: &[(&str, fn(&Path) -> Case)] = &[$((stringify!($case), corpus::$case)),*];
        $(
            $(#[$m])*
            #[test]
            fn $case() {
                run(stringify!($case), corpus::$case);
            }
        )*
    };
}

corpus! {
    // safetensors headers
    truncated_header,
    header_length_past_eof,
    header_invalid_json,
    offsets_out_of_range,
    overlapping_offsets,
    partially_overlapping_offsets,
    unknown_dtype,
    element_count_overflow,
    // shard index
    index_names_missing_shard,
    index_shard_outside_dir,
    index_tensor_absent_from_shard,
    // config.json
    config_missing,
    config_invalid_json,
    config_not_an_object,
    unknown_model_type,
    text_config_is_array,
    layer_types_length_mismatch,
    num_hidden_layers_zero,
    full_attention_interval_zero,
    rms_norm_eps_zero,
    wrong_typed_field,
    rope_theta_wrong_type,
    rope_type_unsupported,
    hidden_act_unsupported,
    tie_word_embeddings_not_bool,
    // weights vs config
    shape_mismatch_vs_config,
    integer_dtype_for_float_weight,
    // prompts
    empty_prompt_in_file,
    empty_prompt_ids_flag,
    prompt_too_long,
    token_id_out_of_range,
    prompts_not_utf8,
    prompts_line_not_object,
    prompts_line_not_json,
    // report directory
    report_dir_is_a_file,
    existing_report_without_force,
    // Hub cache
    hub_id_not_cached,
    hub_ref_not_a_commit,
    hub_revision_escapes,
    // a finding, not bad input: exit 1
    nan_weights,
}

#[test]
fn corpus_is_large_and_generated_fresh() {
    assert!(CASES.len() >= 25, "{} cases", CASES.len());
    // Generators are deterministic and independent: each builds its own tree.
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    for (name, generate) in CASES {
        let (ra, rb) = (a.path().join(name), b.path().join(name));
        std::fs::create_dir_all(&ra).unwrap();
        std::fs::create_dir_all(&rb).unwrap();
        let ca = generate(&ra);
        let cb = generate(&rb);
        assert_eq!(ca.needles, cb.needles, "{name}");
        assert_eq!(ca.args.len(), cb.args.len(), "{name}");
    }
}
