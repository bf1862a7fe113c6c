//! The DDTree tree and the τ summaries.

use super::*;
use candle_core::Device;

#[test]
fn tree_is_best_first_and_respects_budget() {
    // Depth 1: token 2 (p .6), token 1 (.3); depth 2: token 0 (.9).
    let l = |p: &[f32]| p.iter().map(|x| x.ln()).collect::<Vec<f32>>();
    let rows = [l(&[0.1, 0.3, 0.6]), l(&[0.9, 0.05, 0.05])];
    let flat: Vec<f32> = rows.concat();
    let t = Tensor::from_vec(flat, (2, 3), &Device::Cpu).unwrap();
    let tree = build_tree(&t, 3).unwrap();
    assert_eq!(tree.len(), 4); // root + 3
                               // Order: 2 (.6), then 2→0 (.54), then 1 (.3).
    assert_eq!(tree[0][&2], 1);
    assert_eq!(tree[1][&0], 2);
    assert_eq!(tree[0][&1], 3);
    // Budget 1 = the top-1 chain's first node.
    assert_eq!(build_tree(&t, 1).unwrap().len(), 2);
}

#[test]
fn summary_matches_hand_computation() {
    let p = vec![PromptTau::new(vec![1, 3]), PromptTau::new(vec![4])];
    let s = summarize(&p, 4);
    assert!((s.tau_macro - 3.0).abs() < 1e-12); // (2 + 4) / 2
    assert!((s.tau_pooled - 8.0 / 3.0).abs() < 1e-12);
    assert_eq!(s.histogram.len(), 5);
    assert!((s.histogram[3] - 1.0 / 3.0).abs() < 1e-12);
    // slot 1 accepted when length > 1: 2 of 3 rounds.
    assert!((s.per_position_acceptance[0] - 2.0 / 3.0).abs() < 1e-12);
    assert!((s.per_position_acceptance[2] - 1.0 / 3.0).abs() < 1e-12);
}

#[test]
fn tree_takes_the_top_tokens_by_logprob_then_lowest_id() {
    // One depth, 1000 tokens on 5 logit levels: many ties at the top.
    let v: Vec<f32> = (0..1000u32).map(|i| ((i * 7919) % 5) as f32).collect();
    let t = Tensor::from_vec(v.clone(), (1, 1000), &Device::Cpu).unwrap();
    for budget in [1, 7, 200, 999, 1000, 1500] {
        let tree = build_tree(&t, budget).unwrap();
        let mut want: Vec<u32> = (0..1000).collect();
        want.sort_by(|&a, &b| v[b as usize].total_cmp(&v[a as usize]).then(a.cmp(&b)));
        want.truncate(budget.min(1000));
        // Node i + 1 is the i-th best token (one depth: best-first is that order).
        let mut got: Vec<(usize, u32)> = tree[0].iter().map(|(&tok, &i)| (i, tok)).collect();
        got.sort();
        let got: Vec<u32> = got.into_iter().map(|(_, tok)| tok).collect();
        assert_eq!(got, want, "budget {budget}");
    }
}
