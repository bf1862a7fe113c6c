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
    // Rows of 128 and 200 lanes: whole register blocks, and blocks with a tail.
    for (t, dk, dv) in [
        (5, 16, 16),
        (64, 32, 48),
        (150, 64, 128),
        (70, 24, 40),
        (131, 128, 200),
    ] {
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

/// `y[r] += Σ_t c[r·k + t] · src[t]`, one element and one term at a time.
fn dense_reference(y: &mut [f32], w: usize, c: &[f32], k: usize, src: &[f32]) {
    for (r, yr) in y.chunks_exact_mut(w).enumerate() {
        for (x, v) in yr.iter_mut().enumerate() {
            for t in 0..k {
                *v += c[r * k + t] * src[t * w + x];
            }
        }
    }
}

#[test]
fn row_builds_are_bitwise_one_term_at_a_time() {
    let mut r = rand::rngs::StdRng::seed_from_u64(11);
    let mut vals = |n: usize| {
        (0..n)
            .map(|_| r.gen_range(-1.0f32..1.0))
            .collect::<Vec<_>>()
    };
    let caps = crate::kernels::capabilities();
    for (rows, w, k) in [
        (1, 16, 3),
        (4, 64, 64),
        (7, 128, 128),
        (9, 200, 37),
        (64, 40, 5),
    ] {
        let (y0, c, src) = (vals(rows * w), vals(rows * k), vals(k * w));
        let mut want = y0.clone();
        dense_reference(&mut want, w, &c, k, &src);
        let mut got = y0.clone();
        // SAFETY: `Lanes` is plain Rust.
        unsafe { rows::Lanes::dense_rows(&mut got, w, &c, k, &src) };
        assert_eq!(bits(&got), bits(&want), "lanes rows={rows} w={w} k={k}");
        if caps.avx512f {
            let mut got = y0.clone();
            // SAFETY: the CPU has AVX-512F.
            unsafe { rows::Zmm::dense_rows(&mut got, w, &c, k, &src) };
            assert_eq!(bits(&got), bits(&want), "zmm rows={rows} w={w} k={k}");
        }
    }
    let ks = rows::KEY_STRIDE;
    for (rows, n, dk) in [
        (1, 1, 8),
        (5, 5, 16),
        (22, 22, 128),
        (64, 64, 128),
        (64, 37, 24),
    ] {
        let (xs, kt) = (vals(rows * dk), vals(dk * ks));
        let dot =
            |i: usize, j: usize| -> f32 { (0..dk).map(|a| xs[i * dk + a] * kt[a * ks + j]).sum() };
        let mut builds: Vec<(&str, Vec<f32>)> = Vec::new();
        let mut d = vec![f32::NAN; rows * ks];
        // SAFETY: `Lanes` is plain Rust.
        unsafe { rows::Lanes::dots_lower(&mut d, &xs, dk, &kt, n) };
        builds.push(("lanes", d));
        if caps.avx512f {
            let mut d = vec![f32::NAN; rows * ks];
            // SAFETY: the CPU has AVX-512F.
            unsafe { rows::Zmm::dots_lower(&mut d, &xs, dk, &kt, n) };
            builds.push(("zmm", d));
        }
        for (name, d) in builds {
            for i in 0..rows {
                for j in 0..=i.min(n - 1) {
                    let (got, want) = (d[i * ks + j], dot(i, j));
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{name} dots n={n} i={i} j={j}"
                    );
                }
            }
        }
    }
}
