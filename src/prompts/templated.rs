//! Prompts rendered with a chat template, as an evaluation harness sends
//! them: `--chat` (each text prompt one user turn), `--messages FILE.jsonl`
//! and `--prompt-set NAME[:N]`, with `--chat-template FILE`,
//! `--enable-thinking true|false` and `--system TEXT`. The template is
//! rendered by [`crate::chat`] (transformers 5.23.0's
//! `apply_chat_template(…, add_generation_prompt=True)`) and the text encoded
//! with `add_special_tokens=False`, as `apply_chat_template(tokenize=True)` does.

use std::path::Path;

use super::jsonl::Tokenizer;
use super::{ChatPrompt, Prompt, PromptOptions, PromptSource};
use crate::chat::{ChatTemplate, Conversation, RenderOptions, TemplateSource, TokenizerConfig};
use crate::error::{Error, Result};

/// The template a run renders its conversations with, and how.
pub(super) struct Templating {
    template: ChatTemplate,
    render: RenderOptions,
    system: Option<String>,
}

impl Templating {
    /// The template `opts` ask for: `--chat-template FILE`, else the
    /// checkpoint's own (found as transformers finds it, with the special
    /// tokens of its `tokenizer_config.json`); `None` when no option renders
    /// a prompt with a template.
    ///
    /// Errors ([`Error::Input`], one line): a template-only flag
    /// (`--chat-template`, `--enable-thinking`, `--system`) without `--chat`,
    /// `--messages` or `--prompt-set`; no `tokenizer.json`; no template in
    /// the checkpoint (naming the directory); a template file that is
    /// unreadable or does not parse (naming the file and line); a
    /// `tokenizer_config.json` that is not JSON ([`Error::Config`]).
    pub(super) fn open(
        opts: &PromptOptions,
        dir: Option<&Path>,
        tokenizer: Option<&Path>,
    ) -> Result<Option<Templating>> {
        if !opts.templated() {
            return match opts.template_only_flag() {
                Some(flag) => Err(Error::Input(format!(
                    "{flag} applies to prompts rendered with a chat template: add --chat (each --prompt as one user turn), --messages FILE.jsonl or --prompt-set NAME[:N]"
                ))),
                None => Ok(None),
            };
        }
        let dir = dir.ok_or_else(|| {
            Error::Input(
                "chat templates need the checkpoint directory (tokenizer_config.json, chat_template.jinja)"
                    .into(),
            )
        })?;
        if tokenizer.is_none() {
            return Err(Error::Input(format!(
                "{}: no tokenizer.json: prompts rendered with a chat template (--chat, --messages, --prompt-set) are tokenised with it",
                dir.display()
            )));
        }
        let config = TokenizerConfig::read(dir)?;
        let template = match &opts.chat_template {
            Some(file) => ChatTemplate::from_file(file, &config)?,
            None => ChatTemplate::require_for_checkpoint(dir, &config)?,
        };
        Ok(Some(Templating::new(template, opts, opts.enable_thinking)))
    }

    /// The template of a drafter run's default prompts
    /// ([`super::DefaultPrompts::Drafter`]): `--chat-template FILE`, else the
    /// checkpoint's own; `None` when the checkpoint has none (the default set
    /// is then fed as raw text). `enable_thinking` is false unless given
    /// (z-lab/dflash `benchmark.py` passes `enable_thinking=False` by default).
    ///
    /// Errors: as [`Templating::open`]; `--enable-thinking` or `--system`
    /// with no template to render them.
    pub(super) fn open_default(opts: &PromptOptions, dir: &Path) -> Result<Option<Templating>> {
        let config = TokenizerConfig::read(dir)?;
        let template = match &opts.chat_template {
            Some(file) => ChatTemplate::from_file(file, &config)?,
            None => match ChatTemplate::for_checkpoint(dir, &config)? {
                Some(t) => t,
                None => {
                    return match opts
                        .template_only_flag()
                        .or(opts.chat.then_some("--chat"))
                    {
                        Some(flag) => Err(Error::Input(format!(
                            "{flag}: {} has no chat template to render the default prompts with; give one with --chat-template FILE",
                            dir.display()
                        ))),
                        None => Ok(None),
                    }
                }
            },
        };
        let thinking = Some(opts.enable_thinking.unwrap_or(false));
        Ok(Some(Templating::new(template, opts, thinking)))
    }

    /// `template` rendering with `add_generation_prompt=True`, `enable_thinking`
    /// and `opts`' system turn.
    fn new(template: ChatTemplate, opts: &PromptOptions, enable_thinking: Option<bool>) -> Self {
        Templating {
            template,
            render: RenderOptions {
                add_generation_prompt: true,
                enable_thinking,
            },
            system: opts.system.clone(),
        }
    }

    /// The `enable_thinking` this templating passes.
    pub(super) fn enable_thinking(&self) -> Option<bool> {
        self.render.enable_thinking
    }

    /// The template used for conversations without tools (the report's).
    pub(super) fn source(&self) -> &TemplateSource {
        self.template.source()
    }

    /// `conversation` (after `--system`'s turn) rendered and tokenised.
    ///
    /// Errors ([`Error::Input`], naming the conversation's origin): `--system`
    /// on a conversation that starts with a system turn; the template raised
    /// or failed (naming the template file); the tokenizer failed.
    pub(super) fn prompt(
        &self,
        conversation: Conversation,
        source: PromptSource,
        tokenizer: &Tokenizer,
    ) -> Result<Prompt> {
        let conversation = match &self.system {
            None => conversation,
            Some(system) => {
                if conversation
                    .messages
                    .first()
                    .is_some_and(|m| m.role() == "system")
                {
                    return Err(Error::Input(format!(
                        "{}: the conversation starts with a system turn already; --system would put a second one before it",
                        conversation.origin
                    )));
                }
                conversation.with_system(system)
            }
        };
        let text = self.template.render(&conversation, &self.render)?;
        let ids = tokenizer.encode(&text, &conversation.origin)?;
        Ok(Prompt {
            source,
            origin: conversation.origin.clone(),
            ids,
            chat: Some(ChatPrompt { conversation, text }),
        })
    }
}
