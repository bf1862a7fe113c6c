//! Where a checkpoint's chat template comes from, and rendering it
//! (`tokenization_utils_base.py` lookup, `apply_chat_template`).

use crate::error::{Error, Result};
use indexmap::IndexMap;
use minijinja::{Environment, Value};
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::{Path, PathBuf};

use super::python::*;
use super::*;

/// The named special tokens transformers 5.23.0 knows
/// (`PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES`), in its order.
pub const SPECIAL_TOKEN_ATTRIBUTES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// `model_type`s whose tokenizer transformers 5.23.0 builds as
/// `Qwen3_5Tokenizer` or `Qwen2Tokenizer` whatever `tokenizer_class` says
/// (`models/auto/tokenization_auto.py`: `TOKENIZER_MAPPING_NAMES` and
/// `MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`).
const QWEN_FORCED_MODEL_TYPES: [&str; 5] = [
    "qwen2",
    "qwen3_5",
    "qwen3_5_text",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
];

/// The chat-template part of `tokenizer_config.json` and the special tokens
/// the template sees.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenizerConfig {
    /// The file read, `None` when the checkpoint has none.
    pub path: Option<PathBuf>,
    /// `chat_template`: a string, or named templates (a list of `{name,
    /// template}`, as `PreTrainedTokenizerBase.__init__` turns it into a dict).
    pub chat_template: Option<ConfigTemplate>,
    /// `special_tokens_map` as transformers builds it: the named special
    /// tokens that are set, in [`SPECIAL_TOKEN_ATTRIBUTES`] order.
    pub special_tokens: Vec<(String, String)>,
}

/// `chat_template` in `tokenizer_config.json`.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigTemplate {
    /// One template.
    Single(String),
    /// Named templates, in file order.
    Named(Vec<(String, String)>),
}

impl TokenizerConfig {
    /// Reads `dir/tokenizer_config.json` (an empty config when absent) and
    /// `dir/config.json`'s `model_type`.
    ///
    /// Special tokens follow `PreTrainedTokenizerBase.special_tokens_map`: a
    /// named token given as a string or an `AddedToken` object
    /// (`{"content": …}`) is set, an explicit `null` is not. A token the file
    /// does not mention takes the tokenizer class's default, which hsparity
    /// knows for the Qwen classes only: `Qwen2Tokenizer` and
    /// `Qwen3_5Tokenizer` (`models/qwen2/tokenization_qwen2.py`,
    /// `models/qwen3_5/tokenization_qwen3_5.py`) default `unk_token`,
    /// `eos_token` and `pad_token` to `<|endoftext|>`. The class is the one
    /// `AutoTokenizer.from_pretrained` picks: forced for `model_type` `qwen2`
    /// and the `qwen3_5` family, else `tokenizer_class` when it names a Qwen
    /// class, else (no `tokenizer_class`) the class registered for
    /// `model_type` `qwen3`.
    ///
    /// Errors ([`Error::Config`], naming the file): not JSON, not an object,
    /// or a `chat_template` that is neither a string nor a list of `{name,
    /// template}` objects.
    pub fn read(dir: &Path) -> Result<TokenizerConfig> {
        let model_type = read_model_type(&dir.join("config.json"));
        let path = dir.join("tokenizer_config.json");
        if !path.is_file() {
            return Ok(TokenizerConfig {
                special_tokens: special_tokens(&[], model_type.as_deref(), None),
                ..TokenizerConfig::default()
            });
        }
        Self::from_file(&path, model_type.as_deref())
    }

