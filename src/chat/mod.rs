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

use std::fmt;
use std::path::Path;

use indexmap::IndexMap;
use minijinja::Value;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::error::{Error, Result};

mod bounds;
mod python;
mod template;
#[cfg(test)]
mod tests;

pub use template::*;

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
        let bytes = crate::input::read(path)?;
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
