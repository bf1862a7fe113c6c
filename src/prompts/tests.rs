//! Unit tests of prompt resolution.

use super::*;

#[test]
fn builtin_ids_are_deterministic_and_in_range() {
    let a = builtin_ids(384);
    assert_eq!(a, builtin_ids(384));
    assert_eq!(a[1].len(), 100);
    assert!(a.iter().flatten().all(|&i| i < 384));
}

#[test]
fn limits_are_enforced() {
    let lim = PromptLimits {
        vocab_size: 10,
        max_tokens: 3,
    };
    let long = PromptOptions {
        ids: vec![vec![1, 2, 3, 4]],
        ..Default::default()
    };
    let e = resolve(&long, None, lim).unwrap_err().to_string();
    assert!(e.contains("max_position_embeddings = 3"), "{e}");
    let oob = PromptOptions {
        ids: vec![vec![10]],
        ..Default::default()
    };
    assert!(resolve(&oob, None, lim)
        .unwrap_err()
        .to_string()
        .contains("out of range"));
    let text = PromptOptions {
        texts: vec!["hi".into()],
        ..Default::default()
    };
    assert!(resolve(&text, None, lim)
        .unwrap_err()
        .to_string()
        .contains("tokenizer.json"));
    assert!(parse_ids("1, x").is_err());
}

#[test]
fn errors_name_the_source_and_keep_the_index() {
    let lim = PromptLimits {
        vocab_size: 10,
        max_tokens: 4,
    };
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("p.jsonl");
    std::fs::write(&f, "{\"input_ids\": [1]}\n\n{\"input_ids\": [2, 11]}\n").unwrap();
    let opts = PromptOptions {
        ids: vec![vec![1, 2], vec![3]],
        file: Some(f.clone()),
        ..Default::default()
    };
    let e = resolve(&opts, None, lim).unwrap_err().to_string();
    let want = format!(
        "prompt 3 ({}:3): token id 11 at position 1 is out of range",
        f.display()
    );
    assert!(e.contains(&want), "{e}");
    let opts = PromptOptions {
        ids: vec![vec![1, 2], vec![]],
        ..Default::default()
    };
    let e = resolve(&opts, None, lim).unwrap_err().to_string();
    assert_eq!(e, "prompt 1 (--prompt-ids #2) has no tokens");
    let opts = PromptOptions {
        ids: vec![vec![1; 5]],
        ..Default::default()
    };
    let e = resolve(&opts, None, lim).unwrap_err().to_string();
    assert!(
        e.starts_with("prompt 0 (--prompt-ids #1) has 5 tokens"),
        "{e}"
    );
    let opts = PromptOptions {
        texts: vec!["a".into(), "b".into()],
        ..Default::default()
    };
    let e = resolve(&opts, None, lim).unwrap_err().to_string();
    assert!(e.starts_with("--prompt #1: text prompt"), "{e}");
    assert!(parse_ids("").unwrap().is_empty());
    for empty in ["1,,2", "1,2,", ",1"] {
        let e = parse_ids(empty).unwrap_err().to_string();
        assert!(e.contains("is empty"), "{empty}: {e}");
    }
    assert!(parse_ids("1,x")
        .unwrap_err()
        .to_string()
        .contains("--prompt-ids \"1,x\""));
}

#[test]
fn malformed_prompt_files() {
    let lim = PromptLimits {
        vocab_size: 10,
        max_tokens: 4,
    };
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("p.jsonl");
    let run = |body: &[u8]| {
        std::fs::write(&f, body).unwrap();
        let opts = PromptOptions {
            file: Some(f.clone()),
            ..Default::default()
        };
        let e = resolve(&opts, None, lim).unwrap_err().to_string();
        assert!(e.contains(&f.display().to_string()), "{e}");
        assert!(!e.contains('\n'), "{e}");
        e
    };
    let e = run(b"{\"input_ids\": [1]}\n[1, 2]\n");
    assert!(
        e.contains(
            ":2: line 2: expected an object {\"text\": \u{2026}} or {\"input_ids\": [\u{2026}]}"
        ),
        "{e}"
    );
    assert!(run(b"5\n").contains("line 1: expected an object"));
    assert!(run(b"\xff\xfe{}").contains("not UTF-8"));
    assert!(run(b"{\"input_ids\": \"12\"}").contains("input_ids: invalid type"));
    assert!(run(b"{\"input_ids\": [-1]}").contains("negative"));
    assert!(run(b"{\"txt\": \"a\"}").contains("unknown field"));
    assert!(run(b"{\"text\": \"a\", \"input_ids\": [1]}").contains("exactly one"));
    assert!(run(b"{\"input_ids\": [1,}").contains("line 1: not valid JSON at column"));
    assert!(run(b"\n  \n").contains("no prompts"));
    // A UTF-8 byte-order mark is skipped.
    std::fs::write(&f, "\u{feff}{\"input_ids\": [1]}\n").unwrap();
    let opts = PromptOptions {
        file: Some(f.clone()),
        ..Default::default()
    };
    let p = resolve(&opts, None, lim).unwrap();
    assert_eq!(p[0].origin, format!("{}:1", f.display()));
}

