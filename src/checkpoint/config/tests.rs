//! Unit tests of `config.json` parsing: defaults, validation, messages.

use super::*;
use serde_json::json;

#[test]
fn qwen3_fields_default_as_qwen3config_does() {
    // configuration_qwen3.py (5.23.0): head_dim 128, kv heads = heads when
    // absent, full rotary, every layer full attention.
    let c = ModelConfig::from_value(
        json!({"model_type": "qwen3", "num_attention_heads": 8, "num_hidden_layers": 3}),
    )
    .unwrap();
    let t = &c.text;
    assert_eq!(t.family, Family::Qwen3);
    assert_eq!(
        (t.num_key_value_heads, t.head_dim, t.vocab_size),
        (8, 128, 151936)
    );
    assert_eq!(t.rotary_dim(), 128);
    assert_eq!(t.layer_types().unwrap(), vec![LayerType::FullAttention; 3]);
    let e = ModelConfig::from_value(json!({"model_type": "qwen3", "use_sliding_window": true}))
        .unwrap_err()
        .to_string();
    assert!(e.contains("use_sliding_window"), "{e}");
}

/// A minimal valid VLM config (sizes of the tiny fixture).
fn vlm() -> Value {
    json!({
        "model_type": "qwen3_5",
        "dtype": "float32",
        "tie_word_embeddings": false,
        "text_config": {
            "vocab_size": 384, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 32, "max_position_embeddings": 512, "hidden_act": "silu",
            "layer_types": ["linear_attention", "full_attention"],
            "linear_key_head_dim": 16, "linear_value_head_dim": 16,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]}
        },
        "vision_config": {"depth": 2}
    })
}

fn err(v: Value) -> String {
    let e = ModelConfig::from_value(v).expect_err("must fail");
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    let m = e.to_string();
    assert!(m.contains("config.json"), "names the file: {m}");
    assert!(!m.contains('\n'), "one line: {m}");
    m
}

fn with(path: &str, value: Value) -> Value {
    let mut v = vlm();
    let mut cur = &mut v;
    let parts: Vec<&str> = path.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        cur = &mut cur[*p];
    }
    cur[*parts.last().unwrap()] = value;
    v
}

fn without(path: &str) -> Value {
    let mut v = vlm();
    let (parent, last) = path.rsplit_once('.').unwrap_or(("", path));
    let mut cur = &mut v;
    for p in parent.split('.').filter(|p| !p.is_empty()) {
        cur = &mut cur[p];
    }
    cur.as_object_mut().unwrap().remove(last);
    v
}

#[test]
fn valid_config_and_defaults() {
    let c = ModelConfig::from_value(vlm()).unwrap();
    assert_eq!(c.text.rotary_dim(), 8);
    assert_eq!(c.dtype.as_deref(), Some("float32"));
    // Absent optional fields take transformers' defaults.
    let mut v = vlm();
    let tc = v["text_config"].as_object_mut().unwrap();
    for k in [
        "hidden_act",
        "rope_parameters",
        "rms_norm_eps",
        "linear_conv_kernel_dim",
    ] {
        tc.remove(k);
    }
    let c = ModelConfig::from_value(v).unwrap();
    assert_eq!(c.text.rope_theta(), 10000.0);
    assert_eq!(c.text.partial_rotary_factor(), 0.25);
    assert_eq!(c.text.rms_norm_eps, 1e-6);
    // Nulls count as absent.
    let c = ModelConfig::from_value(with("text_config.rope_parameters.rope_type", Value::Null))
        .unwrap();
    assert_eq!(c.text.rope_theta(), 10000.0);
    assert!(ModelConfig::from_value(with("vision_config", Value::Null))
        .unwrap()
        .vision_config
        .is_none());
    assert!(
        ModelConfig::from_value(with("tie_word_embeddings", Value::Null))
            .unwrap()
            .tie_word_embeddings
            .is_none()
    );
    // Legacy spellings: torch_dtype, mrope, top-level rope_theta.
    let mut v = without("dtype");
    v["torch_dtype"] = json!("bfloat16");
    v["text_config"]["torch_dtype"] = json!("bfloat16");
    v["text_config"]["dtype"] = json!("float16");
    let c = ModelConfig::from_value(v).unwrap();
    assert_eq!(c.dtype.as_deref(), Some("bfloat16"));
    assert_eq!(
        c.text.dtype.as_deref(),
        Some("float16"),
        "dtype wins over torch_dtype"
    );
    let mut v = without("text_config.rope_parameters");
    v["text_config"]["rope_scaling"] = json!({"type": "mrope", "mrope_section": [2, 1, 1]});
    v["text_config"]["rope_theta"] = json!(5e6);
    let c = ModelConfig::from_value(v).unwrap();
    assert_eq!(c.text.rope_theta(), 5e6);
}

