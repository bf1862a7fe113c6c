//! Hostile inputs on every verb (`inventory`, `compare`, `dump`, `diff`,
//! `drafter`, `triage`, `import`, `prompts`), by class: sizes that would
//! allocate without bound, paths that are not UTF-8, inputs that are not
//! regular files, facts that must give the same verdict on every verb,
//! strict parsing, report folders written all or nothing, and messages that
//! say what is wrong.
//!
//! The contract (README, exit codes): bad input exits 2 with exactly one
//! stderr line `error: …` naming the file or flag, nothing on stdout and no
//! report; a finding exits 1; never a panic, a hang (every run here is
//! killed after [`LIMIT`]), a stray file or an overwrite.

use crate::common;

use crate::common::bad_inputs as corpus;

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{hsparity, BIN};
use corpus::{edit_json, edit_shard, edit_text_config, repo_root, tiny_copy, Shard};
use serde_json::{json, Value};

/// Every run is killed after this long (a hang fails the test).
const LIMIT: Duration = Duration::from_secs(120);
/// The toy target/drafter pair (fast drafter runs).
const PAIR: &str = "fixtures/toy-pair";

/// What a run gave.
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `hsparity args…` from the repository root, killed after [`LIMIT`].
fn run<I, S>(args: I) -> Out
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = hsparity().args(args).timeout(LIMIT).output().unwrap();
    Out {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Bad input: exit 2, one `error: ` line holding every needle, nothing on stdout.
fn bad(o: &Out, needles: &[&str]) {
    assert!(!o.stderr.contains("panicked"), "panicked: {}", o.stderr);
    assert_eq!(o.code, Some(2), "expected exit 2: {}", o.stderr);
    let lines: Vec<&str> = o.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {:?}", o.stderr);
    assert!(lines[0].starts_with("error: "), "{:?}", o.stderr);
    for n in needles {
        assert!(lines[0].contains(n), "expected {n:?} in {:?}", o.stderr);
    }
    assert!(!o.stderr.contains("DESIGN"), "{:?}", o.stderr);
    assert!(o.stdout.is_empty(), "stdout: {:?}", o.stdout);
}

/// A finding: exit 1, every needle in stdout or stderr.
fn finding(o: &Out, needles: &[&str]) {
    assert!(!o.stderr.contains("panicked"), "panicked: {}", o.stderr);
    assert_eq!(o.code, Some(1), "expected exit 1: {}", o.stderr);
    for n in needles {
        assert!(
            o.stdout.contains(n) || o.stderr.contains(n),
            "expected {n:?} in {}\n{}",
            o.stdout,
            o.stderr
        );
    }
}

/// Success.
fn ok(o: &Out) {
    assert!(!o.stderr.contains("panicked"), "panicked: {}", o.stderr);
    assert_eq!(o.code, Some(0), "expected exit 0: {}", o.stderr);
}

fn s(p: &Path) -> &OsStr {
    p.as_os_str()
}

/// A named pipe at `path`.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

/// `root` joined with a file name holding the byte 0xFF (not UTF-8).
fn non_utf8(root: &Path, stem: &str) -> PathBuf {
    let mut name = stem.as_bytes().to_vec();
    name.push(0xFF);
    root.join(OsStr::from_bytes(&name))
}

/// A copy of the toy target or drafter (`which` = "target" | "drafter") under `root`.
fn pair_copy(root: &Path, which: &str) -> PathBuf {
    let src = repo_root().join(PAIR).join(which);
    let dst = root.join(which);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

/// Writes a bf16 NaN and +Inf at the start of tensor `name` of `dir/model.safetensors`.
fn poke_bf16_nan(dir: &Path, name: &str) {
    edit_shard(dir, "model.safetensors", |sh| {
        let (b, _) = sh.offsets(name);
        let b = b as usize;
        sh.data[b..b + 4].copy_from_slice(&[0xC0, 0x7F, 0x80, 0x7F]);
    });
}

/// The toy target without its `lm_head.weight` (MISSING on every path: untied).
fn target_missing_lm_head(root: &Path) -> PathBuf {
    let d = pair_copy(root, "target");
    let p = d.join("model.safetensors");
    let mut t = candle_core::safetensors::load(&p, &candle_core::Device::Cpu).unwrap();
    t.remove("lm_head.weight").unwrap();
    candle_core::safetensors::save(&t, &p).unwrap();
    d
}

/// A dump file with one prompt: `p0.input_ids` `ids` and hidden states 0 and
/// 1 of shape `[rows, width]`.
fn write_dump(path: &Path, ids: &[i64], rows: usize, width: usize) {
    use candle_core::{Device, Tensor};
    let mut m = std::collections::HashMap::new();
    m.insert(
        "p0.input_ids".to_string(),
        Tensor::new(ids, &Device::Cpu).unwrap(),
    );
    for i in 0..2 {
        let v: Vec<f32> = (0..rows * width).map(|k| (k + i) as f32 * 0.01).collect();
        m.insert(
            format!("p0.hidden_states.{i}"),
            Tensor::from_vec(v, (rows, width), &Device::Cpu).unwrap(),
        );
    }
    candle_core::safetensors::save(&m, path).unwrap();
}

fn pair_drafter_args(target: &Path, drafter: &Path) -> Vec<OsString> {
    vec![
        "drafter".into(),
        target.into(),
        "--drafter".into(),
        drafter.into(),
        "--prompt".into(),
        "count 347: 347 348".into(),
        "--max-new-tokens".into(),
        "16".into(),
        "--paths".into(),
        "causal-lm".into(),
        "--json".into(),
        "-q".into(),
    ]
}

fn pair_triage_args(target: &Path, extra: &[&str]) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec![
        "triage".into(),
        target.into(),
        "--drafter".into(),
        repo_root().join(PAIR).join("drafter").into(),
        "--prompt-ids".into(),
        "3,4,5,6".into(),
        "--max-new-tokens".into(),
        "4".into(),
        "--no-report".into(),
        "--json".into(),
        "-q".into(),
    ];
    v.extend(extra.iter().map(OsString::from));
    v
}

const IDS: [&str; 2] = ["--prompt-ids", "1,2,3,4"];

/// `dump <ckpt> --path causal-lm --out <out> [--force] -q` on [`IDS`].
fn dump_run(ckpt: &Path, out: &Path, force: bool) -> Out {
    let mut args: Vec<&OsStr> = vec![OsStr::new("dump"), s(ckpt)];
    args.extend(["--path", "causal-lm", "--out"].map(OsStr::new));
    args.push(s(out));
    if force {
        args.push(OsStr::new("--force"));
    }
    args.push(OsStr::new("-q"));
    args.extend(IDS.map(OsStr::new));
    run(args)
}

/// `compare <ckpt> --no-report` on [`IDS`].
fn compare_run(ckpt: &Path) -> Out {
    let mut args = vec![OsStr::new("compare"), s(ckpt), OsStr::new("--no-report")];
    args.extend(IDS.map(OsStr::new));
    run(args)
}

// ------------------------------------------------ 1. sizes vs allocation

#[test]
fn alloc_inventory_a_billion_layers() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tiny_copy(tmp.path());
    edit_text_config(&d, |t| {
        t.remove("layer_types");
        t.insert("num_hidden_layers".into(), json!(1_000_000_000u64));
    });
    bad(
        &run([OsStr::new("inventory"), s(&d)]),
        &["num_hidden_layers"],
    );
}

