//! Chat templates, rendered as transformers 5.23.0 renders them.
//!
//! What a DFlash evaluation really feeds the target is the checkpoint's chat
//! template applied to the conversation, not raw text. This module reproduces
//! transformers' `tokenizer.apply_chat_template(conversation,
//! add_generation_prompt=True[, enable_thinking=…])` byte for byte:
//!
//! - **lookup** ([`ChatTemplate::for_checkpoint`]) as
//!   `PreTrainedTokenizerBase.from_pretrained` / `_from_pretrained`
//!   (`tokenization_utils_base.py`) do it: `chat_template.jinja` and
//!   `additional_chat_templates/*.jinja` override the `chat_template` key of
//!   `tokenizer_config.json`; a list of `{name, template}` becomes named
//!   templates, and `get_chat_template` picks `tool_use` when tools are given,
//!   else `default`;
//! - **rendering** ([`ChatTemplate::render`]) with `minijinja` configured as
//!   `utils/chat_template_utils.py::_cached_compile_jinja_template` configures
//!   Jinja2 (`trim_blocks`, `lstrip_blocks`, no auto-escaping,
//!   `raise_exception`, a `tojson` that does not HTML-escape, loop controls,
//!   `{% generation %}` blocks) plus Python semantics where minijinja differs
//!   (`str` methods through `minijinja_contrib::pycompat`, Python's
//!   whitespace in `strip`/`trim`, `None`/`True`/`False` and float `repr` when
//!   printed), and the inputs prepared as `apply_chat_template` and
//!   `render_jinja_template` prepare them (message keys whose value is `None`
//!   dropped, reasoning fields aliased, the tokenizer's special tokens as
//!   variables, `enable_thinking` passed only when set);
//! - **encoding** ([`encode`]) with `add_special_tokens=false`, as
//!   `apply_chat_template(tokenize=True)` encodes the rendered text.
//!
//! Not covered: `strftime_now` (an unknown function here), the legacy
//! processor `chat_template.json`, `continue_final_message`, and the
//! tokenizer-class defaults of tokenizer classes other than the Qwen ones
//! (see [`TokenizerConfig`]).

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{AutoEscape, Environment, ErrorKind, State, UndefinedBehavior, Value};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

// ------------------------------------------------------------------------------------------------
// JSON with ordered objects
// ------------------------------------------------------------------------------------------------

/// A JSON value whose objects keep their keys in document order, as Python's
/// `json.loads` dicts do (templates can iterate a message's items).
///
/// A repeated key keeps its first position and its last value, as a Python
/// dict built by `json.loads` does.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null` (Python `None`).
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer or a float, as written (`1` is an int, `1.0` a float).
    Number(serde_json::Number),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<Json>),
    /// An object, keys in document order.
    Object(Vec<(String, Json)>),
}

