//! The prompts of a run: `--prompt TEXT`, `--prompt-ids 1,2,3`,
//! `--prompts FILE.jsonl`, `--messages FILE.jsonl`, `--prompt-set NAME[:N]`,
//! or a built-in set when none is given (text prompts when the checkpoint has
//! `tokenizer.json`, deterministic token ids otherwise).
//!
//! Raw text is tokenised with the checkpoint's `tokenizer.json` without
//! special tokens, so ids are what `tokenizer(text, add_special_tokens=False)`
//! gives in Python. With `--chat` each text prompt becomes one user turn;
//! conversations (`--messages`, `--prompt-set`) are rendered with the chat
//! template ([`crate::chat`], `--chat-template`, `--enable-thinking`,
//! `--system`) and the rendered text encoded the same way, as
//! `apply_chat_template(…, tokenize=True)` encodes it (`prompts/templated.rs`).

mod defaults;
mod jsonl;
mod templated;

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::chat::{Conversation, TemplateSource};
use crate::checkpoint::config::TextConfig;
use crate::error::{Error, Result};
use crate::prompt_sets::{self, PromptSetSource, PromptSetSpec};
pub use crate::text::preview;
use jsonl::{read_jsonl, Tokenizer};
use templated::Templating;

pub use defaults::{
    builtin_ids, describe, DefaultPrompts, PromptBasis, BUILTIN_TEXTS, DRAFTER_DEFAULT_SET,
};
use defaults::{builtin_prompts, default_set, raw_turn};

/// The kind of a prompt's source, as reports name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromptKind {
    /// `--prompt` or a text line.
    Text,
    /// `--prompt-ids` or an `input_ids` line.
    Ids,
    /// The built-in prompts.
    Builtin,
    /// `--messages`.
    Messages,
    /// `--prompt-set`.
    PromptSet,
}

impl PromptKind {
    /// `text`, `ids`, `builtin`, `messages`, `prompt-set`.
    pub fn name(self) -> &'static str {
        match self {
            PromptKind::Text => "text",
            PromptKind::Ids => "ids",
            PromptKind::Builtin => "builtin",
            PromptKind::Messages => "messages",
            PromptKind::PromptSet => "prompt-set",
        }
    }
}

/// Where a prompt came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptSource {
    /// Text tokenised with `tokenizer.json` (`--prompt`, a `{"text"}` line of
    /// `--prompts`; with `--chat` rendered as one user turn first).
    Text(String),
    /// Token ids given directly.
    Ids,
    /// Built-in prompt (text or ids).
    Builtin(Option<String>),
    /// A conversation of `--messages FILE.jsonl`.
    Messages,
    /// A record of the built-in benchmark set of this name (`--prompt-set`,
    /// or a drafter run's default), with its user turn when it was fed as
    /// raw text (no chat template to render it with).
    PromptSet(&'static str, Option<String>),
}

/// A prompt rendered with the chat template.
#[derive(Debug, Clone)]
pub struct ChatPrompt {
    /// The conversation rendered (with `--system`'s turn when given).
    pub conversation: Conversation,
    /// The rendered text: what was tokenised.
    pub text: String,
}

/// One prompt, tokenised.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// Origin of the prompt.
    pub source: PromptSource,
    /// Where it was given, for messages: `--prompt #2`, `--prompt-ids #1`
    /// (1-based occurrence of the option), `prompts.jsonl:3` (file and line),
    /// `built-in prompt #1`, `gsm8k row 1101`.
    pub origin: String,
    /// Token ids `[T]`.
    pub ids: Vec<u32>,
    /// The conversation and its rendering, when the chat template made the
    /// text (`None` for raw text and token ids).
    pub chat: Option<ChatPrompt>,
}

