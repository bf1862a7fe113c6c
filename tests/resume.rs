//! Resume points: a DFlash loop whose prefill is split at its prompt's last
//! Gated DeltaNet chunk boundary gives the loop's own bits, and a
//! teacher-forced sweep started there gives the bits of the sweep from
//! token 0 (`hsparity::drafter::target::Resume`), on the toy pair's Qwen3.5
//! target in bf16 and f32, over prompt lengths on both sides of the chunk
//! boundaries and past the attention's query blocks.

use crate::common::{self, bits};
use candle_core::Tensor;
use hsparity::checkpoint::Checkpoint;
use hsparity::drafter::eval::EndRule;
use hsparity::drafter::faults::Faults;
use hsparity::drafter::generate::{dflash_loop_with, Generation, Lane};
use hsparity::drafter::target::{Capture, TargetModel, MIN_ROWS};
use hsparity::drafter::{features, teacher_forced, Forced};
use hsparity::loading::{self, LoadingPath};
use hsparity::models::dflash::Drafter;
use hsparity::models::{CacheCrop, GdnForm, TextModelSpec};
use hsparity::precision::Precision;
use std::path::Path;

const T: &str = "fixtures/toy-pair";

/// Asserts `a` and `b` hold the same bits, naming `what` and the first
/// difference.
fn same_bits(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes");
    let (x, y) = (bits(a), bits(b));
    let first = x.iter().zip(&y).position(|(p, q)| p != q);
    assert!(first.is_none(), "{what}: first difference at {first:?}");
}

/// The lanes of one prompt: plain, shifted positions, the crop that leaves
/// the recurrent state, fp8 keys and values, the recurrent form, a Gated
/// DeltaNet reset mid-prompt (its chunks start anew there) and one past the
/// prompt.
fn lanes(q: &[u32]) -> Vec<Lane> {
    let plain = Lane::plain(q);
    let faults = |f: Faults| Lane {
        faults: f,
        ..plain.clone()
    };
    let d = Faults::default();
    vec![
        plain.clone(),
        Lane {
            decode_shift: 16,
            ..plain.clone()
        },
        faults(Faults {
            crop: CacheCrop::ConvOnly,
            ..d
        }),
        faults(Faults { kv_fp8: true, ..d }),
        Lane {
            form: GdnForm::Recurrent,
            ..plain.clone()
        },
        faults(Faults {
            gdn_reset_at: Some(q.len() / 2),
            ..d
        }),
        faults(Faults {
            gdn_reset_at: Some(q.len() + 3),
            ..d
        }),
    ]
}

/// Prompts of `lens` tokens: the toy pair's held-out prompts one after
/// another, from a different one for each length.
fn prompts(lens: &[usize]) -> Vec<Vec<u32>> {
    let at = lens.iter().enumerate();
    at.map(|(k, &n)| common::toy_pair_text(n, k * 11)).collect()
}

/// The resume point of a prompt of `len` tokens: the last chunk boundary
/// (from token 0, or from the reset at `len / 2` of [`lanes`]) with at
/// least 257 tokens after it, when at least 257 lie before it.
fn expected_point(len: usize, reset_mid: bool) -> Option<usize> {
    let plain = [(577, 320), (640, 320), (641, 384), (700, 384), (1100, 832)];
    let reset = [
        (576, 288),
        (577, 288),
        (640, 320),
        (641, 384),
        (700, 414),
        (1100, 806),
    ];
    let table: &[(usize, usize)] = if reset_mid { &reset } else { &plain };
    table.iter().find(|(l, _)| *l == len).map(|&(_, at)| at)
}

