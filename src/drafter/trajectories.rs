//! Supplied trajectories (`--trajectories FILE.jsonl`): the greedy output an
//! engine produced for each prompt (SGLang, vLLM or transformers at
//! temperature 0), one JSON object per line — `{"prompt_ids": [...],
//! "output_ids": [...]}`, or `{"prompt": "...", "output": "..."}` as text
//! when the checkpoint has a tokenizer. hsparity then needs one
//! teacher-forced sweep per loading path: it checks at every position that
//! the given token is this path's argmax ([`departures`]) and replays the
//! drafter on the path's taps over prompt + output.

use std::path::Path;

use candle_core::Tensor;
use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::prompts::{Prompt, PromptSource};

/// One line of the file.
#[derive(Debug, Clone)]
pub struct Trajectory {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// The engine's greedy output ids.
    pub output: Vec<u32>,
    /// `FILE:line`.
    pub origin: String,
}

impl Trajectory {
    /// Prompt + output.
    pub fn tokens(&self) -> Vec<u32> {
        [self.prompt.clone(), self.output.clone()].concat()
    }

    /// The prompt as a run's prompt.
    pub fn as_prompt(&self) -> Prompt {
        Prompt {
            source: PromptSource::Ids,
            origin: self.origin.clone(),
            ids: self.prompt.clone(),
            chat: None,
        }
    }
}

/// Default near-tie margin, relative to the top-1 logit: two bf16 ulps
/// (2⁻⁶). Engines serve in bf16, where two logits this close can come out in
/// either order.
pub const NEAR_TIE: f64 = 1.0 / 64.0;

/// A position where the given token is not this path's argmax.
#[derive(Debug, Clone, Serialize)]
pub struct Departure {
    /// Prompt index.
    pub prompt: usize,
    /// Index in the output (0 = the first generated token).
    pub position: usize,
    /// The given token.
    pub given: u32,
    /// This path's argmax there.
    pub argmax: u32,
    /// Top-1 logit minus the given token's logit (≥ 0).
    pub margin: f64,
    /// Within the near-tie margin (listed, not failed).
    pub near_tie: bool,
}

fn ids_of(v: &Value, key: &str, at: &str, vocab: usize) -> Result<Vec<u32>> {
    let a = v
        .as_array()
        .ok_or_else(|| Error::Input(format!("{at}: \"{key}\" must be a list of token ids")))?;
    a.iter()
        .enumerate()
        .map(|(i, x)| match x.as_u64() {
            Some(id) if (id as usize) < vocab => Ok(id as u32),
            Some(id) => Err(Error::Input(format!(
                "{at}: {key}[{i}] = {id} is out of the target's vocabulary ({vocab} rows)"
            ))),
            None => Err(Error::Input(format!(
                "{at}: {key}[{i}] = {x} is not a token id"
            ))),
        })
        .collect()
}