impl Json {
    /// The string, when this is one (a Python `str` in the template).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value under `key`, when this is an object that has it (Python
    /// `dict.get`).
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(kv) => kv.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The template value, as transformers' `_plain_template_data` hands JSON
    /// types to Jinja2 (dicts in insertion order, ints and floats apart).
    fn to_value(&self) -> Value {
        match self {
            Json::Null => Value::from(()),
            Json::Bool(b) => Value::from(*b),
            Json::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Value::from(i)
                } else if let Some(u) = n.as_u64() {
                    Value::from(u)
                } else {
                    Value::from(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Json::String(s) => Value::from(s.as_str()),
            Json::Array(a) => Value::from(a.iter().map(Json::to_value).collect::<Vec<_>>()),
            Json::Object(kv) => Value::from(
                kv.iter()
                    .map(|(k, v)| (Value::from(k.as_str()), v.to_value()))
                    .collect::<IndexMap<Value, Value>>(),
            ),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Number(_) => "a number",
            Json::String(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Json;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> std::result::Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_none<E>(self) -> std::result::Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, b: bool) -> std::result::Result<Json, E> {
                Ok(Json::Bool(b))
            }
            fn visit_i64<E>(self, i: i64) -> std::result::Result<Json, E> {
                Ok(Json::Number(i.into()))
            }
            fn visit_u64<E>(self, u: u64) -> std::result::Result<Json, E> {
                Ok(Json::Number(u.into()))
            }
            fn visit_f64<E: de::Error>(self, f: f64) -> std::result::Result<Json, E> {
                serde_json::Number::from_f64(f)
                    .map(Json::Number)
                    .ok_or_else(|| E::custom("non-finite number"))
            }
            fn visit_str<E>(self, s: &str) -> std::result::Result<Json, E> {
                Ok(Json::String(s.to_owned()))
            }
            fn visit_string<E>(self, s: String) -> std::result::Result<Json, E> {
                Ok(Json::String(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> std::result::Result<Json, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Json::Array(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> std::result::Result<Json, A::Error> {
                let mut kv: Vec<(String, Json)> = Vec::new();
                while let Some((k, v)) = a.next_entry::<String, Json>()? {
                    match kv.iter_mut().find(|(x, _)| *x == k) {
                        Some(slot) => slot.1 = v,
                        None => kv.push((k, v)),
                    }
                }
                Ok(Json::Object(kv))
            }
        }
        d.deserialize_any(V)
    }
}

// ------------------------------------------------------------------------------------------------
// Messages and conversations
// ------------------------------------------------------------------------------------------------

/// One chat message in the OpenAI chat format: a JSON object with a string
/// `role` and, usually, a `content` (a string or a list of
/// `{"type": "text", "text": …}` blocks); any other field (`reasoning_content`,
/// `tool_calls`, `name`, …) is passed to the template as it is, as
/// transformers' `apply_chat_template` passes a message dict.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    fields: Vec<(String, Json)>,
}

impl Message {
    /// A message `{"role": role, "content": content}` with string content,
    /// the message dict of transformers' chat format (`apply_chat_template`'s
    /// `conversation`).
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            fields: vec![
                ("role".into(), Json::String(role.into())),
                ("content".into(), Json::String(content.into())),
            ],
        }
    }

    /// `{"role": "user", "content": text}`.
    pub fn user(text: &str) -> Message {
        Message::new("user", text)
    }

    /// `{"role": "system", "content": text}`.
    pub fn system(text: &str) -> Message {
        Message::new("system", text)
    }

    /// `{"role": "assistant", "content": text}`.
    pub fn assistant(text: &str) -> Message {
        Message::new("assistant", text)
    }

    /// A message from a JSON object, which must be a dict as
    /// `render_jinja_template` requires of every message (it raises
    /// `TypeError` otherwise). Errors (one line, for the caller to prefix with
    /// the line): not an object, or no string `role`.
    pub fn from_json(value: Json) -> std::result::Result<Message, String> {
        let Json::Object(fields) = value else {
            return Err(format!(
                "a message must be an object with \"role\" and \"content\", found {}",
                value.kind()
            ));
        };
        match fields.iter().find(|(k, _)| k == "role").map(|(_, v)| v) {
            Some(Json::String(_)) => Ok(Message { fields }),
            Some(other) => Err(format!("\"role\" must be a string, found {}", other.kind())),
            None => Err("a message needs a \"role\"".into()),
        }
    }

    /// Adds or replaces a field, as Python's `message[key] = value` (an
    /// existing key keeps its position).
    pub fn with(mut self, key: &str, value: Json) -> Message {
        match self.fields.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.fields.push((key.into(), value)),
        }
        self
    }

    /// `message["role"]`.
    pub fn role(&self) -> &str {
        self.get("role").and_then(Json::as_str).unwrap_or_default()
    }

    /// `message.get("content")`.
    pub fn content(&self) -> Option<&Json> {
        self.get("content")
    }

    /// `message.get(key)`.
    pub fn get(&self, key: &str) -> Option<&Json> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// All fields, in insertion order (`message.items()`).
    pub fn fields(&self) -> &[(String, Json)] {
        &self.fields
    }

    /// The message as the template sees it: keys whose value is `null`
    /// dropped (`apply_chat_template`, transformers 5.23.0
    /// `tokenization_utils_base.py`), then the reasoning aliased as
    /// `chat_template_utils.py::_alias_reasoning_fields` does it: the first of
    /// `reasoning_content`, `thinking`, `reasoning` that is set becomes
    /// `{"thinking": r, **message, "reasoning_content": r}`.
    fn template_value(&self) -> Value {
        let mut kv: Vec<(String, Json)> = self
            .fields
            .iter()
            .filter(|(_, v)| *v != Json::Null)
            .cloned()
            .collect();
        let reasoning = ["reasoning_content", "thinking", "reasoning"]
            .iter()
            .find_map(|key| kv.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()));
        if let Some(r) = reasoning {
            let mut out: Vec<(String, Json)> = vec![("thinking".into(), r.clone())];
            for (k, v) in kv {
                match out.iter_mut().find(|(x, _)| *x == k) {
                    Some(slot) => slot.1 = v,
                    None => out.push((k, v)),
                }
            }
            match out.iter_mut().find(|(x, _)| x == "reasoning_content") {
                Some(slot) => slot.1 = r,
                None => out.push(("reasoning_content".into(), r)),
            }
            kv = out;
        }
        Json::Object(kv).to_value()
    }
}