    /// Reads one `tokenizer_config.json`; `model_type` as in [`Self::read`].
    pub fn from_file(path: &Path, model_type: Option<&str>) -> Result<TokenizerConfig> {
        let text = crate::input::read_to_string(path)?;
        let json: Json = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: not valid JSON: {e}", path.display())))?;
        let Json::Object(kv) = json else {
            return Err(Error::Config(format!(
                "{}: expected a JSON object",
                path.display()
            )));
        };
        let chat_template = match kv
            .iter()
            .find(|(k, _)| k == "chat_template")
            .map(|(_, v)| v)
        {
            None | Some(Json::Null) => None,
            Some(Json::String(s)) => Some(ConfigTemplate::Single(s.clone())),
            Some(Json::Array(items)) => {
                let mut named = Vec::new();
                for it in items {
                    match (it.get("name"), it.get("template")) {
                        (Some(Json::String(n)), Some(Json::String(t))) => {
                            named.push((n.clone(), t.clone()))
                        }
                        _ => {
                            return Err(Error::Config(format!(
                                "{}: chat_template: each entry of the list must be {{\"name\": \u{2026}, \"template\": \u{2026}}}",
                                path.display()
                            )))
                        }
                    }
                }
                Some(ConfigTemplate::Named(named))
            }
            Some(other) => {
                return Err(Error::Config(format!(
                    "{}: chat_template must be a string or a list of {{name, template}}, found {}",
                    path.display(),
                    other.kind()
                )))
            }
        };
        let class = kv
            .iter()
            .find(|(k, _)| k == "tokenizer_class")
            .and_then(|(_, v)| v.as_str());
        Ok(TokenizerConfig {
            path: Some(path.to_path_buf()),
            chat_template,
            special_tokens: special_tokens(&kv, model_type, class),
        })
    }
}

fn read_model_type(config: &Path) -> Option<String> {
    let text = crate::input::read_to_string(config).ok()?;
    let json: Json = serde_json::from_str(&text).ok()?;
    json.get("model_type")?.as_str().map(str::to_owned)
}

fn special_tokens(
    kv: &[(String, Json)],
    model_type: Option<&str>,
    class: Option<&str>,
) -> Vec<(String, String)> {
    let class = class.map(|c| c.strip_suffix("Fast").unwrap_or(c));
    let qwen_class = model_type.is_some_and(|m| QWEN_FORCED_MODEL_TYPES.contains(&m))
        || matches!(class, Some("Qwen2Tokenizer" | "Qwen3_5Tokenizer"))
        || (class.is_none() && model_type == Some("qwen3"));
    let mut out = Vec::new();
    for attr in SPECIAL_TOKEN_ATTRIBUTES {
        let token = match kv.iter().find(|(k, _)| k == attr).map(|(_, v)| v) {
            Some(Json::String(s)) => Some(s.clone()),
            Some(obj @ Json::Object(_)) => {
                obj.get("content").and_then(Json::as_str).map(str::to_owned)
            }
            Some(_) => None,
            None if qwen_class && matches!(attr, "unk_token" | "eos_token" | "pad_token") => {
                Some("<|endoftext|>".to_owned())
            }
            None => None,
        };
        if let Some(t) = token {
            out.push((attr.to_owned(), t));
        }
    }
    out
}

// ------------------------------------------------------------------------------------------------
// Templates
// ------------------------------------------------------------------------------------------------

/// Where a chat template came from, for reports: the file
/// `PreTrainedTokenizerBase.from_pretrained` read it from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateSource {
    /// The file: a `.jinja` file, or `tokenizer_config.json` for its
    /// `chat_template` key.
    pub path: PathBuf,
    /// The template's name when the checkpoint has several (`default`,
    /// `tool_use`, an `additional_chat_templates/` file stem), else `None`.
    pub name: Option<String>,
    /// sha256 of the template text (for a `.jinja` file: of the file).
    pub sha256: String,
}

impl fmt::Display for TemplateSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if self.path.extension().is_some_and(|e| e == "json") {
            f.write_str(" \"chat_template\"")?;
        }
        if let Some(n) = &self.name {
            write!(f, " [{n}]")?;
        }
        write!(f, " (sha256 {})", self.sha256)
    }
}

/// How to render: `apply_chat_template`'s arguments that hsparity exposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderOptions {
    /// `add_generation_prompt` (true for every prompt hsparity feeds a model).
    pub add_generation_prompt: bool,
    /// `enable_thinking`: `None` = not passed at all, so the template sees an
    /// undefined variable (which is not `false`: the Qwen3.5 template then
    /// opens a think block).
    pub enable_thinking: Option<bool>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            add_generation_prompt: true,
            enable_thinking: None,
        }
    }
}

/// `true`, `false` or `unset`: the thinking flag as the report names it
/// (`unset` = `apply_chat_template` called without `enable_thinking`).
pub fn thinking_label(enable_thinking: Option<bool>) -> &'static str {
    match enable_thinking {
        Some(true) => "true",
        Some(false) => "false",
        None => "unset",
    }
}

struct Compiled {
    source: TemplateSource,
    text: String,
    env: Environment<'static>,
    /// The name the template is registered under in `env` (its file name),
    /// which minijinja puts in error messages.
    key: String,
}

