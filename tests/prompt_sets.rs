//! The built-in benchmark prompt sets against `fixtures/chat/prompt-sets.json`
//! (written by `tools/chat_fixtures.py`, which formats the raw data with
//! z-lab/dflash `benchmark.py`'s own `format` lambdas and selects samples with
//! its `_limit_dataset` after `random.seed(0)`, and renders them with
//! transformers' `apply_chat_template` on `fixtures/tiny-qwen3_5`).

use std::path::Path;

use hsparity::chat::{self, ChatTemplate, RenderOptions, TokenizerConfig};
use hsparity::error::Error;
use hsparity::prompt_sets::{self, PromptSetSpec, NAMES};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn golden() -> Value {
    serde_json::from_str(&std::fs::read_to_string("fixtures/chat/prompt-sets.json").unwrap())
        .unwrap()
}

#[test]
fn every_set_is_in_the_golden_and_back() {
    let g = golden();
    let mut names: Vec<&String> = g["sets"].as_object().unwrap().keys().collect();
    names.sort();
    assert_eq!(
        names,
        NAMES
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .iter()
            .collect::<Vec<_>>()
    );
}

#[test]
fn formatting_and_selection_match_zlab_benchmark() {
    let g = golden();
    for name in NAMES {
        let s = &g["sets"][name];
        let rows = s["rows"].as_u64().unwrap() as usize;
        let turns = prompt_sets::user_turns(name).unwrap();
        assert_eq!(turns.len(), rows, "{name}");
        // unshuffled head (--max-samples unset)
        for r in s["first_rows"].as_array().unwrap() {
            let i = r["row"].as_u64().unwrap() as usize;
            assert_eq!(turns[i], r["turns"][0].as_str().unwrap(), "{name} row {i}");
        }
        // --max-samples 4: random.seed(0); random.shuffle; [:4]
        let want: Vec<usize> = s["max_samples_4"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["row"].as_u64().unwrap() as usize)
            .collect();
        let set = prompt_sets::load(name, Some(4)).unwrap();
        assert_eq!(set.rows, want, "{name}");
        assert_eq!(set.conversations.len(), 4);
        for (conv, r) in set
            .conversations
            .iter()
            .zip(s["max_samples_4"].as_array().unwrap())
        {
            assert_eq!(conv.messages.len(), 1, "{name}: one user turn");
            assert_eq!(conv.messages[0].role(), "user");
            assert_eq!(
                conv.messages[0].content().unwrap().as_str().unwrap(),
                r["turns"][0].as_str().unwrap(),
                "{name}"
            );
            assert!(
                conv.origin.starts_with(&format!("{name} row {}", r["row"])),
                "{}",
                conv.origin
            );
        }
        // all of it, in file order, with N unset or N >= the size
        for n in [None, Some(rows), Some(rows + 3)] {
            let all = prompt_sets::load(name, n).unwrap();
            assert_eq!(all.rows, (0..rows).collect::<Vec<_>>(), "{name} {n:?}");
        }
        // N just below the size is the shuffle's prefix
        let perm = prompt_sets::zlab_permutation(name, 0).unwrap();
        assert_eq!(
            prompt_sets::load(name, Some(rows - 1)).unwrap().rows,
            perm[..rows - 1]
        );
        assert_eq!(&perm[..4], &want[..]);
    }
}

#[test]
fn mt_bench_is_first_turn_only() {
    let g = golden();
    let set = prompt_sets::load("mt-bench", None).unwrap();
    assert!(set.selection.contains("first turn"), "{}", set.selection);
    let first = &g["sets"]["mt-bench"]["first_rows"][0];
    assert_eq!(
        first["turns"].as_array().unwrap().len(),
        2,
        "the data has two turns"
    );
    assert_eq!(
        set.conversations[0].messages[0].content().unwrap().as_str(),
        first["turns"][0].as_str()
    );
}

