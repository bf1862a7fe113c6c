//! Unit tests of chat-template lookup and rendering.

use super::python::*;
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
