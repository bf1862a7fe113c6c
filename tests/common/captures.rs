//! `fixtures/engine-captures/manifest.json` (written by
//! `tools/make_engine_captures.py`) read for the tests: every count (prompt
//! lengths, padding, rows, layer ids, N, H) comes from it, never typed in; and
//! the one tolerance an engine file is held to against transformers' goldens.

use std::path::PathBuf;

use candle_core::{DType, Tensor};
use hsparity::import::StateIndex;
use serde_json::Value;

use super::repo_root;

/// How close an imported engine state must be to the golden rounded to bf16
/// (the engines store bf16; the fixture files hold transformers' states
/// rounded to bf16 once).
#[derive(Debug, Clone, Copy)]
pub struct Bf16Match {
    /// Name, for failure messages.
    pub name: &'static str,
    /// Largest |imported − bf16(golden)| per element, in bf16 ulps of the
    /// row's scale (the bf16 spacing at the row's largest |golden|); 0 = bitwise.
    pub row_scale_ulps: f64,
    /// Why this bound.
    pub reason: &'static str,
}

/// The engine ran the unpadded sequence: the file holds exactly the golden rounded to bf16.
pub const UNPADDED: Bf16Match = Bf16Match {
    name: "bitwise bf16 of the golden",
    row_scale_ulps: 0.0,
    reason: "the generator's transformers run is asserted bitwise equal to the goldens, and the engine file \
             holds that run's states rounded to bf16 once (round-to-nearest-even in torch and candle alike)",
};

/// The engine ran a right-padded batch (SpecForge's collator pads a short sample to the batch maximum).
pub const PADDED: Bf16Match = Bf16Match {
    name: "within one bf16 ulp of the golden",
    row_scale_ulps: 1.0,
    reason: "the padded forward differs from the unpadded one by f32 round-off (another sequence length, \
             another GEMM blocking), absolute at about 2^-21 of the row's scale; after the bf16 rounding an \
             element can land on the neighbouring bf16 value, never a full ulp of the row's scale away",
};

/// The tolerance of a manifest file entry: [`PADDED`] when the engine ran a padded batch.
pub fn tolerance_of(file: &Value) -> Bf16Match {
    if file["trailing_padding"].as_u64().unwrap_or(0) > 0 {
        PADDED
    } else {
        UNPADDED
    }
}

/// Asserts `imported` (`[T, H]`) matches the first T rows of `golden` within `tol`.
pub fn assert_bf16_of(imported: &Tensor, golden: &Tensor, tol: &Bf16Match, what: &str) {
    let (t, h) = imported.dims2().unwrap();
    let g = golden.narrow(0, 0, t).unwrap();
    assert_eq!(g.dims2().unwrap(), (t, h), "{what}: shape");
    let rounded = g
        .to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let a = imported.to_vec2::<f32>().unwrap();
    let r = rounded.to_vec2::<f32>().unwrap();
    let gv = g.to_vec2::<f32>().unwrap();
    for (row, ((x, y), z)) in a.iter().zip(&r).zip(&gv).enumerate() {
        let scale = z
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()))
            .max(f32::MIN_POSITIVE);
        let ulp = 2f64.powi(scale.log2().floor() as i32 - 7);
        for (j, (&x, &y)) in x.iter().zip(y).enumerate() {
            let d = (x as f64 - y as f64).abs();
            assert!(
                d <= tol.row_scale_ulps * ulp && (tol.row_scale_ulps > 0.0 || x.to_bits() == y.to_bits()),
                "{what}: row {row} element {j}: {x} vs bf16(golden) {y} ({d:e} = {} row-scale ulps): not {} ({})",
                d / ulp,
                tol.name,
                tol.reason
            );
        }
    }
}

/// The manifest.
pub fn manifest() -> Value {
    serde_json::from_str(&std::fs::read_to_string(caps("manifest.json")).unwrap()).unwrap()
}

/// A path under `fixtures/engine-captures/`.
pub fn caps(rel: &str) -> PathBuf {
    repo_root().join("fixtures/engine-captures").join(rel)
}

/// `v` as a list of usize.
pub fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap_or_else(|| panic!("manifest: {v} is not a list"))
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

/// `v` as a list of i64.
pub fn i64s(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap_or_else(|| panic!("manifest: {v} is not a list"))
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

/// `v` as usize.
pub fn num(v: &Value) -> usize {
    v.as_u64()
        .unwrap_or_else(|| panic!("manifest: {v} is not a count")) as usize
}

/// N of the tiny fixture.
pub fn n_tiny(m: &Value) -> usize {
    num(&m["tiny"]["num_layers"])
}

/// H of the tiny fixture.
pub fn h_tiny(m: &Value) -> usize {
    num(&m["tiny"]["hidden_size"])
}

/// Token counts of the tiny fixture's prompts.
pub fn tiny_prompts(m: &Value) -> Vec<usize> {
    usizes(&m["tiny"]["prompts"])
}

/// The manifest entries whose path contains `part`, in manifest order.
pub fn files<'a>(m: &'a Value, part: &str) -> Vec<&'a Value> {
    m["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["path"].as_str().unwrap().contains(part))
        .collect()
}

/// The one manifest entry whose path ends with `suffix`.
pub fn file<'a>(m: &'a Value, suffix: &str) -> &'a Value {
    let v: Vec<&Value> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["path"].as_str().unwrap().ends_with(suffix))
        .collect();
    assert_eq!(v.len(), 1, "manifest entries ending with {suffix}");
    v[0]
}

/// A manifest index value (a number, or "last_layer_output").
pub fn index(v: &Value) -> StateIndex {
    match v {
        Value::Number(n) => StateIndex::Hidden(n.as_u64().unwrap() as usize),
        Value::String(s) if s == "last_layer_output" => StateIndex::LastLayerOutput,
        other => panic!("manifest index {other}"),
    }
}

/// The indices the generator found for a file's stored layers.
pub fn stored_indices(file: &Value) -> std::collections::BTreeSet<StateIndex> {
    file["stored_layers"]
        .as_object()
        .unwrap_or_else(|| panic!("{}: no stored_layers", file["path"]))
        .values()
        .map(index)
        .collect()
}
