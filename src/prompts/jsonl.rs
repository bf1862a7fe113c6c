//! The prompts file (`--prompts FILE.jsonl`: `{"text": …}` or
//! `{"input_ids": […]}` per line) and the checkpoint's `tokenizer.json`.

use std::path::Path;

use serde::Deserialize;

use super::{Prompt, PromptSource};
use crate::error::{Error, Result};
use crate::text::{one_line, preview};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonlPrompt {
    text: Option<String>,
    input_ids: Option<Vec<i64>>,
}

/// The checkpoint's `tokenizer.json`, parsed on the first text prompt and
/// reused for the others.
pub(super) struct Tokenizer<'a> {
    path: Option<&'a Path>,
    loaded: std::cell::OnceCell<tokenizers::Tokenizer>,
}

impl<'a> Tokenizer<'a> {
    pub(super) fn new(path: Option<&'a Path>) -> Self {
        Tokenizer {
            path,
            loaded: std::cell::OnceCell::new(),
        }
    }

    /// Token ids of `text` (no special tokens added). Errors: no tokenizer
    /// (naming `origin`), an unloadable tokenizer, an encoding failure.
    pub(super) fn encode(&self, text: &str, origin: &str) -> Result<Vec<u32>> {
        let path = self.path.ok_or_else(|| {
            Error::Input(format!(
                "{origin}: text prompt {:?} needs tokenizer.json in the checkpoint; use --prompt-ids instead",
                preview(text)
            ))
        })?;
        let tok = match self.loaded.get() {
            Some(t) => t,
            None => {
                let t =
                    tokenizers::Tokenizer::from_bytes(crate::input::read(path)?).map_err(|e| {
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

/// The prompts of a `--prompts` file, in order; `text(t, origin)` makes the
/// prompt of a `{"text": t}` line (tokenised, or rendered with `--chat`),
/// called as each line is read so errors keep their line order.
///
/// Errors ([`Error::Input`], naming the file and line): unreadable, not
/// UTF-8, a line that is not one of the two objects, a negative id, no
/// prompt in the file; and whatever `text` returns.
pub(super) fn read_jsonl(
    path: &Path,
    mut text: impl FnMut(String, String) -> Result<Prompt>,
) -> Result<Vec<Prompt>> {
    let bytes = crate::input::read(path)?;
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
            (Some(t), None) => out.push(text(t, at)?),
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
                    chat: None,
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