#[test]
fn zero_and_nonpositive_sizes_are_rejected() {
    for f in [
        "num_hidden_layers",
        "hidden_size",
        "vocab_size",
        "head_dim",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "max_position_embeddings",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_conv_kernel_dim",
    ] {
        let m = err(with(&format!("text_config.{f}"), json!(0)));
        assert!(m.contains(&format!("text_config.{f} = 0")), "{m}");
    }
    let mut v = with("text_config.num_hidden_layers", json!(0));
    v["text_config"]["layer_types"] = json!([]);
    assert!(err(v).contains("text_config.num_hidden_layers = 0"));
    for eps in [json!(0.0), json!(-1e-6)] {
        let m = err(with("text_config.rms_norm_eps", eps));
        assert!(
            m.contains("text_config.rms_norm_eps") && m.contains("positive"),
            "{m}"
        );
    }
    let mut v = without("text_config.layer_types");
    v["text_config"]["full_attention_interval"] = json!(0);
    assert!(err(v).contains("text_config.full_attention_interval = 0"));
    let m = err(with("text_config.rope_parameters.rope_theta", json!(0)));
    assert!(m.contains("rope_theta"), "{m}");
    let m = err(with(
        "text_config.rope_parameters.partial_rotary_factor",
        json!(1.5),
    ));
    assert!(m.contains("partial_rotary_factor"), "{m}");
    let m = err(with("text_config.hidden_size", json!(1u64 << 62)));
    assert!(m.contains("overflow"), "{m}");
}

#[test]
fn badly_typed_or_unsupported_fields_are_named() {
    let cases: &[(&str, Value, &str)] = &[
        (
            "text_config.hidden_size",
            json!("x"),
            "config.json: text_config.hidden_size: invalid type: string \"x\", expected usize",
        ),
        (
            "text_config.rope_parameters.rope_theta",
            json!("abc"),
            "text_config.rope_parameters.rope_theta: invalid type: string \"abc\"",
        ),
        (
            "text_config.rope_parameters.partial_rotary_factor",
            json!("x"),
            "text_config.rope_parameters.partial_rotary_factor: invalid type",
        ),
        (
            "text_config.rope_parameters.rope_type",
            json!("yarn"),
            "unsupported rope_type \"yarn\" (hsparity implements default rope)",
        ),
        (
            "text_config.rope_parameters.rope_type",
            json!(3),
            "text_config.rope_parameters.rope_type: invalid type",
        ),
        (
            "text_config.rope_scaling",
            json!({"rope_type": "linear", "factor": 2.0}),
            "text_config.rope_scaling.rope_type: unsupported rope_type \"linear\"",
        ),
        (
            "text_config.rope_scaling",
            json!({"type": "dynamic"}),
            "text_config.rope_scaling.type: unsupported rope_type \"dynamic\"",
        ),
        (
            "text_config.hidden_act",
            json!("gelu"),
            "text_config.hidden_act = \"gelu\"",
        ),
        (
            "text_config.tie_word_embeddings",
            json!("no"),
            "text_config.tie_word_embeddings: invalid type",
        ),
        (
            "tie_word_embeddings",
            json!(1),
            "tie_word_embeddings: expected true or false",
        ),
        ("dtype", json!(5), "dtype: expected a string"),
        (
            "text_config.dtype",
            json!(["bf16"]),
            "text_config.dtype: invalid type",
        ),
        (
            "text_config.layer_types",
            json!("linear_attention"),
            "text_config.layer_types: invalid type",
        ),
        (
            "text_config",
            json!([1, 2]),
            "text_config must be an object, found an array",
        ),
        ("text_config", json!(null), "no \"text_config\" object"),
        (
            "vision_config",
            json!([1]),
            "vision_config must be an object",
        ),
        ("model_type", json!(5), "model_type must be a string"),
    ];
    for (path, value, want) in cases {
        let m = err(with(path, value.clone()));
        assert!(
            m.contains(want),
            "{path} = {value}: expected {want:?} in {m}"
        );
    }
    let mut v = without("dtype");
    v["torch_dtype"] = json!(16);
    assert!(err(v).contains("torch_dtype: expected a string"));
    assert!(err(json!([1, 2])).contains("config.json is not a JSON object"));
    assert!(err(without("model_type")).contains("no \"model_type\""));
}