#[test]
fn alloc_compare_1e18_layers() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tiny_copy(tmp.path());
    edit_text_config(&d, |t| {
        t.remove("layer_types");
        t.insert(
            "num_hidden_layers".into(),
            json!(1_000_000_000_000_000_000u64),
        );
    });
    let o = compare_run(&d);
    bad(&o, &["num_hidden_layers"]);
}

#[test]
fn alloc_dump_a_million_valid_layer_types() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tiny_copy(tmp.path());
    edit_text_config(&d, |t| {
        t.insert("num_hidden_layers".into(), json!(1_000_000));
        t.insert(
            "layer_types".into(),
            json!(vec!["linear_attention"; 1_000_000]),
        );
    });
    let out = tmp.path().join("d.safetensors");
    let o = dump_run(&d, &out, false);
    bad(&o, &["num_hidden_layers"]);
    assert!(!out.exists());
}

#[test]
fn alloc_inventory_vision_depth() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tiny_copy(tmp.path());
    edit_json(&d.join("config.json"), |v| {
        v["vision_config"]["depth"] = json!(1_000_000_000u64)
    });
    bad(&run([OsStr::new("inventory"), s(&d)]), &["depth"]);
}

#[test]
fn alloc_drafter_a_billion_draft_layers() {
    let tmp = tempfile::tempdir().unwrap();
    let dr = pair_copy(tmp.path(), "drafter");
    edit_json(&dr.join("config.json"), |v| {
        v["num_hidden_layers"] = json!(1_000_000_000u64);
        v.as_object_mut().unwrap().remove("layer_types");
    });
    let t = repo_root().join(PAIR).join("target");
    bad(&run(pair_drafter_args(&t, &dr)), &["num_hidden_layers"]);
}

#[test]
fn alloc_triage_a_billion_layers() {
    let tmp = tempfile::tempdir().unwrap();
    let t = pair_copy(tmp.path(), "target");
    edit_text_config(&t, |c| {
        c.remove("layer_types");
        c.insert("num_hidden_layers".into(), json!(1_000_000_000u64));
    });
    bad(&run(pair_triage_args(&t, &[])), &["num_hidden_layers"]);
}

// ------------------------------------------------ 2. paths that are not UTF-8

#[test]
fn utf8_compare_report_dir_and_prompts_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = non_utf8(tmp.path(), "reports");
    let prompts = non_utf8(tmp.path(), "prompts.jsonl");
    std::fs::write(&prompts, b"{\"input_ids\": [1, 2, 3]}\n").unwrap();
    let o = run([
        OsStr::new("compare"),
        OsStr::new(corpus::TINY),
        OsStr::new("--prompts"),
        s(&prompts),
        OsStr::new("--report-dir"),
        s(&dir),
        OsStr::new("--name"),
        OsStr::new("r"),
        OsStr::new("-q"),
    ]);
    ok(&o);
    assert!(dir.join("r").join("report.json").is_file());
}

#[test]
fn utf8_diff_missing_inputs_named_lossily() {
    let tmp = tempfile::tempdir().unwrap();
    let a = non_utf8(tmp.path(), "a.safetensors");
    let o = run([OsStr::new("diff"), s(&a), s(&a), OsStr::new("--no-report")]);
    bad(&o, &["a.safetensors\u{FFFD}"]);
}

#[test]
fn utf8_dump_out() {
    let tmp = tempfile::tempdir().unwrap();
    let out = non_utf8(tmp.path(), "d.safetensors");
    let o = dump_run(Path::new(corpus::TINY), &out, false);
    ok(&o);
    assert!(out.is_file());
}

#[test]
fn utf8_drafter_trajectories() {
    let tmp = tempfile::tempdir().unwrap();
    let f = non_utf8(tmp.path(), "traj.jsonl");
    let t = repo_root().join(PAIR).join("target");
    let dr = repo_root().join(PAIR).join("drafter");
    let mut args = pair_drafter_args(&t, &dr);
    args.extend(["--trajectories".into(), f.into()]);
    bad(&run(args), &["traj.jsonl\u{FFFD}"]);
}

#[test]
fn utf8_import_and_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let f = non_utf8(tmp.path(), "capture");
    bad(&run([OsStr::new("import"), s(&f)]), &["capture\u{FFFD}"]);
    let m = non_utf8(tmp.path(), "messages.jsonl");
    let o = run([
        OsStr::new("prompts"),
        OsStr::new(corpus::TINY),
        OsStr::new("--messages"),
        s(&m),
    ]);
    bad(&o, &["messages.jsonl\u{FFFD}"]);
}

