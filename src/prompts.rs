//! Prompt sets: `--prompt TEXT`, `--prompt-ids 1,2,3`, `--prompts FILE.jsonl`,
//! or a built-in set when none is given (text prompts when the checkpoint has
//! `tokenizer.json`, deterministic token ids otherwise). Text is tokenised
//! with the checkpoint's `tokenizer.json` without special tokens, so ids are
//! what `tokenizer(text, add_special_tokens=False)` gives in Python.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::text::one_line;
pub use crate::text::preview;

/// Where a prompt came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptSource {
    /// Text tokenised with `tokenizer.json`.
    Text(String),
    /// Token ids given directly.
    Ids,
    /// Built-in prompt (text or ids).
    Builtin(Option<String>),
}

/// One prompt, tokenised.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// Origin of the prompt.
    pub source: PromptSource,
    /// Where it was given, for messages: `--prompt #2`, `--prompt-ids #1`
    /// (1-based occurrence of the option), `prompts.jsonl:3` (file and line),
    /// `built-in prompt #1`.
    pub origin: String,
    /// Token ids `[T]`.
    pub ids: Vec<u32>,
}

impl Prompt {
    /// `text`, `ids` or `builtin`.
    pub fn kind(&self) -> &'static str {
        match self.source {
            PromptSource::Text(_) => "text",
            PromptSource::Ids => "ids",
            PromptSource::Builtin(_) => "builtin",
        }
    }

    /// The text, when there is one.
    pub fn text(&self) -> Option<&str> {
        match &self.source {
            PromptSource::Text(t) | PromptSource::Builtin(Some(t)) => Some(t),
            _ => None,
        }
    }
}

/// Prompt options as given on the command line.
#[derive(Debug, Clone, Default)]
pub struct PromptOptions {
    /// `--prompt TEXT` (repeatable).
    pub texts: Vec<String>,
    /// `--prompt-ids 1,2,3` (repeatable).
    pub ids: Vec<Vec<u32>>,
    /// `--prompts FILE.jsonl`: lines `{"text": …}` or `{"input_ids": […]}`.
    pub file: Option<PathBuf>,
}

/// Limits a prompt must respect.
#[derive(Debug, Clone, Copy)]
pub struct PromptLimits {
    /// `vocab_size`: every id must be below it.
    pub vocab_size: usize,
    /// `max_position_embeddings`: the longest prompt allowed.
    pub max_tokens: usize,
}

/// Built-in text prompts: a short one, and one longer than the Gated DeltaNet
/// chunk (64 tokens) and not a multiple of it for byte-level tokenizers.
pub const BUILTIN_TEXTS: &[&str] = &[
    "The capital of France is",
    "Speculative decoding drafts several tokens with a small model and verifies them with the target in one forward pass. \
     The drafter reads the target's hidden states at a few tap layers, so when two ways of loading the target disagree, \
     acceptance falls even though both models look healthy in isolation.",
];

/// Built-in token-id prompts (16 and 100 tokens) for checkpoints without a
/// tokenizer: a fixed linear-congruential sequence reduced modulo the vocabulary.
pub fn builtin_ids(vocab_size: usize) -> Vec<Vec<u32>> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    [16usize, 100]
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((x >> 33) % vocab_size as u64) as u32
                })
                .collect()
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonlPrompt {
    text: Option<String>,
    input_ids: Option<Vec<i64>>,
}

/// The checkpoint's `tokenizer.json`, parsed on the first text prompt and
/// reused for the others.
struct Tokenizer<'a> {
    path: Option<&'a Path>,
    loaded: std::cell::OnceCell<tokenizers::Tokenizer>,
}

impl<'a> Tokenizer<'a> {
    fn new(path: Option<&'a Path>) -> Self {
        Tokenizer {
            path,
            loaded: std::cell::OnceCell::new(),
        }
    }

    /// Token ids of `text` (no special tokens added). Errors: no tokenizer
    /// (naming `origin`), an unloadable tokenizer, an encoding failure.
    fn encode(&self, text: &str, origin: &str) -> Result<Vec<u32>> {
        let path = self.path.ok_or_else(|| {
            Error::Input(format!(
                "{origin}: text prompt {:?} needs tokenizer.json in the checkpoint; use --prompt-ids instead",
                preview(text)
            ))
        })?;
        let tok = match self.loaded.get() {
            Some(t) => t,
            None => {
                let t = tokenizers::Tokenizer::from_file(path).map_err(|e| {
                    Error::Input(format!(
                        "{}: cannot load tokenizer: {}",
                        path.display(),
                        one_line(&e.to_string())
                    ))
                })?;
                self.loaded.get_or_init(|| t)
            }
        };
        let enc = tok.encode(text, false).map_err(|e| {
            Error::Input(format!(
                "{origin}: tokenising {:?}: {}",
                preview(text),
                one_line(&e.to_string())
            ))
        })?;
        Ok(enc.get_ids().to_vec())
    }
}

