//! Every JSON report the suite's fixtures produce validates against
//! `docs/report.schema.json` (JSON Schema draft 2020-12, validated with boon):
//! `compare` on the tiny checkpoint and on every divergence fixture, the files
//! `compare` writes, `compare --drafter` on the toy pair, a run with NaN
//! weights (metrics written as null), `diff` of two dumps, `drafter` and
//! `triage` (also on supplied trajectories), `prompts` and runs on
//! chat-templated prompts, the engine-capture reports (`import`, `diff
//! --align` on an imported dump, `drafter --features`), and the committed
//! examples.

use crate::common;

use std::path::{Path, PathBuf};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn hsparity(args: &[&str]) -> (i32, String, String) {
    let out = common::hsparity()
        .args(args)
        .output()
        .expect("runs hsparity");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The schema compiled at `location` (`docs/report.schema.json` or one of its `$defs`).
struct Validator {
    schemas: boon::Schemas,
    top: boon::SchemaIndex,
    compiler_defs: Vec<(String, boon::SchemaIndex)>,
}

impl Validator {
    fn new(defs: &[&str]) -> Self {
        let path = root().join("docs/report.schema.json");
        let url = format!("file://{}", path.display());
        let doc: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("schema is JSON");
        let mut schemas = boon::Schemas::new();
        let mut compiler = boon::Compiler::new();
        compiler.add_resource(&url, doc).unwrap();
        let top = compiler
            .compile(&url, &mut schemas)
            .unwrap_or_else(|e| panic!("schema compiles: {e:#}"));
        let compiler_defs = defs
            .iter()
            .map(|d| {
                let loc = format!("{url}#/$defs/{d}");
                let idx = compiler
                    .compile(&loc, &mut schemas)
                    .unwrap_or_else(|e| panic!("{loc}: {e:#}"));
                (d.to_string(), idx)
            })
            .collect();
        Self {
            schemas,
            top,
            compiler_defs,
        }
    }

    fn check(&self, what: &str, v: &Value) {
        if let Err(e) = self.schemas.validate(v, self.top) {
            panic!("{what} does not validate against docs/report.schema.json:\n{e:#}");
        }
    }

    fn check_def(&self, def: &str, what: &str, v: &Value) {
        let idx = self
            .compiler_defs
            .iter()
            .find(|(d, _)| d == def)
            .map(|(_, i)| *i)
            .expect("compiled def");
        if let Err(e) = self.schemas.validate(v, idx) {
            panic!("{what} does not validate against $defs/{def}:\n{e:#}");
        }
    }
}

fn json(s: &str, what: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {s}"))
}

#[test]
fn compare_reports_validate() {
    let v = Validator::new(&[]);
    // The tiny checkpoint, stdout and the written report.json.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let (code, out, err) = hsparity(&[
        "compare",
        "fixtures/tiny-qwen3_5",
        "--taps",
        "1,4",
        "--json",
        "--quiet",
        "--report-dir",
        dir,
        "--name",
        "t",
    ]);
    assert_eq!(code, 0, "{err}");
    let stdout = json(&out, "compare --json");
    v.check("compare --json (tiny)", &stdout);
    assert_eq!(stdout["kind"], "compare");
    let written = std::fs::read_to_string(tmp.path().join("t/report.json")).unwrap();
    v.check("report.json (tiny)", &json(&written, "report.json"));

    // Every divergence fixture: passing and failing reports, missing tensors, ties.
    let (mut seen, mut fixtures) = (0, 0);
    for e in std::fs::read_dir(root().join("fixtures/divergence")).unwrap() {
        fixtures += 1;
        let d = e.unwrap().path();
        let name = d.file_name().unwrap().to_string_lossy().into_owned();
        let ckpt = format!("fixtures/divergence/{name}");
        let prompts = format!("{ckpt}/prompts.jsonl");
        let mut args = vec!["compare", &ckpt, "--json", "--no-report", "--quiet"];
        if Path::new(&root().join(&prompts)).exists() {
            args.extend(["--prompts", &prompts]);
        }
        let (code, out, err) = hsparity(&args);
        // Every divergence fixture has two default paths that apply: a report.
        assert!(code == 0 || code == 1, "{name}: exit {code}: {err}");
        let r = json(&out, &name);
        v.check(&format!("compare --json ({name})"), &r);
        assert_eq!(r["exit_code"].as_i64(), Some(code as i64), "{name}");
        seen += 1;
    }
    assert_eq!(seen, fixtures, "every divergence fixture compared");
    assert_eq!(fixtures, 6);
}