#[test]
fn rendered_like_zlab_on_tiny_qwen3_5() {
    let g = golden();
    let dir = Path::new(g["rendered_with"].as_str().unwrap());
    let tmpl = ChatTemplate::for_checkpoint(dir, &TokenizerConfig::read(dir).unwrap())
        .unwrap()
        .unwrap();
    let tok = chat::load_tokenizer(&dir.join("tokenizer.json")).unwrap();
    let mut n = 0;
    for name in NAMES {
        let set = prompt_sets::load(name, Some(4)).unwrap();
        for r in g["sets"][name]["rendered_max_samples_4"]
            .as_array()
            .unwrap()
        {
            let row = r["row"].as_u64().unwrap() as usize;
            let k = set.rows.iter().position(|&x| x == row).unwrap();
            let opts = RenderOptions {
                add_generation_prompt: true,
                enable_thinking: Some(r["enable_thinking"].as_bool().unwrap()),
            };
            let text = tmpl.render(&set.conversations[k], &opts).unwrap();
            assert!(
                text == r["text"].as_str().unwrap(),
                "{name} row {row}: {text:?}"
            );
            let ids = chat::encode(&tok, &text, name).unwrap();
            let want: Vec<u32> = r["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(ids, want, "{name} row {row}");
            n += 1;
        }
    }
    assert!(n >= 2 * NAMES.len());
}

#[test]
fn sources_name_the_embedded_file_and_license() {
    for name in NAMES {
        let set = prompt_sets::load(name, Some(1)).unwrap();
        let s = &set.source;
        let bytes = std::fs::read(s.file).unwrap();
        assert_eq!(s.sha256, format!("{:x}", Sha256::digest(&bytes)), "{name}");
        let folder = Path::new(s.file).parent().unwrap();
        assert!(
            folder.join("LICENSE").is_file(),
            "{name}: license beside the data"
        );
        assert!(
            folder.join("SOURCE.md").is_file(),
            "{name}: SOURCE.md beside the data"
        );
        assert!(s.to_string().contains(&s.sha256));
        assert_eq!(s.records, prompt_sets::user_turns(name).unwrap().len());
    }
}

#[test]
fn permutations_are_permutations() {
    for name in NAMES {
        let n = prompt_sets::user_turns(name).unwrap().len();
        for seed in [0, 42] {
            let mut p = prompt_sets::zlab_permutation(name, seed).unwrap();
            p.sort_unstable();
            assert_eq!(p, (0..n).collect::<Vec<_>>(), "{name} seed {seed}");
        }
    }
    assert!(prompt_sets::zlab_permutation("gsm8k", 7).is_err());
    // the documented head of the seed-0 shuffle of gsm8k (Python: random.seed(0); random.shuffle(list(range(1319))))
    let g = golden();
    let head: Vec<usize> = g["sets"]["gsm8k"]["max_samples_4"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["row"].as_u64().unwrap() as usize)
        .collect();
    assert_eq!(
        prompt_sets::zlab_permutation("gsm8k", 0).unwrap()[..4],
        head[..]
    );
}

#[test]
fn spec_parsing() {
    assert_eq!(
        PromptSetSpec::parse("humaneval:16").unwrap(),
        PromptSetSpec {
            name: "humaneval",
            n: Some(16)
        }
    );
    assert_eq!(PromptSetSpec::parse("mt-bench").unwrap().n, None);
    assert_eq!(
        PromptSetSpec::parse("gsm8k:128").unwrap().to_string(),
        "gsm8k:128"
    );
    let err = |s: &str| {
        let e = PromptSetSpec::parse(s).unwrap_err();
        assert!(matches!(e, Error::Input(_)), "{e:?}");
        let m = e.to_string();
        assert!(m.starts_with(&format!("--prompt-set {s:?}: ")), "{m}");
        assert!(!m.contains('\n'));
        m
    };
    assert!(err("gsm8k:0").contains("at least 1"));
    assert!(err("gsm8k:x").contains("not a number"));
    assert!(err("gsm8k:").contains("not a number"));
    assert!(err("gsm8k:-3").contains("not a number"));
    let m = err("alpaca");
    assert!(m.contains("unknown prompt set \"alpaca\""), "{m}");
    for n in NAMES {
        assert!(m.contains(n), "{m}");
    }
    assert!(err("GSM8K").contains("unknown"));
    assert!(matches!(
        prompt_sets::load("gsm8k", Some(0)),
        Err(Error::Input(_))
    ));
    assert!(matches!(
        prompt_sets::load("nope", None),
        Err(Error::Input(_))
    ));
    assert_eq!(
        prompt_sets::load_spec("mbpp:2")
            .unwrap()
            .conversations
            .len(),
        2
    );
}