#[test]
fn utf8_checkpoint_argument() {
    let tmp = tempfile::tempdir().unwrap();
    let d = non_utf8(tmp.path(), "ckpt");
    bad(
        &run([OsStr::new("inventory"), s(&d)]),
        &["ckpt\u{FFFD} is not UTF-8"],
    );
    let t = repo_root().join(PAIR).join("target");
    bad(
        &run(pair_drafter_args(&t, &non_utf8(tmp.path(), "drafter"))),
        &["--drafter", "drafter\u{FFFD} is not UTF-8"],
    );
}

// ------------------------------------------------ 3. inputs that are not regular files

#[test]
fn irregular_inventory_shard_is_a_fifo() {
    let tmp = tempfile::tempdir().unwrap();
    let t = pair_copy(tmp.path(), "target");
    std::fs::remove_file(t.join("model.safetensors")).unwrap();
    mkfifo(&t.join("model.safetensors"));
    bad(
        &run([OsStr::new("inventory"), s(&t)]),
        &["model.safetensors", "named pipe"],
    );
}

#[test]
fn irregular_config_is_a_directory_or_a_fifo() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tiny_copy(tmp.path());
    std::fs::remove_file(d.join("config.json")).unwrap();
    std::fs::create_dir(d.join("config.json")).unwrap();
    bad(
        &run([OsStr::new("inventory"), s(&d)]),
        &["config.json", "a directory"],
    );
    std::fs::remove_dir(d.join("config.json")).unwrap();
    mkfifo(&d.join("config.json"));
    let o = compare_run(&d);
    bad(&o, &["config.json", "named pipe"]);
}

#[test]
fn irregular_prompts_and_chat_template() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("p.jsonl");
    mkfifo(&p);
    let o = run([
        OsStr::new("prompts"),
        OsStr::new(corpus::TINY),
        OsStr::new("--prompts"),
        s(&p),
    ]);
    bad(&o, &["p.jsonl", "named pipe"]);
    let o = run([
        OsStr::new("prompts"),
        OsStr::new(corpus::TINY),
        OsStr::new("--prompt"),
        OsStr::new("hi"),
        OsStr::new("--chat"),
        OsStr::new("--chat-template"),
        s(tmp.path()),
    ]);
    bad(&o, &["a directory"]);
    let d = tiny_copy(tmp.path());
    std::fs::remove_file(d.join("tokenizer.json")).unwrap();
    mkfifo(&d.join("tokenizer.json"));
    let o = run([
        OsStr::new("prompts"),
        s(&d),
        OsStr::new("--prompt"),
        OsStr::new("hi"),
    ]);
    bad(&o, &["tokenizer.json", "named pipe"]);
}

#[test]
fn irregular_diff_input_and_import_input() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("a.safetensors");
    mkfifo(&p);
    bad(
        &run([OsStr::new("diff"), s(&p), s(&p), OsStr::new("--no-report")]),
        &["named pipe"],
    );
    bad(&run([OsStr::new("import"), s(&p)]), &["named pipe"]);
}

#[test]
fn irregular_drafter_files() {
    let tmp = tempfile::tempdir().unwrap();
    let t = repo_root().join(PAIR).join("target");
    let dr = pair_copy(tmp.path(), "drafter");
    std::fs::remove_file(dr.join("model.safetensors")).unwrap();
    mkfifo(&dr.join("model.safetensors"));
    bad(
        &run(pair_drafter_args(&t, &dr)),
        &["model.safetensors", "named pipe"],
    );
    let dr2 = tmp.path().join("d2");
    std::fs::create_dir(&dr2).unwrap();
    std::fs::copy(
        repo_root().join(PAIR).join("drafter/model.safetensors"),
        dr2.join("model.safetensors"),
    )
    .unwrap();
    mkfifo(&dr2.join("config.json"));
    bad(
        &run(pair_drafter_args(&t, &dr2)),
        &["config.json", "named pipe"],
    );
}

#[test]
fn irregular_triage_trajectories_device() {
    let t = repo_root().join(PAIR).join("target");
    let o = run(pair_triage_args(&t, &["--trajectories", "/dev/null"]));
    bad(&o, &["/dev/null", "character device"]);
}

// ------------------------------------------------ 4. the same facts, the same verdict

#[test]
fn verdict_dump_on_nan_and_missing_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let t = pair_copy(tmp.path(), "target");
    poke_bf16_nan(&t, "model.language_model.layers.1.mlp.up_proj.weight");
    let out = tmp.path().join("d.safetensors");
    let o = dump_run(&t, &out, false);
    finding(&o, &["up_proj", "NaN"]);
    let m = target_missing_lm_head(&tmp.path().join("m"));
    let out = tmp.path().join("m.safetensors");
    let o = dump_run(&m, &out, false);
    finding(&o, &["MISSING", "lm_head.weight"]);
    // compare and inventory say the same.
    let o = run([OsStr::new("inventory"), s(&m), OsStr::new("--json")]);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
}

/// NaN/Inf in one MLP weight that both paths read: `compare` does not call
/// the paths divergent (they agree bit for bit), and names the layer's
/// sub-layer and the tensor the NaN enters through, not the layer's mixer.
#[test]
fn verdict_compare_on_nan_both_paths_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let t = pair_copy(tmp.path(), "target");
    poke_bf16_nan(&t, "model.language_model.layers.1.mlp.up_proj.weight");
    let o = run([
        OsStr::new("compare"),
        s(&t),
        OsStr::new("--prompt"),
        OsStr::new("count 12: 12 13"),
        OsStr::new("--no-report"),
    ]);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    let summary = o.stdout.lines().next().unwrap();
    assert!(!summary.contains("diverge"), "{summary}");
    for want in [
        "causal-lm and vlm agree bitwise, but both hold NaN/Inf from hidden_states[2]",
        "it enters through layer 1's mlp.up_proj.weight",
    ] {
        assert!(summary.contains(want), "{want:?} not in {summary}");
    }
    assert!(!o.stdout.contains("local cos_min -inf"), "{}", o.stdout);
}