#[test]
fn a_split_prefill_and_a_sweep_from_its_resume_point_give_the_whole_sweeps_bits() {
    let c = Checkpoint::open(&format!("{T}/target")).unwrap();
    let p = loading::resolve(&c, LoadingPath::CausalLm).unwrap();
    let spec = TextModelSpec::new(&p.text_config).unwrap();
    let dir = format!("{T}/drafter");
    let drafter =
        Drafter::load_dir(Path::new(&dir), p.text_config.hidden_size, Precision::F32).unwrap();
    let n = spec.num_layers();
    // Every hidden state and the raw last-layer output (the baseline's
    // group in triage), and the taps.
    let all: Vec<Capture> = (0..=n)
        .map(Capture::Hidden)
        .chain([Capture::Tap(n - 1)])
        .collect();
    // 577 is the shortest prompt with a point (320, leaving 257 tokens
    // after it), 641 the shortest with one a chunk later; every sweep of
    // more than 512 tokens runs its attention in query blocks.
    let lens = [100, 576, 577, 640, 641, 700, 1100];
    let qs = prompts(&lens);
    for prec in [p.dtype, Precision::F32] {
        let target = TargetModel {
            spec: &spec,
            weights: &p.view,
            head: &p.view,
            prec,
        };
        let ls: Vec<Lane> = qs.iter().flat_map(|q| lanes(q)).collect();
        let run = |keep: &[Capture]| -> Generation {
            dflash_loop_with(
                &target,
                &drafter,
                &ls,
                8,
                EndRule::GithubMain,
                keep,
                &|_| {},
            )
            .unwrap()
        };
        let (plain, split) = (run(&[]), run(&all));
        assert!(plain.resumes.iter().all(Option::is_none));
        assert_eq!(
            split.sweeps,
            plain.sweeps + 1,
            "{prec:?}: the split prefill's sweep"
        );
        for (i, lane) in ls.iter().enumerate() {
            let what = format!("{prec:?}, lane {i} ({} tokens)", lane.prompt.len());
            assert_eq!(split.tokens[i], plain.tokens[i], "{what}: tokens");
            assert_eq!(
                split.acceptance_lengths[i], plain.acceptance_lengths[i],
                "{what}"
            );
            same_bits(
                &split.features[i],
                &plain.features[i],
                &format!("{what}: taps"),
            );
            let len = lane.prompt.len();
            let reset_inside = lane.faults.gdn_reset_at.is_some_and(|r| r < len);
            let want = expected_point(len, reset_inside);
            let resume = split.resumes[i].as_deref();
            assert_eq!(resume.map(|r| r.at()), want, "{what}: resume point");
            let Some(resume) = resume else {
                continue;
            };
            // The lane's tokens teacher-forced, every hidden state and the
            // continuation's logits, from token 0 and from the point.
            let forced = Forced {
                tokens: &split.tokens[i],
                prompt_len: len,
                form: lane.form,
                decode_shift: lane.decode_shift,
                faults: lane.faults,
                resume: None,
            };
            assert!(resume.serves(&target, &forced, &all), "{what}");
            let from = Forced {
                resume: Some(resume),
                ..forced
            };
            // Alone, and beside each other in one sweep.
            let whole = teacher_forced(&target, &[forced], &all, true).unwrap();
            let part = teacher_forced(&target, &[from], &all, true).unwrap();
            let both = teacher_forced(&target, &[forced, from], &all, true).unwrap();
            let outs = [&whole[0], &part[0], &both[0], &both[1]];
            for (k, o) in outs.iter().enumerate().skip(1) {
                for (c, (a, b)) in all.iter().zip(whole[0].captures.iter().zip(&o.captures)) {
                    same_bits(a, b, &format!("{what}: {c:?} ({k})"));
                }
            }
            let logits = |o: &hsparity::drafter::target::StepOut| o.logits.clone().unwrap();
            for (k, o) in outs.iter().enumerate().skip(1) {
                same_bits(
                    &logits(&whole[0]),
                    &logits(o),
                    &format!("{what}: logits ({k})"),
                );
            }
            // Settings a prefill leaves elsewhere, a token changed before
            // the point, too few tokens after it, another form, a capture
            // not kept, another target: not served, and refused.
            let fp8 = Faults {
                kv_fp8: !lane.faults.kv_fp8,
                ..lane.faults
            };
            let mut changed = split.tokens[i].clone();
            let swap = changed.iter().position(|&t| t != changed[5]).unwrap();
            changed[5] = changed[swap];
            let form = match lane.form {
                GdnForm::Chunked => GdnForm::Recurrent,
                GdnForm::Recurrent => GdnForm::Chunked,
            };
            let short = &split.tokens[i][..resume.at() + MIN_ROWS - 1];
            let other = [
                Forced {
                    faults: fp8,
                    ..forced
                },
                Forced {
                    prompt_len: len - 1,
                    ..forced
                },
                Forced {
                    tokens: &changed,
                    ..forced
                },
                Forced {
                    tokens: short,
                    ..forced
                },
                Forced { form, ..forced },
            ];
            let names = ["fp8", "prompt length", "a token", "too few", "form"];
            for (f, name) in other.iter().zip(names) {
                assert!(!resume.serves(&target, f, &all), "{what}: {name}");
                let refused = teacher_forced(
                    &target,
                    &[Forced {
                        resume: Some(resume),
                        ..*f
                    }],
                    &all,
                    false,
                );
                assert!(refused.is_err(), "{what}: {name} started at the point");
            }
            let f32_target = TargetModel {
                prec: match prec {
                    Precision::F32 => Precision::Bf16,
                    _ => Precision::F32,
                },
                ..target
            };
            assert!(
                !resume.serves(&f32_target, &forced, &all),
                "{what}: another dtype"
            );
            // The taps of a plain lane as `drafter`'s cross run takes them.
            if lane.faults.is_none() && lane.form == GdnForm::Chunked && lane.decode_shift == 0 {
                let toks = std::slice::from_ref(&split.tokens[i]);
                let taps = [1, n - 1];
                let point = [split.resumes[i].clone()];
                let at = |r: &[Option<std::sync::Arc<_>>]| {
                    features(&target, toks, &[len], &taps, (GdnForm::Chunked, 0), r).unwrap()
                };
                same_bits(&at(&[])[0], &at(&point)[0], &format!("{what}: features"));
            }
            let no_such = [Capture::Hidden(n + 1)];
            assert!(!resume.serves(&target, &forced, &no_such), "{what}");
        }
    }
}
