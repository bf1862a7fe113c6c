//! Bitwise refactors of the forward: independent sequences stacked through
//! one product per weight (`DecoderLayer::forward_batch`) give the bits each
//! gives alone, the prefill-vs-incremental check run inside the capture's sweep
//! gives the rows of the separate layer-major pass, targets swept together
//! give each its own sweep's bits, and the drafter's cached context keys and
//! values (`Drafter::forward_cached`) give the whole-context forward's.

use crate::common;

use candle_core::Tensor;
use hsparity::commands::compare::{self, CompareOptions};
use hsparity::loading::LoadingPath;
use hsparity::models::layers::rows_batchable;
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

/// A batch mixing two fresh sequences of one length, one continuing a
/// prefill's state tentatively (a speculative block, committed in part
/// after), one leaving a snapshot and a short one (whose narrow products
/// are not stacked) gives each the bits of its own call, and leaves the
/// states those calls leave (the snapshot: a separate prefill's): steps from
/// each give the same bits. Every layer of the tiny fixture, f32 and bf16,
/// both delta-rule forms; the mixers' wide products stack at these lengths.
#[test]
fn a_batch_of_fresh_continued_and_snapshot_sequences_gives_each_alone() {
    let session = Session::open(&common::target(TINY, None), &[LoadingPath::CausalLm]).unwrap();
    let (spec, src) = (&session.spec, &session.paths[0].view);
    let (g, h) = (&spec.geo, spec.geo.hidden);
    for n in [g.conv_dim(), 2 * g.num_heads * g.head_dim] {
        assert!(
            rows_batchable(65, h, n) && rows_batchable(40, h, n),
            "[{h}, {n}]"
        );
    }
    assert!(rows_batchable(65, g.lin_v_heads * g.lin_v_dim, h) && !rows_batchable(40, h, h));
    let pos = |at, t| spec.positions(at, t).unwrap();
    let (pos65, pos130, pos40, pos_next) = (pos(0, 65), pos(0, 130), pos(0, 40), pos(70, 66));
    for prec in [Precision::F32, Precision::Bf16] {
        for form in [GdnForm::Chunked, GdnForm::Recurrent] {
            for l in 0..spec.num_layers() {
                let what = format!("layer {l} {prec:?} {form:?}");
                let layer = DecoderLayer::load(spec, src, l, prec).unwrap();
                let x = |t: usize, j: u64| input(t, h, 300 + 10 * l as u64 + j, prec);
                let (a, b, c, d, e) = (x(65, 0), x(66, 1), x(130, 2), x(40, 3), x(65, 5));
                let mut prefilled = layer.new_state(spec);
                layer
                    .forward(&x(70, 4), spec, &pos(0, 70), form, Some(&mut prefilled))
                    .unwrap();
                prefilled.begin_tentative();
                let (mut cont, mut snap) = (prefilled.clone(), layer.new_state(spec));
                let seq = |h, pos, state, snapshot| Sequence {
                    h,
                    pos,
                    form,
                    state,
                    snapshot,
                };
                let mut seqs = vec![
                    seq(&a, &pos65, None, None),
                    seq(&b, &pos_next, Some(&mut cont), None),
                    seq(&c, &pos130, None, Some((100, &mut snap))),
                    seq(&d, &pos40, None, None),
                    seq(&e, &pos65, None, None),
                ];
                let batch = layer.forward_batch(&mut seqs, spec).unwrap();
                drop(seqs);
                let (mut cont_alone, mut prefix) = (prefilled.clone(), layer.new_state(spec));
                let alone = [
                    layer.forward(&a, spec, &pos65, form, None).unwrap(),
                    layer
                        .forward(&b, spec, &pos_next, form, Some(&mut cont_alone))
                        .unwrap(),
                    layer.forward(&c, spec, &pos130, form, None).unwrap(),
                    layer.forward(&d, spec, &pos40, form, None).unwrap(),
                    layer.forward(&e, spec, &pos65, form, None).unwrap(),
                ];
                for (j, ((o, _), want)) in batch.iter().zip(&alone).enumerate() {
                    assert!(
                        common::bits(o) == common::bits(want),
                        "{what}: sequence {j}"
                    );
                }
                // The continued sequence read its state; the snapshot is the
                // state a separate prefill of its first 100 tokens leaves.
                let fresh_b = layer.forward(&b, spec, &pos_next, form, None).unwrap();
                assert!(
                    common::bits(&batch[1].0) != common::bits(&fresh_b),
                    "{what}"
                );
                let c100 = c.narrow(0, 0, 100).unwrap();
                layer
                    .forward(&c100, spec, &pos(0, 100), form, Some(&mut prefix))
                    .unwrap();
                for s in [&mut cont, &mut cont_alone] {
                    s.commit(70, 100).unwrap();
                }
                same_steps(
                    &layer,
                    spec,
                    l,
                    &what,
                    [(100, [cont, cont_alone]), (100, [snap, prefix])],
                );
            }
        }
    }
}

