//! Unit tests of the expert-fusion plan: key parsing, natural order, scope, refusals.

use super::*;

fn h(name: &str, shape: &[usize]) -> TensorHeader {
    TensorHeader {
        name: name.into(),
        dtype: "BF16".into(),
        shape: shape.to_vec(),
        data_offsets: (0, 0),
        shard: 0,
    }
}

fn per_expert(prefix: &str, e: usize) -> Vec<TensorHeader> {
    (0..e)
        .flat_map(|i| {
            [
                h(
                    &format!("{prefix}mlp.experts.{i}.gate_proj.weight"),
                    &[4, 8],
                ),
                h(&format!("{prefix}mlp.experts.{i}.up_proj.weight"), &[4, 8]),
                h(
                    &format!("{prefix}mlp.experts.{i}.down_proj.weight"),
                    &[8, 4],
                ),
            ]
        })
        .collect()
}

#[test]
fn parses_only_per_expert_weights() {
    assert_eq!(
        parse_expert_key("model.language_model.layers.3.mlp.experts.12.up_proj.weight"),
        Some(("model.language_model.layers.3.", 12, Proj::Up))
    );
    assert_eq!(
        parse_expert_key("mlp.experts.0.down_proj.weight"),
        Some(("", 0, Proj::Down))
    );
    for k in [
        "model.layers.0.mlp.experts.gate_up_proj",
        "model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv",
        "model.layers.0.mlp.shared_expert.gate_proj.weight",
        "model.layers.0.xmlp.experts.0.gate_proj.weight",
        "model.layers.0.mlp.experts.a.gate_proj.weight",
    ] {
        assert_eq!(parse_expert_key(k), None, "{k}");
    }
}

#[test]
fn natural_order_matches_transformers() {
    let mut v = vec![
        "l.experts.10.w",
        "l.experts.9.w",
        "l.experts.2.w",
        "l.shard_11",
        "l.shard_2",
        "l.a",
    ];
    v.sort_by(|a, b| dot_natural_cmp(a, b));
    assert_eq!(
        v,
        [
            "l.a",
            "l.experts.2.w",
            "l.experts.9.w",
            "l.experts.10.w",
            "l.shard_2",
            "l.shard_11"
        ]
    );
}

#[test]
fn orders_sources_numerically_and_scopes() {
    let mut hs = per_expert("model.language_model.layers.0.", 12);
    hs.extend(per_expert("mtp.layers.0.", 12));
    hs.reverse();
    let p = plan(&hs, ConversionScope::Unscoped, 12).unwrap();
    assert_eq!(p.fused.len(), 4);
    assert_eq!(p.converted_keys(), 72);
    let gu = p
        .get("model.language_model.layers.0.mlp.experts.gate_up_proj")
        .unwrap();
    assert_eq!(gu.shape, [12, 8, 8]);
    assert_eq!(
        gu.sources[10],
        "model.language_model.layers.0.mlp.experts.10.gate_proj.weight"
    );
    assert_eq!(
        gu.sources[12],
        "model.language_model.layers.0.mlp.experts.0.up_proj.weight"
    );
    assert_eq!(p.under("mtp.").count(), 2);
    let v = plan(&hs, ConversionScope::LanguageModel, 12).unwrap();
    assert_eq!(v.fused.len(), 2);
    assert_eq!(v.under("mtp.").count(), 0);
}

#[test]
fn refuses_broken_groups_naming_the_expert() {
    let base = per_expert("m.", 4);
    let err = |hs: Vec<TensorHeader>| {
        plan(&hs, ConversionScope::Unscoped, 4)
            .unwrap_err()
            .to_string()
    };
    let e = err(base[..9].to_vec());
    assert!(e.contains("expert 3 is missing"), "{e}");
    let mut gap = base.clone();
    for t in gap.iter_mut().filter(|t| t.name.contains(".2.")) {
        t.name = t.name.replace(".2.", ".4.");
    }
    let e = err(gap);
    assert!(
        e.contains("expert 2 is missing and expert 4 is present"),
        "{e}"
    );
    let e = err(base
        .iter()
        .filter(|t| t.name != "m.mlp.experts.1.up_proj.weight")
        .cloned()
        .collect());
    assert!(
        e.contains("expert 1 has gate_proj and down_proj but no up_proj"),
        "{e}"
    );
    let mut bad = base.clone();
    bad[6].shape = vec![3, 8];
    let e = err(bad);
    assert!(
        e.contains("expert 2's gate_proj.weight has shape [3, 8]"),
        "{e}"
    );
    let mut both = base.clone();
    both.push(h("m.mlp.experts.down_proj", &[4, 8, 4]));
    assert!(err(both).contains("fused and per expert"));
    let mut dup = base;
    dup.push(h("m.mlp.experts.01.gate_proj.weight", &[4, 8]));
    assert!(err(dup).contains("both expert 1's gate_proj"));
}
