//! Supplied trajectories (`--trajectories FILE.jsonl`): the greedy output an
//! engine produced for each prompt (SGLang, vLLM or transformers at
//! temperature 0), one JSON object per line — `{"prompt_ids": [...],
//! "output_ids": [...]}`, or `{"prompt": "...", "output": "..."}` as text
//! when the checkpoint has a tokenizer. hsparity then needs one
//! teacher-forced sweep per loading path: it checks at every position that
//! the given token is this path's argmax ([`departures`]) and replays the
//! drafter on the path's taps over prompt + output.

use std::path::{Path, PathBuf};

use candle_core::Tensor;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::eval::{lookahead, EndRule};
use super::target::StepOut;
use crate::error::{Error, Result};
use crate::prompts::{Prompt, PromptSource};
use crate::session::Session;

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

/// A list of token ids (`key` of line `at`), each below `vocab`.
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

/// One side (prompt or output) of a line: `{side}_ids` as ids, or `{side}`
/// as text encoded with `tok` (loaded on first use from `tokenizer`).
fn side(
    v: &Value,
    name: &str,
    at: &str,
    vocab: usize,
    tokenizer: Option<&Path>,
    tok: &mut Option<tokenizers::Tokenizer>,
) -> Result<Vec<u32>> {
    let ids_key = format!("{name}_ids");
    match (v.get(&ids_key), v.get(name)) {
        (Some(ids), None) => ids_of(ids, &ids_key, at, vocab),
        (None, Some(Value::String(text))) => {
            if tok.is_none() {
                let p = tokenizer.ok_or_else(|| {
                    Error::Input(format!(
                        "{at}: \"{name}\" is text, but the checkpoint has no tokenizer.json; give \"{ids_key}\""
                    ))
                })?;
                *tok = Some(tokenizers::Tokenizer::from_bytes(crate::input::read(p)?).map_err(|e| {
                    Error::Input(format!("{}: cannot load tokenizer: {e}", p.display()))
                })?);
            }
            let t = tok.as_ref().expect("loaded above");
            let ids = t
                .encode(text.as_str(), false)
                .map_err(|e| Error::Input(format!("{at}: tokenising \"{name}\": {e}")))?
                .get_ids()
                .to_vec();
            match ids.iter().find(|&&i| i as usize >= vocab) {
                Some(bad) => Err(Error::Input(format!(
                    "{at}: \"{name}\" encodes to token id {bad}, outside the target's vocabulary ({vocab} rows)"
                ))),
                None => Ok(ids),
            }
        }
        (None, Some(_)) => Err(Error::Input(format!("{at}: \"{name}\" must be a string"))),
        (Some(_), Some(_)) => Err(Error::Input(format!(
            "{at}: give \"{ids_key}\" or \"{name}\", not both"
        ))),
        (None, None) => Err(Error::Input(format!(
            "{at}: no \"{ids_key}\" (or \"{name}\" as text); expected {{\"prompt_ids\": [...], \"output_ids\": [...]}}"
        ))),
    }
}

/// Reads a trajectories file: per line the prompt as `prompt_ids` (or
/// `prompt`, text tokenised with `tokenizer` without special tokens) and the
/// output as `output_ids` (or `output`), checking ids against `vocab` and
/// lengths against `max_positions`.
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
    let text = crate::input::read_to_string(path)?;
    let mut tok = None;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{}", path.display(), n + 1);
        let v: Value = serde_json::from_str(line).map_err(|e| {
            Error::Input(format!(
                "{at}: not valid JSON ({e}); expected {{\"prompt_ids\": [...], \"output_ids\": [...]}}"
            ))
        })?;
        if !v.is_object() {
            return Err(Error::Input(format!(
                "{at}: expected an object {{\"prompt_ids\": [...], \"output_ids\": [...]}}"
            )));
        }
        let prompt = side(&v, "prompt", &at, vocab, tokenizer, &mut tok)?;
        let output = side(&v, "output", &at, vocab, tokenizer, &mut tok)?;
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
        return Err(Error::Input(format!(
            "{}: no trajectories (expected one JSON object per line)",
            path.display()
        )));
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

/// `--trajectories` as asked for.
#[derive(Debug, Clone)]
pub struct GivenFile {
    /// The JSONL file.
    pub file: PathBuf,
    /// `--max-new-tokens` when given: replay at most this many output tokens
    /// per prompt (else all the output allows).
    pub max_new: Option<usize>,
}

/// Supplied trajectories as a run uses them.
#[derive(Debug, Clone)]
pub struct Given {
    /// The file.
    pub file: PathBuf,
    /// sha256 of the file (first 16 hex chars).
    pub sha256: String,
    /// One per prompt, in order.
    pub lines: Vec<Trajectory>,
    /// Prompt + output per prompt.
    pub tokens: Vec<Vec<u32>>,
    /// Output tokens replayed per prompt ([`replayed_lengths`]; empty until
    /// [`Given::with_replay`]).
    pub replayed: Vec<usize>,
    /// `--max-new-tokens` when given: the most tokens replayed per prompt.
    pub cap: Option<usize>,
}

