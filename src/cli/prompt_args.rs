//! The prompt options every verb that runs the model takes (and `prompts`),
//! parsed once into [`PromptOptions`].

use std::path::PathBuf;

use clap::Args;

use crate::prompt_sets::PromptSetSpec;
use crate::prompts::{parse_id_list, PromptOptions};

/// One `--prompt-ids` value, parsed by clap ([`parse_id_list`]).
#[derive(Debug, Clone)]
pub(super) struct TokenIds(Vec<u32>);

fn token_ids(s: &str) -> std::result::Result<TokenIds, String> {
    parse_id_list(s).map(TokenIds)
}

/// The prompt options every verb that runs the model takes.
#[derive(Args)]
pub(super) struct PromptArgs {
    /// Prompt text (needs tokenizer.json); repeatable.
    #[arg(long = "prompt")]
    prompt: Vec<String>,
    /// Prompt as token ids, e.g. 1,2,3; repeatable (use --prompt-ids=... for a value starting with '-').
    #[arg(long = "prompt-ids", value_parser = token_ids)]
    prompt_ids: Vec<TokenIds>,
    /// JSONL file: one {"text": ...} or {"input_ids": [...]} per line.
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// JSONL file of conversations, one {"messages": [{"role": ..., "content": ...}, ...]} per line (OpenAI chat format), each rendered with the chat template (add_generation_prompt=True).
    #[arg(long, value_name = "FILE.jsonl")]
    messages: Option<PathBuf>,
    /// Render each text prompt (--prompt, text lines of --prompts, the built-in texts) as one user turn with the chat template.
    #[arg(long)]
    chat: bool,
    /// Chat template (Jinja) to render with instead of the checkpoint's.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// enable_thinking passed to the chat template; absent = not passed (which is not false: a Qwen3.5 template then opens a think block).
    #[arg(long, value_name = "true|false")]
    enable_thinking: Option<bool>,
    /// A system turn put before each conversation.
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// Built-in benchmark prompts, formatted and selected as z-lab/dflash benchmark.py does (NAME:N = --max-samples N): gsm8k, humaneval, math500, mbpp, mt-bench (first turn).
    #[arg(long, value_name = "NAME[:N]", value_parser = clap::value_parser!(PromptSetSpec))]
    prompt_set: Option<PromptSetSpec>,
}

impl PromptArgs {
    /// The options as typed values (clap parsed each flag's value).
    pub(super) fn options(&self) -> PromptOptions {
        PromptOptions {
            texts: self.prompt.clone(),
            ids: self.prompt_ids.iter().map(|t| t.0.clone()).collect(),
            file: self.prompts.clone(),
            messages: self.messages.clone(),
            chat: self.chat,
            chat_template: self.chat_template.clone(),
            enable_thinking: self.enable_thinking,
            system: self.system.clone(),
            prompt_set: self.prompt_set,
            default: Default::default(),
        }
    }
}
