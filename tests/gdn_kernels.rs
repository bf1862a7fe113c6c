//! The delta-rule kernels against transformers' own
//! `torch_chunk_gated_delta_rule` / `torch_recurrent_gated_delta_rule`
//! (fixtures/tiny-qwen3_5/golden/gdn_kernels.safetensors, written by
//! tools/make_fixtures.py with transformers 5.23.0).

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use hsparity::models::qwen3_5::gated_delta_net::{chunked, recurrent, DeltaRuleInputs};

fn golden() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(
        "fixtures/tiny-qwen3_5/golden/gdn_kernels.safetensors",
        &Device::Cpu,
    )
    .expect("golden kernels")
}

fn v(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Builds kernel inputs with GVA applied (value head h reads key head h / (nv/nk)).
fn inputs(g: &HashMap<String, Tensor>) -> DeltaRuleInputs {
    let (_, t, nk, dk) = g["q"].dims4().unwrap();
    let (_, _, nv, dv) = g["v"].dims4().unwrap();
    let (q, k) = (v(&g["q"]), v(&g["k"]));
    let rep = nv / nk;
    let mut qe = Vec::new();
    let mut ke = Vec::new();
    for i in 0..t {
        for h in 0..nv {
            let off = (i * nk + h / rep) * dk;
            qe.extend_from_slice(&q[off..off + dk]);
            ke.extend_from_slice(&k[off..off + dk]);
        }
    }
    DeltaRuleInputs {
        t,
        heads: nv,
        dk,
        dv,
        q: qe,
        k: ke,
        v: v(&g["v"]),
        g: v(&g["g"]),
        beta: v(&g["beta"]),
    }
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn scale(a: &[f32]) -> f32 {
    a.iter().map(|x| x.abs()).fold(0.0, f32::max).max(1.0)
}

#[test]
fn chunked_and_recurrent_match_transformers_kernels() {
    let g = golden();
    let inp = inputs(&g);
    let n_state = inp.heads * inp.dk * inp.dv;
    for (init, prefix) in [(false, ""), (true, "_init")] {
        let start = if init {
            v(&g["initial_state"])
        } else {
            vec![0.0; n_state]
        };
        for (name, f) in [
            (
                "chunk",
                chunked as fn(&DeltaRuleInputs, &mut [f32]) -> Vec<f32>,
            ),
            ("recurrent", recurrent),
        ] {
            let mut state = start.clone();
            let out = f(&inp, &mut state);
            let want_out = v(&g[&format!("{name}{prefix}.out")]);
            let want_state = v(&g[&format!("{name}{prefix}.final_state")]);
            let (d_out, d_state) = (max_abs(&out, &want_out), max_abs(&state, &want_state));
            println!("{name}{prefix}: out max|Δ| {d_out:.3e}, state max|Δ| {d_state:.3e}");
            // f32 round-off: transformers itself sees 1e-7..4e-7 between its two forms.
            assert!(
                d_out <= 1e-5 * scale(&want_out),
                "{name}{prefix} out differs by {d_out}"
            );
            assert!(
                d_state <= 1e-5 * scale(&want_state),
                "{name}{prefix} state differs by {d_state}"
            );
        }
    }
}

#[test]
fn golden_tells_a_chunk_kernel_that_drops_the_state() {
    // Sanity: the golden distinguishes a kernel that forgets to carry the state.
    let g = golden();
    let good = v(&g["chunk.out"]);
    let broken = v(&g["chunk.out_no_carry"]);
    assert!(max_abs(&good, &broken) > 1e-2);
}

#[test]
fn chunked_and_recurrent_agree_with_each_other() {
    let g = golden();
    let inp = inputs(&g);
    let n_state = inp.heads * inp.dk * inp.dv;
    let (mut s1, mut s2) = (vec![0.0; n_state], vec![0.0; n_state]);
    let a = chunked(&inp, &mut s1);
    let b = recurrent(&inp, &mut s2);
    let d = max_abs(&a, &b);
    println!("chunked vs recurrent (hsparity): max|Δ| {d:.3e}");
    assert!(d <= 1e-3 * scale(&b));
}

/// Exact multiples of the chunk size (64, 128) and a single token: the chunked
/// form must agree with the recurrent one there too (no golden prompt is an
/// exact multiple; the fixture's long prompt has 103 tokens).
#[test]
fn chunked_equals_recurrent_at_chunk_boundaries() {
    for t in [1usize, 63, 64, 65, 128] {
        let (heads, dk, dv) = (3, 8, 4);
        let mut x: u64 = 0x9e3779b97f4a7c15 ^ t as u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
        };
        let mut gen = |n: usize| (0..n).map(|_| rnd()).collect::<Vec<f32>>();
        let inp = DeltaRuleInputs {
            t,
            heads,
            dk,
            dv,
            q: gen(t * heads * dk),
            k: gen(t * heads * dk),
            v: gen(t * heads * dv),
            g: gen(t * heads)
                .iter()
                .map(|u| -0.05 - 0.1 * u.abs())
                .collect(),
            beta: gen(t * heads).iter().map(|u| 0.5 + 0.4 * u).collect(),
        };
        let (mut s1, mut s2) = (vec![0.0; heads * dk * dv], vec![0.0; heads * dk * dv]);
        let a = chunked(&inp, &mut s1);
        let b = recurrent(&inp, &mut s2);
        assert!(
            max_abs(&a, &b) <= 1e-5 * scale(&b),
            "T={t}: out {}",
            max_abs(&a, &b)
        );
        assert!(
            max_abs(&s1, &s2) <= 1e-5 * scale(&s2),
            "T={t}: state {}",
            max_abs(&s1, &s2)
        );
    }
}