/// A run whose weights hold NaN/Inf: its NaN metrics are written as null
/// (JSON has no NaN), which the schema allows for every float.
#[test]
fn nan_metrics_validate_as_null() {
    let v = Validator::new(&[]);
    let tmp = tempfile::tempdir().unwrap();
    common::tiny_fixture_with_non_finite(
        tmp.path(),
        "model.language_model.layers.2.self_attn.k_proj.weight",
    );
    let (code, out, err) = hsparity(&[
        "compare",
        tmp.path().to_str().unwrap(),
        "--json",
        "--no-report",
        "--quiet",
    ]);
    assert_eq!(code, 1, "{err}");
    let r = json(&out, &err);
    // `json` parsed it: no bare NaN token in the output.
    let rows = r["pairs"][0]["hidden_states"].as_array().unwrap();
    assert!(
        rows.iter().any(|h| h["cos_min"].is_null()),
        "a NaN cosine is written as null"
    );
    v.check("report with null metrics", &r);
    // A renamed member does not validate.
    let mut bad = r.clone();
    let m = bad.as_object_mut().unwrap();
    let verdict = m.remove("verdict").unwrap();
    m.insert("status".into(), verdict);
    assert!(v.schemas.validate(&bad, v.top).is_err());
}

#[test]
fn compare_with_drafter_validates() {
    let v = Validator::new(&["drafter_report"]);
    let (code, out, err) = hsparity(&[
        "compare",
        "fixtures/toy-pair/target",
        "--drafter",
        "fixtures/toy-pair/drafter",
        "--prompts",
        "fixtures/toy-pair/prompts.jsonl",
        "--max-new-tokens",
        "16",
        "--json",
        "--no-report",
        "--quiet",
    ]);
    assert!(code == 0 || code == 1, "exit {code}: {err}");
    let r = json(&out, &err);
    v.check("compare --drafter --json (toy pair)", &r);
    assert!(r["drafter"].is_object());
    v.check_def("drafter_report", "drafter member", &r["drafter"]);
}

#[test]
fn diff_report_validates() {
    let v = Validator::new(&["diff_report"]);
    let g = "fixtures/tiny-qwen3_5/golden";
    let (code, out, err) = hsparity(&[
        "diff",
        &format!("{g}/causal-lm.safetensors"),
        &format!("{g}/vlm.safetensors"),
        "--json",
        "--no-report",
    ]);
    assert!(code == 0 || code == 1, "exit {code}: {err}");
    let r = json(&out, &err);
    v.check("diff --json", &r);
    v.check_def("diff_report", "diff --json", &r);
}

#[test]
fn diff_reports_of_dumps_that_part_and_of_checkpoints_validate() {
    let v = Validator::new(&["diff_report", "weights_report"]);
    let d = "fixtures/diagnosis";
    for case in [
        "chunk-state-lost",
        "pads-unmasked",
        "pre-norm-last",
        "request-leak",
    ] {
        let (code, out, err) = hsparity(&[
            "diff",
            &format!("{d}/{case}/a.safetensors"),
            &format!("{d}/{case}/b.safetensors"),
            "--json",
            "--no-report",
        ]);
        assert_eq!(code, 1, "{case}: {err}");
        let r = json(&out, &err);
        v.check(case, &r);
        v.check_def("diff_report", case, &r);
    }
    let (code, out, err) = hsparity(&[
        "diff",
        &format!("{d}/norm-plus-one/a"),
        &format!("{d}/norm-plus-one/b"),
        "--json",
        "--no-report",
    ]);
    assert_eq!(code, 1, "{err}");
    let r = json(&out, &err);
    v.check("diff CKPT CKPT", &r);
    v.check_def("weights_report", "diff CKPT CKPT", &r);
}

#[test]
fn committed_examples_validate() {
    let v = Validator::new(&[]);
    let dir = root().join("reports/examples");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path().join("report.json");
        if p.exists() {
            v.check(
                &p.display().to_string(),
                &json(&std::fs::read_to_string(&p).unwrap(), "example"),
            );
            n += 1;
        }
    }
    assert!(n >= 2, "examples under {}: {n}", dir.display());
}

