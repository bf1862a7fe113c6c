//! The prompt options end to end (`--messages`, `--chat`, `--chat-template`,
//! `--enable-thinking`, `--system`, `--prompt-set`) through the binary:
//! `hsparity prompts` shows exactly transformers 5.23.0's
//! `apply_chat_template` rendering and the `tokenizer.json` ids of every
//! golden conversation (`fixtures/chat/*.json`, `tools/chat_fixtures.py`) and
//! of the benchmark sets (`fixtures/chat/prompt-sets.json`); the other verbs
//! feed those ids and record the template, the thinking flag and each
//! prompt's token count and text sha256; bad input exits 2 with one line
//! naming the line or file.

use crate::common;

use std::path::{Path, PathBuf};

use common::{hsparity, same_len};
use serde_json::Value;
use sha2::{Digest, Sha256};

const FIXTURES: [&str; 4] = ["tiny-qwen3_5", "tiny-qwen3", "toy-pair", "toy-pair-qwen3"];

fn golden(name: &str) -> Value {
    let p = format!("fixtures/chat/{name}.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}")))
        .unwrap()
}

/// Runs `hsparity args…`: (exit code, stdout, stderr).
fn run(args: &[&str]) -> (i32, String, String) {
    let out = hsparity().args(args).output().expect("runs hsparity");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `hsparity prompts args… --json`: exit 0, or 1 when it lists prompts a
/// run would refuse (over `max_position_embeddings`).
fn listing(args: &[&str]) -> Value {
    let mut all = vec!["prompts"];
    all.extend_from_slice(args);
    all.push("--json");
    let (c, out, err) = run(&all);
    let rep: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{all:?}: {e}: {out}{err}"));
    let refused = !rep["refused"].as_array().unwrap().is_empty();
    assert_eq!(c, i32::from(refused), "{all:?}: {err}");
    assert_eq!(rep["exit_code"], c);
    rep
}

/// A bad input: exit 2, one line on stderr holding every `needle`.
fn refused(args: &[&str], needles: &[&str]) {
    let (c, out, err) = run(args);
    assert_eq!(c, 2, "{args:?} should be refused: {out}{err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: one line: {err}"
    );
    for n in needles {
        assert!(err.contains(n), "{args:?}: {err:?} should name {n:?}");
    }
    assert!(out.is_empty(), "{args:?}: no report on stdout: {out}");
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn sha256(text: &str) -> String {
    format!("{:x}", Sha256::digest(text.as_bytes()))
}

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The `--enable-thinking` arguments of a golden flag (`unset`: none).
fn thinking_args(flag: &str) -> Vec<&str> {
    match flag {
        "unset" => vec![],
        f => vec!["--enable-thinking", f],
    }
}

/// Every golden conversation the parser accepts and the template renders,
/// one `--messages` file per fixture and flag: text byte for byte, ids
/// exactly, the text's sha256, and the environment's template and flag.
#[test]
fn messages_render_every_golden_conversation() {
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for fx in FIXTURES {
        let g = golden(fx);
        let ckpt = g["checkpoint"].as_str().unwrap();
        for flag in ["unset", "true", "false"] {
            let cases: Vec<&Value> = g["cases"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|c| c["enable_thinking"] == flag && c["error"].is_null())
                .filter(|c| c["name"] != "no_user_turn")
                .collect();
            assert!(cases.len() >= 5, "{fx}/{flag}");
            let lines: Vec<&str> = cases.iter().map(|c| c["line"].as_str().unwrap()).collect();
            let f = write(
                tmp.path(),
                &format!("{fx}-{flag}.jsonl"),
                &(lines.join("\n") + "\n"),
            );
            let mut args = vec![ckpt, "--messages", s(&f)];
            args.extend(thinking_args(flag));
            let rep = listing(&args);
            let env = &rep["environment"];
            assert_eq!(env["enable_thinking"], flag, "{fx}");
            assert_eq!(env["chat_template"]["file"], g["template"]["file"], "{fx}");
            assert_eq!(
                env["chat_template"]["sha256"], g["template"]["sha256"],
                "{fx}"
            );
            let shown = rep["prompts"].as_array().unwrap();
            same_len(&format!("{fx}/{flag}"), shown, &cases);
            for (k, (p, c)) in shown.iter().zip(&cases).enumerate() {
                let case = format!("{fx}/{}/{flag}", c["name"]);
                let want = c["text"].as_str().unwrap();
                assert!(
                    p["text"] == want,
                    "{case}: rendering differs\n ours: {}\n want: {want:?}",
                    p["text"]
                );
                assert_eq!(ids(&p["ids"]), ids(&c["ids"]), "{case}");
                assert_eq!(p["rendered_sha256"], sha256(want), "{case}");
                assert_eq!(p["tokens"], c["ids"].as_array().unwrap().len(), "{case}");
                assert_eq!(p["source"], "messages");
                assert_eq!(p["origin"], format!("{}:{}", f.display(), k + 1));
                assert_eq!(env["prompts"][k]["tokens"], p["tokens"], "{case}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 100, "{checked} renderings checked");
}

/// A conversation the template rejects (`raise_exception`): exit 2 naming
/// the template file and the line, with the template's own message.
#[test]
fn template_exceptions_name_the_line_and_the_template() {
    let tmp = tempfile::tempdir().unwrap();
    let mut seen = 0;
    for fx in FIXTURES {
        let g = golden(fx);
        let ckpt = g["checkpoint"].as_str().unwrap();
        for c in g["cases"].as_array().unwrap() {
            if c["error"]["type"] != "TemplateError" || c["name"] == "no_user_turn" {
                continue;
            }
            // the rejected conversation on line 2, after one that renders
            let ok = r#"{"messages": [{"role": "user", "content": "count 1: 1 2"}]}"#;
            let f = write(
                tmp.path(),
                "bad.jsonl",
                &format!("{ok}\n{}\n", c["line"].as_str().unwrap()),
            );
            let mut args = vec!["prompts", ckpt, "--messages", s(&f)];
            args.extend(thinking_args(c["enable_thinking"].as_str().unwrap()));
            let line = format!("{}:2", f.display());
            let msg = c["error"]["message"].as_str().unwrap();
            refused(
                &args,
                &[g["template"]["file"].as_str().unwrap(), &line, msg],
            );
            seen += 1;
        }
    }
    assert!(seen >= 10, "{seen}");
}

/// The Qwen3 template never calls `raise_exception` for a role it does not
/// know: transformers drops the turn, and so does hsparity.
#[test]
fn qwen3_drops_unknown_roles() {
    let g = golden("tiny-qwen3");
    let c = g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "unknown_role" && c["enable_thinking"] == "unset")
        .unwrap();
    assert!(c["error"].is_null(), "transformers renders it");
    let tmp = tempfile::tempdir().unwrap();
    let f = write(tmp.path(), "m.jsonl", c["line"].as_str().unwrap());
    let rep = listing(&["fixtures/tiny-qwen3", "--messages", s(&f)]);
    assert_eq!(rep["prompts"][0]["text"], c["text"]);
    assert!(!c["text"].as_str().unwrap().contains("narrator"));
}

/// The content of message `i` of a golden line.
fn content(line: &str, i: usize) -> String {
    let v: Value = serde_json::from_str(line).unwrap();
    v["messages"][i]["content"].as_str().unwrap().to_owned()
}

fn case<'a>(g: &'a Value, name: &str, flag: &str) -> &'a Value {
    g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name && c["enable_thinking"] == flag)
        .unwrap_or_else(|| panic!("no golden case {name}/{flag}"))
}

/// `--chat --prompt TEXT` is the golden one-user-turn conversation, and
/// `--system` puts the golden system turn before it; `--chat` applies to the
/// text lines of `--prompts` too.
#[test]
fn chat_and_system_match_the_golden_conversations() {
    let tmp = tempfile::tempdir().unwrap();
    for fx in FIXTURES {
        let g = golden(fx);
        let ckpt = g["checkpoint"].as_str().unwrap();
        for flag in ["unset", "true", "false"] {
            let single = case(&g, "single_user", flag);
            let user = content(single["line"].as_str().unwrap(), 0);
            let mut args = vec![ckpt, "--chat", "--prompt", &user];
            args.extend(thinking_args(flag));
            let rep = listing(&args);
            let p = &rep["prompts"][0];
            assert_eq!(p["text"], single["text"], "{fx}/{flag}");
            assert_eq!(ids(&p["ids"]), ids(&single["ids"]), "{fx}/{flag}");
            assert_eq!(
                (p["source"].as_str(), p["chat"].as_bool()),
                (Some("text"), Some(true))
            );

            let line = format!("{}\n", serde_json::json!({ "text": user }));
            let f = write(tmp.path(), "p.jsonl", &line);
            let mut args = vec![ckpt, "--chat", "--prompts", s(&f)];
            args.extend(thinking_args(flag));
            assert_eq!(listing(&args)["prompts"][0]["text"], single["text"]);

            let sys = case(&g, "system_user", flag);
            let l = sys["line"].as_str().unwrap();
            let (system, user) = (content(l, 0), content(l, 1));
            let mut args = vec![ckpt, "--chat", "--prompt", &user, "--system", &system];
            args.extend(thinking_args(flag));
            let rep = listing(&args);
            assert_eq!(rep["prompts"][0]["text"], sys["text"], "{fx}/{flag}");
            assert_eq!(ids(&rep["prompts"][0]["ids"]), ids(&sys["ids"]));
            assert_eq!(rep["environment"]["system"], system.as_str());
        }
    }
}

/// Without `--chat` a text prompt is tokenised as given, and nothing names a
/// template.
#[test]
fn raw_text_is_not_rendered() {
    let g = golden("tiny-qwen3_5");
    let user = content(
        case(&g, "single_user", "unset")["line"].as_str().unwrap(),
        0,
    );
    let rep = listing(&["fixtures/tiny-qwen3_5", "--prompt", &user]);
    let p = &rep["prompts"][0];
    assert_eq!(p["text"], user.as_str());
    assert_eq!(p["chat"], false);
    assert_eq!(p["rendered_sha256"], sha256(&user));
    assert!(rep["environment"]["chat_template"].is_null());
    assert_eq!(rep["environment"]["enable_thinking"], "unset");
    let ids_only = listing(&["fixtures/tiny-qwen3_5", "--prompt-ids", "1,2,3"]);
    assert!(ids_only["prompts"][0]["text"].is_null());
    assert!(ids_only["prompts"][0]["rendered_sha256"].is_null());
}

/// `--chat-template FILE` replaces the checkpoint's: a copy of the Qwen3.5
/// fixture without its template refuses `--chat`, and renders the goldens
/// with the template given.
#[test]
fn chat_template_file_overrides_the_checkpoints() {
    let g = golden("tiny-qwen3_5");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    common::copy_tiny(&dir);
    std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
    let single = case(&g, "single_user", "false");
    let user = content(single["line"].as_str().unwrap(), 0);
    refused(
        &["prompts", s(&dir), "--chat", "--prompt", &user],
        &[s(&dir), "no chat template", "--chat-template"],
    );
    let tmpl = g["template"]["file"].as_str().unwrap();
    let rep = listing(&[
        s(&dir),
        "--chat",
        "--prompt",
        &user,
        "--enable-thinking",
        "false",
        "--chat-template",
        tmpl,
    ]);
    assert_eq!(rep["prompts"][0]["text"], single["text"]);
    assert_eq!(rep["environment"]["chat_template"]["file"], tmpl);
    assert_eq!(
        rep["environment"]["chat_template"]["sha256"],
        g["template"]["sha256"]
    );
}

/// `--prompt-set NAME:4` is z-lab/dflash `benchmark.py --max-samples 4`:
/// its rows in its order, rendered and tokenised as transformers does
/// (`prompt-sets.json`); prompts over `max_position_embeddings` are listed
/// and refused (exit 1), as a run would refuse them.
#[test]
fn prompt_sets_render_like_zlab_benchmark() {
    let g = golden("prompt-sets");
    let ckpt = g["rendered_with"].as_str().unwrap();
    let mut checked = 0;
    for (name, set) in g["sets"].as_object().unwrap() {
        let rows: Vec<u64> = set["max_samples_4"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["row"].as_u64().unwrap())
            .collect();
        for flag in ["true", "false"] {
            let spec = format!("{name}:4");
            let rep = listing(&[ckpt, "--prompt-set", &spec, "--enable-thinking", flag]);
            let env = &rep["environment"];
            assert_eq!(env["prompt_set"]["name"], name.as_str());
            assert_eq!(env["prompt_set"]["n"], 4);
            assert_eq!(env["enable_thinking"], flag);
            let shown = rep["prompts"].as_array().unwrap();
            same_len(name, shown, &rows);
            for (p, row) in shown.iter().zip(&rows) {
                assert!(
                    p["origin"]
                        .as_str()
                        .unwrap()
                        .starts_with(&format!("{name} row {row}")),
                    "{}",
                    p["origin"]
                );
                assert_eq!(p["source"], "prompt-set");
            }
            for r in set["rendered_max_samples_4"].as_array().unwrap() {
                if r["enable_thinking"].as_bool().unwrap().to_string() != flag {
                    continue;
                }
                let k = rows
                    .iter()
                    .position(|&x| Some(x) == r["row"].as_u64())
                    .unwrap();
                assert_eq!(shown[k]["text"], r["text"], "{name} row {}", r["row"]);
                assert_eq!(ids(&shown[k]["ids"]), ids(&r["ids"]), "{name}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "{checked}");
}

/// Bad input: exit 2 with one line naming the line or the file.
#[test]
fn bad_prompt_input_exits_2_naming_the_line_or_file() {
    let tmp = tempfile::tempdir().unwrap();
    let ok = r#"{"messages": [{"role": "user", "content": "Hello"}]}"#;
    let not_json = write(
        tmp.path(),
        "a.jsonl",
        &format!("{ok}\n{{\"messages\": [oops\n"),
    );
    let no_user = write(
        tmp.path(),
        "b.jsonl",
        &format!(
            "{ok}\n\n{}\n",
            r#"{"messages": [{"role": "system", "content": "x"}]}"#
        ),
    );
    let with_system = write(
        tmp.path(),
        "c.jsonl",
        r#"{"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]}"#,
    );
    let bad_tmpl = write(
        tmp.path(),
        "t.jinja",
        "{% for m in messages %}{{ m.content }\n",
    );
    let q = "fixtures/tiny-qwen3_5";
    let line = |f: &Path, n: usize| format!("{}:{n}", f.display());
    refused(
        &["prompts", q, "--messages", s(&not_json)],
        &[&line(&not_json, 2), "not valid JSON"],
    );
    refused(
        &["prompts", q, "--messages", s(&no_user)],
        &[&line(&no_user, 3), "no user turn"],
    );
    refused(
        &[
            "prompts",
            q,
            "--chat",
            "--prompt",
            "hi",
            "--chat-template",
            s(&bad_tmpl),
        ],
        &[&format!("{}:1", bad_tmpl.display()), "does not parse"],
    );
    refused(
        &["prompts", q, "--prompt-set", "gsm9k"],
        &["--prompt-set", "gsm9k", "gsm8k, humaneval"],
    );
    refused(
        &["prompts", q, "--prompt-set", "gsm8k:0"],
        &["--prompt-set", "gsm8k:0", "at least 1"],
    );
    refused(
        &[
            "prompts",
            "fixtures/divergence/fp16-disk",
            "--chat",
            "--prompt",
            "hi",
        ],
        &["fixtures/divergence/fp16-disk", "no chat template"],
    );
    refused(
        &[
            "prompts",
            q,
            "--messages",
            s(&with_system),
            "--system",
            "again",
        ],
        &[&line(&with_system, 1), "--system"],
    );
    for flag in [
        ["--enable-thinking", "true"],
        ["--system", "x"],
        ["--chat-template", "t.jinja"],
    ] {
        refused(
            &["prompts", q, "--prompt", "hi", flag[0], flag[1]],
            &[flag[0], "--chat"],
        );
    }
    refused(
        &["prompts", q, "--chat", "--prompt-ids", "1,2"],
        &["--chat", "--prompt-ids"],
    );
    refused(
        &["prompts", q, "--chat", "--enable-thinking", "yes"],
        &["--enable-thinking", "true, false"],
    );
    refused(
        &[
            "prompts",
            "fixtures/toy-pair/target",
            "--messages",
            s(&tmp.path().join("missing.jsonl")),
        ],
        &["missing.jsonl"],
    );
}

/// Every verb that takes prompts takes the prompt options: the same bad
/// input is refused by each before any work, with the same line.
#[test]
fn every_verb_takes_the_prompt_options() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("d.safetensors");
    let toy = "fixtures/toy-pair/target";
    let dr = "fixtures/toy-pair/drafter";
    let g = golden("toy-pair");
    let c = case(&g, "unknown_role", "unset");
    let f = write(tmp.path(), "m.jsonl", c["line"].as_str().unwrap());
    let msg = c["error"]["message"].as_str().unwrap();
    let verbs: [Vec<&str>; 5] = [
        vec!["compare", toy, "--no-report"],
        vec!["dump", toy, "--path", "causal-lm", "--out", s(&out)],
        vec!["drafter", toy, "--drafter", dr],
        vec!["triage", toy, "--drafter", dr, "--no-report"],
        vec!["prompts", toy],
    ];
    for v in &verbs {
        let mut a = v.clone();
        a.extend(["--messages", s(&f)]);
        refused(&a, &[&format!("{}:1", f.display()), msg]);
        let mut a = v.clone();
        a.extend(["--prompt-set", "mt-bench:0"]);
        refused(&a, &["mt-bench:0"]);
    }
    assert!(!out.exists(), "dump wrote nothing");
}

/// What `prompts` shows is what the other verbs feed: `dump`'s input_ids,
/// `compare`'s prompts and the environment of `drafter` (which names the
/// template and the flag) agree with it.
#[test]
fn the_verbs_feed_what_prompts_shows() {
    let tmp = tempfile::tempdir().unwrap();
    let toy = "fixtures/toy-pair/target";
    let base = [
        toy,
        "--prompts",
        "fixtures/toy-pair/prompts.jsonl",
        "--chat",
    ];
    let g = golden("toy-pair");
    for flag in ["true", "false"] {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(["--enable-thinking", flag]);
        let shown = listing(&args);
        let shown = shown["prompts"].as_array().unwrap();

        // dump: p{k}.input_ids are the ids shown
        let out = tmp.path().join(format!("{flag}.safetensors"));
        let mut a = vec!["dump"];
        a.extend(&args);
        a.extend([
            "--path",
            "causal-lm",
            "--out",
            s(&out),
            "--quiet",
            "--no-logits",
        ]);
        let (c, _, err) = run(&a);
        assert_eq!(c, 0, "{err}");
        let t = candle_core::safetensors::load(&out, &candle_core::Device::Cpu).unwrap();
        for (k, p) in shown.iter().enumerate() {
            let dumped: Vec<i64> = t[&format!("p{k}.input_ids")].to_vec1().unwrap();
            let want: Vec<i64> = ids(&p["ids"]).into_iter().map(|i| i as i64).collect();
            assert_eq!(dumped, want, "dump p{k}");
        }

        // drafter --json: the environment names the template and the flag
        let mut a = vec!["drafter"];
        a.extend(&args);
        a.extend([
            "--drafter",
            "fixtures/toy-pair/drafter",
            "--paths",
            "causal-lm",
        ]);
        a.extend(["--max-new-tokens", "8", "--json", "--quiet"]);
        let (c, out, err) = run(&a);
        assert_eq!(c, 0, "{err}");
        let rep: Value = serde_json::from_str(&out).unwrap();
        let env = &rep["environment"];
        assert_eq!(env["enable_thinking"], flag);
        assert_eq!(env["chat_template"]["file"], g["template"]["file"]);
        assert_eq!(env["chat_template"]["sha256"], g["template"]["sha256"]);
        let facts = env["prompts"].as_array().unwrap();
        same_len("drafter environment.prompts", facts, shown);
        for (f, p) in facts.iter().zip(shown) {
            assert_eq!(f["rendered_sha256"], p["rendered_sha256"]);
            assert_eq!(f["tokens"], p["tokens"]);
            assert_eq!(f["chat"], true);
        }
    }

    // compare: prompts[] carry the same sha256 and token counts
    let mut a = vec!["compare"];
    a.extend(base);
    a.extend(["--no-report", "--json", "--quiet", "--no-incremental"]);
    let (c, out, err) = run(&a);
    assert_eq!(c, 0, "{err}");
    let rep: Value = serde_json::from_str(&out).unwrap();
    let shown = listing(&base);
    let shown = shown["prompts"].as_array().unwrap();
    let prompts = rep["prompts"].as_array().unwrap();
    same_len("compare prompts", prompts, shown);
    for (p, want) in prompts.iter().zip(shown) {
        assert_eq!(p["rendered_sha256"], want["rendered_sha256"]);
        assert_eq!(p["tokens"], want["tokens"]);
        assert_eq!(p["origin"], want["origin"]);
    }
    assert_eq!(rep["environment"]["enable_thinking"], "unset");
}

/// The README's toy-pair demonstration is current: each `$ hsparity …` line
/// of the prompts section, run as written, prints the lines the README shows
/// after it (τ with `--enable-thinking true` and `false`, and the line that
/// names the template and the flag).
#[test]
fn readme_thinking_demo_is_what_the_tool_prints() {
    let readme = std::fs::read_to_string(common::repo_root().join("README.md")).unwrap();
    let lines: Vec<&str> = readme.lines().collect();
    let mut runs = 0;
    for (i, l) in lines.iter().enumerate() {
        let Some(cmd) = l.strip_prefix("$ hsparity ") else {
            continue;
        };
        let shown: Vec<&str> = lines[i + 1..]
            .iter()
            .take_while(|x| !x.starts_with("$ ") && !x.starts_with("```"))
            .copied()
            .collect();
        let mut args: Vec<&str> = cmd.split_whitespace().collect();
        args.push("--quiet");
        let (c, out, err) = run(&args);
        assert_eq!(c, 0, "{cmd}: {err}");
        let printed: Vec<&str> = out.lines().take(shown.len()).collect();
        assert_eq!(printed, shown, "README.md:{}: {cmd}", i + 1);
        assert!(shown.iter().any(|x| x.contains("enable_thinking")), "{cmd}");
        runs += 1;
    }
    assert!(runs >= 2, "the README shows the true and false runs");
}

/// `hsparity drafter TARGET --drafter DRAFTER ARGS… --json`: exit code and JSON.
fn drafter_json(target: &std::path::Path, args: &[&str]) -> (i32, Value, String) {
    let out = hsparity()
        .arg("drafter")
        .arg(target)
        .args([
            "--drafter",
            "fixtures/toy-pair/drafter",
            "--max-new-tokens",
            "4",
        ])
        .args(args)
        .args(["--quiet", "--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), v, err)
}

/// Without prompt options a drafter run measures τ on the drafter default:
/// 2 records of each built-in set in z-lab/dflash `benchmark.py`'s order
/// (`mix:2`) that fit the target, rendered with the checkpoint's template,
/// thinking off; every τ line says so.
#[test]
fn a_drafter_run_without_prompts_measures_tau_on_the_benchmark_default() {
    let root = common::repo_root();
    let target = root.join("fixtures/toy-pair/target");
    let (code, v, err) = drafter_json(&target, &[]);
    assert_eq!(code, 0, "{err}");
    let env = &v["environment"];
    assert_eq!(env["prompt_basis"], "drafter-default");
    assert_eq!(v["prompt_basis"], "drafter-default");
    assert_eq!(env["enable_thinking"], "false");
    assert_eq!(env["prompt_set"]["name"], "mix");
    assert_eq!(env["prompt_set"]["n"], 2);
    let sets: Vec<&str> = env["prompt_set"]["sets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(sets, hsparity::prompt_sets::MIX_ORDER);
    let prompts = env["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 10);
    assert!(prompts
        .iter()
        .all(|p| p["chat"] == true && p["source"] == "prompt-set"));
    let summary = v["summary"].as_str().unwrap();
    assert!(
        summary.contains("τ on 10 prompts: the drafter default mix:2"),
        "{summary}"
    );
    assert!(summary.contains("enable_thinking false"), "{summary}");
    // Each set's records are its first in benchmark.py's order that fit in
    // half the toy target's positions; the ones passed over are named.
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(target.join("config.json")).unwrap())
            .unwrap();
    let max_pos = cfg["text_config"]["max_position_embeddings"]
        .as_u64()
        .unwrap() as usize;
    let room = max_pos / 2;
    for (k, name) in hsparity::prompt_sets::MIX_ORDER.iter().enumerate() {
        let order = hsparity::prompt_sets::zlab_permutation(name, 0).unwrap();
        let rows: Vec<usize> = prompts[2 * k..2 * k + 2]
            .iter()
            .map(|p| {
                let o = p["origin"].as_str().unwrap();
                o.split(" row ")
                    .nth(1)
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        let (a, b) = (
            order.iter().position(|&r| r == rows[0]).unwrap(),
            order.iter().position(|&r| r == rows[1]).unwrap(),
        );
        assert!(a < b, "{name}: {rows:?} in benchmark.py's order");
        let passed_over = &order[..b];
        let selection = env["prompt_set"]["sets"][k]["selection"].as_str().unwrap();
        if passed_over.len() > 1 {
            assert!(
                selection.contains("passed over: longer than"),
                "{name}: {selection}"
            );
            assert!(selection.contains(&format!("{room} tokens")), "{selection}");
        }
        assert!(prompts[2 * k]["tokens"].as_u64().unwrap() <= room as u64);
    }
    assert!(
        summary.contains("longer than half the target's positions passed over"),
        "{summary}"
    );
    // The default is the checkpoint's alone: another --max-new-tokens (or
    // triage) runs the same prompts.
    let other = common::json_of(
        hsparity()
            .args(["compare", "fixtures/toy-pair/target"])
            .args(["--drafter", "fixtures/toy-pair/drafter"])
            .args(["--max-new-tokens", "32", "--quiet", "--json", "--no-report"]),
    );
    assert_eq!(
        other["environment"]["prompts_sha256"],
        env["prompts_sha256"]
    );
}

/// A checkpoint without a chat template feeds the default's user turns as
/// raw text; one without a tokenizer runs the parity token ids, and the τ
/// line says they are not a benchmark.
#[test]
fn the_drafter_default_without_a_template_or_a_tokenizer_says_what_ran() {
    let tmp = tempfile::tempdir().unwrap();
    let src = common::repo_root().join("fixtures/toy-pair/target");
    let copy = |name: &str, files: &[&str]| {
        let d = tmp.path().join(name);
        std::fs::create_dir(&d).unwrap();
        for f in files {
            std::fs::copy(src.join(f), d.join(f)).unwrap();
        }
        d
    };
    let raw = copy(
        "raw",
        &["config.json", "model.safetensors", "tokenizer.json"],
    );
    let (code, v, err) = drafter_json(&raw, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["prompt_basis"], "drafter-default");
    let prompts = v["environment"]["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 10);
    assert!(prompts.iter().all(|p| p["chat"] == false), "{prompts:?}");
    assert!(v["summary"]
        .as_str()
        .unwrap()
        .contains("raw text (the checkpoint has no chat template)"));
    for flag in [
        &["--enable-thinking", "true"][..],
        &["--chat"],
        &["--system", "Be brief."],
    ] {
        let (code, _, err) = drafter_json(&raw, flag);
        assert_eq!(code, 2, "{flag:?}: {err}");
        assert!(
            err.contains(&format!("{}: ", flag[0]))
                && err.contains("has no chat template to render the default prompts with"),
            "{flag:?}: {err}"
        );
    }
    let ids = copy("ids", &["config.json", "model.safetensors"]);
    let (code, v, err) = drafter_json(&ids, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["prompt_basis"], "builtin-ids");
    assert!(v["summary"].as_str().unwrap().contains("not a τ benchmark"));
}