fn read_jsonl(path: &Path, tokenizer: &Tokenizer) -> Result<Vec<Prompt>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let body = String::from_utf8(bytes).map_err(|e| {
        Error::Input(format!(
            "{}: not UTF-8 text (invalid byte at offset {}); expected JSON lines {{\"text\": …}} or {{\"input_ids\": […]}}",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
    })?;
    let body = body.strip_prefix('\u{feff}').unwrap_or(&body);
    let mut out = Vec::new();
    for (n, line) in body.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{}", path.display(), n + 1);
        let expected = "expected an object {\"text\": …} or {\"input_ids\": […]}";
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
            // serde_json's location is relative to the line: keep the column only.
            let msg = e.to_string();
            let msg = msg
                .rsplit_once(" at line ")
                .map_or(msg.as_str(), |(m, _)| m);
            Error::Input(format!(
                "{at}: line {}: not valid JSON at column {} ({msg}); {expected}",
                n + 1,
                e.column()
            ))
        })?;
        if !v.is_object() {
            return Err(Error::Input(format!("{at}: line {}: {expected}", n + 1)));
        }
        let p: JsonlPrompt = serde_path_to_error::deserialize(&v).map_err(|e| {
            let field = e.path().to_string();
            let field = if field == "." {
                String::new()
            } else {
                format!("{field}: ")
            };
            Error::Input(format!(
                "{at}: line {}: {field}{}; {expected}",
                n + 1,
                e.inner()
            ))
        })?;
        match (p.text, p.input_ids) {
            (Some(t), None) => out.push(Prompt {
                ids: tokenizer.encode(&t, &at)?,
                source: PromptSource::Text(t),
                origin: at,
            }),
            (None, Some(ids)) => {
                let ids = ids
                    .into_iter()
                    .map(|i| {
                        u32::try_from(i).map_err(|_| {
                            Error::Input(format!("{at}: token id {i} is negative or too large"))
                        })
                    })
                    .collect::<Result<_>>()?;
                out.push(Prompt {
                    source: PromptSource::Ids,
                    ids,
                    origin: at,
                })
            }
            _ => {
                return Err(Error::Input(format!(
                    "{at}: give exactly one of \"text\" or \"input_ids\""
                )))
            }
        }
    }
    if out.is_empty() {
        return Err(Error::Input(format!(
            "{}: no prompts in file",
            path.display()
        )));
    }
    Ok(out)
}

/// Resolves the prompt set and checks it against `limits`.
///
/// Errors ([`Error::Input`]): a text prompt without `tokenizer.json`, an
/// unreadable, non-UTF-8 or malformed prompts file, an empty prompt, a token
/// id `≥ vocab_size`, or a prompt longer than `max_position_embeddings`.
/// Messages give the prompt's index (as in dumps, `p{k}`) and where it came
/// from ([`Prompt::origin`]).
pub fn resolve(
    opts: &PromptOptions,
    tokenizer: Option<&Path>,
    limits: PromptLimits,
) -> Result<Vec<Prompt>> {
    let tok = Tokenizer::new(tokenizer);
    let mut prompts = Vec::new();
    for (i, t) in opts.texts.iter().enumerate() {
        let origin = format!("--prompt #{}", i + 1);
        prompts.push(Prompt {
            ids: tok.encode(t, &origin)?,
            source: PromptSource::Text(t.clone()),
            origin,
        });
    }
    for (i, ids) in opts.ids.iter().enumerate() {
        prompts.push(Prompt {
            source: PromptSource::Ids,
            ids: ids.clone(),
            origin: format!("--prompt-ids #{}", i + 1),
        });
    }
    if let Some(f) = &opts.file {
        prompts.extend(read_jsonl(f, &tok)?);
    }
    if prompts.is_empty() {
        prompts = match tokenizer {
            Some(_) => BUILTIN_TEXTS
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let origin = format!("built-in prompt #{}", i + 1);
                    Ok(Prompt {
                        ids: tok.encode(t, &origin)?,
                        source: PromptSource::Builtin(Some(t.to_string())),
                        origin,
                    })
                })
                .collect::<Result<_>>()?,
            None => builtin_ids(limits.vocab_size)
                .into_iter()
                .enumerate()
                .map(|(i, ids)| Prompt {
                    source: PromptSource::Builtin(None),
                    ids,
                    origin: format!("built-in prompt #{}", i + 1),
                })
                .collect(),
        };
        // The built-in set is ours: fit it to small models instead of refusing.
        for p in prompts.iter_mut() {
            if p.ids.len() > limits.max_tokens {
                p.ids.truncate(limits.max_tokens);
                p.origin.push_str(&format!(
                    ", cut to max_position_embeddings = {}",
                    limits.max_tokens
                ));
            }
        }
    }
    for (k, p) in prompts.iter().enumerate() {
        let o = &p.origin;
        if p.ids.is_empty() {
            return Err(Error::Input(format!("prompt {k} ({o}) has no tokens")));
        }
        if p.ids.len() > limits.max_tokens {
            return Err(Error::Input(format!(
                "prompt {k} ({o}) has {} tokens, more than the model allows (max_position_embeddings = {})",
                p.ids.len(),
                limits.max_tokens
            )));
        }
        if let Some((pos, bad)) = p
            .ids
            .iter()
            .enumerate()
            .find(|(_, &i)| i as usize >= limits.vocab_size)
        {
            return Err(Error::Input(format!(
                "prompt {k} ({o}): token id {bad} at position {pos} is out of range (vocab_size = {})",
                limits.vocab_size
            )));
        }
    }
    Ok(prompts)
}

/// Parses `1,2,3` into ids. Errors: a non-integer or negative entry.
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.parse::<u32>().map_err(|_| {
                Error::Input(format!(
                    "--prompt-ids {:?}: {x:?} is not a token id (non-negative integer below 2^32)",
                    preview(s)
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
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
}