#[test]
fn text_only_config_names_fields_without_prefix() {
    let mut v = vlm()["text_config"].clone();
    v["model_type"] = json!("qwen3_5_text");
    assert!(ModelConfig::from_value(v.clone()).is_ok());
    v["hidden_size"] = json!(-3);
    let m = err(v);
    assert!(
        m.contains("config.json: hidden_size: invalid value: integer `-3`"),
        "{m}"
    );
}

#[test]
fn qwen3_fields_are_named_in_errors() {
    for (field, value) in [
        ("rms_norm_eps", json!("x")),
        ("hidden_size", json!("x")),
        ("rope_parameters", json!({"rope_theta": "x"})),
    ] {
        let mut v =
            json!({"model_type": "qwen3", "num_attention_heads": 8, "num_hidden_layers": 3});
        v[field] = value;
        let e = ModelConfig::from_value(v).unwrap_err().to_string();
        assert!(e.contains(field), "{field}: {e}");
    }
    // null counts as absent, as Qwen3Config's keyword defaults do.
    let c = ModelConfig::from_value(json!({"model_type": "qwen3", "head_dim": null})).unwrap();
    assert_eq!(c.text.head_dim, 128);
}

#[test]
fn qwen3_5_moe_fields_default_as_qwen3_5moetextconfig_does() {
    // configuration_qwen3_5_moe.py (5.23.0): hidden 2048, 40 layers, 2 kv
    // heads, E 256, top-8, I = S = 512, partial rotary 0.25.
    let text = ModelConfig::from_value(json!({"model_type": "qwen3_5_moe_text"})).unwrap();
    let t = &text.text;
    assert_eq!(t.family, Family::Qwen3_5Moe);
    assert!(!text.is_vlm());
    assert_eq!(
        (t.hidden_size, t.num_hidden_layers, t.num_key_value_heads),
        (2048, 40, 2)
    );
    assert_eq!(
        t.moe,
        Some(MoeConfig {
            num_experts: 256,
            num_experts_per_tok: 8,
            moe_intermediate_size: 512,
            shared_expert_intermediate_size: 512
        })
    );
    assert_eq!(t.rotary_dim(), 64);
    let vlm = ModelConfig::from_value(json!({"model_type": "qwen3_5_moe", "text_config": {
        "num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 3}}))
    .unwrap();
    assert!(vlm.is_vlm());
    assert_eq!(vlm.text.family, Family::Qwen3_5Moe);
    assert_eq!(vlm.text.moe.unwrap().num_experts, 8);
    assert_eq!(vlm.text.layer_types().unwrap()[3], LayerType::FullAttention);
    let e = err(json!({"model_type": "qwen3_5_moe"}));
    assert!(e.contains("\"qwen3_5_moe\" but no \"text_config\""), "{e}");
    let e = err(json!({"model_type": "qwen3_5_moe", "text_config": {
        "num_experts": 4, "num_experts_per_tok": 5}}));
    assert!(
        e.contains("text_config.num_experts_per_tok = 5 exceeds text_config.num_experts = 4"),
        "{e}"
    );
    let e = err(json!({"model_type": "qwen3_5_moe_text", "num_experts": 0}));
    assert!(e.contains("num_experts = 0: must be at least 1"), "{e}");
    let e = err(json!({"model_type": "qwen3_5_moe_text", "moe_intermediate_size": "x"}));
    assert!(e.contains("moe_intermediate_size"), "{e}");
}
