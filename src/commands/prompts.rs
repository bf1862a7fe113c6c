//! `hsparity prompts`: what a run would feed the model, prompt by prompt —
//! the text after the chat template and the token ids — so it can be checked
//! against an evaluation harness before a long run. Reads the checkpoint's
//! config, tokenizer and template; loads no weights.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::prompts::{self, PromptLimits, PromptOptions};
use crate::report::{prompts::build, Environment, PromptsReport};

/// Options of `prompts`.
#[derive(Debug, Clone)]
pub struct PromptsOptions {
    /// Checkpoint directory or Hub id `org/name[@rev]` in the local cache.
    pub checkpoint: String,
    /// Prompt options as given.
    pub prompts: PromptOptions,
    /// The command line, for the report.
    pub command_line: String,
}

/// Resolves the prompts as a run on the checkpoint would, and lists them;
/// prompts a run would refuse (longer than `max_position_embeddings`, a
/// token id over `vocab_size`) are listed too and fail the report.
///
/// Errors: as [`Checkpoint::open`] and [`prompts::collect`].
pub fn run(opts: &PromptsOptions) -> Result<PromptsReport> {
    let ckpt = Checkpoint::open(&opts.checkpoint)?;
    let limits = PromptLimits::of(&ckpt.config.text);
    let resolved = prompts::collect(
        &opts.prompts,
        Some(&ckpt.source.dir),
        ckpt.tokenizer.as_deref(),
        limits,
    )?;
    let refused = prompts::violations(&resolved.prompts, limits);
    let env = Environment::of_prompts(&ckpt, &resolved)?;
    Ok(build(
        &resolved.prompts,
        refused,
        env,
        opts.command_line.clone(),
    ))
}