/// A weight finite in bf16 but past f16's range: `dump --dtype f16` writes
/// the hidden states it computes, and exits 1 naming the first one that
/// holds Inf or NaN, as a finding (it exited 0).
#[test]
fn verdict_dump_in_f16_that_overflows() {
    let tmp = tempfile::tempdir().unwrap();
    let t = pair_copy(tmp.path(), "target");
    edit_shard(&t, "model.safetensors", |sh| {
        let (b, _) = sh.offsets("model.language_model.embed_tokens.weight");
        let b = b as usize;
        // bf16 0x47C3 = 99840, finite in bf16, Inf in f16: rows 0–4 (width
        // 64), the embeddings of IDS' tokens.
        for k in 0..5 * 64 {
            sh.data[b + 2 * k..b + 2 * k + 2].copy_from_slice(&[0xC3, 0x47]);
        }
    });
    let out = tmp.path().join("f16.safetensors");
    let mut args: Vec<&OsStr> = vec![OsStr::new("dump"), s(&t)];
    args.extend(["--path", "causal-lm", "--dtype", "f16", "-q", "--out"].map(OsStr::new));
    args.push(s(&out));
    args.extend(IDS.map(OsStr::new));
    let o = run(args);
    finding(
        &o,
        &["hidden_states[", "Inf values", "the f16 run overflows"],
    );
    assert!(out.exists(), "the dump is written as computed");
    // In its own dtype (bf16) the same checkpoint dumps clean.
    let o = dump_run(&t, &tmp.path().join("bf16.safetensors"), false);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
}

#[test]
fn verdict_drafter_and_triage_on_nan_and_missing_targets() {
    let tmp = tempfile::tempdir().unwrap();
    let t = pair_copy(tmp.path(), "target");
    poke_bf16_nan(&t, "model.language_model.layers.1.mlp.up_proj.weight");
    let dr = repo_root().join(PAIR).join("drafter");
    let o = run(pair_drafter_args(&t, &dr));
    finding(&o, &["up_proj", "NaN"]);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["verdict"], "fail");
    finding(&run(pair_triage_args(&t, &[])), &["NaN"]);
    let m = target_missing_lm_head(&tmp.path().join("m"));
    finding(
        &run(pair_drafter_args(&m, &dr)),
        &["MISSING", "lm_head.weight"],
    );
}

#[test]
fn verdict_diff_of_nothing_is_not_a_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, e, z) = (
        tmp.path().join("a.safetensors"),
        tmp.path().join("empty.safetensors"),
        tmp.path().join("zero.safetensors"),
    );
    write_dump(&a, &[1, 2, 3], 3, 4);
    write_dump(&e, &[], 0, 4);
    write_dump(&z, &[1, 2, 3], 3, 0);
    for (x, needle) in [(&e, "empty prompt"), (&z, "zero-width")] {
        bad(
            &run([OsStr::new("diff"), s(x), s(x), OsStr::new("--no-report")]),
            &[needle],
        );
        bad(
            &run([OsStr::new("diff"), s(&a), s(x), OsStr::new("--no-report")]),
            &[needle],
        );
    }
    ok(&run([
        OsStr::new("diff"),
        s(&a),
        s(&a),
        OsStr::new("--no-report"),
    ]));
}

#[test]
fn verdict_drafter_weights_and_config_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let t = repo_root().join(PAIR).join("target");
    let nan = pair_copy(&tmp.path().join("nan"), "drafter");
    poke_bf16_nan(&nan, "fc.weight");
    bad(&run(pair_drafter_args(&t, &nan)), &["fc.weight", "NaN"]);
    for (k, v, needle) in [
        ("rms_norm_eps", json!(-1e-6), "rms_norm_eps"),
        ("num_hidden_layers", json!(0), "num_hidden_layers = 0"),
    ] {
        let d = pair_copy(&tmp.path().join(k), "drafter");
        edit_json(&d.join("config.json"), |c| c[k] = v);
        bad(&run(pair_drafter_args(&t, &d)), &[needle]);
    }
}

#[test]
fn verdict_stale_safetensors_beside_the_drafter_is_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let t = repo_root().join(PAIR).join("target");
    let clean = run(pair_drafter_args(
        &t,
        &repo_root().join(PAIR).join("drafter"),
    ));
    ok(&clean);
    let d = pair_copy(tmp.path(), "drafter");
    // A stale file whose tensors would otherwise win: zeros for every weight.
    let src = d.join("model.safetensors");
    let mut all = candle_core::safetensors::load(&src, &candle_core::Device::Cpu).unwrap();
    for v in all.values_mut() {
        *v = v.zeros_like().unwrap();
    }
    candle_core::safetensors::save(&all, d.join("zz-stale.safetensors")).unwrap();
    let stale = run(pair_drafter_args(&t, &d));
    ok(&stale);
    let tau = |o: &Out| {
        serde_json::from_str::<Value>(&o.stdout).unwrap()["paths"][0]["tau_macro"]
            .as_f64()
            .unwrap()
    };
    // The clean drafter drafts this prompt well; zeros would not.
    assert!(tau(&clean) > 4.0, "{}", clean.stdout);
    assert_eq!(tau(&clean), tau(&stale));
}

// ------------------------------------------------ 5. strict parsing

#[test]
fn strict_headers_duplicate_names_and_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    let t = pair_copy(tmp.path(), "target");
    let p = t.join("model.safetensors");
    let sh = Shard::read(&p);
    let (name, e) = sh
        .header
        .iter()
        .find(|(k, _)| *k != "__metadata__")
        .unwrap();
    let text = serde_json::to_string(&Value::Object(sh.header.clone())).unwrap();
    let dup = format!("{{{}:{},{}", json!(name), e, &text[1..]);
    let mut h = dup.into_bytes();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    corpus::write_raw(&p, &h, &sh.data);
    bad(&run([OsStr::new("inventory"), s(&t)]), &["named twice"]);
    let d = tiny_copy(&tmp.path().join("m"));
    edit_shard(&d, corpus::SHARD1, |sh| {
        sh.header
            .insert("__metadata__".into(), json!({"format": 1}));
    });
    let o = compare_run(&d);
    bad(&o, &["__metadata__"]);
}

