//! Prompt sets: `--prompt TEXT`, `--prompt-ids 1,2,3`, `--prompts FILE.jsonl`,
//! or a built-in set when none is given (text prompts when the checkpoint has
//! `tokenizer.json`, deterministic token ids otherwise). Text is tokenised
//! with the checkpoint's `tokenizer.json` without special tokens, so ids are
//! what `tokenizer(text, add_special_tokens=False)` gives in Python.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};

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

fn tokenize(tokenizer: Option<&Path>, text: &str) -> Result<Vec<u32>> {
    let path = tokenizer.ok_or_else(|| {
        Error::Input(format!(
            "text prompt {:?} needs tokenizer.json in the checkpoint; use --prompt-ids instead",
            preview(text)
        ))
    })?;
    let tok = tokenizers::Tokenizer::from_file(path)
        .map_err(|e| Error::Input(format!("{}: cannot load tokenizer: {e}", path.display())))?;
    let enc = tok
        .encode(text, false)
        .map_err(|e| Error::Input(format!("tokenising {:?}: {e}", preview(text))))?;
    Ok(enc.get_ids().to_vec())
}

/// The first 40 characters of `text`, for messages and reports.
pub fn preview(text: &str) -> String {
    let mut s: String = text.chars().take(40).collect();
    if text.chars().count() > 40 {
        s.push('…');
    }
    s
}

fn read_jsonl(path: &Path, tokenizer: Option<&Path>) -> Result<Vec<Prompt>> {
    let body = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut out = Vec::new();
    for (n, line) in body.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), n + 1);
        let p: JsonlPrompt = serde_json::from_str(line).map_err(|e| {
            Error::Input(format!(
                "{}: expected {{\"text\": …}} or {{\"input_ids\": […]}}: {e}",
                at()
            ))
        })?;
        match (p.text, p.input_ids) {
            (Some(t), None) => out.push(Prompt {
                ids: tokenize(tokenizer, &t)?,
                source: PromptSource::Text(t),
            }),
            (None, Some(ids)) => {
                let ids = ids
                    .into_iter()
                    .map(|i| {
                        u32::try_from(i).map_err(|_| {
                            Error::Input(format!("{}: token id {i} is negative or too large", at()))
                        })
                    })
                    .collect::<Result<_>>()?;
                out.push(Prompt {
                    source: PromptSource::Ids,
                    ids,
                })
            }
            _ => {
                return Err(Error::Input(format!(
                    "{}: give exactly one of \"text\" or \"input_ids\"",
                    at()
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
/// unreadable or malformed prompts file, an empty prompt, a token id
/// `≥ vocab_size`, or a prompt longer than `max_position_embeddings`.
pub fn resolve(
    opts: &PromptOptions,
    tokenizer: Option<&Path>,
    limits: PromptLimits,
) -> Result<Vec<Prompt>> {
    let mut prompts = Vec::new();
    for t in &opts.texts {
        prompts.push(Prompt {
            ids: tokenize(tokenizer, t)?,
            source: PromptSource::Text(t.clone()),
        });
    }
    for ids in &opts.ids {
        prompts.push(Prompt {
            source: PromptSource::Ids,
            ids: ids.clone(),
        });
    }
    if let Some(f) = &opts.file {
        prompts.extend(read_jsonl(f, tokenizer)?);
    }
    if prompts.is_empty() {
        prompts = match tokenizer {
            Some(_) => BUILTIN_TEXTS
                .iter()
                .map(|t| {
                    Ok(Prompt {
                        ids: tokenize(tokenizer, t)?,
                        source: PromptSource::Builtin(Some(t.to_string())),
                    })
                })
                .collect::<Result<_>>()?,
            None => builtin_ids(limits.vocab_size)
                .into_iter()
                .map(|ids| Prompt {
                    source: PromptSource::Builtin(None),
                    ids,
                })
                .collect(),
        };
    }
    for (k, p) in prompts.iter().enumerate() {
        if p.ids.is_empty() {
            return Err(Error::Input(format!("prompt {k} has no tokens")));
        }
        if p.ids.len() > limits.max_tokens {
            return Err(Error::Input(format!(
                "prompt {k} has {} tokens, more than the model allows (max_position_embeddings = {})",
                p.ids.len(),
                limits.max_tokens
            )));
        }
        if let Some(bad) = p.ids.iter().find(|&&i| i as usize >= limits.vocab_size) {
            return Err(Error::Input(format!(
                "prompt {k}: token id {bad} is out of range (vocab_size = {})",
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
                    "--prompt-ids: {x:?} is not a token id (non-negative integer)"
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
}
