//! The router agreement of `compare` on MoE pairs: counted per layer from
//! the routings the capture reports, and rendered (table column, the cause
//! sentence) — here with synthetic routings, since transformers' paths route
//! identically on every bundled fixture (`fixtures/moe/*/golden/load_report.json`,
//! `golden_router_choices_f32_vs_bf16`, and `tests/moe_golden.rs`).

use hsparity::capture::{HiddenKind, Observer};
use hsparity::checkpoint::config::LayerType;
use hsparity::models::moe::Routing;
use hsparity::parity::{PairObserver, RouterAgreement};
use hsparity::precision::Precision;
use hsparity::report::compare::{router_cause, router_summary};

fn routing(indices: &[u32]) -> Routing {
    Routing {
        top_k: 2,
        indices: indices.to_vec(),
        weights: vec![0.5; indices.len()],
    }
}

#[test]
fn agreement_counts_slots_tokens_and_local_flips() {
    let a = [routing(&[1, 2, 3, 4]), routing(&[5, 6])];
    let b = [routing(&[2, 1, 3, 7]), routing(&[5, 6])];
    let r = RouterAgreement::of(&a, &b, Some(&a)).unwrap();
    assert_eq!(
        r,
        RouterAgreement {
            slots: 6,
            slots_differing: 3,
            tokens_with_other_experts: 1,
            local_slots_differing: Some(0),
            noise_slots_differing: None,
            within_noise_floor: None,
        }
    );
    assert_eq!(r.cell(), "3/6");
    let l = RouterAgreement::of(&a, &b, Some(&b)).unwrap();
    assert_eq!(l.cell(), "3/6 (local 3)");
    assert!(RouterAgreement::of(&a, &[routing(&[1, 2])], None).is_err());
}

#[test]
fn pair_rows_carry_the_router_and_the_first_flip_is_named() {
    let names = [
        ("causal-lm".to_string(), Precision::Bf16),
        ("vlm".to_string(), Precision::F16),
    ];
    let mut obs = PairObserver::new(&names);
    let t = candle_core::Tensor::ones((2, 4), candle_core::DType::F32, &candle_core::Device::Cpu)
        .unwrap();
    let states = vec![vec![t.clone()], vec![t.clone()]];
    obs.hidden_states(0, HiddenKind::Embedding, &states, &[None, None])
        .unwrap();
    for l in 0..2 {
        let kind = HiddenKind::Layer(LayerType::LinearAttention);
        obs.hidden_states(l + 1, kind, &states, &[None, Some(vec![t.clone()])])
            .unwrap();
        let a = vec![routing(&[1, 2, 3, 4])];
        let b = vec![if l == 0 {
            a[0].clone()
        } else {
            routing(&[1, 2, 4, 3])
        }];
        obs.routing(l, &[a.clone(), b], &[None, Some(a)]).unwrap();
    }
    let pair = &obs.pairs[0];
    assert!(pair.hidden_states[0].router.is_none());
    assert_eq!(pair.hidden_states[1].router.unwrap().slots_differing, 0);
    assert_eq!(pair.hidden_states[2].router.unwrap().slots_differing, 2);
    let cause = router_cause(pair).unwrap();
    assert!(
        cause.starts_with(
            "router: vlm routes differently from causal-lm in 2 of 8 token×slot choices over 2 MoE layers \
             (0 tokens with another expert set), first at layer 1 (hs 2)"
        ),
        "{cause}"
    );
    assert!(
        cause.contains(
            "at layer 1, fed causal-lm's input, vlm's router agrees: its flips are inherited"
        ),
        "{cause}"
    );
    // No floor: the summary is the cause alone.
    assert_eq!(router_summary(pair), [cause]);
}
