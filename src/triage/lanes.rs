//! How a harness or engine suspect's lanes differ from the baseline's: the
//! faults its sequences carry, the prompt it feeds (pads before it, or
//! another rendering), and which rows its divergence compares. One
//! [`LaneEdit`] per suspect; the loading and numerics suspects use the
//! default (the baseline's lanes).

use candle_core::Tensor;

use crate::drafter::faults::Faults;
use crate::error::Result;

/// What a suspect's prompt is, per baseline prompt.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum PromptEdit {
    /// The baseline's prompt.
    #[default]
    Same,
    /// `count` copies of `pad` before it (no mask).
    LeftPad {
        /// The pad token id.
        pad: u32,
        /// Pads per prompt.
        count: usize,
    },
    /// Another rendering of the same conversation, per prompt (the
    /// continuation is compared, not the prompt).
    Replaced(Vec<Vec<u32>>),
}

/// Where a position of the Gated DeltaNet reset lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetAt {
    /// `⌊T/2⌋` of each prompt of T tokens.
    Middle,
    /// This absolute position in every prompt.
    At(usize),
}

/// A suspect's lanes relative to the baseline's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LaneEdit {
    /// Faults every sequence carries (the reset position set per prompt
    /// from `reset`).
    pub faults: Faults,
    /// The Gated DeltaNet state reset, when this suspect has one.
    pub reset: Option<ResetAt>,
    /// The prompt it feeds.
    pub prompt: PromptEdit,
    /// Divergence on its own trajectory (its loop's features against a
    /// correct forward over the same tokens) instead of teacher-forced on
    /// the baseline's: for faults that live in the decode loop, which a
    /// teacher-forced pass never exercises.
    pub own_trajectory: bool,
}

/// How a suspect's teacher-forced rows line up with the baseline's.
#[derive(Debug, Clone)]
pub struct Forcing {
    /// Tokens fed.
    pub tokens: Vec<u32>,
    /// Of which the prompt.
    pub prompt_len: usize,
    /// Faults of the sequence.
    pub faults: Faults,
    /// The suspect's first compared row.
    pub skip: usize,
    /// The baseline's first compared row.
    pub base_skip: usize,
}

impl LaneEdit {
    /// The prompt of lane `k` for the baseline's `prompt`.
    pub fn prompt(&self, k: usize, prompt: &[u32]) -> Vec<u32> {
        match &self.prompt {
            PromptEdit::Same => prompt.to_vec(),
            PromptEdit::LeftPad { pad, count } => {
                let mut p = vec![*pad; *count];
                p.extend_from_slice(prompt);
                p
            }
            PromptEdit::Replaced(ps) => ps[k].clone(),
        }
    }

    /// The faults of lane `k` for a baseline prompt of `prompt_len` tokens
    /// (the reset position counted in the lane's own prompt).
    pub fn faults(&self, prompt_len: usize) -> Faults {
        let pads = match self.prompt {
            PromptEdit::LeftPad { count, .. } => count,
            _ => 0,
        };
        Faults {
            gdn_reset_at: self.reset.map(|r| {
                pads + match r {
                    ResetAt::Middle => prompt_len / 2,
                    ResetAt::At(k) => k,
                }
            }),
            ..self.faults
        }
    }

    /// What lane `k` feeds teacher-forced on the baseline's `tokens` (prompt
    /// of `prompt_len`) and which rows compare with the baseline's.
    pub fn forcing(&self, k: usize, tokens: &[u32], prompt_len: usize) -> Forcing {
        let faults = self.faults(prompt_len);
        match &self.prompt {
            PromptEdit::Same => Forcing {
                tokens: tokens.to_vec(),
                prompt_len,
                faults,
                skip: 0,
                base_skip: 0,
            },
            PromptEdit::LeftPad { pad, count } => {
                let mut t = vec![*pad; *count];
                t.extend_from_slice(tokens);
                Forcing {
                    tokens: t,
                    prompt_len: prompt_len + count,
                    faults,
                    skip: *count,
                    base_skip: 0,
                }
            }
            PromptEdit::Replaced(ps) => {
                let mut t = ps[k].clone();
                t.extend_from_slice(&tokens[prompt_len..]);
                Forcing {
                    tokens: t,
                    prompt_len: ps[k].len(),
                    faults,
                    skip: ps[k].len(),
                    base_skip: prompt_len,
                }
            }
        }
    }

    /// True when the lane's continuation follows the same prompt as the
    /// baseline's (so "leaves the baseline's greedy continuation" means
    /// something): every edit but another rendering.
    pub fn same_conversation_text(&self) -> bool {
        !matches!(self.prompt, PromptEdit::Replaced(_))
    }
}

/// What lane `k` of a suspect with `edit` feeds teacher-forced: the
/// baseline's `tokens` (prompt of `prompt_len`) as the edit changes them, or
/// its `own` tokens with no fault when its divergence is measured on its own
/// trajectory.
pub fn forcing_for(
    edit: &LaneEdit,
    k: usize,
    tokens: &[u32],
    prompt_len: usize,
    own: &[u32],
) -> Forcing {
    if edit.own_trajectory {
        Forcing {
            tokens: own.to_vec(),
            prompt_len: edit.prompt(k, &tokens[..prompt_len]).len(),
            faults: Faults::default(),
            skip: 0,
            base_skip: 0,
        }
    } else {
        edit.forcing(k, tokens, prompt_len)
    }
}

/// The rows a lane's divergence compares: from its teacher-forced features
/// `forced` (per prompt), the rows from each forcing's `skip` on; on its own
/// trajectory, its loop's `features` against the correct forward's rows for
/// the same tokens (returned as the reference).
///
/// Errors: a tensor failure.
pub fn compared(
    edit: &LaneEdit,
    forced: Vec<Tensor>,
    features: &[Tensor],
    forcings: &[Forcing],
) -> Result<(Vec<Tensor>, Option<Vec<Tensor>>)> {
    if edit.own_trajectory {
        let reference = forced
            .iter()
            .zip(features)
            .map(|(f, own)| Ok(f.narrow(0, 0, own.dim(0)?)?))
            .collect::<Result<Vec<_>>>()?;
        return Ok((features.to_vec(), Some(reference)));
    }
    let rows = forced
        .into_iter()
        .zip(forcings)
        .map(|(f, fc)| Ok(f.narrow(0, fc.skip, f.dim(0)? - fc.skip)?))
        .collect::<Result<Vec<_>>>()?;
    Ok((rows, None))
}

#[cfg(test)]
mod tests;
