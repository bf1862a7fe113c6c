//! The layer-major target engine of the drafter evaluation
//! (`hsparity::drafter::target`): a sweep equals the resident model's
//! forward bitwise; a tentative block cropped to its first n tokens leaves
//! the state a direct feed of those n tokens leaves (KV cache truncated,
//! Gated DeltaNet state advanced by exactly n tokens); weights held resident
//! in their stored dtype give the same results as the mapped checkpoint.

use crate::common;

use candle_core::Tensor;
use common::{assert_close, F32_MODEL};
use hsparity::checkpoint::Checkpoint;
use hsparity::drafter::target::{Capture, Sequence, Step, TargetModel};
use hsparity::loading::resident::Resident;
use hsparity::loading::{self, LoadingPath, ResolvedPath};
use hsparity::models::{GdnForm, TextModel, TextModelSpec};

fn path(ckpt: &str) -> (ResolvedPath, TextModelSpec) {
    let c = Checkpoint::open(ckpt).unwrap();
    let p = loading::resolve(&c, LoadingPath::CausalLm).unwrap();
    let spec = TextModelSpec::new(&p.text_config).unwrap();
    (p, spec)
}

fn ids(n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % vocab).collect()
}

fn bitwise(what: &str, a: &Tensor, b: &Tensor) {
    let (x, y) = (
        a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    );
    assert_eq!(x.len(), y.len(), "{what}: sizes");
    assert!(
        x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
        "{what}: not bitwise equal"
    );
}

/// Every hidden state and the logits of a sweep equal `TextModel::forward`'s,
/// bit for bit, on the hybrid (f32) and the bf16 toy target.
#[test]
fn a_sweep_is_the_resident_forward() {
    for ckpt in ["fixtures/tiny-qwen3_5", "fixtures/toy-pair/target"] {
        let (p, spec) = path(ckpt);
        let prec = p.dtype;
        let toks = ids(70, spec_vocab(&p));
        let m = TextModel::load(&spec, &p.view, Some(&p.view), prec).unwrap();
        let full = m.forward(&toks, None, GdnForm::Chunked, true).unwrap();
        let t = TargetModel {
            spec: &spec,
            weights: &p.view,
            head: &p.view,
            prec,
        };
        let n = spec.num_layers();
        let caps: Vec<Capture> = (0..=n).map(Capture::Hidden).collect();
        let mut seq = Sequence::new(&spec, toks.len(), GdnForm::Chunked, 0);
        let out = t
            .sweep(
                &mut [Step {
                    seq: &mut seq,
                    ids: &toks,
                    tentative: false,
                    logits: 0..toks.len(),
                }],
                &caps,
            )
            .unwrap();
        let hs = full.hidden_states.unwrap();
        for (i, (a, b)) in out[0].captures.iter().zip(&hs).enumerate() {
            bitwise(&format!("{ckpt} hidden_states[{i}]"), a, b);
        }
        bitwise(
            &format!("{ckpt} logits"),
            out[0].logits.as_ref().unwrap(),
            &full.logits.unwrap(),
        );
        // Resident (stored dtype) weights: the same bits.
        let r = Resident::load(&p.view, p.view.names()).unwrap();
        let tr = TargetModel {
            weights: &r,
            head: &r,
            ..t
        };
        let mut seq = Sequence::new(&spec, toks.len(), GdnForm::Chunked, 0);
        let out_r = tr
            .sweep(
                &mut [Step {
                    seq: &mut seq,
                    ids: &toks,
                    tentative: false,
                    logits: 0..toks.len(),
                }],
                &caps,
            )
            .unwrap();
        for (a, b) in out_r[0].captures.iter().zip(&out[0].captures) {
            bitwise(&format!("{ckpt} resident"), a, b);
        }
    }
}

fn spec_vocab(p: &ResolvedPath) -> u32 {
    p.text_config.vocab_size as u32
}

