//! Incremental decoding (KV cache for full attention, conv + recurrent state
//! for Gated DeltaNet) equals one full forward, as transformers' own cached
//! decode does (qwen3_5 brief §4.9: prefill 90 + 10 steps vs full, 2.4e-5).

use hsparity::checkpoint::Checkpoint;
use hsparity::loading::{self, LoadingPath};
use hsparity::models::precision::Precision;
use hsparity::models::qwen3_5::{GdnForm, TextModel, TextModelSpec};
use hsparity::parity::Accumulator;

fn model() -> TextModel {
    let ckpt = Checkpoint::open("fixtures/tiny-qwen3_5").unwrap();
    let p = loading::resolve(&ckpt, LoadingPath::CausalLm).unwrap();
    let spec = TextModelSpec::new(&p.text_config).unwrap();
    TextModel::load(&spec, &p.view, Some(&p.view), Precision::F32).unwrap()
}

fn ids(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 384).collect()
}

#[test]
fn prefill_plus_single_steps_equals_full_forward() {
    let m = model();
    let ids = ids(100);
    let full = m.forward(&ids, None, GdnForm::Chunked, true).unwrap();
    let full_logits = full.logits.unwrap();
    let mut state = m.new_state();
    let pre = m
        .forward(&ids[..90], Some(&mut state), GdnForm::Chunked, false)
        .unwrap();
    let mut acc = Accumulator::default();
    acc.add(
        0,
        &pre.logits.unwrap(),
        &full_logits.narrow(0, 0, 90).unwrap(),
    )
    .unwrap();
    for t in 90..100 {
        let step = m
            .forward(&ids[t..t + 1], Some(&mut state), GdnForm::Chunked, false)
            .unwrap();
        acc.add(
            0,
            &step.logits.unwrap(),
            &full_logits.narrow(0, t, 1).unwrap(),
        )
        .unwrap();
    }
    let m = acc.finish();
    println!(
        "prefill 90 + 10 steps vs full: max_abs {:.3e}, cos_min {:.9}",
        m.max_abs, m.cos_min
    );
    assert!(
        m.cos_min >= 0.99999 && m.max_abs <= 1e-4 * m.max_ref_abs.max(1.0),
        "{m:?}"
    );
    assert_eq!(state.len, 100);
}

#[test]
fn chunked_prefill_with_a_state_continues_correctly() {
    // Two chunked prefills (64 + 36) with the carried state equal one of 100.
    let m = model();
    let ids = ids(100);
    let full = m
        .forward(&ids, None, GdnForm::Chunked, false)
        .unwrap()
        .logits
        .unwrap();
    let mut state = m.new_state();
    m.forward(&ids[..64], Some(&mut state), GdnForm::Chunked, false)
        .unwrap();
    let rest = m
        .forward(&ids[64..], Some(&mut state), GdnForm::Chunked, false)
        .unwrap()
        .logits
        .unwrap();
    let mut acc = Accumulator::default();
    acc.add(0, &rest, &full.narrow(0, 64, 36).unwrap()).unwrap();
    let r = acc.finish();
    assert!(r.cos_min >= 0.99999, "{r:?}");
}

#[test]
fn greedy_generation_is_the_argmax_of_full_forwards() {
    let m = model();
    let prompt = ids(20);
    let gen = m.greedy(&prompt, 12, GdnForm::Chunked).unwrap();
    assert_eq!(gen.len(), 12);
    // Re-derive each token with a full forward over prompt + tokens so far.
    let mut seq = prompt.clone();
    for &tok in &gen {
        let l = m
            .forward(&seq, None, GdnForm::Chunked, false)
            .unwrap()
            .logits
            .unwrap();
        let last = l.get(seq.len() - 1).unwrap();
        let want = last.argmax(0).unwrap().to_scalar::<u32>().unwrap();
        assert_eq!(tok, want);
        seq.push(tok);
    }
}
