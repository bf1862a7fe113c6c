//! Every build of the head loops gives the portable build's bits: the same
//! operations on wider lanes, no contraction into fused multiply-adds.

use rand::{Rng, SeedableRng};

use super::*;

/// Random heads of `t` tokens: q, k, v in ±1, log decays in (−2, 0),
/// write strengths in (0, 1), and a random starting state.
fn inputs(t: usize, dk: usize, dv: usize, seed: u64) -> (Head, Vec<f32>) {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v =
        |n: usize, lo: f32, hi: f32| (0..n).map(|_| r.gen_range(lo..hi)).collect::<Vec<f32>>();
    let mut q = v(t * dk, -1.0, 1.0);
    let mut k = v(t * dk, -1.0, 1.0);
    for i in 0..t {
        l2norm(&mut q[i * dk..(i + 1) * dk]);
        l2norm(&mut k[i * dk..(i + 1) * dk]);
    }
    let head = (q, k, v(t * dv, -1.0, 1.0), v(t, -2.0, 0.0), v(t, 0.0, 1.0));
    let state = v(dk * dv, -0.5, 0.5);
    (head, state)
}

/// Runs `k`'s builds this CPU has on the same head and state.
fn builds_agree(k: Builds, name: &str) {
    // A partial chunk, exactly one chunk, several chunks and a partial;
    // widths that fill AVX-512 lanes and widths that leave a remainder.
    for (t, dk, dv) in [(5, 16, 16), (64, 32, 48), (150, 64, 128), (70, 24, 40)] {
        let (h, s0) = inputs(t, dk, dv, (t * dk + dv) as u64);
        let (mut s, mut s2, mut s5) = (s0.clone(), s0.clone(), s0.clone());
        let want = (k.portable)(&h, &mut s, (t, dk, dv));
        let caps = crate::kernels::capabilities();
        let required = std::env::var("HSPARITY_REQUIRE_KERNELS").unwrap_or_default();
        for (has, kernel) in [
            (caps.avx2, "delta-rule-avx2"),
            (caps.avx512f, "delta-rule-avx512"),
        ] {
            assert!(
                has || !required.split(',').any(|r| r.trim() == kernel),
                "HSPARITY_REQUIRE_KERNELS names {kernel}, which this CPU cannot run"
            );
        }
        if caps.avx2 {
            // SAFETY: the CPU has AVX2.
            let got = unsafe { (k.avx2)(&h, &mut s2, (t, dk, dv)) };
            assert!(
                bits(&got) == bits(&want) && bits(&s2) == bits(&s),
                "{name} avx2 t={t} dk={dk} dv={dv}"
            );
        }
        if caps.avx512f {
            // SAFETY: the CPU has AVX-512F.
            let got = unsafe { (k.avx512)(&h, &mut s5, (t, dk, dv)) };
            assert!(
                bits(&got) == bits(&want) && bits(&s5) == bits(&s),
                "{name} avx512 t={t} dk={dk} dv={dv}"
            );
        }
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn chunked_builds_are_bitwise_the_portable_one() {
    builds_agree(CHUNKED, "chunked");
}

#[test]
fn recurrent_builds_are_bitwise_the_portable_one() {
    builds_agree(RECURRENT, "recurrent");
}