/// A tentative block of 8 kept to its first 3 tokens, then 5 more tokens:
/// the same logits as feeding the 3 kept tokens directly, then the 5.
#[test]
fn a_cropped_block_leaves_the_state_of_the_kept_tokens() {
    let (p, spec) = path("fixtures/tiny-qwen3_5");
    let t = TargetModel {
        spec: &spec,
        weights: &p.view,
        head: &p.view,
        prec: p.dtype,
    };
    let toks = ids(40, spec_vocab(&p));
    let (pre, block, kept, after) = (&toks[..20], &toks[20..28], 3, &toks[28..33]);
    let run = |steps: &[(&[u32], bool, Option<usize>)]| -> Tensor {
        let mut seq = Sequence::new(&spec, 20, GdnForm::Chunked, 0);
        let mut last = None;
        let want: usize = steps.iter().map(|(ids, _, c)| c.unwrap_or(ids.len())).sum();
        for (ids, tentative, commit) in steps {
            let out = t
                .sweep(
                    &mut [Step {
                        seq: &mut seq,
                        ids,
                        tentative: *tentative,
                        logits: 0..ids.len(),
                    }],
                    &[],
                )
                .unwrap();
            if let Some(n) = commit {
                seq.commit(*n).unwrap();
            }
            last = out.into_iter().next().unwrap().logits;
        }
        assert_eq!(seq.len(), want);
        last.unwrap()
    };
    let cropped = run(&[
        (pre, false, None),
        (block, true, Some(kept)),
        (after, false, None),
    ]);
    let direct = run(&[
        (pre, false, None),
        (&block[..kept], false, None),
        (after, false, None),
    ]);
    // The crop advances the Gated DeltaNet state token by token (recurrent
    // form) where the direct feed used the chunked form: round-off only.
    assert_close("cropped vs direct", &cropped, &direct, &F32_MODEL);
    // Keeping the whole block is exactly the block's own state.
    let whole = run(&[
        (pre, false, None),
        (block, true, Some(8)),
        (after, false, None),
    ]);
    let fed = run(&[
        (pre, false, None),
        (block, false, None),
        (after, false, None),
    ]);
    bitwise("whole block kept", &whole, &fed);
}

/// A MISSING, randomly initialised lm_head (fixtures/divergence/tied-top-level
/// on causal-lm) read in vocabulary chunks and as gathered rows gives the
/// values of the whole tensor rounded to the compute dtype, in every dtype
/// (the view generates it once per dtype and serves chunks from that copy).
#[test]
fn chunks_of_a_missing_tensor_are_the_whole_tensors_rows() {
    use hsparity::loading::{LoadingPath, WeightSource};
    use hsparity::precision::Precision;
    let c = Checkpoint::open("fixtures/divergence/tied-top-level").unwrap();
    let p = loading::resolve(&c, LoadingPath::CausalLm)
        .unwrap()
        .seeded(7, &candle_core::Device::Cpu);
    assert!(matches!(
        p.view.origin("lm_head.weight"),
        Some(hsparity::loading::view::WeightOrigin::Missing { .. })
    ));
    let whole = p.view.tensor("lm_head.weight").unwrap();
    let v = whole.dim(0).unwrap();
    for prec in Precision::ALL {
        let want = prec.round(&whole).unwrap();
        let (a, n) = (v / 3, v / 4);
        let chunk = p.view.row_range("lm_head.weight", a, n, prec).unwrap();
        bitwise(
            &format!("{prec} chunk"),
            &chunk,
            &want.narrow(0, a, n).unwrap(),
        );
        let rows = p.view.rows("lm_head.weight", &[5, 0, 5], prec).unwrap();
        let idx = Tensor::new(&[5u32, 0, 5], &candle_core::Device::Cpu).unwrap();
        bitwise(
            &format!("{prec} rows"),
            &rows,
            &want.index_select(&idx, 0).unwrap(),
        );
    }
}
