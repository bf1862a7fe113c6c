//! The minijinja environment configured as transformers configures Jinja2,
//! with Python's string and printing semantics where minijinja differs.

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{AutoEscape, Environment, ErrorKind, State, UndefinedBehavior, Value};
use std::borrow::Cow;
use std::fmt::{self, Write as _};

/// Marks an error as `raise_exception`'s, carrying the template's message.
#[derive(Debug)]
pub(super) struct Raised(String);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

pub(super) fn raised_message(e: &minijinja::Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<Raised>() {
            return Some(r.0.clone());
        }
        cur = err.source();
    }
    None
}

pub(super) fn describe(e: &minijinja::Error) -> String {
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

pub(super) fn one_line(s: &str) -> String {
    s.replace('\r', "\\r").replace('\n', "\\n")
}

/// `{% generation %}…{% endgeneration %}` (transformers' `AssistantTracker`
/// extension) only records where assistant text is; rendering is the body's.
/// minijinja has no such tag, so it becomes `{% if true %}…{% endif %}`,
/// keeping the whitespace-control markers (the same trimming).
pub(super) fn rewrite_generation_tags(src: &str) -> Cow<'_, str> {
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

pub(super) fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(super::bounds::RENDER_FUEL));
    env.set_recursion_limit(super::bounds::RENDER_RECURSION);
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
        super::bounds::check_nesting(value)?;
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
pub(super) fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

pub(super) fn py_strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
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
pub(super) fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => v.as_str().unwrap_or_default().to_owned(),
        _ => py_repr(v),
    }
}

pub(super) fn py_repr(v: &Value) -> String {
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
pub(super) fn py_str_repr(s: &str) -> String {
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
pub(super) fn py_float_repr(x: f64) -> String {
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
    super::bounds::check_nesting(value)?;
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