/// Three decode steps from each pair of states (at position `at`) give the
/// same bits.
fn same_steps<const N: usize>(
    layer: &DecoderLayer,
    spec: &hsparity::models::TextModelSpec,
    l: usize,
    what: &str,
    pairs: [(usize, [hsparity::models::LayerState; 2]); N],
) {
    let steps = input(3, spec.geo.hidden, 400 + l as u64, layer.prec);
    for (i, (at, [mut s0, mut s1])) in pairs.into_iter().enumerate() {
        let pos_steps: Vec<_> = (at..at + 3)
            .map(|i| spec.positions(i, 1).unwrap())
            .collect();
        let go = |s: &mut _| layer.forward_steps(&steps, spec, &pos_steps, s).unwrap();
        let (o0, o1) = (go(&mut s0), go(&mut s1));
        assert!(
            common::bits(&o0) == common::bits(&o1),
            "{what}: state pair {i}"
        );
    }
}

/// A batch refuses a snapshot of a sequence that continues a state, and a
/// snapshot cut at 0 or past its sequence; a state of the other mixer's
/// kind is not continued (that sequence runs as a fresh one). Every layer
/// of the tiny fixture.
#[test]
fn a_batch_refuses_bad_snapshots_and_starts_a_foreign_state_fresh() {
    let session = Session::open(&common::target(TINY, None), &[LoadingPath::CausalLm]).unwrap();
    let (spec, src) = (&session.spec, &session.paths[0].view);
    let pos = spec.positions(0, 65).unwrap();
    for l in 0..spec.num_layers() {
        let layer = DecoderLayer::load(spec, src, l, Precision::F32).unwrap();
        let (a, b) = (
            input(65, spec.geo.hidden, 500 + l as u64, Precision::F32),
            input(65, spec.geo.hidden, 600 + l as u64, Precision::F32),
        );
        let (mut st, mut snaps) = (
            layer.new_state(spec),
            [0, 1, 2].map(|_| layer.new_state(spec)),
        );
        let seq = |h, state, snapshot| Sequence {
            h,
            pos: &pos,
            form: GdnForm::Chunked,
            state,
            snapshot,
        };
        let [s10, s0, s66] = &mut snaps;
        let mut both = [seq(&a, None, None), seq(&b, Some(&mut st), Some((10, s10)))];
        assert!(
            layer.forward_batch(&mut both, spec).is_err(),
            "layer {l}: both"
        );
        for (at, snap) in [(0, s0), (66, s66)] {
            let mut cut = [seq(&a, None, None), seq(&b, None, Some((at, snap)))];
            assert!(
                layer.forward_batch(&mut cut, spec).is_err(),
                "layer {l}: at {at}"
            );
        }
        let kind = |s: &hsparity::models::LayerState| std::mem::discriminant(s);
        let mine = kind(&layer.new_state(spec));
        let mut foreign = (0..spec.num_layers())
            .map(|o| DecoderLayer::load(spec, src, o, Precision::F32).unwrap())
            .map(|other| other.new_state(spec))
            .find(|s| kind(s) != mine)
            .expect("the fixture has mixers of both kinds");
        let mut batch = [seq(&a, None, None), seq(&b, Some(&mut foreign), None)];
        let got = layer.forward_batch(&mut batch, spec).unwrap();
        let fresh = layer
            .forward(&b, spec, &pos, GdnForm::Chunked, None)
            .unwrap();
        assert!(common::bits(&got[1].0) == common::bits(&fresh), "layer {l}");
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
                resume: None,
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

/// A drafter of hidden size 128 (its `fc` has 128 outputs) whose `k_proj`
/// and `v_proj` have `2 × hd` outputs, one sliding and one full layer, bf16
/// weights drawn from `common::uniform`; written under `dir`.
fn wide_drafter(dir: &std::path::Path, hd: usize) {
    use std::collections::HashMap;
    let (h, k, nh, nkv, inter) = (128usize, 2usize, 4usize, 2usize, 96usize);
    let mut t: HashMap<String, Tensor> = HashMap::new();
    let mut seed = 0u64;
    let mut put = |name: String, dims: &[usize], scale: f32, centre: f32| {
        seed += 1;
        let n: usize = dims.iter().product();
        let v: Vec<f32> = common::uniform(n, seed)
            .into_iter()
            .map(|u| centre + (u - 0.5) * 2.0 * scale)
            .collect();
        let w = Tensor::from_vec(v, dims, &candle_core::Device::Cpu).unwrap();
        t.insert(name, w.to_dtype(candle_core::DType::BF16).unwrap());
    };
    put("fc.weight".into(), &[h, k * h], 0.06, 0.0);
    for n in ["hidden_norm.weight", "norm.weight"] {
        put(n.into(), &[h], 0.1, 1.0);
    }
    for i in 0..2 {
        let n = |s: &str| format!("layers.{i}.{s}");
        for (s, dims) in [
            ("self_attn.q_proj.weight", [nh * hd, h]),
            ("self_attn.k_proj.weight", [nkv * hd, h]),
            ("self_attn.v_proj.weight", [nkv * hd, h]),
            ("self_attn.o_proj.weight", [h, nh * hd]),
            ("mlp.gate_proj.weight", [inter, h]),
            ("mlp.up_proj.weight", [inter, h]),
            ("mlp.down_proj.weight", [h, inter]),
        ] {
            put(n(s), &dims, 1.5 / (dims[1] as f32).sqrt(), 0.0);
        }
        for (s, d) in [
            ("input_layernorm.weight", h),
            ("post_attention_layernorm.weight", h),
            ("self_attn.q_norm.weight", hd),
            ("self_attn.k_norm.weight", hd),
        ] {
            put(n(s), &[d], 0.1, 1.0);
        }
    }
    std::fs::create_dir_all(dir).unwrap();
    candle_core::safetensors::save(&t, dir.join("model.safetensors")).unwrap();
    let cfg = serde_json::json!({"architectures": ["DFlashDraftModel"], "hidden_size": h,
        "intermediate_size": inter, "num_hidden_layers": 2, "num_attention_heads": nh,
        "num_key_value_heads": nkv, "head_dim": hd, "block_size": 8, "rms_norm_eps": 1e-6,
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 12,
        "use_sliding_window": true,
        "dflash_config": {"target_layer_ids": [0, 1], "mask_token_id": 1}});
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
}

/// The drafters the cached-context tests run, with their hidden sizes:
/// `wide` (key/value products of 96 outputs) and `narrow` (64, candle's
/// small-size rule below 65 rows) written under `dir`, and the toy pair's.
fn test_drafters(dir: &std::path::Path) -> [(&'static str, std::path::PathBuf, usize); 3] {
    let (wide, narrow) = (dir.join("wide"), dir.join("narrow"));
    wide_drafter(&wide, 48);
    wide_drafter(&narrow, 32);
    [
        ("wide", wide, 128),
        ("narrow", narrow, 128),
        ("toy", "fixtures/toy-pair/drafter".into(), 64),
    ]
}

/// The drafter's forward with its context keys and values held across the
/// anchors of a walk (`forward_cached`) gives the whole-context forward's
/// bits at every anchor: one new row (its `fc` product re-projects held
/// rows), none, many, an anchor behind those held, in bf16 and f32 (f32
/// is the one whose bits show a product summed in another order). Products
/// with 64 outputs or fewer follow candle's small-size rule below 65 rows,
/// so such a drafter runs whole until its products pass 64 rows: the
/// 64-wide key/value products of `narrow` once 57 context rows join the
/// block's 8, and the toy pair's drafter (hidden size 64) once `fc` reads
/// 65 rows.
#[test]
fn cached_draft_context_gives_the_whole_context_forward() {
    use hsparity::models::dflash::{DraftContext, Drafter};
    let tmp = tempfile::tempdir().unwrap();
    let anchors = [
        5usize, 6, 6, 9, 30, 20, 31, 56, 57, 58, 66, 67, 67, 70, 130, 129,
    ];
    for ((what, path, hidden), whole_until) in
        test_drafters(tmp.path()).into_iter().zip([0, 56, 64])
    {
        for prec in [Precision::Bf16, Precision::F32] {
            let d = Drafter::load_dir(&path, hidden, prec).unwrap();
            let (h, k, b) = (
                d.cfg.hidden_size,
                d.cfg.target_layer_ids.len(),
                d.cfg.block_size,
            );
            let feats = input(140, k * h, 7, prec);
            let rows = |a: usize, e: usize| Ok(feats.narrow(0, a, e - a)?);
            let mut ctx = DraftContext::new();
            for (j, &start) in anchors.iter().enumerate() {
                let noise = input(b, h, 100 + j as u64, prec);
                let whole = d.forward(&noise, &feats.narrow(0, 0, start).unwrap(), 0, start);
                let cached = d.forward_cached(&noise, start, &mut ctx, &rows).unwrap();
                assert!(
                    bits_of(&cached) == bits_of(&whole.unwrap()),
                    "{what} {prec:?}: anchor {start} (step {j})"
                );
                let held = anchors[..=j].iter().filter(|&&a| a > whole_until).max();
                assert_eq!(ctx.len(), held.copied().unwrap_or(0), "{what} {prec:?} {j}");
            }
        }
    }
}

/// Several drafts through the drafter's layers together
/// (`Drafter::forward_cached_each`: each layer read once, its products over
/// the stacked rows where the kernel sums each row as alone) are bitwise
/// each draft's own `forward_cached`, and leave each context as its own
/// call does: a fresh context, held ones read in part or re-projected,
/// ones too short for the cache (the whole-context forward; the shortest
/// take candle's row-at-a-time route, which a stack would change), full and
/// shortened blocks, each draft its own features, on the drafters of the
/// test above, in bf16 and f32; a draft whose features fail fails the
/// batch and leaves every context of it as it was.
#[test]
fn drafts_through_the_layers_together_give_each_alones_bits() {
    use hsparity::models::dflash::{CachedDraft, DraftContext, Drafter};
    let tmp = tempfile::tempdir().unwrap();
    // (anchor held before, anchor, block slots)
    let cases = [
        (None, 100, 8),
        (Some(70), 90, 8),
        (None, 10, 8),
        (Some(80), 80, 5),
        (Some(40), 130, 8),
        (Some(20), 30, 3),
        (None, 4, 3),
    ];
    for (what, path, hidden) in test_drafters(tmp.path()) {
        for prec in [Precision::Bf16, Precision::F32] {
            let d = Drafter::load_dir(&path, hidden, prec).unwrap();
            let (h, k) = (d.cfg.hidden_size, d.cfg.target_layer_ids.len());
            // Each draft its own features (as each trajectory has).
            let feats: Vec<Tensor> = (0..cases.len())
                .map(|i| input(160, k * h, 7 + i as u64, prec))
                .collect();
            let rows: Vec<_> = feats
                .iter()
                .map(|f| move |a: usize, e: usize| Ok(f.narrow(0, a, e - a)?))
                .collect();
            let noises: Vec<Tensor> = (0..cases.len())
                .map(|i| input(cases[i].2, h, 90 + i as u64, prec))
                .collect();
            let warm = |i: usize| {
                let mut ctx = DraftContext::new();
                if let Some(a) = cases[i].0 {
                    let noise = input(8, h, 3, prec);
                    d.forward_cached(&noise, a, &mut ctx, &rows[i]).unwrap();
                }
                ctx
            };
            let mut together: Vec<DraftContext> = (0..cases.len()).map(warm).collect();
            let mut alone: Vec<DraftContext> = (0..cases.len()).map(warm).collect();
            let drafts = together
                .iter_mut()
                .zip(&cases)
                .zip(&noises)
                .zip(&rows)
                .map(|(((ctx, c), noise), rows)| CachedDraft {
                    noise,
                    start: c.1,
                    ctx,
                    rows,
                })
                .collect();
            let ys = d.forward_cached_each(drafts).unwrap();
            let each = cases.iter().zip(&noises).zip(alone.iter_mut());
            for (i, ((c, noise), ctx)) in each.enumerate() {
                let want = d.forward_cached(noise, c.1, ctx, &rows[i]).unwrap();
                assert!(
                    bits_of(&ys[i]) == bits_of(&want),
                    "{what} {prec:?} draft {i} {c:?}: not its own forward's bits"
                );
            }
            // The contexts as left: the same length, and a later draft on
            // each reads the same keys and values.
            for (i, (t, a)) in together.iter_mut().zip(alone.iter_mut()).enumerate() {
                assert_eq!(t.len(), a.len(), "{what} {prec:?} context {i}");
                let noise = input(8, h, 5, prec);
                let (yt, ya) = (
                    d.forward_cached(&noise, 150, t, &rows[i]).unwrap(),
                    d.forward_cached(&noise, 150, a, &rows[i]).unwrap(),
                );
                let same = bits_of(&yt) == bits_of(&ya);
                assert!(same, "{what} {prec:?} context {i} after");
            }
            // A draft whose features cannot be read fails the batch, and no
            // context of it changes.
            let mut ctxs: Vec<DraftContext> = (0..cases.len()).map(warm).collect();
            let held: Vec<usize> = ctxs.iter().map(|c| c.len()).collect();
            let broken = |_: usize, _: usize| -> hsparity::error::Result<Tensor> {
                Err(hsparity::error::Error::Config("features unreadable".into()))
            };
            let drafts = ctxs
                .iter_mut()
                .zip(&cases)
                .zip(&noises)
                .enumerate()
                .map(|(i, ((ctx, c), noise))| CachedDraft {
                    noise,
                    start: c.1,
                    ctx,
                    rows: if i == 4 { &broken } else { &rows[i] },
                })
                .collect();
            let e = d.forward_cached_each(drafts).unwrap_err().to_string();
            assert!(e.contains("features unreadable"), "{e}");
            let after: Vec<usize> = ctxs.iter().map(|c| c.len()).collect();
            assert_eq!(
                after, held,
                "{what} {prec:?}: a failed batch changed a context"
            );
        }
    }
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