/// A checkpoint's chat template(s), compiled, with the special tokens the
/// tokenizer passes to them.
pub struct ChatTemplate {
    templates: Vec<Compiled>,
    special_tokens: Vec<(String, String)>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field(
                "templates",
                &self.templates.iter().map(|t| &t.source).collect::<Vec<_>>(),
            )
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

impl ChatTemplate {
    /// The checkpoint's chat template, found as transformers 5.23.0 finds it
    /// (`PreTrainedTokenizerBase.from_pretrained` collects
    /// `chat_template.jinja` and `additional_chat_templates/*.jinja`;
    /// `_from_pretrained` lets them replace `tokenizer_config.json`'s
    /// `chat_template`: a lone `chat_template.jinja` is the template, with
    /// additional files it is the `default` of a set of named templates, and
    /// additional files alone replace the config key with their own set).
    ///
    /// `Ok(None)`: no template anywhere. Errors ([`Error::Config`], naming the
    /// file): a template that does not parse, an unreadable `.jinja` file, or
    /// named templates without a `default` (transformers'
    /// `get_chat_template` refuses those unless given a name).
    pub fn for_checkpoint(dir: &Path, config: &TokenizerConfig) -> Result<Option<ChatTemplate>> {
        let mut files: Vec<(String, PathBuf)> = Vec::new();
        let main = dir.join("chat_template.jinja");
        if main.is_file() {
            files.push(("default".into(), main));
        }
        let extra = dir.join("additional_chat_templates");
        if extra.is_dir() {
            let mut found = Vec::new();
            let rd = std::fs::read_dir(&extra).map_err(|e| Error::io(&extra, e))?;
            for entry in rd {
                let p = entry.map_err(|e| Error::io(&extra, e))?.path();
                if p.is_file() && p.extension().is_some_and(|e| e == "jinja") {
                    if let Some(stem) = p.file_stem().and_then(|s| s.to_str()) {
                        found.push((stem.to_owned(), p.clone()));
                    }
                }
            }
            found.sort();
            for (name, p) in found {
                // a later file of the same name replaces an earlier one, as in the dict
                files.retain(|(n, _)| *n != name);
                files.push((name, p));
            }
        }
        let mut named: Vec<(Option<String>, String, PathBuf)> = Vec::new();
        if !files.is_empty() {
            let single = files.len() == 1 && files[0].0 == "default";
            for (name, p) in files {
                let text = crate::input::read_to_string(&p)?;
                named.push(((!single).then_some(name), text, p));
            }
        } else {
            let cfg_path = config
                .path
                .clone()
                .unwrap_or_else(|| dir.join("tokenizer_config.json"));
            match &config.chat_template {
                None => return Ok(None),
                Some(ConfigTemplate::Single(t)) => named.push((None, t.clone(), cfg_path)),
                Some(ConfigTemplate::Named(list)) => {
                    for (n, t) in list {
                        named.retain(|(x, _, _)| x.as_deref() != Some(n.as_str()));
                        named.push((Some(n.clone()), t.clone(), cfg_path.clone()));
                    }
                }
            }
        }
        Self::compile(named, config, Error::Config).map(Some)
    }

    /// The checkpoint's chat template, or an error saying there is none
    /// (for `--chat`: transformers' `get_chat_template` raises
    /// "Cannot use chat template functions because tokenizer.chat_template is
    /// not set").
    ///
    /// Errors: as [`Self::for_checkpoint`], and [`Error::Input`] naming the
    /// directory when it has no template.
    pub fn require_for_checkpoint(dir: &Path, config: &TokenizerConfig) -> Result<ChatTemplate> {
        Self::for_checkpoint(dir, config)?.ok_or_else(|| {
            Error::Input(format!(
                "{}: the checkpoint has no chat template (no chat_template.jinja, no additional_chat_templates/*.jinja, no \"chat_template\" in tokenizer_config.json); give one with --chat-template FILE",
                dir.display()
            ))
        })
    }

    /// A template file given explicitly (`--chat-template FILE`), with the
    /// special tokens of the checkpoint's tokenizer config. As
    /// `apply_chat_template(chat_template=<text>)`: the text is the template.
    ///
    /// Errors: unreadable or not UTF-8 ([`Error::Io`]); does not parse
    /// ([`Error::Input`], naming the file and line).
    pub fn from_file(path: &Path, config: &TokenizerConfig) -> Result<ChatTemplate> {
        let text = crate::input::read_to_string(path)?;
        Self::compile(vec![(None, text, path.to_path_buf())], config, Error::Input)
    }