/// One conversation: what one prompt of a run is rendered from, the
/// `conversation` (and `tools`) arguments of transformers'
/// `apply_chat_template`.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    /// The messages, in order.
    pub messages: Vec<Message>,
    /// Tool schemas (`"tools"` of the JSONL line), passed to the template as
    /// `tools`, as `apply_chat_template(tools=…)` does; `None` when absent.
    pub tools: Option<Vec<Json>>,
    /// Where it came from, for messages: `msgs.jsonl:3`, `--prompt #1`,
    /// `gsm8k row 1101`.
    pub origin: String,
}

impl Conversation {
    /// One user turn holding `text` (what `--chat` makes of a `--prompt`, and
    /// what z-lab/dflash `benchmark.py` sends: `[{"role": "user", "content":
    /// turn}]`).
    pub fn user(text: &str, origin: &str) -> Conversation {
        Conversation {
            messages: vec![Message::user(text)],
            tools: None,
            origin: origin.into(),
        }
    }

    /// The same conversation with a system turn `text` put first (`--system`),
    /// `[{"role": "system", "content": text}, *messages]`.
    pub fn with_system(mut self, text: &str) -> Conversation {
        self.messages.insert(0, Message::system(text));
        self
    }

    /// Parses one OpenAI-style JSONL line: `{"messages": [{"role": …,
    /// "content": …}, …]}`, optionally with `"tools": [...]`, decoded as
    /// Python's `json.loads` decodes it (objects in key order) and handed to
    /// the template as `apply_chat_template(messages, tools=tools)` hands it.
    ///
    /// Errors ([`Error::Input`], one line starting with `origin`): not JSON,
    /// not an object, an unknown top-level key, `messages` missing, empty or
    /// not an array, a message that is not an object with a string `role`,
    /// `content` that is neither a string, a list of objects nor null, `tools`
    /// not an array, or no `user` turn.
    pub fn parse_jsonl_line(line: &str, origin: &str) -> Result<Conversation> {
        let bad = |m: String| Error::Input(format!("{origin}: {m}"));
        let value: Json = serde_json::from_str(line).map_err(|e| {
            bad(format!(
                "not valid JSON: {e} (expected {{\"messages\": [{{\"role\": \"user\", \"content\": \u{2026}}}]}})"
            ))
        })?;
        let Json::Object(top) = value else {
            return Err(bad(format!(
                "expected an object {{\"messages\": [\u{2026}]}}, found {}",
                value.kind()
            )));
        };
        let mut messages = None;
        let mut tools = None;
        for (k, v) in top {
            match (k.as_str(), v) {
                ("messages", Json::Array(m)) => messages = Some(m),
                ("messages", other) => {
                    return Err(bad(format!(
                        "\"messages\" must be an array of messages, found {}",
                        other.kind()
                    )))
                }
                ("tools", Json::Array(t)) => tools = Some(t),
                ("tools", Json::Null) => {}
                ("tools", other) => {
                    return Err(bad(format!(
                        "\"tools\" must be an array of tool schemas, found {}",
                        other.kind()
                    )))
                }
                (other, _) => {
                    return Err(bad(format!(
                        "unknown key {other:?} (a line holds \"messages\" and optionally \"tools\")"
                    )))
                }
            }
        }
        let raw = messages.ok_or_else(|| bad("no \"messages\" array".into()))?;
        if raw.is_empty() {
            return Err(bad("\"messages\" is empty".into()));
        }
        let mut out = Vec::with_capacity(raw.len());
        for (i, m) in raw.into_iter().enumerate() {
            let m = Message::from_json(m).map_err(|e| bad(format!("message {}: {e}", i + 1)))?;
            match m.content() {
                None | Some(Json::Null) | Some(Json::String(_)) => {}
                Some(Json::Array(blocks)) => {
                    if let Some(b) = blocks.iter().find(|b| !matches!(b, Json::Object(_))) {
                        return Err(bad(format!(
                            "message {}: content blocks must be objects like {{\"type\": \"text\", \"text\": \u{2026}}}, found {}",
                            i + 1,
                            b.kind()
                        )));
                    }
                }
                Some(other) => {
                    return Err(bad(format!(
                        "message {}: \"content\" must be a string or a list of content blocks, found {}",
                        i + 1,
                        other.kind()
                    )))
                }
            }
            out.push(m);
        }
        if !out.iter().any(|m| m.role() == "user") {
            return Err(bad(
                "no user turn (a conversation needs at least one {\"role\": \"user\"} message)"
                    .into(),
            ));
        }
        Ok(Conversation {
            messages: out,
            tools,
            origin: origin.into(),
        })
    }

