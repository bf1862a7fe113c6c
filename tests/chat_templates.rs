//! Chat templates against transformers 5.23.0 (`fixtures/chat/*.json`, written
//! by `tools/chat_fixtures.py` with `tokenizer.apply_chat_template`): every
//! rendering byte for byte and every id list exactly, for each conversation ×
//! `enable_thinking` true / false / unset × fixture (Qwen3.5, Qwen3, the two
//! toy pairs); the template lookup rules; and the error cases.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hsparity::chat::{
    self, ChatTemplate, Conversation, Json, Message, RenderOptions, TokenizerConfig,
};
use hsparity::error::Error;
use serde_json::Value;

fn golden(name: &str) -> Value {
    let p = format!("fixtures/chat/{name}.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}")))
        .unwrap()
}

fn thinking(flag: &str) -> Option<bool> {
    match flag {
        "unset" => None,
        "true" => Some(true),
        "false" => Some(false),
        other => panic!("thinking flag {other}"),
    }
}

/// The conversation of a golden line. Lines the parser refuses on purpose (no
/// user turn) are built message by message, so the template still sees them.
fn conversation(line: &str, origin: &str) -> Conversation {
    match Conversation::parse_jsonl_line(line, origin) {
        Ok(c) => c,
        Err(e) => {
            assert!(e.to_string().contains("no user turn"), "{origin}: {e}");
            let v: Json = serde_json::from_str(line).unwrap();
            let Some(Json::Array(ms)) = v.get("messages").cloned() else {
                panic!("{origin}: no messages")
            };
            Conversation {
                messages: ms
                    .into_iter()
                    .map(|m| Message::from_json(m).unwrap())
                    .collect(),
                tools: None,
                origin: origin.into(),
            }
        }
    }
}