/// `drafter --json` and `triage --json` on the toy pair (short runs).
#[test]
fn drafter_and_triage_reports_validate() {
    let v = Validator::new(&["drafter_report", "triage_report"]);
    let pair = [
        "fixtures/toy-pair/target",
        "--drafter",
        "fixtures/toy-pair/drafter",
    ];
    let short = [
        "--prompt",
        "count 347: 347 348",
        "--max-new-tokens",
        "8",
        "--json",
        "--quiet",
    ];
    let (code, out, err) = hsparity(&[&["drafter"][..], &pair, &short].concat());
    assert_eq!(code, 0, "{err}");
    let d = json(&out, "drafter --json");
    v.check("drafter --json", &d);
    v.check_def("drafter_report", "drafter --json", &d);
    assert_eq!(d["kind"], "drafter");
    let (code, out, err) = hsparity(&[&["triage"][..], &pair, &short, &["--no-report"]].concat());
    assert_eq!(code, 0, "{err}");
    let t = json(&out, "triage --json");
    v.check("triage --json", &t);
    v.check_def("triage_report", "triage --json", &t);
    assert_eq!(t["kind"], "triage");
    // On supplied trajectories (one of them tampered, so a departure is
    // listed): both reports carry the trajectory member.
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("t.jsonl");
    std::fs::write(
        &f,
        "{\"prompt\": \"count 347: 347 348\", \"output\": \" 349 350 351 352 353 354 355 356 357\"}\n\
         {\"prompt_ids\": [3, 4, 5], \"output_ids\": [6, 7, 8, 9, 10, 11, 12, 13, 14]}\n",
    )
    .unwrap();
    let given = ["--trajectories", f.to_str().unwrap(), "--json", "--quiet"];
    let (code, out, err) = hsparity(&[&["drafter"][..], &pair, &given].concat());
    assert!(code == 0 || code == 1, "{err}");
    let d = json(&out, "drafter --trajectories --json");
    v.check_def("drafter_report", "drafter --trajectories --json", &d);
    assert!(d["trajectories"]["paths"].is_array());
    let (code, out, err) = hsparity(&[&["triage"][..], &pair, &given, &["--no-report"]].concat());
    assert_eq!(code, 0, "{err}");
    let t = json(&out, "triage --trajectories --json");
    v.check_def("triage_report", "triage --trajectories --json", &t);
    assert!(t["trajectories"]["paths"][0]["checked"].as_u64().unwrap() > 0);
    // The sequence faults carry their departures; the loop and rendering
    // suspects are listed as not applicable there.
    let kv = t["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "kv-fp8");
    assert!(kv.unwrap()["departures"]["checked"].is_u64(), "{t}");
    let na: Vec<&str> = t["not_applicable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert!(
        na.contains(&"harness-gdn-crop") && na.contains(&"thinking-flipped"),
        "{na:?}"
    );
    // The τ gap between the two paths carries its interval (two prompts).
    assert!(d["tau_gap_interval"]["interval"]["low"].is_number(), "{d}");
}

/// `prompts --json` (passing, and failing with prompts a run would refuse)
/// and the verbs run on chat-templated prompts (`--chat`, `--prompt-set`,
/// `--system`, `--enable-thinking`) validate; the environment names the
/// template and the flag.
#[test]
fn templated_prompt_reports_validate() {
    let v = Validator::new(&["prompts_report", "drafter_report", "environment"]);
    let q = "fixtures/tiny-qwen3_5";
    for args in [
        &["prompts", q, "--json"][..],
        &["prompts", q, "--prompt-ids", "1,2", "--json"],
        &[
            "prompts",
            q,
            "--prompt-set",
            "mbpp:2",
            "--system",
            "Be brief.",
            "--json",
        ],
        &[
            "prompts",
            q,
            "--prompt-set",
            "humaneval:4",
            "--enable-thinking",
            "true",
            "--json",
        ],
    ] {
        let (code, out, err) = hsparity(args);
        assert!(code == 0 || code == 1, "{args:?}: {err}");
        let r = json(&out, "prompts --json");
        v.check(&format!("{args:?}"), &r);
        v.check_def("prompts_report", &format!("{args:?}"), &r);
        assert_eq!(r["kind"], "prompts");
        assert_eq!(r["exit_code"], code);
    }
    let (code, out, err) = hsparity(&[
        "drafter",
        "fixtures/toy-pair/target",
        "--drafter",
        "fixtures/toy-pair/drafter",
        "--prompts",
        "fixtures/toy-pair/prompts.jsonl",
        "--chat",
        "--enable-thinking",
        "false",
        "--max-new-tokens",
        "8",
        "--json",
        "--quiet",
    ]);
    assert_eq!(code, 0, "{err}");
    let d = json(&out, "drafter --chat --json");
    v.check("drafter --chat --json", &d);
    v.check_def(
        "environment",
        "drafter --chat environment",
        &d["environment"],
    );
    assert_eq!(d["environment"]["enable_thinking"], "false");
    assert!(d["environment"]["chat_template"]["sha256"].is_string());
}

/// The engine-capture reports: `import --json` (every format), `diff --align`
/// on an imported partial dump, and `drafter --features` on the toy pair's records.
#[test]
fn engine_capture_reports_validate() {
    let v = Validator::new(&["import_report", "diff_report", "drafter_report"]);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("vllm.safetensors");
    let out_s = out.to_str().unwrap();
    let m = common::captures::manifest();
    let n = common::captures::n_tiny(&m).to_string();
    let ids = common::captures::usizes(&m["vllm"]["eagle_aux_hidden_state_layer_ids"])
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let vllm = "fixtures/engine-captures/vllm/0.safetensors";
    let (code, stdout, err) = hsparity(&[
        "import",
        vllm,
        "--layer-ids",
        &ids,
        "--num-layers",
        &n,
        "--out",
        out_s,
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let r = json(&stdout, "import --json");
    v.check("import --json", &r);
    v.check_def("import_report", "import --json", &r);
    assert_eq!(r["kind"], "import");
    // a dump of prompt 0 from hsparity itself, against the partial engine dump, with --align
    let ids0 = m["sglang_dump"]["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let ours = tmp.path().join("ours.safetensors");
    let (code, _, err) = hsparity(&[
        "dump",
        "fixtures/tiny-qwen3_5",
        "--path",
        "causal-lm",
        "--prompt-ids",
        &ids0,
        "--out",
        ours.to_str().unwrap(),
        "--quiet",
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, stdout, err) = hsparity(&[
        "diff",
        ours.to_str().unwrap(),
        out_s,
        "--align",
        "--json",
        "--no-report",
    ]);
    assert_eq!(code, 0, "{err}");
    let d = json(&stdout, "diff --align --json");
    v.check("diff --align --json", &d);
    v.check_def("diff_report", "diff --align --json", &d);
    assert!(d["alignment"]["rows"]
        .as_array()
        .is_some_and(|r| !r.is_empty()));
    assert!(d["pairs"][0]["last_layer_output"].is_object());
    let (code, stdout, err) = hsparity(&[
        "drafter",
        "fixtures/toy-pair/target",
        "--drafter",
        "fixtures/toy-pair/drafter",
        "--features",
        "fixtures/engine-captures/toy-pair-specforge",
        "--max-new-tokens",
        "8",
        "--json",
        "--quiet",
    ]);
    assert_eq!(code, 0, "{err}");
    let f = json(&stdout, "drafter --features --json");
    v.check("drafter --features --json", &f);
    v.check_def("drafter_report", "drafter --features --json", &f);
    assert_eq!(f["features"]["format"], "specforge");
}

/// The MoE layouts: compare reports carry a router agreement on every MoE
/// layer's row and a converted category per path; `inventory --json`
/// validates too.
#[test]
fn moe_reports_validate() {
    let v = Validator::new(&["inventory_report"]);
    for layout in ["qwen3.5-fused", "qwen3.6-fused", "per-expert"] {
        let ckpt = format!("fixtures/moe/{layout}");
        let prompts = format!("{ckpt}/prompts.jsonl");
        let (code, out, err) = hsparity(&[
            "compare",
            &ckpt,
            "--prompts",
            &prompts,
            "--json",
            "--no-report",
            "--quiet",
        ]);
        assert_eq!(code, 0, "{layout}: {err}");
        let r = json(&out, layout);
        v.check(&format!("compare --json ({layout})"), &r);
        for pair in r["pairs"].as_array().unwrap() {
            for row in pair["hidden_states"].as_array().unwrap() {
                assert_eq!(
                    row.get("router").is_some(),
                    row["index"] != 0,
                    "{layout}: router member on every layer row"
                );
            }
        }
        for p in r["inventory"]["paths"].as_array().unwrap() {
            assert!(p["converted"].is_object(), "{layout}");
        }
        let (code, out, err) = hsparity(&["inventory", &ckpt, "--json"]);
        assert_eq!(code, 0, "{err}");
        v.check_def(
            "inventory_report",
            &format!("inventory --json ({layout})"),
            &json(&out, layout),
        );
    }
    // A diff of an hsparity MoE dump (its floor with the shadow's router
    // flips) against transformers' dump (router choices recorded).
    let tmp = tempfile::tempdir().unwrap();
    let ours = crate::noise_floor::dump_entry(tmp.path(), "moe-s0-bf16");
    let entry = "fixtures/noise-floor/moe-s0-bf16";
    let theirs = format!("{entry}/transformers.safetensors");
    let (code, out, err) = hsparity(&["diff", &ours, &theirs, "--json", "--no-report"]);
    assert_eq!(code, 0, "{err}");
    let r = json(&out, "diff (moe)");
    v.check("diff --json (moe, routers against the floor)", &r);
    assert!(
        out.contains("\"within_noise_floor\"") && out.contains("\"routers\""),
        "{out}"
    );
    // Dense pairs: no router member, no converted category.
    let (_, out, _) = hsparity(&[
        "compare",
        "fixtures/tiny-qwen3_5",
        "--json",
        "--no-report",
        "--quiet",
    ]);
    let r = json(&out, "tiny");
    assert!(
        !out.contains("\"router\"") && !out.contains("\"converted\""),
        "dense: {r}"
    );
}