impl Prompt {
    /// `text`, `ids`, `builtin`, `messages` or `prompt-set`.
    pub fn kind(&self) -> &'static str {
        self.source_kind().name()
    }

    /// Where the prompt came from, as a kind ([`PromptKind`]).
    pub fn source_kind(&self) -> PromptKind {
        match self.source {
            PromptSource::Text(_) => PromptKind::Text,
            PromptSource::Ids => PromptKind::Ids,
            PromptSource::Builtin(_) => PromptKind::Builtin,
            PromptSource::Messages => PromptKind::Messages,
            PromptSource::PromptSet(..) => PromptKind::PromptSet,
        }
    }

    /// The text as given, when there is one (`--prompt`, a text line, a
    /// built-in text; not a conversation).
    pub fn text(&self) -> Option<&str> {
        match &self.source {
            PromptSource::Text(t)
            | PromptSource::Builtin(Some(t))
            | PromptSource::PromptSet(_, Some(t)) => Some(t),
            _ => None,
        }
    }

    /// The text that was tokenised: the chat template's rendering, else the
    /// text as given; `None` for token ids.
    pub fn fed_text(&self) -> Option<&str> {
        match &self.chat {
            Some(c) => Some(&c.text),
            None => self.text(),
        }
    }

    /// sha256 (64 hex digits) of [`Self::fed_text`] as UTF-8, as Python's
    /// `hashlib.sha256(text.encode()).hexdigest()`; `None` for token ids.
    pub fn rendered_sha256(&self) -> Option<String> {
        self.fed_text()
            .map(|t| format!("{:x}", Sha256::digest(t.as_bytes())))
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
    /// `--messages FILE.jsonl`: one `{"messages": [{"role": …, "content":
    /// …}, …]}` per line, rendered with the chat template.
    pub messages: Option<PathBuf>,
    /// `--chat`: every text prompt (`--prompt`, text lines of `--prompts`,
    /// the built-in texts) becomes one user turn rendered with the template.
    pub chat: bool,
    /// `--chat-template FILE`: this template instead of the checkpoint's.
    pub chat_template: Option<PathBuf>,
    /// `--enable-thinking true|false`; `None` = not passed to the template
    /// (which is not `false`).
    pub enable_thinking: Option<bool>,
    /// `--system TEXT`: a system turn put before every conversation.
    pub system: Option<String>,
    /// `--prompt-set NAME[:N]`: a built-in benchmark set.
    pub prompt_set: Option<PromptSetSpec>,
    /// What runs when no option names prompts (set by the verb, not a flag).
    pub default: DefaultPrompts,
}

/// `arg` quoted for a POSIX shell when it needs it.
pub fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:,=@%+".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

impl PromptOptions {
    /// The options as command-line flags, shell-quoted, in a fixed order
    /// (each flag followed by its value; the valueless `--chat` last): what
    /// another command needs to run on the same prompts, rendered the same
    /// way.
    pub fn to_flags(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut flag = |name: &str, value: String| {
            out.push(name.to_string());
            out.push(shell_quote(&value));
        };
        for t in &self.texts {
            flag("--prompt", t.clone());
        }
        for ids in &self.ids {
            let list: Vec<String> = ids.iter().map(u32::to_string).collect();
            flag("--prompt-ids", list.join(","));
        }
        if let Some(f) = &self.file {
            flag("--prompts", f.display().to_string());
        }
        if let Some(f) = &self.messages {
            flag("--messages", f.display().to_string());
        }
        if let Some(f) = &self.chat_template {
            flag("--chat-template", f.display().to_string());
        }
        if let Some(t) = self.enable_thinking {
            flag("--enable-thinking", t.to_string());
        }
        if let Some(s) = &self.system {
            flag("--system", s.clone());
        }
        if let Some(s) = &self.prompt_set {
            flag("--prompt-set", s.to_string());
        }
        if self.chat {
            out.push("--chat".into());
        }
        out
    }

    /// True when the drafter default runs: a drafter evaluation's options
    /// name no prompts.
    pub fn uses_drafter_default(&self) -> bool {
        self.default == DefaultPrompts::Drafter && !self.names_prompts()
    }

    /// True when some option names prompts (else the built-in set runs).
    pub fn names_prompts(&self) -> bool {
        !self.texts.is_empty()
            || !self.ids.is_empty()
            || self.file.is_some()
            || self.messages.is_some()
            || self.prompt_set.is_some()
    }

    /// True when some prompt is rendered with a chat template (`--chat`,
    /// `--messages`, `--prompt-set`).
    pub fn templated(&self) -> bool {
        self.chat || self.messages.is_some() || self.prompt_set.is_some()
    }

    /// The first given flag that only means something with a template.
    fn template_only_flag(&self) -> Option<&'static str> {
        if self.chat_template.is_some() {
            Some("--chat-template")
        } else if self.enable_thinking.is_some() {
            Some("--enable-thinking")
        } else if self.system.is_some() {
            Some("--system")
        } else {
            None
        }
    }
}

/// Limits a prompt must respect.
#[derive(Debug, Clone, Copy)]
pub struct PromptLimits {
    /// `vocab_size`: every id must be below it.
    pub vocab_size: usize,
    /// `max_position_embeddings`: the longest prompt allowed.
    pub max_tokens: usize,
}

impl PromptLimits {
    /// The limits of a text config (`vocab_size`, `max_position_embeddings`).
    pub fn of(text: &TextConfig) -> Self {
        PromptLimits {
            vocab_size: text.vocab_size,
            max_tokens: text.max_position_embeddings,
        }
    }
}