    /// A template from its text; `path` names it in sources and errors.
    ///
    /// Errors ([`Error::Input`]): the template does not parse.
    pub fn from_text(text: &str, path: &Path, config: &TokenizerConfig) -> Result<ChatTemplate> {
        Self::compile(
            vec![(None, text.to_owned(), path.to_path_buf())],
            config,
            Error::Input,
        )
    }

    fn compile(
        named: Vec<(Option<String>, String, PathBuf)>,
        config: &TokenizerConfig,
        kind: fn(String) -> Error,
    ) -> Result<ChatTemplate> {
        let mut templates = Vec::with_capacity(named.len());
        for (name, text, path) in named {
            if text.len() > super::bounds::MAX_TEMPLATE_BYTES {
                return Err(kind(format!(
                    "{}: the chat template is {} bytes, more than a chat template holds (hsparity reads at most {} KiB; Qwen3.5's is 8)",
                    path.display(),
                    text.len(),
                    super::bounds::MAX_TEMPLATE_BYTES >> 10
                )));
            }
            let sha256 = format!("{:x}", Sha256::digest(text.as_bytes()));
            let key = path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_else(|| "chat_template".into());
            let key = match &name {
                Some(n) if path.extension().is_some_and(|e| e == "json") => format!("{key}[{n}]"),
                _ => key,
            };
            let mut env = environment();
            let source = rewrite_generation_tags(&text).into_owned();
            env.add_template_owned(key.clone(), source).map_err(|e| {
                kind(format!(
                    "{}{}: chat template does not parse: {}",
                    path.display(),
                    e.line().map(|l| format!(":{l}")).unwrap_or_default(),
                    one_line(e.detail().unwrap_or(&e.kind().to_string()))
                ))
            })?;
            templates.push(Compiled {
                source: TemplateSource { path, name, sha256 },
                text,
                env,
                key,
            });
        }
        let t = ChatTemplate {
            templates,
            special_tokens: config.special_tokens.clone(),
        };
        if t.templates.iter().any(|c| c.source.name.is_some()) && t.named("default").is_none() {
            let names: Vec<&str> = t
                .templates
                .iter()
                .filter_map(|c| c.source.name.as_deref())
                .collect();
            return Err(Error::Config(format!(
                "{}: the checkpoint has several chat templates ({}) and none is named \"default\" (transformers refuses to pick one)",
                t.templates[0].source.path.display(),
                names.join(", ")
            )));
        }
        Ok(t)
    }

    fn named(&self, name: &str) -> Option<&Compiled> {
        self.templates
            .iter()
            .find(|c| c.source.name.as_deref() == Some(name))
    }

    /// The template `get_chat_template(None, tools)` picks: the only one, else
    /// `tool_use` when the conversation has tools and there is one, else
    /// `default`.
    fn select(&self, with_tools: bool) -> &Compiled {
        if self.templates.len() == 1 {
            return &self.templates[0];
        }
        with_tools
            .then(|| self.named("tool_use"))
            .flatten()
            .or_else(|| self.named("default"))
            .unwrap_or(&self.templates[0])
    }

    /// The source of the template used for conversations without tools (the
    /// only template, or `default`: `get_chat_template(None, None)`), for the
    /// report.
    pub fn source(&self) -> &TemplateSource {
        &self.select(false).source
    }

    /// The source of the template [`Self::render`] uses for `conversation`
    /// (`get_chat_template(None, tools)`).
    pub fn source_for(&self, conversation: &Conversation) -> &TemplateSource {
        &self.select(conversation.tools.is_some()).source
    }

    /// The text of the template used without tools
    /// (`tokenizer.get_chat_template()`).
    pub fn text(&self) -> &str {
        &self.select(false).text
    }

    /// Every template with its source: one, or the named set
    /// (`tokenizer.chat_template` as a dict).
    pub fn sources(&self) -> Vec<&TemplateSource> {
        self.templates.iter().map(|c| &c.source).collect()
    }

    /// The special tokens passed as template variables
    /// (`tokenizer.special_tokens_map`, spread into the template kwargs by
    /// `apply_chat_template`).
    pub fn special_tokens(&self) -> &[(String, String)] {
        &self.special_tokens
    }

