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
    assert!(e.contains(":2: line 2: expected an object {\"text\": \u{2026}} or {\"input_ids\": [\u{2026}]}"), "{e}");
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