/// Reads `given` for `session` and makes its prompts the session's: when no
/// prompt option was given (`prompts_named` false) the trajectories' prompts
/// replace the built-in set, else they must equal the session's
/// ([`check_prompts`]). The replayed lengths are set by
/// [`Given::with_replay`] once the drafter is known.
///
/// Errors: as [`read`] and [`check_prompts`].
pub fn attach(session: &mut Session, given: &GivenFile, prompts_named: bool) -> Result<Given> {
    let tc = &session.paths[0].text_config;
    let lines = read(
        &given.file,
        session.ckpt.tokenizer.as_deref(),
        tc.vocab_size,
        tc.max_position_embeddings,
    )?;
    if prompts_named {
        check_prompts(&lines, &session.prompts)?;
    } else {
        session.prompts = lines.iter().map(Trajectory::as_prompt).collect();
        session.rendering = crate::prompts::Rendering {
            basis: crate::prompts::PromptBasis::Trajectories,
            ..Default::default()
        };
    }
    let bytes = crate::input::read(&given.file)?;
    let d = Sha256::digest(&bytes);
    Ok(Given {
        file: given.file.clone(),
        sha256: d.iter().take(8).map(|b| format!("{b:02x}")).collect(),
        tokens: lines.iter().map(Trajectory::tokens).collect(),
        lines,
        replayed: Vec::new(),
        cap: given.max_new,
    })
}

impl Given {
    /// Sets the replayed lengths for a drafter of `block` under `rule`
    /// (capped by [`Given::cap`]).
    ///
    /// Errors: as [`replayed_lengths`].
    pub fn with_replay(mut self, block: usize, rule: EndRule) -> Result<Self> {
        self.replayed = replayed_lengths(&self.lines, block, rule, self.cap)?;
        Ok(self)
    }

    /// Prompt length per line.
    pub fn prompt_lens(&self) -> Vec<usize> {
        self.lines.iter().map(|t| t.prompt.len()).collect()
    }
}

/// Output tokens a replay can judge on each trajectory: every round's
/// block must lie inside the given tokens. Under GitHub main's rule a round
/// starting at output position j reads the target's tokens up to j + B − 1,
/// so L − (B − 1) tokens are replayed; the wheel's shortened last blocks
/// stop at the end (all L tokens, at least 2 for one round). `cap` bounds
/// each.
///
/// Errors ([`Error::Input`], naming the line): an output too short for one
/// round.
pub fn replayed_lengths(
    lines: &[Trajectory],
    block: usize,
    rule: EndRule,
    cap: Option<usize>,
) -> Result<Vec<usize>> {
    lines
        .iter()
        .map(|t| {
            let l = t.output.len();
            let n = l.saturating_sub(lookahead(rule, block));
            let least = if rule == EndRule::Wheel { 2 } else { 1 };
            if n < least {
                return Err(Error::Input(format!(
                    "{}: {l} output tokens; --end-rule {} needs at least {} to judge one round of block size {block}",
                    t.origin,
                    rule.flag(),
                    least + lookahead(rule, block)
                )));
            }
            Ok(cap.map_or(n, |c| c.min(n)))
        })
        .collect()
}

/// At most this many departures are listed per path (all are counted).
pub const LISTED: usize = 32;

/// How one loading path's argmax agrees with the given trajectories.
#[derive(Debug, Clone, Serialize)]
pub struct PathDepartures {
    /// Loading path (or triage variant).
    pub path: String,
    /// Output positions checked (every given output token).
    pub checked: usize,
    /// Positions whose given token is not this path's argmax.
    pub departures: usize,
    /// Of those, near-ties (listed, not failed).
    pub near_ties: usize,
    /// The first departure that is not a near-tie: the run fails.
    pub first_failure: Option<Departure>,
    /// The first [`LISTED`] departures, in prompt and position order.
    pub listed: Vec<Departure>,
}

impl PathDepartures {
    /// Summarises `all` (in prompt and position order) for `path`.
    pub fn new(path: &str, checked: usize, all: &[Departure]) -> Self {
        Self {
            path: path.to_string(),
            checked,
            departures: all.len(),
            near_ties: all.iter().filter(|d| d.near_tie).count(),
            first_failure: all.iter().find(|d| !d.near_tie).cloned(),
            listed: all.iter().take(LISTED).cloned().collect(),
        }
    }

    /// One line: the first failure, or the near-ties.
    pub fn describe(&self) -> String {
        match &self.first_failure {
            Some(d) => format!(
                "{} departs from the given trajectory at prompt {} output position {} (given {}, argmax {}, logit margin {:.4}); {} departures in {} positions",
                self.path, d.prompt, d.position, d.given, d.argmax, d.margin, self.departures, self.checked
            ),
            None if self.near_ties > 0 => format!(
                "{} agrees with the given trajectory at all {} positions but {} near-ties",
                self.path, self.checked, self.near_ties
            ),
            None => format!(
                "{} agrees with the given trajectory at all {} positions",
                self.path, self.checked
            ),
        }
    }
}