    /// Renders `conversation` as transformers 5.23.0
    /// `PreTrainedTokenizerBase.apply_chat_template(conversation.messages,
    /// tools=conversation.tools, add_generation_prompt=…, tokenize=False[,
    /// enable_thinking=…])` does: `render_jinja_template` calls
    /// `compiled.render(messages=…, tools=…, documents=None,
    /// add_generation_prompt=…, **special_tokens_map, **kwargs)`.
    ///
    /// Errors ([`Error::Input`], one line naming the template file and the
    /// conversation's origin): the template raised (`raise_exception`: its
    /// own message, verbatim) or failed while rendering (with minijinja's
    /// description and the template line).
    pub fn render(&self, conversation: &Conversation, opts: &RenderOptions) -> Result<String> {
        let t = self.select(conversation.tools.is_some());
        let mut ctx: IndexMap<Value, Value> = IndexMap::new();
        for (k, v) in &self.special_tokens {
            ctx.insert(Value::from(k.as_str()), Value::from(v.as_str()));
        }
        if let Some(b) = opts.enable_thinking {
            ctx.insert(Value::from("enable_thinking"), Value::from(b));
        }
        let messages: Vec<Value> = conversation
            .messages
            .iter()
            .map(Message::template_value)
            .collect();
        ctx.insert(Value::from("messages"), Value::from(messages));
        ctx.insert(
            Value::from("tools"),
            match &conversation.tools {
                Some(tools) => Value::from(tools.iter().map(Json::to_value).collect::<Vec<_>>()),
                None => Value::from(()),
            },
        );
        ctx.insert(Value::from("documents"), Value::from(()));
        ctx.insert(
            Value::from("add_generation_prompt"),
            Value::from(opts.add_generation_prompt),
        );
        let file = t.source.path.display();
        let origin = &conversation.origin;
        let rendered = super::bounds::render(t.env.clone(), t.key.clone(), Value::from(ctx))
            .map_err(|m| Error::Input(format!("{file}: {m} ({origin})")))?;
        rendered.map_err(|e| {
            let at = e.line().map(|l| format!(":{l}")).unwrap_or_default();
            if let Some(msg) = raised_message(&e) {
                Error::Input(format!(
                    "{file}{at}: the chat template raised an exception: {} ({origin})",
                    one_line(&msg)
                ))
            } else if e.kind() == minijinja::ErrorKind::OutOfFuel {
                Error::Input(format!(
                    "{file}{at}: the chat template did more work than one render may ({} units of instructions and data, about {} MB): it loops or grows without end ({origin})",
                    super::bounds::RENDER_FUEL,
                    super::bounds::RENDER_FUEL * 64 / 1_000_000
                ))
            } else {
                Error::Input(format!(
                    "{file}{at}: rendering the chat template failed: {} ({origin})",
                    one_line(&describe(&e))
                ))
            }
        })
    }
}

/// Encodes a rendered prompt as `apply_chat_template(tokenize=True)` does:
/// `tokenizer(text, add_special_tokens=False)` (special and added tokens in
/// the text are matched as tokens, `split_special_tokens=False`).
///
/// Errors ([`Error::Input`], naming `origin`): the tokenizer fails.
pub fn encode(tokenizer: &tokenizers::Tokenizer, text: &str, origin: &str) -> Result<Vec<u32>> {
    tokenizer
        .encode(text, false)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| {
            Error::Input(format!(
                "{origin}: tokenizing the rendered prompt failed: {e}"
            ))
        })
}

/// Reads a `tokenizer.json` with the `tokenizers` crate (the file
/// transformers' `TokenizersBackend` reads; see `tools/chat_fixtures.py` for
/// when its pipeline differs from the one `AutoTokenizer` rebuilds).
///
/// Errors ([`Error::Input`], naming the file): unreadable or not a tokenizer.
pub fn load_tokenizer(path: &Path) -> Result<tokenizers::Tokenizer> {
    tokenizers::Tokenizer::from_bytes(crate::input::read(path)?).map_err(|e| {
        Error::Input(format!(
            "{}: cannot read the tokenizer: {e}",
            path.display()
        ))
    })
}

// ------------------------------------------------------------------------------------------------
// The Jinja environment (transformers' _cached_compile_jinja_template, in minijinja)
// ------------------------------------------------------------------------------------------------