fn tiny() -> (PathBuf, PathBuf, PromptLimits) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-qwen3_5");
    let tok = dir.join("tokenizer.json");
    let lim = PromptLimits {
        vocab_size: 384,
        max_tokens: 512,
    };
    (dir, tok, lim)
}

#[test]
fn prompts_come_in_option_order_with_their_origins() {
    let (dir, tok, lim) = tiny();
    let tmp = tempfile::tempdir().unwrap();
    let msgs = tmp.path().join("m.jsonl");
    std::fs::write(
        &msgs,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n",
    )
    .unwrap();
    let opts = PromptOptions {
        texts: vec!["a".into()],
        ids: vec![vec![1, 2]],
        messages: Some(msgs.clone()),
        chat: true,
        prompt_set: Some(PromptSetSpec::parse("mbpp:1").unwrap()),
        enable_thinking: Some(false),
        ..Default::default()
    };
    let r = resolve_in(&opts, Some(&dir), Some(&tok), lim).unwrap();
    let got: Vec<(&str, bool)> = r
        .prompts
        .iter()
        .map(|p| (p.kind(), p.chat.is_some()))
        .collect();
    assert_eq!(
        got,
        [
            ("text", true),
            ("ids", false),
            ("messages", true),
            ("prompt-set", true)
        ]
    );
    assert_eq!(r.prompts[0].origin, "--prompt #1");
    assert_eq!(r.prompts[2].origin, format!("{}:1", msgs.display()));
    assert!(r.prompts[3].origin.starts_with("mbpp row "));
    assert_eq!(r.prompts[1].fed_text(), None);
    assert_eq!(r.prompts[0].text(), Some("a"), "the text as given");
    assert_ne!(r.prompts[0].fed_text(), Some("a"), "the rendering");
    let t = r.rendering.template.unwrap();
    assert_eq!(t.path, dir.join("chat_template.jinja"));
    assert_eq!(r.rendering.enable_thinking, Some(false));
    assert_eq!(r.rendering.prompt_set.unwrap().spec.n, Some(1));
}

#[test]
fn violations_are_listed_not_raised_by_collect() {
    let (dir, tok, _) = tiny();
    let lim = PromptLimits {
        vocab_size: 384,
        max_tokens: 8,
    };
    let opts = PromptOptions {
        texts: vec!["a".into()],
        chat: true,
        ..Default::default()
    };
    let r = collect(&opts, Some(&dir), Some(&tok), lim).unwrap();
    let v = violations(&r.prompts, lim);
    assert_eq!(v.len(), 1);
    assert!(v[0].starts_with("prompt 0 (--prompt #1) has "), "{}", v[0]);
    let e = resolve_in(&opts, Some(&dir), Some(&tok), lim).unwrap_err();
    assert_eq!(e.to_string(), v[0]);
}

#[test]
fn templates_need_a_directory_and_a_tokenizer() {
    let (dir, _, lim) = tiny();
    let opts = PromptOptions {
        texts: vec!["a".into()],
        chat: true,
        ..Default::default()
    };
    let e = resolve(&opts, None, lim).unwrap_err().to_string();
    assert!(e.contains("checkpoint directory"), "{e}");
    let e = resolve_in(&opts, Some(&dir), None, lim)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no tokenizer.json"), "{e}");
}
