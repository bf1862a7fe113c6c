//! Resume points: a DFlash loop whose prefill is split at its prompt's last
//! Gated DeltaNet chunk boundary gives the loop's own bits, and a
//! teacher-forced sweep started there gives the bits of the sweep from
//! token 0 (`hsparity::drafter::target::Resume`), on the toy pair's Qwen3.5
//! target in bf16 and f32, over prompt lengths on both sides of the chunk
//! boundaries and past the attention's query blocks.

use candle_core::Tensor;
use hsparity::checkpoint::Checkpoint;
use hsparity::drafter::eval::EndRule;
use hsparity::drafter::faults::Faults;
use hsparity::drafter::generate::{dflash_loop_with, Generation, Lane};
use hsparity::drafter::target::{Capture, TargetModel, MIN_ROWS};
use hsparity::drafter::{teacher_forced, Forced};
use hsparity::loading::{self, LoadingPath};
use hsparity::models::dflash::Drafter;
use hsparity::models::{CacheCrop, GdnForm, TextModelSpec};
use hsparity::precision::Precision;
use std::path::Path;

const T: &str = "fixtures/toy-pair";

fn bits(t: &Tensor) -> Vec<u32> {
    let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

/// Asserts `a` and `b` hold the same bits, naming `what` and the first
/// difference.
fn same_bits(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes");
    let (x, y) = (bits(a), bits(b));
    let first = x.iter().zip(&y).position(|(p, q)| p != q);
    assert!(first.is_none(), "{what}: first difference at {first:?}");
}

/// The lanes of one prompt: plain, shifted positions, the crop that leaves
/// the recurrent state, fp8 keys and values, the recurrent form, and a
/// Gated DeltaNet reset (no resume point: its chunks start anew).
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
    ]
}

/// Prompts of `lens` tokens: the toy pair's held-out prompts one after
/// another, from a different one for each length.
fn prompts(lens: &[usize]) -> Vec<Vec<u32>> {
    let g: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{T}/golden/reference_generate_gdn_crop.json")).unwrap(),
    )
    .unwrap();
    let text: Vec<u32> = g["sets"]["held_out"]["per_prompt"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|q| q["input_ids"].as_array().unwrap().clone())
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    lens.iter()
        .enumerate()
        .map(|(k, &n)| text.iter().cycle().skip(k * 11).take(n).copied().collect())
        .collect()
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
            let point = len.saturating_sub(MIN_ROWS) / 64 * 64;
            let want = (point >= MIN_ROWS && lane.faults.gdn_reset_at.is_none()).then_some(point);
            let resume = split.resumes[i].as_ref();
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
            assert!(resume.serves(&forced, &all), "{what}");
            let from = Forced {
                resume: Some(resume),
                ..forced
            };
            let whole = teacher_forced(&target, &[forced], &all, true).unwrap();
            let part = teacher_forced(&target, &[from], &all, true).unwrap();
            for (c, (a, b)) in all
                .iter()
                .zip(whole[0].captures.iter().zip(&part[0].captures))
            {
                same_bits(a, b, &format!("{what}: {c:?}"));
            }
            let logits = |o: &hsparity::drafter::target::StepOut| o.logits.clone().unwrap();
            same_bits(
                &logits(&whole[0]),
                &logits(&part[0]),
                &format!("{what}: logits"),
            );
            // Settings a prefill leaves elsewhere, other tokens, a capture
            // not kept: not served.
            let fp8 = Faults {
                kv_fp8: !lane.faults.kv_fp8,
                ..lane.faults
            };
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
                    tokens: &split.tokens[(i + ls.len() - 6) % ls.len()],
                    ..forced
                },
            ];
            for f in &other {
                assert!(!resume.serves(f, &all), "{what}: {f:?}");
            }
            let no_such = [Capture::Hidden(n + 1)];
            assert!(!resume.serves(&forced, &no_such), "{what}");
        }
    }
}