#[test]
fn strict_configs() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tiny_copy(tmp.path());
    edit_text_config(&d, |t| {
        t.insert("rope_parameters".into(), json!([]));
    });
    bad(&run([OsStr::new("inventory"), s(&d)]), &["rope_parameters"]);
    let tr = repo_root().join(PAIR).join("target");
    let dr = pair_copy(&tmp.path().join("eps"), "drafter");
    edit_json(&dr.join("config.json"), |c| {
        c["rms_norm_eps"] = json!("1e-6")
    });
    bad(
        &run(pair_drafter_args(&tr, &dr)),
        &["rms_norm_eps must be a number"],
    );
    let dr = pair_copy(&tmp.path().join("int"), "drafter");
    edit_shard(&dr, "model.safetensors", |sh| {
        sh.entry("fc.weight")["dtype"] = json!("I16");
    });
    bad(
        &run(pair_drafter_args(&tr, &dr)),
        &["fc.weight", "not a floating-point weight"],
    );
}

#[test]
fn strict_lists() {
    let o = run([
        OsStr::new("prompts"),
        OsStr::new(corpus::TINY),
        OsStr::new("--prompt-ids"),
        OsStr::new("1,,2"),
    ]);
    bad(&o, &["--prompt-ids", "entry 2 is empty"]);
    let o = run([
        OsStr::new("prompts"),
        OsStr::new(corpus::TINY),
        OsStr::new("--prompt-ids"),
        OsStr::new("1,2,"),
    ]);
    bad(&o, &["entry 3 is empty"]);
    bad(
        &run(["inventory", corpus::TINY, "--paths", ""]),
        &["--paths"],
    );
    bad(&run(["inventory", corpus::TINY, "--paths="]), &["--paths"]);
    let o = run([
        "compare",
        corpus::TINY,
        "--paths",
        "",
        "--no-report",
        "--prompt-ids",
        "1,2",
    ]);
    bad(&o, &["--paths"]);
    bad(
        &run(["inventory", corpus::TINY, "--paths", ","]),
        &["--paths"],
    );
}

#[test]
fn strict_numeric_ranges() {
    let t = repo_root().join(PAIR).join("target");
    for tau in ["NaN", "-1", "inf", "1e9"] {
        let flag = format!("--observed-tau={tau}");
        bad(
            &run(pair_triage_args(&t, &[flag.as_str()])),
            &["--observed-tau"],
        );
    }
    let dr = repo_root().join(PAIR).join("drafter");
    let mut args = pair_drafter_args(&t, &dr);
    args.extend(["--ddtree-budget".into(), "10000000".into()]);
    bad(&run(args), &["--ddtree-budget", "1..=1024"]);
    let mut args = pair_drafter_args(&t, &dr);
    args.extend(["--max-tau-gap".into(), "NaN".into()]);
    bad(&run(args), &["--max-tau-gap"]);
    bad(
        &run(["import", "x", "--num-layers", "0"]),
        &["--num-layers"],
    );
    bad(
        &run(["diff", "a", "b", "--tap-offset", "-99999"]),
        &["--tap-offset"],
    );
    bad(
        &run(pair_triage_args(&t, &["--position-shift", "0"])),
        &["--position-shift"],
    );
    bad(
        &run(pair_triage_args(&t, &["--reset-at", "0"])),
        &["--reset-at"],
    );
    bad(
        &run(pair_triage_args(&t, &["--left-pad", "99999999"])),
        &["--left-pad"],
    );
}

// ------------------------------------------------ 6. report folders: all or nothing

/// `compare` of the tiny fixture into `dir` with `extra` flags.
fn compare_into(dir: &Path, extra: &[&OsStr]) -> Out {
    let mut args: Vec<&OsStr> = vec![
        OsStr::new("compare"),
        OsStr::new(corpus::TINY),
        OsStr::new("--report-dir"),
        s(dir),
        OsStr::new("-q"),
        OsStr::new("--no-incremental"),
    ];
    args.extend(IDS.map(OsStr::new));
    args.extend(extra);
    run(args)
}

#[test]
fn report_name_too_long_and_failed_runs_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("new").join("reports");
    let long = "n".repeat(300);
    let o = compare_into(&dir, &[OsStr::new("--name"), OsStr::new(&long)]);
    bad(&o, &["--name", "255"]);
    assert!(!tmp.path().join("new").exists());
    // A run failing after the folder was claimed removes what it created.
    let o = compare_into(&dir, &[OsStr::new("--prompt-ids"), OsStr::new("999999")]);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(!tmp.path().join("new").exists(), "the claim was not undone");
}

#[test]
fn report_dangling_symlinks() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("reports");
    std::fs::create_dir_all(dir.join("r")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("nowhere"), dir.join("r/report.md")).unwrap();
    let o = compare_into(&dir, &[OsStr::new("--name"), OsStr::new("r")]);
    bad(&o, &["report.md", "dangling symbolic link"]);
    assert!(!dir.join("r/report.json").exists());
    let o = compare_into(
        &dir,
        &[OsStr::new("--name"), OsStr::new("r"), OsStr::new("--force")],
    );
    bad(&o, &["report.md", "--force replaces regular files only"]);
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(tmp.path().join("gone"), &link).unwrap();
    let o = compare_into(&link, &[OsStr::new("--name"), OsStr::new("r")]);
    bad(&o, &["dangling symbolic link"]);
    assert!(!tmp.path().join("gone").exists());
}

#[test]
fn report_files_honour_the_umask() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("reports");
    let out = tmp.path().join("d.safetensors");
    let script = format!(
        "umask 022 && \"$0\" compare {t} --report-dir {d} --name r -q --no-incremental --prompt-ids 1,2 && \
         \"$0\" dump {t} --path causal-lm --out {o} -q --prompt-ids 1,2",
        t = repo_root().join(corpus::TINY).display(),
        d = dir.display(),
        o = out.display()
    );
    let st = assert_cmd::Command::new("sh")
        .args(["-c", &script, BIN])
        .timeout(LIMIT)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.join("r")), 0o755);
    assert_eq!(mode(&dir.join("r/report.json")), 0o644);
    assert_eq!(mode(&dir.join("r/report.md")), 0o644);
    assert_eq!(mode(&out), 0o644);
    // The dump is streamed through a temporary file: none is left beside it.
    let mut left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, ["d.safetensors", "reports"]);
}