/// The report member of a run on supplied trajectories.
#[derive(Debug, Clone, Serialize)]
pub struct TrajectoryReport {
    /// The file as given.
    pub file: String,
    /// sha256 of the file (first 16 hex chars).
    pub sha256: String,
    /// Output tokens per prompt.
    pub output_tokens: Vec<usize>,
    /// Output tokens replayed per prompt.
    pub replayed_tokens: Vec<usize>,
    /// Near-tie threshold: top-1 logit minus the given token's, relative to
    /// max(1, |top-1|).
    pub near_tie_margin: f64,
    /// Per loading path (or variant): its argmax against the given tokens.
    pub paths: Vec<PathDepartures>,
}

impl TrajectoryReport {
    /// The report member for `given` with each path's departures.
    pub fn new(given: &Given, paths: Vec<PathDepartures>) -> Self {
        Self {
            file: given.file.display().to_string(),
            sha256: given.sha256.clone(),
            output_tokens: given.lines.iter().map(|t| t.output.len()).collect(),
            replayed_tokens: given.replayed.clone(),
            near_tie_margin: NEAR_TIE,
            paths,
        }
    }

    /// True when some path departs beyond a near-tie.
    pub fn failed(&self) -> bool {
        self.paths.iter().any(|p| p.first_failure.is_some())
    }
}

/// Departures of every prompt from one teacher-forced sweep's outputs
/// (`outs[k].logits`: rows from the last prompt token on).
///
/// Errors: a sweep without logits; a tensor failure.
pub fn departures_of(given: &Given, outs: &[StepOut]) -> Result<Vec<Departure>> {
    let mut all = Vec::new();
    for (k, (o, t)) in outs.iter().zip(&given.lines).enumerate() {
        let logits = o
            .logits
            .as_ref()
            .ok_or_else(|| Error::Input("a trajectory sweep without logits".into()))?;
        let rows = logits.narrow(0, 0, t.output.len())?;
        all.extend(departures(k, &t.output, &rows, NEAR_TIE)?);
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(prompt: usize, output: usize) -> Trajectory {
        Trajectory {
            prompt: vec![1; prompt],
            output: vec![2; output],
            origin: "t.jsonl:1".into(),
        }
    }

    /// GitHub main reads B − 1 tokens past the last anchor; the wheel's
    /// last blocks shrink to the end; `--max-new-tokens` caps either.
    #[test]
    fn replayed_lengths_leave_room_for_the_last_block() {
        let l = [line(3, 71), line(5, 8)];
        assert_eq!(
            replayed_lengths(&l, 8, EndRule::GithubMain, None).unwrap(),
            [64, 1]
        );
        assert_eq!(
            replayed_lengths(&l, 8, EndRule::Wheel, None).unwrap(),
            [71, 8]
        );
        assert_eq!(
            replayed_lengths(&l, 8, EndRule::Wheel, Some(10)).unwrap(),
            [10, 8]
        );
        let e = replayed_lengths(&[line(3, 7)], 8, EndRule::GithubMain, None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t.jsonl:1: 7 output tokens"), "{e}");
        assert!(replayed_lengths(&[line(3, 1)], 8, EndRule::Wheel, None).is_err());
        assert!(replayed_lengths(&[line(3, 2)], 8, EndRule::Wheel, None).is_ok());
    }

    /// Margins are top-1 minus the given token's logit; near-tie within
    /// 2⁻⁶ × max(1, |top-1|): hand-computed rows.
    #[test]
    fn departures_carry_the_margin_and_the_near_tie_flag() {
        let rows: [[f32; 4]; 4] = [
            [0.0, 3.0, 1.0, 0.0],     // given 1 = argmax: no departure
            [0.0, 2.0, 2.01, 0.0],    // given 1, top 2.01: margin 0.01 ≤ 1/64
            [0.0, 100.0, 101.0, 0.0], // margin 1.0 ≤ 101/64 ≈ 1.58: near-tie
            [0.0, 0.5, 0.0, 1.0],     // margin 0.5 > 1/64: departure
        ];
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        let t = Tensor::from_vec(flat, (4, 4), &candle_core::Device::Cpu).unwrap();
        let d = departures(7, &[1, 1, 1, 1], &t, NEAR_TIE).unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(
            d.iter()
                .map(|x| (x.position, x.argmax, x.near_tie))
                .collect::<Vec<_>>(),
            [(1, 2, true), (2, 2, true), (3, 3, false)]
        );
        assert!((d[0].margin - 0.01).abs() < 1e-6);
        assert_eq!(d[1].margin, 1.0);
        assert_eq!(d[2].margin, 0.5);
        assert!(d.iter().all(|x| x.prompt == 7 && x.given == 1));
        let s = PathDepartures::new("causal-lm", 4, &d);
        assert_eq!((s.departures, s.near_ties), (3, 2));
        assert_eq!(s.first_failure.as_ref().map(|f| f.position), Some(3));
    }
}
