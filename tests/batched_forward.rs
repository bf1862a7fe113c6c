//! Two bitwise refactors of the capture's sweep: independent sequences
//! stacked through one feed-forward (`DecoderLayer::forward_batch`) give the
//! bits each gives alone, and the prefill-vs-incremental check run inside
//! the capture's sweep gives the rows of the separate layer-major pass.

use crate::common;

use candle_core::Tensor;
use hsparity::commands::compare::{self, CompareOptions};
use hsparity::loading::LoadingPath;
use hsparity::models::{DecoderLayer, FeedForward, GdnForm, Sequence};
use hsparity::parity::incremental;
use hsparity::precision::Precision;
use hsparity::session::{Session, Target};

const TINY: &str = "fixtures/tiny-qwen3_5";

use common::hidden_input as input;

/// Sequences of 1 to 130 tokens through every layer of the tiny fixture
/// (linear and full attention, chunked and recurrent delta rule), stacked
/// and alone, in f32 and bf16: the same bits. The long ones are stacked
/// (the test would not exercise anything otherwise).
#[test]
fn stacked_sequences_give_the_bits_of_each_alone() {
    let session = Session::open(&common::target(TINY, None), &[LoadingPath::CausalLm]).unwrap();
    let (spec, src) = (&session.spec, &session.paths[0].view);
    let h = spec.geo.hidden;
    let lens = [1usize, 2, 40, 65, 70, 130];
    for prec in [Precision::F32, Precision::Bf16] {
        for form in [GdnForm::Chunked, GdnForm::Recurrent] {
            for l in 0..spec.num_layers() {
                let layer = DecoderLayer::load(spec, src, l, prec).unwrap();
                if let FeedForward::Dense(m) = &layer.mlp {
                    assert!(m.rows_batchable(65) && !m.rows_batchable(40) && !m.rows_batchable(1));
                }
                let xs: Vec<Tensor> = lens
                    .iter()
                    .enumerate()
                    .map(|(j, &t)| input(t, h, (l * 10 + j) as u64, prec))
                    .collect();
                let pos: Vec<_> = lens
                    .iter()
                    .map(|&t| spec.positions(0, t).unwrap())
                    .collect();
                let mut seqs: Vec<Sequence> = xs
                    .iter()
                    .zip(&pos)
                    .map(|(h, pos)| Sequence {
                        h,
                        pos,
                        form,
                        state: None,
                        snapshot: None,
                    })
                    .collect();
                let stacked = layer.forward_batch(&mut seqs, spec).unwrap();
                assert_eq!(stacked.len(), lens.len());
                for ((x, p), (o, _)) in xs.iter().zip(&pos).zip(&stacked) {
                    let (alone, _) = layer.forward_routed(x, spec, p, form, None).unwrap();
                    assert!(
                        common::bits(&alone) == common::bits(o),
                        "layer {l} {prec:?} {form:?}: {} tokens stacked differ from alone",
                        x.dim(0).unwrap()
                    );
                }
            }
        }
    }
}

/// `compare`'s prefill-vs-incremental rows (the check inside the capture's
/// sweep) equal the separate layer-major pass of `incremental::check`,
/// field for field, in f32 and bf16.
#[test]
fn the_check_in_the_capture_sweep_equals_the_separate_pass() {
    for dtype in [Precision::F32, Precision::Bf16] {
        let opts = CompareOptions {
            target: Target {
                dtype: Some(dtype),
                ..common::target(TINY, Some(&format!("{TINY}/prompts.jsonl")))
            },
            paths: vec![LoadingPath::CausalLm, LoadingPath::Vlm],
            taps: Vec::new(),
            gdn_form: GdnForm::Chunked,
            noise_floor: Default::default(),
            incremental: Some(true),
            drafter: None,
            quiet: true,
            command_line: String::new(),
        };
        let report = compare::run(&opts).unwrap();
        let folded = serde_json::to_value(&report.body.incremental).unwrap();
        let session = Session::open(&opts.target, &opts.paths).unwrap();
        let separate: Vec<_> = session
            .paths
            .iter()
            .map(|p| incremental::check(&session, p, dtype).unwrap().unwrap())
            .collect();
        let separate = serde_json::to_value(&separate).unwrap();
        assert_eq!(
            folded.as_array().map(Vec::len),
            Some(2),
            "{dtype:?}: both paths"
        );
        assert_eq!(folded, separate, "{dtype:?}");
    }
}

/// A layer's forward of a fresh sequence leaves, beside its own outputs
/// (the bits of the plain forward), the state a separate prefill of its
/// first `at` tokens hands on, bit for bit: the prefill's rows are the
/// forward's first rows, and steps continuing either state give the same
/// bits. Every layer of the tiny fixture (delta rule and attention), f32
/// and bf16, both delta-rule forms, cut mid-chunk, at a chunk boundary and
/// at the end; prefills long enough that their products take candle's
/// blocked route (as the capture's rows do).
#[test]
fn a_snapshot_is_the_state_a_separate_prefill_hands_on() {
    let session = Session::open(&common::target(TINY, None), &[LoadingPath::CausalLm]).unwrap();
    let (spec, src) = (&session.spec, &session.paths[0].view);
    let (h, t) = (spec.geo.hidden, 130);
    let pos = spec.positions(0, t).unwrap();
    for prec in [Precision::F32, Precision::Bf16] {
        for form in [GdnForm::Chunked, GdnForm::Recurrent] {
            for l in 0..spec.num_layers() {
                let layer = DecoderLayer::load(spec, src, l, prec).unwrap();
                let x = input(t, h, 100 + l as u64, prec);
                let (full, _) = layer.forward_routed(&x, spec, &pos, form, None).unwrap();
                for at in [65, 100, 128, 130] {
                    let what = format!("layer {l} {prec:?} {form:?} at {at}");
                    let mut snap = layer.new_state(spec);
                    let (out, _) = layer
                        .forward_snapshot(&x, spec, &pos, form, (at, &mut snap))
                        .unwrap();
                    assert!(common::bits(&out) == common::bits(&full), "{what}: outputs");
                    let mut state = layer.new_state(spec);
                    let pre = spec.positions(0, at).unwrap();
                    let head = x.narrow(0, 0, at).unwrap();
                    let prefill = layer
                        .forward(&head, spec, &pre, form, Some(&mut state))
                        .unwrap();
                    let first = full.narrow(0, 0, at).unwrap();
                    assert!(
                        common::bits(&prefill) == common::bits(&first),
                        "{what}: rows"
                    );
                    let steps = input(3, h, 200 + l as u64, prec);
                    let pos_steps: Vec<_> = (at..at + 3)
                        .map(|i| spec.positions(i, 1).unwrap())
                        .collect();
                    let a = layer
                        .forward_steps(&steps, spec, &pos_steps, &mut snap)
                        .unwrap();
                    let b = layer
                        .forward_steps(&steps, spec, &pos_steps, &mut state)
                        .unwrap();
                    assert!(common::bits(&a) == common::bits(&b), "{what}: steps");
                }
                for at in [0, t + 1] {
                    let mut snap = layer.new_state(spec);
                    let r = layer.forward_snapshot(&x, spec, &pos, form, (at, &mut snap));
                    assert!(r.is_err(), "layer {l}: a snapshot at {at} of {t} tokens");
                }
            }
        }
    }
}