#[test]
fn report_force_replaces_regular_files_only() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("out.safetensors");
    mkfifo(&fifo);
    for target in [fifo.as_path(), Path::new("/dev/null")] {
        let o = dump_run(Path::new(corpus::TINY), target, true);
        bad(&o, &["--force replaces regular files only"]);
    }
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn report_concurrent_runs_get_distinct_folders() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("reports");
    let spawn = || {
        std::process::Command::new(BIN)
            .current_dir(repo_root())
            .args([
                "compare",
                corpus::TINY,
                "-q",
                "--no-incremental",
                "--prompt-ids",
                "1,2",
            ])
            .arg("--report-dir")
            .arg(&dir)
            .output()
    };
    let (a, b) = std::thread::scope(|sc| {
        let a = sc.spawn(spawn);
        let b = sc.spawn(spawn);
        (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
    });
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    for n in &names {
        assert!(dir.join(n).join("report.json").is_file(), "{n:?}");
        assert!(
            !n.to_string_lossy().starts_with('.'),
            "temporary folder left: {n:?}"
        );
    }
}

// ------------------------------------------------ 7. messages that help

#[test]
fn message_byte_order_marks() {
    let tmp = tempfile::tempdir().unwrap();
    let bom = |p: &Path| {
        let mut b = b"\xEF\xBB\xBF".to_vec();
        b.extend(std::fs::read(p).unwrap());
        std::fs::write(p, b).unwrap();
    };
    let d = tiny_copy(tmp.path());
    bom(&d.join("config.json"));
    bad(
        &run([OsStr::new("inventory"), s(&d)]),
        &["config.json", "byte-order mark"],
    );
    let d = tiny_copy(&tmp.path().join("i"));
    bom(&d.join("model.safetensors.index.json"));
    let o = compare_run(&d);
    bad(&o, &["model.safetensors.index.json", "byte-order mark"]);
    let dr = pair_copy(&tmp.path().join("d"), "drafter");
    bom(&dr.join("config.json"));
    let t = repo_root().join(PAIR).join("target");
    bad(
        &run(pair_drafter_args(&t, &dr)),
        &["config.json", "byte-order mark"],
    );
}

#[test]
fn message_diff_of_what_is_not_a_dump() {
    let model = repo_root().join(PAIR).join("target/model.safetensors");
    let o = run([
        OsStr::new("diff"),
        s(&model),
        s(&model),
        OsStr::new("--no-report"),
    ]);
    bad(&o, &["not an hsparity dump", "docs/dump-format.md"]);
    let cfg = repo_root().join(PAIR).join("target/config.json");
    bad(
        &run([
            OsStr::new("diff"),
            s(&cfg),
            s(&cfg),
            OsStr::new("--no-report"),
        ]),
        &["not a safetensors file"],
    );
}

#[test]
fn message_diff_gate_names_prompt_and_position() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (
        tmp.path().join("a.safetensors"),
        tmp.path().join("b.safetensors"),
    );
    write_dump(&a, &[5, 6, 7, 8], 4, 4);
    write_dump(&b, &[5, 6, 9, 8], 4, 4);
    let o = run([OsStr::new("diff"), s(&a), s(&b), OsStr::new("--no-report")]);
    bad(&o, &["p0", "position 2", "token 7", "token 9"]);
}

/// A reader of stderr that has gone (`2>&1 | head -1`) does not turn the
/// verdict into a panic (exit 101): the report line, the drafter's plan and
/// the error line are written to a closed pipe and dropped.
#[test]
fn a_closed_stderr_keeps_the_exit_code() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = repo_root().join("fixtures/tiny-qwen3_5");
    let pair = repo_root().join(PAIR);
    let cases: Vec<(Vec<OsString>, i32)> = vec![
        (
            vec![
                "compare".into(),
                tiny.clone().into(),
                "--quiet".into(),
                "--report-dir".into(),
                tmp.path().into(),
            ],
            0,
        ),
        (
            vec![
                "drafter".into(),
                pair.join("target").into(),
                "--drafter".into(),
                pair.join("drafter").into(),
                "--prompt".into(),
                "count 3: 3 4".into(),
                "--max-new-tokens".into(),
                "8".into(),
                "--json".into(),
            ],
            0,
        ),
        (vec!["inventory".into(), tmp.path().join("nope").into()], 2),
    ];
    for (args, want) in cases {
        let mut child = std::process::Command::new(BIN)
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Close the read end before the run writes its lines.
        drop(child.stderr.take());
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(want), "{args:?}");
    }
}

/// `prompts` on the tiny checkpoint with `body` as `--chat-template NAME.jinja`.
fn render_with(dir: &Path, name: &str, body: &str) -> Out {
    let file = dir.join(format!("{name}.jinja"));
    std::fs::write(&file, body).unwrap();
    run([
        OsStr::new("prompts"),
        OsStr::new("fixtures/tiny-qwen3_5"),
        OsStr::new("--chat"),
        OsStr::new("--prompt"),
        OsStr::new("hi"),
        OsStr::new("--chat-template"),
        s(&file),
    ])
}

/// Templates that loop or grow without end (they come from the checkpoint,
/// i.e. the Hub): the render's work bound ends each with exit 2 naming the
/// template file, instead of a hang or an out-of-memory abort.
#[test]
fn bound_chat_templates_that_loop_or_grow() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            "nested-loops",
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        ),
        (
            "doubling",
            r#"{% set ns = namespace(s="x") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"#,
        ),
        (
            "repeat-in-loop",
            r#"{% for i in range(100000) %}{{ "x" * 100000 }}{% endfor %}"#,
        ),
        ("join", r#"{{ range(100000)|join("x" * 100000) }}"#),
        (
            "recursion",
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        ),
    ];
    for (name, body) in cases {
        let o = render_with(tmp.path(), name, body);
        bad(&o, &[&format!("{name}.jinja")]);
    }
}

/// `import PATH` as a vLLM capture of the layers the shipped fixture holds
/// (`--layer-ids 0,2,4,6 --num-layers 6`).
fn vllm_import(path: &Path) -> Vec<OsString> {
    let mut a = vec![OsString::from("import"), path.as_os_str().to_owned()];
    a.extend(
        [
            "--format",
            "vllm",
            "--layer-ids",
            "0,2,4,6",
            "--num-layers",
            "6",
        ]
        .map(OsString::from),
    );
    a
}