    /// Reads a JSONL file of conversations ([`Self::parse_jsonl_line`] per
    /// non-blank line; a UTF-8 byte-order mark is skipped). Origins are
    /// `path:line` (1-based).
    ///
    /// Errors: the file unreadable ([`Error::Io`]), not UTF-8, a bad line, or
    /// no conversation in it ([`Error::Input`], naming the file and line).
    pub fn read_jsonl(path: &Path) -> Result<Vec<Conversation>> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            Error::Input(format!(
                "{}: not UTF-8 (invalid byte at offset {})",
                path.display(),
                e.valid_up_to()
            ))
        })?;
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut out = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let origin = format!("{}:{}", path.display(), n + 1);
            out.push(Conversation::parse_jsonl_line(line, &origin)?);
        }
        if out.is_empty() {
            return Err(Error::Input(format!(
                "{}: no conversations in file (one {{\"messages\": [\u{2026}]}} object per line)",
                path.display()
            )));
        }
        Ok(out)
    }
}

// ------------------------------------------------------------------------------------------------
// tokenizer_config.json
// ------------------------------------------------------------------------------------------------

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
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
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
    let text = std::fs::read_to_string(config).ok()?;
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
                let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
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
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
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
        let tmpl = t
            .env
            .get_template(&t.key)
            .map_err(|e| Error::Input(format!("{}: {e}", t.source.path.display())))?;
        tmpl.render(Value::from(ctx)).map_err(|e| {
            let at = e.line().map(|l| format!(":{l}")).unwrap_or_default();
            let file = t.source.path.display();
            let origin = &conversation.origin;
            if let Some(msg) = raised_message(&e) {
                Error::Input(format!(
                    "{file}{at}: the chat template raised an exception: {} ({origin})",
                    one_line(&msg)
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
    tokenizers::Tokenizer::from_file(path).map_err(|e| {
        Error::Input(format!(
            "{}: cannot read the tokenizer: {e}",
            path.display()
        ))
    })
}

// ------------------------------------------------------------------------------------------------
// The Jinja environment (transformers' _cached_compile_jinja_template, in minijinja)
// ------------------------------------------------------------------------------------------------

/// Marks an error as `raise_exception`'s, carrying the template's message.
#[derive(Debug)]
struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raised_message(e: &minijinja::Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<Raised>() {
            return Some(r.0.clone());
        }
        cur = err.source();
    }
    None
}

fn describe(e: &minijinja::Error) -> String {
    let mut s = match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    };
    let mut cur = std::error::Error::source(e);
    while let Some(err) = cur {
        let _ = write!(s, ": {err}");
        cur = err.source();
    }
    s
}

fn one_line(s: &str) -> String {
    s.replace('\r', "\\r").replace('\n', "\\n")
}

/// `{% generation %}…{% endgeneration %}` (transformers' `AssistantTracker`
/// extension) only records where assistant text is; rendering is the body's.
/// minijinja has no such tag, so it becomes `{% if true %}…{% endif %}`,
/// keeping the whitespace-control markers (the same trimming).
fn rewrite_generation_tags(src: &str) -> Cow<'_, str> {
    if !src.contains("generation") {
        return Cow::Borrowed(src);
    }
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(i) = rest.find("{%") {
        out.push_str(&rest[..i]);
        let tag = &rest[i..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return Cow::Owned(out);
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        match body.trim() {
            "generation" => {
                let _ = write!(out, "{{%{lead} if true {trail}%}}");
            }
            "endgeneration" => {
                let _ = write!(out, "{{%{lead} endif {trail}%}}");
            }
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("default delimiters"),
    );
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_formatter(|out, _state, value| {
        out.write_str(&py_str(value))
            .map_err(|_| minijinja::Error::from(ErrorKind::WriteFailure))
    });
    env.set_unknown_method_callback(py_method);
    env.add_function(
        "raise_exception",
        |message: String| -> std::result::Result<Value, minijinja::Error> {
            Err(
                minijinja::Error::new(ErrorKind::InvalidOperation, message.clone())
                    .with_source(Raised(message)),
            )
        },
    );
    env.add_filter("tojson", tojson_filter);
    env.add_filter("trim", trim_filter);
    env.add_filter("string", |v: &Value| Value::from(py_str(v)));
    env
}

// ------------------------------------------------------------------------------------------------
// Python semantics
// ------------------------------------------------------------------------------------------------

/// Python's `str.isspace()` characters: Rust's `char::is_whitespace` plus the
/// separators U+001C–U+001F.
fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn py_strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let f = |c: char| match chars {
        Some(set) => set.contains(c),
        None => py_space(c),
    };
    let s = if left { s.trim_start_matches(f) } else { s };
    if right {
        s.trim_end_matches(f)
    } else {
        s
    }
}

/// The `str` methods whose no-argument form depends on Python's whitespace;
/// everything else is `minijinja_contrib::pycompat`'s.
fn py_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, minijinja::Error> {
    if let Some(s) = value.as_str() {
        let sides = match method {
            "strip" => Some((true, true)),
            "lstrip" => Some((true, false)),
            "rstrip" => Some((false, true)),
            _ => None,
        };
        if let Some((l, r)) = sides {
            let chars = match args {
                [] => None,
                [a] if a.is_none() => None,
                [a] => Some(a.as_str().ok_or_else(|| {
                    minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        format!("{method} arg must be None or str"),
                    )
                })?),
                _ => return Err(minijinja::Error::from(ErrorKind::TooManyArguments)),
            };
            return Ok(Value::from(py_strip(s, chars, l, r)));
        }
        if method == "split" && (args.is_empty() || (args.len() == 1 && args[0].is_none())) {
            return Ok(Value::from(
                s.split(py_space)
                    .filter(|p| !p.is_empty())
                    .map(Value::from)
                    .collect::<Vec<_>>(),
            ));
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Jinja2's `trim` filter: `str(value).strip(chars)`.
fn trim_filter(value: &Value, chars: Option<String>) -> Value {
    let s = py_str(value);
    let out = py_strip(&s, chars.as_deref(), true, true).to_owned();
    if value.is_safe() {
        Value::from_safe_string(out)
    } else {
        Value::from(out)
    }
}

/// Python `str(x)` of a template value: strings as they are, `None`,
/// `True`/`False`, float `repr`, and `repr` of lists and dicts.
fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => v.as_str().unwrap_or_default().to_owned(),
        _ => py_repr(v),
    }
}

fn py_repr(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => if v.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number => {
            if v.is_integer() {
                v.to_string()
            } else {
                py_float_repr(f64::try_from(v.clone()).unwrap_or(f64::NAN))
            }
        }
        ValueKind::String => py_str_repr(v.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<String> = v
                .try_iter()
                .map(|it| it.map(|x| py_repr(&x)).collect())
                .unwrap_or_default();
            format!("[{}]", items.join(", "))
        }
        ValueKind::Map => {
            let items: Vec<String> = v
                .try_iter()
                .map(|it| {
                    it.map(|k| {
                        let val = v.get_item(&k).unwrap_or_default();
                        format!("{}: {}", py_repr(&k), py_repr(&val))
                    })
                    .collect()
                })
                .unwrap_or_default();
            format!("{{{}}}", items.join(", "))
        }
        _ => v.to_string(),
    }
}

/// Python `repr(str)`: single quotes unless the text has `'` and no `"`.
fn py_str_repr(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// Python `float.__repr__`: the shortest digits that round-trip, positional
/// for decimal exponents -4 ≤ e < 16, else `d.ddde±XX`.
fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    let e_fmt = format!("{:e}", x.abs());
    let (mant, exp) = e_fmt.split_once('e').expect("LowerExp has an exponent");
    let exp: i32 = exp.parse().expect("exponent");
    let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if x < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp >= 0 {
            if n > exp + 1 {
                format!(
                    "{}.{}",
                    &digits[..(exp + 1) as usize],
                    &digits[(exp + 1) as usize..]
                )
            } else {
                format!("{}{}.0", digits, "0".repeat((exp + 1 - n) as usize))
            }
        } else {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        };
        format!("{sign}{body}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let es = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{es}{:02}", exp.abs())
    }
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)` — no HTML escaping,
/// `", "` / `": "` separators (`","` / `": "` with an indent).
fn tojson_filter(
    value: &Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > names.len() {
        return Err(minijinja::Error::from(ErrorKind::TooManyArguments));
    }
    let mut opt: [Option<Value>; 4] = Default::default();
    for (i, a) in args.0.into_iter().enumerate() {
        opt[i] = Some(a);
    }
    for (i, n) in names.iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(n)? {
            opt[i] = Some(v);
        }
    }
    kwargs.assert_all_used()?;
    let ensure_ascii = opt[0].as_ref().is_some_and(|v| v.is_true());
    let indent: Option<String> = match &opt[1] {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().into()),
        Some(v) => Some(" ".repeat(i64::try_from(v.clone()).unwrap_or(0).max(0) as usize)),
    };
    let (item_sep, key_sep) = match &opt[2] {
        Some(v) if !v.is_none() => {
            let parts: Vec<String> = v
                .try_iter()?
                .map(|x| x.as_str().unwrap_or_default().to_owned())
                .collect();
            match parts.as_slice() {
                [a, b] => (a.clone(), b.clone()),
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be (item_separator, key_separator)",
                    ))
                }
            }
        }
        _ => (
            if indent.is_some() { "," } else { ", " }.to_owned(),
            ": ".to_owned(),
        ),
    };
    let sort_keys = opt[3].as_ref().is_some_and(|v| v.is_true());
    let mut out = String::new();
    let d = Dumper {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    d.dump(value, 0, &mut out)?;
    Ok(Value::from(out))
}

struct Dumper {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl Dumper {
    fn newline(&self, level: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.ensure_ascii && !c.is_ascii() => {
                    let mut buf = [0u16; 2];
                    for u in c.encode_utf16(&mut buf) {
                        let _ = write!(out, "\\u{:04x}", u);
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }

    fn key(&self, k: &Value) -> std::result::Result<String, minijinja::Error> {
        Ok(match k.kind() {
            ValueKind::String => k.as_str().unwrap_or_default().to_owned(),
            ValueKind::None => "null".into(),
            ValueKind::Bool => if k.is_true() { "true" } else { "false" }.into(),
            ValueKind::Number => py_repr(k),
            _ => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "tojson: keys must be str, int, float, bool or None, not {}",
                        k.kind()
                    ),
                ))
            }
        })
    }

    fn dump(
        &self,
        v: &Value,
        level: usize,
        out: &mut String,
    ) -> std::result::Result<(), minijinja::Error> {
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if v.is_integer() {
                    out.push_str(&v.to_string());
                } else {
                    let x = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                    out.push_str(&if x.is_nan() {
                        "NaN".into()
                    } else if x.is_infinite() {
                        if x > 0.0 { "Infinity" } else { "-Infinity" }.into()
                    } else {
                        py_float_repr(x)
                    });
                }
            }
            ValueKind::String => self.string(v.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(level + 1, out);
                    self.dump(x, level + 1, out)?;
                }
                self.newline(level, out);
                out.push(']');
            }
            ValueKind::Map => {
                let mut keys: Vec<(String, Value)> = Vec::new();
                for k in v.try_iter()? {
                    let val = v.get_item(&k)?;
                    keys.push((self.key(&k)?, val));
                }
                if self.sort_keys {
                    keys.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (i, (k, x)) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(level + 1, out);
                    self.string(k, out);
                    out.push_str(&self.key_sep);
                    self.dump(x, level + 1, out)?;
                }
                self.newline(level, out);
                out.push('}');
            }
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {other} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_repr() {
        for (x, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789.125, "123456789.125"),
            (-2.5e-7, "-2.5e-07"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (0.1 + 0.2, "0.30000000000000004"),
            (-0.0, "-0.0"),
        ] {
            assert_eq!(py_float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn python_strip_and_repr() {
        assert_eq!(py_strip("\u{1c} a \n", None, true, true), "a");
        assert_eq!(py_strip("\n\nx\n", Some("\n"), false, true), "\n\nx");
        assert_eq!(py_str_repr("it's"), "\"it's\"");
        assert_eq!(py_str_repr("a\nb'\""), "'a\\nb\\'\"'");
        let v = Value::from(vec![Value::from(1), Value::from(()), Value::from("x")]);
        assert_eq!(py_str(&v), "[1, None, 'x']");
        assert_eq!(py_str(&Value::from(true)), "True");
    }

    #[test]
    fn tojson_is_python_json_dumps() {
        let env = environment();
        let r = |src: &str| env.render_str(src, ()).unwrap();
        assert_eq!(
            r("{{ {'a': [1, 2.5, none, true], 'b': '<&> \u{e9}\"\\n'}|tojson }}"),
            "{\"a\": [1, 2.5, null, true], \"b\": \"<&> \u{e9}\\\"\\n\"}"
        );
        assert_eq!(
            r("{{ {'b': 1, 'a': [1]}|tojson(indent=2, sort_keys=true) }}"),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": 1\n}"
        );
        assert_eq!(r("{{ '\u{e9}'|tojson(ensure_ascii=true) }}"), "\"\\u00e9\"");
        assert_eq!(
            r("{{ none }}|{{ true }}|{{ 1.0 }}|{{ [1, 'a'] }}"),
            "None|True|1.0|[1, 'a']"
        );
    }

    #[test]
    fn generation_tags_become_plain_blocks() {
        let src = "a{%- generation -%} b {% endgeneration %}c{% if x %}{% endif %}";
        assert_eq!(
            rewrite_generation_tags(src),
            "a{%- if true -%} b {% endif %}c{% if x %}{% endif %}"
        );
        let env = environment();
        assert_eq!(
            env.render_str(
                &rewrite_generation_tags("x {%- generation %} y {% endgeneration -%} z"),
                ()
            )
            .unwrap(),
            "x y z"
        );
    }

    #[test]
    fn reasoning_is_aliased_and_nulls_dropped() {
        let m = Message::user("q")
            .with("name", Json::Null)
            .with("reasoning", Json::String("r".into()));
        let v = m.template_value();
        let keys: Vec<String> = v
            .try_iter()
            .unwrap()
            .map(|k| k.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            keys,
            [
                "thinking",
                "role",
                "content",
                "reasoning",
                "reasoning_content"
            ]
        );
        assert_eq!(v.get_attr("reasoning_content").unwrap().as_str(), Some("r"));
    }
}
