//! The engine faults triage emulates change what they should and nothing
//! else: `gdn-state-reset@K` leaves every row before K bitwise unchanged and
//! a full-attention-only target bitwise unchanged everywhere; `kv-fp8`
//! rounds K and V to e4m3 with scale 1.0 (hand-computed values), leaves the
//! layers before the first attention layer bitwise unchanged and moves the
//! rest only a little.

use candle_core::{Device, Tensor};
use hsparity::checkpoint::Checkpoint;
use hsparity::drafter::faults::Faults;
use hsparity::drafter::target::{Capture, Sequence, Step, TargetModel};
use hsparity::loading::{self, LoadingPath, ResolvedPath};
use hsparity::models::layers::attention::fp8_round_trip;
use hsparity::models::{GdnForm, TextModelSpec};

fn path(ckpt: &str) -> (ResolvedPath, TextModelSpec) {
    let c = Checkpoint::open(ckpt).unwrap();
    let p = loading::resolve(&c, LoadingPath::CausalLm).unwrap();
    let spec = TextModelSpec::new(&p.text_config).unwrap();
    (p, spec)
}

fn ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + 11) % vocab as u32)
        .collect()
}

/// Every `hidden_states[i]` (rows of all tokens) of `toks` fed in pieces of
/// `split` tokens with `faults`.
fn hidden(ckpt: &str, toks: &[u32], split: &[usize], faults: Faults) -> Vec<Vec<Vec<f32>>> {
    let (p, spec) = path(ckpt);
    let t = TargetModel {
        spec: &spec,
        weights: &p.view,
        head: &p.view,
        prec: p.dtype,
    };
    let caps: Vec<Capture> = (0..=spec.num_layers()).map(Capture::Hidden).collect();
    let mut seq = Sequence::new(&spec, toks.len(), GdnForm::Chunked, 0).with_faults(faults);
    let mut rows: Vec<Vec<Vec<f32>>> = vec![Vec::new(); caps.len()];
    let mut at = 0;
    for &n in split
        .iter()
        .chain([&(toks.len() - split.iter().sum::<usize>())])
    {
        let out = t
            .sweep(
                &mut [Step {
                    seq: &mut seq,
                    ids: &toks[at..at + n],
                    tentative: false,
                    logits: 0..0,
                }],
                &caps,
            )
            .unwrap();
        for (r, c) in rows.iter_mut().zip(&out[0].captures) {
            r.extend(c.to_vec2::<f32>().unwrap());
        }
        at += n;
    }
    rows
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn reset_at(k: usize) -> Faults {
    Faults {
        gdn_reset_at: Some(k),
        ..Faults::default()
    }
}

/// On the hybrid toy target: rows before K bitwise as without the reset, rows
/// from K on different from the first (linear-attention) layer's output on,
/// and the reset inside one prefill equals a prefill cut at K whose second
/// piece starts from a dropped state.
#[test]
fn gdn_state_reset_changes_rows_from_k_only() {
    let ckpt = "fixtures/toy-pair/target";
    let toks = ids(30, 40);
    let k = 13;
    let clean = hidden(ckpt, &toks, &[], Faults::default());
    let reset = hidden(ckpt, &toks, &[], reset_at(k));
    for (i, (c, r)) in clean.iter().zip(&reset).enumerate() {
        for row in 0..k {
            assert!(same_bits(&c[row], &r[row]), "hidden_states[{i}] row {row}");
        }
        let changed = (k..toks.len()).any(|row| !same_bits(&c[row], &r[row]));
        assert_eq!(changed, i > 0, "hidden_states[{i}] from row {k}");
    }
    let cut = hidden(ckpt, &toks, &[k], reset_at(k));
    for (i, (a, b)) in reset.iter().zip(&cut).enumerate() {
        for row in 0..toks.len() {
            let d = a[row]
                .iter()
                .zip(&b[row])
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(d <= 0.05, "hidden_states[{i}] row {row}: {d}");
        }
    }
}

/// A target without linear-attention layers has no such state: the reset
/// leaves every hidden state bitwise unchanged.
#[test]
fn gdn_state_reset_leaves_full_attention_targets_unchanged() {
    let ckpt = "fixtures/toy-pair-qwen3/target";
    let toks = ids(30, 40);
    let clean = hidden(ckpt, &toks, &[], Faults::default());
    let reset = hidden(ckpt, &toks, &[], reset_at(13));
    for (c, r) in clean.iter().zip(&reset) {
        assert!(c.iter().zip(r).all(|(a, b)| same_bits(a, b)));
    }
}

/// e4m3 with scale 1.0, by hand: 0.1 = 1.6·2⁻⁴ → 1.625·2⁻⁴ = 0.1015625;
/// 1.0625 is halfway between 1.0 and 1.125 → 1.0 (even mantissa); 300 →
/// 288 (step 32 above 256); 500 and −1000 saturate to ±448; subnormals are
/// m·2⁻⁹: 2⁻⁹ is kept, 2⁻¹⁰ (half of it) → 0, 3·2⁻¹⁰ (1.5·2⁻⁹) → 2·2⁻⁹
/// (ties to even).
#[test]
fn fp8_round_trip_is_e4m3_with_scale_one() {
    let s = 2f32.powi(-10);
    let x = [0.1f32, 1.0625, 300.0, 500.0, -1000.0, 2.0 * s, s, 3.0 * s];
    let want = [
        0.1015625f32,
        1.0,
        288.0,
        448.0,
        -448.0,
        2.0 * s,
        0.0,
        4.0 * s,
    ];
    let t = Tensor::new(&x[..], &Device::Cpu).unwrap();
    let got = fp8_round_trip(&t).unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(got, want);
}

/// fp8 K/V on the hybrid toy target: the embeddings and the first
/// (linear-attention) layer's output bitwise unchanged, every state after
/// the first attention layer changed, and only a little (cos > 0.99).
#[test]
fn kv_fp8_changes_attention_layers_only() {
    let ckpt = "fixtures/toy-pair/target";
    let toks = ids(30, 40);
    let fp8 = Faults {
        kv_fp8: true,
        ..Faults::default()
    };
    let clean = hidden(ckpt, &toks, &[], Faults::default());
    let q = hidden(ckpt, &toks, &[], fp8);
    for (i, (c, r)) in clean.iter().zip(&q).enumerate() {
        let same = c.iter().zip(r).all(|(a, b)| same_bits(a, b));
        assert_eq!(same, i <= 1, "hidden_states[{i}]");
        let (a, b): (Vec<f32>, Vec<f32>) = (c.concat(), r.concat());
        let dot: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (*x as f64) * (*y as f64))
            .sum();
        let n = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        assert!(dot / (n(&a) * n(&b)) > 0.99, "hidden_states[{i}]");
    }
}