/// `import` of the shipped SpecForge DFlash capture with `--target-layer-ids IDS`.
fn specforge_import(ids: &str) -> Vec<OsString> {
    let dir = repo_root().join("fixtures/engine-captures/specforge-dflash");
    let mut a = vec![OsString::from("import"), dir.into_os_string()];
    a.extend(["--format", "specforge", "--target-layer-ids", ids].map(OsString::from));
    a
}

/// A vLLM connector file (`hidden_states` `[T, L, H]` f32, `token_ids` `[T]`
/// i64) written as safetensors.
fn vllm_file(path: &Path, t: usize, l: usize, h: usize, ids: &[i64]) {
    use candle_core::{Device, Tensor};
    let hs = Tensor::ones((t, l, h), candle_core::DType::F32, &Device::Cpu).unwrap();
    let ids = Tensor::new(ids, &Device::Cpu).unwrap();
    let views = [("hidden_states", &hs), ("token_ids", &ids)];
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

/// What no engine writes is refused on import, with or without `--out`, and
/// nothing is written: 0 tokens, 0 width, a negative token id, a value past
/// f32's range, a layer named twice or beyond the target's N.
#[test]
fn import_refuses_what_no_engine_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("d.safetensors");
    let cases: Vec<(&str, Vec<OsString>, &str)> = {
        let f = |name: &str| tmp.path().join(name);
        vllm_file(&f("zero-tokens.safetensors"), 0, 4, 64, &[]);
        vllm_file(&f("zero-wide.safetensors"), 3, 4, 0, &[1, 2, 3]);
        vllm_file(&f("negative-id.safetensors"), 4, 4, 8, &[1, 2, 3, -5]);
        vllm_file(&f("huge-id.safetensors"), 4, 4, 8, &[1, 2, 3, 1 << 62]);
        let vllm = |file: &str| vllm_import(&f(file));
        // SGLang JSON: a value no bf16/f32 state holds.
        let dir = repo_root().join("fixtures/engine-captures/sglang-json");
        let mut resp: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("response.json")).unwrap())
                .unwrap();
        let first = resp
            .pointer_mut("/meta_info/hidden_states/0/0")
            .expect("a first hidden-state row");
        first[0] = json!(1e39);
        std::fs::write(f("huge.json"), resp.to_string()).unwrap();
        let req: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("request.json")).unwrap())
                .unwrap();
        let request_ids: String = req["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",");
        // SGLang dumper: a layer past the target's N.
        let src = repo_root().join("fixtures/engine-captures/sglang-dump/hsparity_fixture");
        let dump = f("sglang-dump");
        std::fs::create_dir(&dump).unwrap();
        for e in std::fs::read_dir(&src).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_str().unwrap();
            let name = name
                .replace("layers.2.", "layers.9.")
                .replace("layer_id=2", "layer_id=9");
            std::fs::copy(&p, dump.join(name)).unwrap();
        }
        let spec = specforge_import;
        vec![
            ("0 tokens", vllm("zero-tokens.safetensors"), "0 tokens"),
            ("0 wide", vllm("zero-wide.safetensors"), "0 wide"),
            ("negative id", vllm("negative-id.safetensors"), "is -5"),
            (
                "huge id",
                vllm("huge-id.safetensors"),
                "beyond any vocabulary",
            ),
            (
                "beyond f32",
                vec![
                    "import".into(),
                    f("huge.json").into_os_string(),
                    "--format".into(),
                    "sglang-json".into(),
                    "--prompt-ids".into(),
                    request_ids.clone().into(),
                    "--num-layers".into(),
                    "6".into(),
                ],
                "beyond the range of f32",
            ),
            (
                "beyond N",
                vec![
                    "import".into(),
                    dump.into_os_string(),
                    "--format".into(),
                    "sglang-dump".into(),
                    "--num-layers".into(),
                    "6".into(),
                ],
                "hidden_states[9], beyond a 6-layer target",
            ),
            ("a layer twice", spec("1,1"), "names layer 1 twice"),
            (
                "a wrapping tap",
                spec("1,18446744073709551615"),
                "beyond any target",
            ),
        ]
    };
    for (what, args, needle) in cases {
        let o = run(args.iter().map(OsString::as_os_str));
        assert!(o.code == Some(2), "{what}: {} {}", o.stderr, o.stdout);
        bad(&o, &[needle]);
        let mut with_out = args.clone();
        with_out.extend(["--out".into(), out.clone().into_os_string()]);
        let o = run(with_out.iter().map(OsString::as_os_str));
        bad(&o, &[needle]);
        assert!(!out.exists(), "{what}: a dump was written");
    }
}

/// A `torch.save` zip holding `pickle` as its `data.pkl`.
fn torch_zip(path: &Path, pickle: &[u8]) {
    use std::io::Write as _;
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    z.start_file("archive/data.pkl", opts).unwrap();
    z.write_all(pickle).unwrap();
    z.start_file("archive/byteorder", opts).unwrap();
    z.write_all(b"little").unwrap();
    z.finish().unwrap();
}

