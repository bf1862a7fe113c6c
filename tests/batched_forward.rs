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

/// Targets swept together (`teacher_forced_together`: the bf16 checkpoint
/// in its dtype with its noise shadow's steps beside, the same checkpoint
/// in f32, an MoE checkpoint with its own geometry) give each target the
/// bits of its own sweep, taps and logits: the lock-step shares the reads
/// of the layers and nothing else.
#[test]
fn targets_swept_together_give_each_the_bits_of_its_own_sweep() {
    use hsparity::drafter::target::{Capture, TargetModel};
    use hsparity::drafter::{teacher_forced, teacher_forced_together, Forced, ForcedJob};
    use hsparity::loading::{NoiseShadow, WeightSource};
    const F: &str = "fixtures/noise-floor";
    let open = |entry: &str| {
        let target = common::target(
            &format!("{F}/{entry}/checkpoint"),
            Some(&format!("{F}/{entry}/prompts.jsonl")),
        );
        Session::open(&target, &[LoadingPath::CausalLm]).unwrap()
    };
    let (dense, moe) = (open("dense-s0-bf16"), open("moe-s0-bf16"));
    fn target_of(s: &Session) -> TargetModel<'_> {
        TargetModel {
            spec: &s.spec,
            weights: &s.paths[0].view,
            head: &s.paths[0].view,
            prec: s.paths[0].dtype,
        }
    }
    let (bf16, moe_t) = (target_of(&dense), target_of(&moe));
    assert_eq!(bf16.prec, Precision::Bf16, "the fixture is stored in bf16");
    let f32_t = TargetModel {
        prec: Precision::F32,
        ..bf16
    };
    let view = &dense.paths[0].view as &dyn WeightSource;
    let shadow = NoiseShadow(view);
    let shadow_t = TargetModel {
        weights: &shadow,
        ..bf16
    };
    let (dense_ids, moe_ids) = (dense.prompt_ids(), moe.prompt_ids());
    fn forced(ids: &[Vec<u32>]) -> Vec<Forced<'_>> {
        ids.iter()
            .map(|t| Forced {
                tokens: t,
                prompt_len: t.len().min(3),
                form: GdnForm::Chunked,
                decode_shift: 0,
                faults: Default::default(),
            })
            .collect()
    }
    let (ds, ms) = (forced(&dense_ids), forced(&moe_ids));
    let taps = |s: &Session| -> Vec<Capture> {
        (0..s.spec.num_layers())
            .map(Capture::Tap)
            .chain([Capture::Hidden(s.spec.num_layers())])
            .collect()
    };
    let (dc, mc) = (taps(&dense), taps(&moe));
    // The bf16 part: its prompts plain (with logits), then shadowed (none).
    let both: Vec<Forced> = ds.iter().chain(&ds).copied().collect();
    let shadowed: Vec<bool> = (0..both.len()).map(|j| j >= ds.len()).collect();
    let wants: Vec<bool> = shadowed.iter().map(|s| !s).collect();
    let (each_both, each_d, each_m) = (
        vec![dc.as_slice(); both.len()],
        vec![dc.as_slice(); ds.len()],
        vec![mc.as_slice(); ms.len()],
    );
    let (all_d, all_m) = (vec![true; ds.len()], vec![true; ms.len()]);
    let jobs = [
        ForcedJob {
            target: bf16,
            seqs: &both,
            capture: &each_both,
            shadowed: &shadowed,
            logits: &wants,
        },
        ForcedJob {
            target: f32_t,
            seqs: &ds,
            capture: &each_d,
            shadowed: &[],
            logits: &all_d,
        },
        ForcedJob {
            target: moe_t,
            seqs: &ms,
            capture: &each_m,
            shadowed: &[],
            logits: &all_m,
        },
    ];
    let got = teacher_forced_together(&jobs).unwrap();
    // The layers' pairs were held for the sweep only: read again now, a
    // weight is a new read each time.
    let name = (0..dense.spec.num_layers())
        .flat_map(|l| dense.spec.layer_tensor_names(l))
        .find(|n| view.bf16_pairs(n).unwrap().is_some())
        .expect("a linear weight stored in bf16");
    let read = || view.bf16_pairs(&name).unwrap().unwrap().1;
    assert!(
        !std::sync::Arc::ptr_eq(&read(), &read()),
        "pairs still held after the sweep"
    );
    let (bits, same) = (bits_of, same_outputs);
    let n = ds.len();
    same(
        &got[0][..n],
        &teacher_forced(&bf16, &ds, &dc, true).unwrap(),
        "bf16",
    );
    same(
        &got[0][n..],
        &teacher_forced(&shadow_t, &ds, &dc, false).unwrap(),
        "shadow",
    );
    same(
        &got[1],
        &teacher_forced(&f32_t, &ds, &dc, true).unwrap(),
        "f32",
    );
    same(
        &got[2],
        &teacher_forced(&moe_t, &ms, &mc, true).unwrap(),
        "moe",
    );
    // The parts differ where they should: f32 is not bf16, the shadow not plain.
    assert!(bits(&got[0][0].captures[0]) != bits(&got[1][0].captures[0]));
    let last = dense.spec.num_layers() - 1;
    assert!(bits(&got[0][0].captures[last]) != bits(&got[0][n].captures[last]));
}

/// The f32 bits of `t`.
fn bits_of(t: &Tensor) -> Vec<u32> {
    let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

/// Asserts `got` and `want` hold the same captures and logits, bit for bit.
fn same_outputs(
    got: &[hsparity::drafter::target::StepOut],
    want: &[hsparity::drafter::target::StepOut],
    what: &str,
) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.captures.len(), w.captures.len(), "{what} prompt {k}");
        for (c, (a, b)) in g.captures.iter().zip(&w.captures).enumerate() {
            assert!(bits_of(a) == bits_of(b), "{what} prompt {k} capture {c}");
        }
        match (&g.logits, &w.logits) {
            (Some(a), Some(b)) => assert!(bits_of(a) == bits_of(b), "{what} prompt {k} logits"),
            (None, None) => {}
            _ => panic!("{what} prompt {k}: logits asked and given differ"),
        }
    }
}