/// Reads a trajectories file (text lines tokenised with `tokenizer`, without
/// special tokens), checking ids against `vocab` and lengths against
/// `max_positions`.
///
/// Errors ([`Error::Input`], naming the line): not JSON, neither form, ids
/// out of vocabulary, an empty prompt or output, text without a tokenizer,
/// a sequence longer than the model allows, an empty file.
pub fn read(
    path: &Path,
    tokenizer: Option<&Path>,
    vocab: usize,
    max_positions: usize,
) -> Result<Vec<Trajectory>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut tok = None;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{}", path.display(), n + 1);
        let v: Value = serde_json::from_str(line).map_err(|e| {
            Error::Input(format!("{at}: not valid JSON ({e}); expected {{\"prompt_ids\": [...], \"output_ids\": [...]}}"))
        })?;
        let (prompt, output) = match (v.get("prompt_ids"), v.get("output_ids"), v.get("prompt"), v.get("output")) {
            (Some(p), Some(o), None, None) => (ids_of(p, "prompt_ids", &at, vocab)?, ids_of(o, "output_ids", &at, vocab)?),
            (None, None, Some(Value::String(p)), Some(Value::String(o))) => {
                let t = match &tok {
                    Some(t) => t,
                    None => {
                        let p = tokenizer.ok_or_else(|| {
                            Error::Input(format!("{at}: text trajectories need tokenizer.json in the checkpoint; give prompt_ids and output_ids"))
                        })?;
                        tok = Some(tokenizers::Tokenizer::from_file(p).map_err(|e| {
                            Error::Input(format!("{}: cannot load tokenizer: {e}", p.display()))
                        })?);
                        tok.as_ref().expect("set")
                    }
                };
                let enc = |s: &str| -> Result<Vec<u32>> {
                    let ids = t
                        .encode(s, false)
                        .map_err(|e| Error::Input(format!("{at}: tokenising: {e}")))?
                        .get_ids()
                        .to_vec();
                    match ids.iter().find(|&&i| i as usize >= vocab) {
                        Some(bad) => Err(Error::Input(format!(
                            "{at}: token id {bad} is out of the target's vocabulary ({vocab} rows)"
                        ))),
                        None => Ok(ids),
                    }
                };
                (enc(p)?, enc(o)?)
            }
            _ => {
                return Err(Error::Input(format!(
                    "{at}: expected {{\"prompt_ids\": [...], \"output_ids\": [...]}} or {{\"prompt\": \"...\", \"output\": \"...\"}}"
                )))
            }
        };
        if prompt.is_empty() || output.is_empty() {
            return Err(Error::Input(format!(
                "{at}: the {} is empty",
                if prompt.is_empty() {
                    "prompt"
                } else {
                    "output"
                }
            )));
        }
        if prompt.len() + output.len() > max_positions {
            return Err(Error::Input(format!(
                "{at}: {} prompt + {} output tokens exceed max_position_embeddings = {max_positions}",
                prompt.len(),
                output.len()
            )));
        }
        out.push(Trajectory {
            prompt,
            output,
            origin: at,
        });
    }
    if out.is_empty() {
        return Err(Error::Input(format!("{}: no trajectories", path.display())));
    }
    Ok(out)
}

/// Refuses trajectories whose prompts are not `prompts` (the run's prompt
/// options), naming the first line that differs.
///
/// Errors ([`Error::Input`]).
pub fn check_prompts(trajectories: &[Trajectory], prompts: &[Prompt]) -> Result<()> {
    if trajectories.len() != prompts.len() {
        return Err(Error::Input(format!(
            "{} trajectories but {} prompts: --trajectories must hold one line per prompt, in order",
            trajectories.len(),
            prompts.len()
        )));
    }
    for (t, p) in trajectories.iter().zip(prompts) {
        if t.prompt != p.ids {
            return Err(Error::Input(format!(
                "{}: its prompt ({} tokens) is not {} ({} tokens)",
                t.origin,
                t.prompt.len(),
                p.origin,
                p.ids.len()
            )));
        }
    }
    Ok(())
}

/// Positions of `output` (prompt `k`) where the given token is not the
/// argmax of `logits` (`[output.len(), V]`: row j predicts output token j),
/// with the margin; within `near_tie` × max(1, |top-1|) a near-tie.
///
/// Errors: a tensor failure.
pub fn departures(
    k: usize,
    output: &[u32],
    logits: &Tensor,
    near_tie: f64,
) -> Result<Vec<Departure>> {
    let rows = logits.to_dtype(candle_core::DType::F32)?.to_vec2::<f32>()?;
    // The argmax the generation uses (candle's, as the DFlash loop's).
    let argmax = super::target::argmax_rows(logits)?;
    let mut out = Vec::new();
    for (j, ((row, &given), &best)) in rows.iter().zip(output).zip(&argmax).enumerate() {
        let top = row[best as usize];
        if best != given {
            let margin = (top - row[given as usize]) as f64;
            out.push(Departure {
                prompt: k,
                position: j,
                given,
                argmax: best,
                margin,
                near_tie: margin <= near_tie * (top.abs() as f64).max(1.0),
            });
        }
    }
    Ok(out)
}