/// Hostile pickles end with exit 2 naming the bound, before candle builds
/// anything: 200 000 nested lists (a stack overflow when built or dropped),
/// memo references doubling 40 times (2^40 copies), a tensor whose element
/// count wraps in 64 bits, a tensor with a negative dimension.
#[test]
fn import_bounds_hostile_pickles() {
    let tmp = tempfile::tempdir().unwrap();
    let mut nested = vec![0x80, 2];
    for i in 0..200_000usize {
        nested.extend([b']', b'q', (i % 256) as u8]);
    }
    nested.extend(std::iter::repeat_n(b'a', 199_999));
    nested.push(b'.');
    let mut doubling = vec![0x80, 2, b']', b'q', 0];
    for k in 0..40u8 {
        doubling.extend([b'(', b'h', k, b'h', k, b'l', b'q', k + 1]);
    }
    doubling.push(b'.');
    // {"hidden_states": _rebuild_tensor_v2(storage, 0, SHAPE, STRIDE)}
    let tensor = |shape: &[i64]| -> Vec<u8> {
        let int = |v: i64| -> Vec<u8> {
            let mut b = vec![0x8a, 8];
            b.extend(v.to_le_bytes());
            b
        };
        let mut p = vec![0x80, 2, b'}', b'X'];
        p.extend(13u32.to_le_bytes());
        p.extend(b"hidden_states");
        p.extend(b"ctorch._utils\n_rebuild_tensor_v2\n");
        p.push(b'(');
        // persistent id ('storage', torch.FloatStorage, '0', 'cpu', numel)
        p.push(b'(');
        p.extend([b'X', 7, 0, 0, 0]);
        p.extend(b"storage");
        p.extend(b"ctorch\nFloatStorage\n");
        p.extend([b'X', 1, 0, 0, 0, b'0', b'X', 3, 0, 0, 0]);
        p.extend(b"cpu");
        p.extend(int(4));
        p.extend([b't', b'Q']);
        p.extend(int(0));
        p.push(b'(');
        for &d in shape {
            p.extend(int(d));
        }
        p.push(b't');
        p.push(b'(');
        for _ in shape {
            p.extend(int(1));
        }
        p.extend([b't', b't', b'R', b's', b'.']);
        p
    };
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("nested", nested, "more than 256 deep"),
        ("doubling", doubling, "more than 1000000 objects"),
        (
            "wrapping",
            tensor(&[1, 4, 1 << 62]),
            "more elements than memory can",
        ),
        (
            "negative",
            tensor(&[1, -4, 8]),
            "a malformed tensor: its shape is not a tuple of non-negative integers",
        ),
    ];
    for (name, pickle, needle) in cases {
        let f = tmp.path().join(format!("{name}.ckpt"));
        torch_zip(&f, &pickle);
        let o = run([
            OsStr::new("import"),
            s(&f),
            OsStr::new("--format"),
            OsStr::new("specforge"),
            OsStr::new("--target-layer-ids"),
            OsStr::new("1"),
        ]);
        bad(&o, &[needle, &format!("{name}.ckpt")]);
    }
}

/// `--out` under a path whose folder is a file names that file (it was
/// "File exists (os error 17)"), for `dump` and `import`.
#[test]
fn out_under_a_file_names_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("in");
    std::fs::write(&file, b"x").unwrap();
    let out = file.join("x.safetensors");
    let out = out.to_str().unwrap();
    let dump = "dump fixtures/tiny-qwen3_5 --path causal-lm --quiet --out";
    let import = "import fixtures/engine-captures/vllm/0.safetensors --layer-ids 0,2,4,6 --num-layers 6 --out";
    for verb in [dump, import] {
        let args: Vec<&str> = verb.split(' ').chain([out]).collect();
        bad(&run(args), &["is a file, not a folder"]);
    }
}

/// Templates past the bounds fuel does not cover: a value nested 100 000
/// deep printed or serialised (printing recurses), a list doubled by
/// concatenation (not charged fuel: the render's time bound ends it), a
/// template file of megabytes.
#[test]
fn bound_chat_templates_past_fuel() {
    let tmp = tempfile::tempdir().unwrap();
    let deep = "{% set ns = namespace(v=[1]) %}{% for i in range(100000) %}{% set ns.v = [ns.v] %}{% endfor %}";
    let cases = [
        ("deep-tojson", format!("{deep}{{{{ ns.v|tojson }}}}"), "nested more than 256 deep"),
        ("deep-print", format!("{deep}{{{{ ns.v }}}}"), "nested more than 256 deep"),
        (
            "list-doubling",
            "{% set ns = namespace(v=[1]) %}{% for i in range(36) %}{% set ns.v = ns.v + ns.v %}{% endfor %}done".to_string(),
            "did not finish rendering in 10 s",
        ),
        ("huge", "x".repeat(2 << 20), "more than a chat template holds"),
    ];
    for (name, body, needle) in cases {
        let o = render_with(tmp.path(), name, body.as_ref());
        bad(&o, &[needle, &format!("{name}.jinja")]);
    }
}

/// More of what no engine writes: a tap far past any target without
/// `--num-layers`, requests of one capture in two dtypes, f64 values past
/// f32's range (they would land as ±inf).
#[test]
fn import_refuses_taps_dtypes_and_values_no_engine_writes() {
    use candle_core::{DType, Device, Tensor};
    let tmp = tempfile::tempdir().unwrap();
    let write = |path: &Path, hs: Tensor| {
        let ids = Tensor::new(&[1i64, 2, 3], &Device::Cpu).unwrap();
        let views = [("hidden_states", &hs), ("token_ids", &ids)];
        std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
    };
    let ones = |dt: DType| Tensor::ones((3, 4, 8), dt, &Device::Cpu).unwrap();
    let mixed = tmp.path().join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    write(&mixed.join("0.safetensors"), ones(DType::F16));
    write(&mixed.join("1.safetensors"), ones(DType::F32));
    let big = tmp.path().join("big.safetensors");
    write(&big, ones(DType::F64).affine(1e300, 0.0).unwrap());
    let vllm = vllm_import;
    let far = specforge_import("1,18446744073709551614");
    // Auto-detected JSON that does not parse says so (it was "a JSON file
    // without meta_info.hidden_states").
    let broken = tmp.path().join("broken.json");
    std::fs::write(&broken, "[[[[").unwrap();
    let broken = vec![OsString::from("import"), broken.into_os_string()];
    // A flag of another format is refused, not ignored.
    let mut rank = vllm(&repo_root().join("fixtures/engine-captures/vllm/0.safetensors"));
    rank.extend(["--rank".into(), "1".into()]);
    for (args, needle) in [
        (rank, "--rank applies to sglang-dump captures"),
        (broken, "not JSON: "),
        (far, "beyond any target"),
        (vllm(&mixed), "share a dtype"),
        (vllm(&big), "beyond the range of f32"),
    ] {
        bad(&run(args.iter().map(OsString::as_os_str)), &[needle]);
    }
}
