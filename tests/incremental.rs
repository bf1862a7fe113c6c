//! Incremental decoding (KV cache for full attention, conv + recurrent state
//! for Gated DeltaNet) equals one full forward, as transformers' own cached
//! decode does (in transformers 5.23.0 a prefill of 90 + 10 cached steps
//! departs from the full forward by 2.4e-5 on a random Qwen3.5).

use crate::common;

use candle_core::Tensor;
use common::{assert_close, F32_MODEL};
use hsparity::checkpoint::Checkpoint;
use hsparity::loading::{self, LoadingPath};
use hsparity::models::{GdnForm, TextModel, TextModelSpec};
use hsparity::precision::Precision;

fn model() -> TextModel {
    let ckpt = Checkpoint::open("fixtures/tiny-qwen3_5").unwrap();
    let p = loading::resolve(&ckpt, LoadingPath::CausalLm).unwrap();
    let spec = TextModelSpec::new(&p.text_config).unwrap();
    TextModel::load(&spec, &p.view, Some(&p.view), Precision::F32).unwrap()
}

fn ids(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 384).collect()
}

#[test]
fn prefill_plus_single_steps_equals_full_forward() {
    let m = model();
    let ids = ids(100);
    let full = m.forward(&ids, None, GdnForm::Chunked, true).unwrap();
    let full_logits = full.logits.unwrap();
    let mut state = m.new_state();
    let pre = m
        .forward(&ids[..90], Some(&mut state), GdnForm::Chunked, false)
        .unwrap();
    let mut rows = vec![pre.logits.unwrap()];
    for t in 90..100 {
        let step = m
            .forward(&ids[t..t + 1], Some(&mut state), GdnForm::Chunked, false)
            .unwrap();
        rows.push(step.logits.unwrap());
    }
    let ours = Tensor::cat(&rows, 0).unwrap();
    let m = assert_close("prefill 90 + 10 steps", &ours, &full_logits, &F32_MODEL);
    println!(
        "prefill 90 + 10 steps vs full: max_abs {:.3e}, cos_min {:.9}",
        m.max_abs, m.cos_min
    );
    assert_eq!(state.len, 100);
}

#[test]
fn chunked_prefill_with_a_state_continues_correctly() {
    // Two chunked prefills (64 + 36) with the carried state equal one of 100.
    let m = model();
    let ids = ids(100);
    let full = m
        .forward(&ids, None, GdnForm::Chunked, false)
        .unwrap()
        .logits
        .unwrap();
    let mut state = m.new_state();
    m.forward(&ids[..64], Some(&mut state), GdnForm::Chunked, false)
        .unwrap();
    let rest = m
        .forward(&ids[64..], Some(&mut state), GdnForm::Chunked, false)
        .unwrap()
        .logits
        .unwrap();
    assert_close(
        "64 + 36 chunked prefill",
        &rest,
        &full.narrow(0, 64, 36).unwrap(),
        &F32_MODEL,
    );
}

#[test]
fn greedy_generation_is_the_argmax_of_full_forwards() {
    let m = model();
    let prompt = ids(20);
    let gen = m.greedy(&prompt, 12, GdnForm::Chunked).unwrap();
    assert_eq!(gen.len(), 12);
    // Re-derive each token with a full forward over prompt + tokens so far.
    let mut seq = prompt.clone();
    for &tok in &gen {
        let l = m
            .forward(&seq, None, GdnForm::Chunked, false)
            .unwrap()
            .logits
            .unwrap();
        let last = l.get(seq.len() - 1).unwrap();
        let want = last.argmax(0).unwrap().to_scalar::<u32>().unwrap();
        assert_eq!(tok, want);
        seq.push(tok);
    }
}