fn check_fixture(name: &str) {
    let g = golden(name);
    let dir = PathBuf::from(g["checkpoint"].as_str().unwrap());
    let cfg = TokenizerConfig::read(&dir).unwrap();
    let tmpl = ChatTemplate::for_checkpoint(&dir, &cfg)
        .unwrap()
        .unwrap_or_else(|| panic!("{name}: no template found"));
    let src = tmpl.source();
    assert_eq!(src.path, dir.join("chat_template.jinja"), "{name}");
    assert_eq!(
        src.sha256,
        g["template"]["sha256"].as_str().unwrap(),
        "{name}"
    );
    assert_eq!(src.name, None);
    // special_tokens_map, as AutoTokenizer builds it for this checkpoint
    let want: BTreeMap<String, String> = g["special_tokens_map"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    let ours: BTreeMap<String, String> = tmpl.special_tokens().iter().cloned().collect();
    assert_eq!(ours, want, "{name}: special tokens");

    let tok = chat::load_tokenizer(&dir.join("tokenizer.json")).unwrap();
    let cases = g["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    let (mut rendered, mut rejected) = (0, 0);
    for c in cases {
        let case = format!(
            "{name}/{}/enable_thinking={}",
            c["name"].as_str().unwrap(),
            c["enable_thinking"].as_str().unwrap()
        );
        let conv = conversation(c["line"].as_str().unwrap(), &case);
        let opts = RenderOptions {
            add_generation_prompt: true,
            enable_thinking: thinking(c["enable_thinking"].as_str().unwrap()),
        };
        let out = tmpl.render(&conv, &opts);
        if let Some(err) = c["error"].as_object() {
            let e = out.expect_err(&format!("{case}: transformers raised, hsparity rendered"));
            assert!(matches!(e, Error::Input(_)), "{case}: {e:?}");
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "{case}: {msg}");
            assert!(
                msg.contains(&src.path.display().to_string()),
                "{case}: {msg}"
            );
            assert!(msg.contains(&case), "{case}: names the conversation: {msg}");
            if err["type"] == "TemplateError" {
                // raise_exception: the template's own message, verbatim
                let m = err["message"].as_str().unwrap();
                assert!(
                    msg.contains(&format!("raised an exception: {m} (")),
                    "{case}: {msg}"
                );
            }
            rejected += 1;
            continue;
        }
        let text = out.unwrap_or_else(|e| panic!("{case}: {e}"));
        let want_text = c["text"].as_str().unwrap();
        assert!(
            text == want_text,
            "{case}: rendering differs\n ours: {text:?}\n want: {want_text:?}"
        );
        let ids = chat::encode(&tok, &text, &case).unwrap();
        let want_ids: Vec<u32> = c["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(ids, want_ids, "{case}: ids");
        if g["transformers_ids_match_tokenizer_json"] == true {
            assert_eq!(c["ids"], c["transformers_ids"], "{case}");
        }
        rendered += 1;
    }
    assert!(rendered > 0 && rendered + rejected == cases.len());
}

#[test]
fn tiny_qwen3_5_matches_transformers() {
    check_fixture("tiny-qwen3_5");
}

#[test]
fn tiny_qwen3_matches_transformers() {
    check_fixture("tiny-qwen3");
}

#[test]
fn toy_pairs_match_transformers() {
    check_fixture("toy-pair");
    check_fixture("toy-pair-qwen3");
}

#[test]
fn goldens_cover_the_matrix() {
    for name in ["tiny-qwen3_5", "tiny-qwen3", "toy-pair", "toy-pair-qwen3"] {
        let g = golden(name);
        let cases = g["cases"].as_array().unwrap();
        let mut by: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for c in cases {
            by.entry(c["name"].as_str().unwrap())
                .or_default()
                .push(c["enable_thinking"].as_str().unwrap());
        }
        for (case, flags) in &by {
            let mut f = flags.clone();
            f.sort();
            assert_eq!(f, ["false", "true", "unset"], "{name}/{case}");
        }
        for need in [
            "single_user",
            "system_user",
            "multi_turn_think",
            "list_content",
            "unknown_role",
        ] {
            assert!(by.contains_key(need), "{name}: no {need} case");
        }
        // something the template rejects
        assert!(cases.iter().any(|c| !c["error"].is_null()), "{name}");
    }
    // the thinking flag changes the Qwen3.5 generation prompt, and unset is not false
    let g = golden("tiny-qwen3_5");
    let text = |flag: &str| {
        g["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "single_user" && c["enable_thinking"] == flag)
            .unwrap()["text"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(text("unset").ends_with("<|im_start|>assistant\n<think>\n"));
    assert_eq!(text("unset"), text("true"));
    assert!(text("false").ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}

/// Where the template comes from: every layout of `fixtures/chat/lookup.json`
/// rebuilt in a temporary checkpoint directory.
#[test]
fn lookup_follows_transformers() {
    let g = golden("lookup");
    let tok_dir = Path::new("fixtures/tiny-qwen3");
    let base: serde_json::Map<String, Value> = serde_json::from_str(
        &std::fs::read_to_string(tok_dir.join("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    let render_text = |text: &str| {
        ChatTemplate::from_text(text, Path::new("golden.jinja"), &TokenizerConfig::default())
            .unwrap()
            .render(&Conversation::user("x", "t"), &RenderOptions::default())
            .unwrap()
    };
    for c in g["cases"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::copy(tok_dir.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
        let mut cfg = base.clone();
        if !c["tokenizer_config_chat_template"].is_null() {
            cfg.insert(
                "chat_template".into(),
                c["tokenizer_config_chat_template"].clone(),
            );
        }
        std::fs::write(
            dir.join("tokenizer_config.json"),
            serde_json::to_string_pretty(&Value::Object(cfg)).unwrap(),
        )
        .unwrap();
        for (rel, content) in c["files"].as_object().unwrap() {
            let p = dir.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content.as_str().unwrap()).unwrap();
        }
        let tc = TokenizerConfig::read(dir).unwrap();
        let ours = ChatTemplate::for_checkpoint(dir, &tc);
        if c["chat_template"].is_null() {
            assert!(matches!(ours, Ok(None)), "{name}: {ours:?}");
            continue;
        }
        if let Some(err) = c["selected"]["error"].as_str() {
            // transformers: "This model has multiple chat templates with no default specified!"
            assert!(err.contains("no default"), "{name}: {err}");
            let e = ours.expect_err(name);
            assert!(matches!(e, Error::Config(_)), "{name}: {e:?}");
            assert!(e.to_string().contains("\"default\""), "{name}: {e}");
            continue;
        }
        let t = ours.unwrap().unwrap();
        let want = c["selected"]["template"].as_str().unwrap();
        assert_eq!(t.text(), want, "{name}: template text");
        assert_eq!(
            t.render(&Conversation::user("x", "t"), &RenderOptions::default())
                .unwrap(),
            render_text(want),
            "{name}"
        );
        // with tools: tool_use when there is one
        let want_tools = c["selected_with_tools"]["template"].as_str().unwrap();
        let mut conv = Conversation::user("x", "t");
        conv.tools = Some(vec![Json::Object(vec![])]);
        assert_eq!(
            t.render(&conv, &RenderOptions::default()).unwrap(),
            render_text(want_tools),
            "{name}: with tools"
        );
        // the named set, when transformers holds a dict
        let names: Vec<Option<String>> = t.sources().iter().map(|s| s.name.clone()).collect();
        match c["chat_template"].as_object() {
            Some(dict) => {
                let mut want: Vec<&String> = dict.keys().collect();
                want.sort();
                let mut got: Vec<String> = names.into_iter().map(Option::unwrap).collect();
                got.sort();
                assert_eq!(got.iter().collect::<Vec<_>>(), want, "{name}");
            }
            None => assert_eq!(names, [None], "{name}"),
        }
        // the file a report names
        let src = t.source();
        let expect_file = if c["files"].as_object().unwrap().is_empty() {
            "tokenizer_config.json".to_owned()
        } else if c["files"].get("chat_template.jinja").is_some() {
            "chat_template.jinja".to_owned()
        } else {
            "additional_chat_templates/default.jinja".to_owned()
        };
        assert_eq!(src.path, dir.join(expect_file), "{name}");
    }
}

#[test]
fn no_template_is_none() {
    for dir in ["fixtures/divergence/bf16-auto", "fixtures/qwen3.6-27b"] {
        let dir = Path::new(dir);
        let tc = TokenizerConfig::read(dir).unwrap();
        assert!(
            ChatTemplate::for_checkpoint(dir, &tc).unwrap().is_none(),
            "{dir:?}"
        );
        // --chat on such a checkpoint: one line naming the directory
        let e = ChatTemplate::require_for_checkpoint(dir, &tc).unwrap_err();
        assert!(matches!(e, Error::Input(_)), "{e:?}");
        let m = e.to_string();
        assert!(
            m.starts_with(&format!(
                "{}: the checkpoint has no chat template",
                dir.display()
            )),
            "{m}"
        );
        assert!(!m.contains('\n'));
    }
}

#[test]
fn bad_template_files_name_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{%- for m in messages %}\n{{ m.content }\n",
    )
    .unwrap();
    let e = ChatTemplate::for_checkpoint(dir, &TokenizerConfig::default()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert!(
        msg.contains(&dir.join("chat_template.jinja").display().to_string()),
        "{msg}"
    );
    assert!(msg.contains("does not parse"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");

    // --chat-template FILE: the same for an explicit file, and a missing one is an I/O error
    let f = dir.join("t.jinja");
    std::fs::write(&f, "{% if %}").unwrap();
    let e = ChatTemplate::from_file(&f, &TokenizerConfig::default()).unwrap_err();
    assert!(matches!(e, Error::Input(_)), "{e:?}");
    assert!(
        e.to_string().starts_with(&format!(
            "{}:1: chat template does not parse: ",
            f.display()
        )),
        "{e}"
    );
    let e = ChatTemplate::from_file(&dir.join("missing.jinja"), &TokenizerConfig::default())
        .unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");

    // a tokenizer_config.json that is not JSON, or whose chat_template has the wrong type
    let d2 = tempfile::tempdir().unwrap();
    std::fs::write(d2.path().join("tokenizer_config.json"), "{").unwrap();
    let e = TokenizerConfig::read(d2.path()).unwrap_err();
    assert!(
        matches!(e, Error::Config(_)) && e.to_string().contains("tokenizer_config.json"),
        "{e}"
    );
    std::fs::write(
        d2.path().join("tokenizer_config.json"),
        "{\"chat_template\": 3}",
    )
    .unwrap();
    let e = TokenizerConfig::read(d2.path()).unwrap_err();
    assert!(e.to_string().contains("chat_template must be"), "{e}");
}

#[test]
fn template_raises_and_failures_name_file_and_origin() {
    let dir = Path::new("fixtures/tiny-qwen3_5");
    let tc = TokenizerConfig::read(dir).unwrap();
    let t = ChatTemplate::for_checkpoint(dir, &tc).unwrap().unwrap();
    let conv = Conversation::parse_jsonl_line(
        r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "critic", "content": "meh"}]}"#,
        "msgs.jsonl:7",
    )
    .unwrap();
    let e = t.render(&conv, &RenderOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("fixtures/tiny-qwen3_5/chat_template.jinja:"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "the chat template raised an exception: Unexpected message role. (msgs.jsonl:7)"
        ),
        "{msg}"
    );
    // an error that is not raise_exception (a template bug) still names file, line and origin
    let t = ChatTemplate::from_text(
        "{{ messages[0].content + 1 }}",
        Path::new("bug.jinja"),
        &TokenizerConfig::default(),
    )
    .unwrap();
    let e = t
        .render(
            &Conversation::user("x", "--prompt #1"),
            &RenderOptions::default(),
        )
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("bug.jinja:1: rendering the chat template failed: "),
        "{msg}"
    );
    assert!(msg.ends_with("(--prompt #1)"), "{msg}");
}

#[test]
fn messages_lines_are_checked() {
    let bad = |line: &str| {
        let e = Conversation::parse_jsonl_line(line, "m.jsonl:3").unwrap_err();
        assert!(matches!(e, Error::Input(_)), "{e:?}");
        let m = e.to_string();
        assert!(m.starts_with("m.jsonl:3: "), "{m}");
        assert!(!m.contains('\n'), "{m}");
        m
    };
    assert!(bad("{\"messages\": [").contains("not valid JSON"));
    assert!(bad("[1]").contains("expected an object"));
    assert!(bad("{}").contains("no \"messages\""));
    assert!(bad("{\"messages\": []}").contains("empty"));
    assert!(bad("{\"messages\": \"hi\"}").contains("must be an array"));
    assert!(bad("{\"mesages\": []}").contains("unknown key \"mesages\""));
    assert!(bad("{\"messages\": [\"hi\"]}").contains("message 1: a message must be an object"));
    assert!(bad("{\"messages\": [{\"content\": \"hi\"}]}").contains("needs a \"role\""));
    assert!(bad("{\"messages\": [{\"role\": 1}]}").contains("\"role\" must be a string"));
    assert!(
        bad("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}")
            .contains("\"content\" must be")
    );
    assert!(
        bad("{\"messages\": [{\"role\": \"user\", \"content\": [\"x\"]}]}")
            .contains("content blocks")
    );
    assert!(
        bad("{\"messages\": [{\"role\": \"user\"}], \"tools\": 1}").contains("\"tools\" must be")
    );
    assert!(bad("{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}")
        .contains("no user turn"));
    // accepted: null content, content blocks, extra message fields, tools
    let c = Conversation::parse_jsonl_line(
        r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}], "name": null}, {"role": "assistant", "content": null, "tool_calls": []}], "tools": []}"#,
        "x",
    )
    .unwrap();
    assert_eq!(c.messages.len(), 2);
    assert_eq!(c.messages[0].role(), "user");
    assert_eq!(c.tools, Some(vec![]));
}

#[test]
fn jsonl_files_name_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("m.jsonl");
    std::fs::write(
        &f,
        "\u{feff}{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"b\"}]}\n",
    )
    .unwrap();
    let cs = Conversation::read_jsonl(&f).unwrap();
    assert_eq!(cs.len(), 2);
    assert_eq!(cs[0].origin, format!("{}:1", f.display()));
    assert_eq!(cs[1].origin, format!("{}:3", f.display()));
    std::fs::write(
        &f,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\nnope\n",
    )
    .unwrap();
    let e = Conversation::read_jsonl(&f).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("{}:2: not valid JSON", f.display())),
        "{e}"
    );
    std::fs::write(&f, "\n \n").unwrap();
    assert!(Conversation::read_jsonl(&f)
        .unwrap_err()
        .to_string()
        .contains("no conversations"));
    std::fs::write(&f, b"\xff\xfe").unwrap();
    assert!(Conversation::read_jsonl(&f)
        .unwrap_err()
        .to_string()
        .contains("not UTF-8"));
}

#[test]
fn system_and_user_helpers_render_like_a_line() {
    let dir = Path::new("fixtures/tiny-qwen3_5");
    let t = ChatTemplate::for_checkpoint(dir, &TokenizerConfig::read(dir).unwrap())
        .unwrap()
        .unwrap();
    let g = golden("tiny-qwen3_5");
    let case = g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "system_user" && c["enable_thinking"] == "false")
        .unwrap();
    let line: Value = serde_json::from_str(case["line"].as_str().unwrap()).unwrap();
    let sys = line["messages"][0]["content"].as_str().unwrap();
    let user = line["messages"][1]["content"].as_str().unwrap();
    let conv = Conversation::user(user, "--prompt #1").with_system(sys);
    let opts = RenderOptions {
        enable_thinking: Some(false),
        ..RenderOptions::default()
    };
    assert_eq!(
        t.render(&conv, &opts).unwrap(),
        case["text"].as_str().unwrap()
    );
    assert_eq!(chat::thinking_label(None), "unset");
    assert_eq!(chat::thinking_label(Some(false)), "false");
}