/// A built-in benchmark set as run: what was asked for, and for each set it
/// names (five for `mix`) its data and how its records were chosen.
#[derive(Debug, Clone)]
pub struct PromptSetRun {
    /// `NAME[:N]`.
    pub spec: PromptSetSpec,
    /// Each set run: the embedded data file, its sha256 and license, and the
    /// selection in words (z-lab/dflash `benchmark.py`'s).
    pub sets: Vec<(PromptSetSource, String)>,
    /// Records passed over because they do not fit the target (the drafter
    /// default only), `set row` each.
    pub passed_over: Vec<String>,
}

/// How the prompts' text was made: the facts a report records.
#[derive(Debug, Clone, Default)]
pub struct Rendering {
    /// The chat template, when one rendered prompts (the one used for
    /// conversations without tools).
    pub template: Option<TemplateSource>,
    /// `--enable-thinking` as given (`None` = not passed).
    pub enable_thinking: Option<bool>,
    /// `--system`, when given.
    pub system: Option<String>,
    /// `--prompt-set` (or the drafter default), when one ran.
    pub prompt_set: Option<PromptSetRun>,
    /// Which prompts ran: given, a default, or the trajectories'.
    pub basis: PromptBasis,
}

/// The prompts of a run and how their text was made.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The prompts, in order: `--prompt`, `--prompt-ids`, `--prompts`,
    /// `--messages`, `--prompt-set` (or the built-in set).
    pub prompts: Vec<Prompt>,
    /// Template, thinking flag, system turn and prompt set.
    pub rendering: Rendering,
}

/// Resolves the prompts and checks them against `limits`, without a
/// checkpoint directory (so without chat templates): the prompts of
/// [`resolve_in`].
///
/// Errors: as [`resolve_in`].
pub fn resolve(
    opts: &PromptOptions,
    tokenizer: Option<&Path>,
    limits: PromptLimits,
) -> Result<Vec<Prompt>> {
    Ok(resolve_in(opts, None, tokenizer, limits)?.prompts)
}

/// Resolves the prompts of checkpoint `dir` ([`collect`]) and checks them
/// against `limits` ([`violations`]: the first one is the error).
///
/// Errors ([`Error::Input`]): anything [`collect`] returns, an empty prompt,
/// a token id `≥ vocab_size`, or a prompt longer than
/// `max_position_embeddings`. Messages give the prompt's index (as in
/// dumps, `p{k}`) and where it came from ([`Prompt::origin`]).
pub fn resolve_in(
    opts: &PromptOptions,
    dir: Option<&Path>,
    tokenizer: Option<&Path>,
    limits: PromptLimits,
) -> Result<Resolved> {
    let resolved = collect(opts, dir, tokenizer, limits)?;
    match violations(&resolved.prompts, limits).into_iter().next() {
        Some(problem) => Err(Error::Input(problem)),
        None => Ok(resolved),
    }
}