/// Whether `compare` runs the check, resolved once from the flags, the
/// model's f32 bytes, the delta-rule form and the CPU: a kernel switch
/// (`HSPARITY_NO_AVX512_GEMM`) changes the check's speed, never whether it
/// runs.
#[test]
fn the_incremental_plan_follows_the_flags_the_size_and_the_cpu() {
    use hsparity::kernels::Capabilities;
    use hsparity::parity::incremental::INCREMENTAL_AUTO_BYTES;
    use hsparity::parity::IncrementalPlan;
    let avx512 = Capabilities {
        avx2: true,
        avx512f: true,
        ..Capabilities::none()
    };
    let switched = Capabilities {
        no_avx512_gemm: true,
        ..avx512
    };
    let none = Capabilities::none();
    let big = INCREMENTAL_AUTO_BYTES + 1;
    let (c, r) = (GdnForm::Chunked, GdnForm::Recurrent);
    let plan = IncrementalPlan::resolve;
    assert_eq!(plan(Some(true), big, r, true, &none), IncrementalPlan::Run);
    assert!(
        matches!(plan(Some(false), 0, c, true, &avx512), IncrementalPlan::Skip(w) if w.contains("--no-incremental"))
    );
    assert_eq!(plan(None, big, c, true, &avx512), IncrementalPlan::Run);
    assert_eq!(plan(None, big, c, true, &switched), IncrementalPlan::Run);
    assert_eq!(
        plan(None, INCREMENTAL_AUTO_BYTES, c, true, &none),
        IncrementalPlan::Run
    );
    let skip = |p: IncrementalPlan| match p {
        IncrementalPlan::Skip(w) => w,
        IncrementalPlan::Run => panic!("runs"),
    };
    assert!(skip(plan(None, big, c, true, &none)).contains("without AVX-512F"));
    assert!(skip(plan(None, big, c, false, &avx512)).contains("on this device"));
    assert!(skip(plan(None, big, r, true, &avx512)).contains("--gdn-form recurrent"));
    assert!(skip(plan(None, big, c, true, &none)).contains("pass --incremental to force it"));
}

/// `compare`'s JSON report on the tiny fixture with `args` (no report
/// folder, no progress).
fn compare_json(args: &[&str]) -> serde_json::Value {
    crate::common::json_of(
        crate::common::hsparity()
            .args([
                "compare",
                "fixtures/tiny-qwen3_5",
                "--json",
                "--no-report",
                "--quiet",
            ])
            .args(args),
    )
}

/// On a long prompt the check prefills all but its last eight tokens and
/// steps through them (positions 412–419 of 420), in the capture's sweep
/// (chunked) and as its own pass (`--gdn-form recurrent`) alike, and
/// passes: the cached decode of the tiny fixture is its full forward there.
#[test]
fn on_a_long_prompt_the_check_steps_through_its_last_tokens() {
    let ids: Vec<String> = (0..420)
        .map(|i| ((17 + 7919 * i) % 384).to_string())
        .collect();
    for form in ["chunked", "recurrent"] {
        let ids = ids.join(",");
        let v = compare_json(&["--incremental", "--gdn-form", form, "--prompt-ids", &ids]);
        for row in v["incremental"].as_array().unwrap() {
            assert_eq!(
                (row["prefill_tokens"].as_u64(), row["steps"].as_u64()),
                (Some(412), Some(8)),
                "{form}"
            );
            assert_eq!(row["verdict"], "pass", "{form}: {row}");
            // The largest difference is named at its position in the prompt.
            if let Some(t) = row["metrics"]["max_abs_at"]["token"].as_u64() {
                assert!((412..420).contains(&t), "{form}: {row}");
            }
        }
        assert_eq!(v["incremental"].as_array().unwrap().len(), 2, "{form}");
    }
}

/// With no prompt of two tokens the check cannot run, and a note says so,
/// even when `--incremental` asks for it (the run itself passes).
#[test]
fn without_a_two_token_prompt_a_note_says_the_check_did_not_run() {
    let v = compare_json(&["--incremental", "--prompt-ids", "5", "--prompt-ids", "7"]);
    assert_eq!(v["incremental"].as_array().map(Vec::len), Some(0));
    let notes = v["notes"].as_array().unwrap();
    assert!(
        notes.iter().any(|n| n
            .as_str()
            .is_some_and(|n| n.contains("no prompt has two tokens"))),
        "{notes:?}"
    );
}

/// The check runs on the first prompt with two tokens, and its table says
/// which (the terminal's and report.md's, as the JSON's `prompt` does).
#[test]
fn the_check_names_the_prompt_it_ran_on() {
    let dir = tempfile::tempdir().unwrap();
    let out = crate::common::hsparity()
        .args(["compare", "fixtures/tiny-qwen3_5", "--incremental"])
        .args(["--prompt-ids", "5", "--prompt-ids", "1,2", "--name", "p"])
        .arg("--report-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let row = |text: &str| -> String {
        text.lines()
            .find(|l| l.contains("causal-lm") && l.contains("1 + 1"))
            .unwrap_or_else(|| panic!("no check row in:\n{text}"))
            .to_string()
    };
    let terminal = row(&String::from_utf8_lossy(&out.stdout));
    assert!(terminal.contains("p1"), "{terminal}");
    let md = std::fs::read_to_string(dir.path().join("p/report.md")).unwrap();
    assert!(row(&md).contains("p1"), "{}", row(&md));
}