/// The prompts `opts` name, rendered and tokenised, unchecked: in order
/// `--prompt`, `--prompt-ids`, `--prompts`, `--messages`, `--prompt-set`;
/// the built-in set when none is given (cut to `limits.max_tokens`).
///
/// Errors ([`Error::Input`], one line naming the flag, file and line or
/// prompt): a text prompt without `tokenizer.json`; an unreadable,
/// non-UTF-8 or malformed prompts or messages file (a line that is not JSON,
/// has no user turn, …); a template-only flag without a templated prompt;
/// no chat template, or one that does not parse, raises or fails;
/// `--system` before a conversation's own system turn; `--chat` that
/// renders nothing (token ids only).
pub fn collect(
    opts: &PromptOptions,
    dir: Option<&Path>,
    tokenizer: Option<&Path>,
    limits: PromptLimits,
) -> Result<Resolved> {
    let tok = Tokenizer::new(tokenizer);
    let benchmark_default = opts.uses_drafter_default() && tokenizer.is_some();
    let chat = match (benchmark_default, dir) {
        (true, Some(d)) => Templating::open_default(opts, d)?,
        _ => Templating::open(opts, dir, tokenizer)?,
    };
    let text_prompt = |text: String, origin: String, builtin: bool| -> Result<Prompt> {
        let source = if builtin {
            PromptSource::Builtin(Some(text.clone()))
        } else {
            PromptSource::Text(text.clone())
        };
        match (&chat, opts.chat) {
            (Some(c), true) => c.prompt(Conversation::user(&text, &origin), source, &tok),
            _ => Ok(Prompt {
                ids: tok.encode(&text, &origin)?,
                source,
                origin,
                chat: None,
            }),
        }
    };
    let mut prompts = Vec::new();
    for (i, t) in opts.texts.iter().enumerate() {
        prompts.push(text_prompt(
            t.clone(),
            format!("--prompt #{}", i + 1),
            false,
        )?);
    }
    for (i, ids) in opts.ids.iter().enumerate() {
        prompts.push(Prompt {
            source: PromptSource::Ids,
            ids: ids.clone(),
            origin: format!("--prompt-ids #{}", i + 1),
            chat: None,
        });
    }
    if let Some(f) = &opts.file {
        prompts.extend(read_jsonl(f, |t, at| text_prompt(t, at, false))?);
    }
    if let (Some(c), Some(f)) = (&chat, &opts.messages) {
        for conv in Conversation::read_jsonl(f)? {
            prompts.push(c.prompt(conv, PromptSource::Messages, &tok)?);
        }
    }
    let render = |conv: Conversation, set: &'static str| match &chat {
        Some(c) => c.prompt(conv, PromptSource::PromptSet(set, None), &tok),
        None => raw_turn(conv, set, &tok),
    };
    let mut prompt_set = None;
    if let (Some(spec), Some(_)) = (opts.prompt_set, &chat) {
        let mut sets = Vec::new();
        for set in prompt_sets::load_all(spec)? {
            for conv in set.conversations {
                prompts.push(render(conv, set.spec.name)?);
            }
            sets.push((set.source, set.selection));
        }
        prompt_set = Some(PromptSetRun {
            spec,
            sets,
            passed_over: Vec::new(),
        });
    }
    if benchmark_default {
        let (chosen, run) = default_set(limits.max_tokens, &render)?;
        prompts.extend(chosen);
        prompt_set = Some(run);
    }
    let basis = if !prompts.is_empty() {
        if benchmark_default {
            PromptBasis::DrafterDefault
        } else {
            PromptBasis::Given
        }
    } else {
        prompts = builtin_prompts(tokenizer.is_some(), limits, |t, origin| {
            text_prompt(t, origin, true)
        })?;
        if opts.uses_drafter_default() {
            PromptBasis::BuiltinIds
        } else {
            PromptBasis::ParityBuiltin
        }
    };
    if opts.chat && !prompts.iter().any(|p| p.chat.is_some()) {
        return Err(Error::Input(
            "--chat renders text prompts (--prompt, text lines of --prompts) as user turns, and every prompt given is token ids (--prompt-ids are fed as they are)".into(),
        ));
    }
    Ok(Resolved {
        prompts,
        rendering: Rendering {
            template: chat.as_ref().map(|c| c.source().clone()),
            enable_thinking: chat
                .as_ref()
                .and_then(|c| c.enable_thinking())
                .or(opts.enable_thinking),
            system: opts.system.clone(),
            prompt_set,
            basis,
        },
    })
}

/// What a run would refuse in `prompts`, one line each, in prompt order:
/// an empty prompt, one longer than `max_position_embeddings`, a token id
/// `≥ vocab_size`.
pub fn violations(prompts: &[Prompt], limits: PromptLimits) -> Vec<String> {
    let mut out = Vec::new();
    for (k, p) in prompts.iter().enumerate() {
        let o = &p.origin;
        if p.ids.is_empty() {
            out.push(format!("prompt {k} ({o}) has no tokens"));
            continue;
        }
        if p.ids.len() > limits.max_tokens {
            out.push(format!(
                "prompt {k} ({o}) has {} tokens, more than the model allows (max_position_embeddings = {})",
                p.ids.len(),
                limits.max_tokens
            ));
        }
        if let Some((pos, bad)) = p
            .ids
            .iter()
            .enumerate()
            .find(|(_, &i)| i as usize >= limits.vocab_size)
        {
            out.push(format!(
                "prompt {k} ({o}): token id {bad} at position {pos} is out of range (vocab_size = {})",
                limits.vocab_size
            ));
        }
    }
    out
}

/// Parses `1,2,3` into ids (an empty string gives no ids). Errors: a
/// non-integer, negative or empty entry (`1,,2`, `1,2,`).
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    parse_id_list(s).map_err(|e| Error::Input(format!("--prompt-ids {:?}: {e}", preview(s))))
}

/// [`parse_ids`]'s list, the message not naming the flag (a clap value
/// parser's error, which clap prefixes with the flag and the value).
///
/// Errors: an empty entry, or one that is not a token id.
pub fn parse_id_list(s: &str) -> std::result::Result<Vec<u32>, String> {
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(str::trim)
        .enumerate()
        .map(|(i, x)| {
            if x.is_empty() {
                return Err(format!(
                    "entry {} is empty (two commas in a row, or one at an end)",
                    i + 1
                ));
            }
            x.parse::<u32>()
                .map_err(|_| format!("{x:?} is not a token id (non-negative integer below 2^32)"))
        })
        .collect()
}

#[cfg(test)]
mod tests;
