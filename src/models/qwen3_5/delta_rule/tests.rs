//! Every build of the head loops gives the portable build's bits: each
//! element's operations in the same order, no contraction into fused
//! multiply-adds; and both row builds give one term at a time's bits.

use rand::{Rng, SeedableRng};

use super::*;

/// Random heads of `t` tokens: q, k, v in ±1, log decays in (`g_min`, 0),
/// write strengths in (0, 1), and a random starting state.
fn inputs(t: usize, dk: usize, dv: usize, seed: u64, g_min: f32) -> (Head, Vec<f32>) {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v =
        |n: usize, lo: f32, hi: f32| (0..n).map(|_| r.gen_range(lo..hi)).collect::<Vec<f32>>();
    let mut q = v(t * dk, -1.0, 1.0);
    let mut k = v(t * dk, -1.0, 1.0);
    for i in 0..t {
        l2norm(&mut q[i * dk..(i + 1) * dk]);
        l2norm(&mut k[i * dk..(i + 1) * dk]);
    }
    let head = (q, k, v(t * dv, -1.0, 1.0), v(t, g_min, 0.0), v(t, 0.0, 1.0));
    let state = v(dk * dv, -0.5, 0.5);
    (head, state)
}

/// Runs `k`'s builds this CPU has on the same head and state, with log
/// decays in (`g_min`, 0).
fn builds_agree(k: Builds, name: &str, g_min: f32) {
    let caps = crate::kernels::capabilities();
    let (avx2, avx512) = (
        runs("delta-rule-avx2", caps.avx2),
        runs("delta-rule-avx512", caps.avx512f),
    );
    // A partial chunk, exactly one chunk, several chunks and a partial;
    // widths that fill AVX-512 lanes and widths that leave a remainder.
    // Rows of 128 and 200 lanes: whole register blocks, and blocks with a tail.
    for (t, dk, dv) in [
        (5, 16, 16),
        (64, 32, 48),
        (150, 64, 128),
        (70, 24, 40),
        (131, 128, 200),
        // A last chunk of 50 rows: past 32 keys, and not a multiple of four.
        (114, 32, 64),
    ] {
        let (h, s0) = inputs(t, dk, dv, (t * dk + dv) as u64, g_min);
        let (mut s, mut s2, mut s5) = (s0.clone(), s0.clone(), s0.clone());
        let want = (k.portable)(&h, &mut s, (t, dk, dv));
        if avx2 {
            // SAFETY: the CPU has AVX2.
            let got = unsafe { (k.avx2)(&h, &mut s2, (t, dk, dv)) };
            assert!(
                bits(&got) == bits(&want) && bits(&s2) == bits(&s),
                "{name} avx2 t={t} dk={dk} dv={dv} g_min={g_min}"
            );
        }
        if avx512 {
            // SAFETY: the CPU has AVX-512F.
            let got = unsafe { (k.avx512)(&h, &mut s5, (t, dk, dv)) };
            assert!(
                bits(&got) == bits(&want) && bits(&s5) == bits(&s),
                "{name} avx512 t={t} dk={dk} dv={dv} g_min={g_min}"
            );
        }
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn chunked_builds_are_bitwise_the_portable_one() {
    builds_agree(CHUNKED, "chunked", -2.0);
}

/// Decays as fast as the mid checkpoints' (transformers' init draws `A` in
/// (0, 16)): within a chunk `e^{γ}` crosses the subnormal range, so the
/// AVX-512F build computes many of its dense terms in f64.
#[test]
fn chunked_builds_agree_where_decays_reach_subnormals() {
    builds_agree(CHUNKED, "chunked", -12.0);
}

#[test]
fn recurrent_builds_are_bitwise_the_portable_one() {
    builds_agree(RECURRENT, "recurrent", -2.0);
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

/// Values of magnitudes 2^e, e in `lo..hi`, random signs, and one in eight
/// an exact ±0.
fn wide(n: usize, r: &mut rand::rngs::StdRng, (lo, hi): (i32, i32)) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let sign = if r.gen_bool(0.5) { -1.0f32 } else { 1.0 };
            if r.gen_ratio(1, 8) {
                return sign * 0.0;
            }
            let m: f32 = r.gen_range(1.0..2.0);
            // In f64: `2f32.powi(e)` is 0 below e = −127 (it divides by 2^−e).
            (f64::from(sign * m) * 2f64.powi(r.gen_range(lo..hi))) as f32
        })
        .collect()
}

/// Dense updates whose products and sums land in the subnormal range (and
/// at ±0) give one term at a time's bits in both row builds: the terms
/// `Zmm` computes in f64 round as f32 arithmetic does.
#[test]
fn dense_rows_are_bitwise_through_subnormals() {
    let mut r = rand::rngs::StdRng::seed_from_u64(29);
    let avx512 = runs("delta-rule-avx512", crate::kernels::capabilities().avx512f);
    let (mut subnormal_results, mut results) = (0, 0);
    for (rows, w, k) in [(4, 64, 64), (7, 128, 128), (9, 200, 37), (1, 16, 3)] {
        for _ in 0..20 {
            // Subnormal and tiny starting values; products from 2⁻¹⁷⁰ (zero)
            // through the subnormal range to 2⁻¹¹⁸.
            let y0 = wide(rows * w, &mut r, (-149, -124));
            let (c, src) = (
                wide(rows * k, &mut r, (-90, -60)),
                wide(k * w, &mut r, (-80, -58)),
            );
            let want = dense_builds_agree(&y0, (w, &c, k, &src), avx512);
            subnormal_results += want.iter().filter(|x| x.is_subnormal()).count();
            results += want.len();
        }
    }
    // The inputs reach what the test is about.
    assert!(
        subnormal_results * 8 > results,
        "{subnormal_results} of {results} results subnormal"
    );
}

/// `y0` after the dense update `(w, c, k, src)` one term at a time, which
/// `Lanes` (and `Zmm`, with `avx512`) must give bit for bit.
fn dense_builds_agree(
    y0: &[f32],
    (w, c, k, src): (usize, &[f32], usize, &[f32]),
    avx512: bool,
) -> Vec<f32> {
    let rows = y0.len() / w;
    let mut want = y0.to_vec();
    dense_reference(&mut want, w, c, k, src);
    let mut got = y0.to_vec();
    // SAFETY: `Lanes` is plain Rust.
    unsafe { rows::Lanes::dense_rows(&mut got, w, c, k, src) };
    assert_eq!(bits(&got), bits(&want), "lanes rows={rows} w={w} k={k}");
    if avx512 {
        let mut got = y0.to_vec();
        // SAFETY: the CPU has AVX-512F.
        unsafe { zmm_dense(&mut got, w, c, k, src) };
        assert_eq!(bits(&got), bits(&want), "zmm rows={rows} w={w} k={k}");
    }
    want
}

/// Whether this CPU runs `kernel` (`has`): a kernel that
/// `HSPARITY_REQUIRE_KERNELS` names must run, and one skipped says so.
fn runs(kernel: &str, has: bool) -> bool {
    let required = std::env::var("HSPARITY_REQUIRE_KERNELS").unwrap_or_default();
    assert!(
        has || !required.split(',').any(|r| r.trim() == kernel),
        "HSPARITY_REQUIRE_KERNELS names {kernel}, which this CPU cannot run"
    );
    if !has {
        eprintln!("SKIPPED {kernel}: this CPU lacks its instructions");
    }
    has
}

/// [`rows::Zmm::dense_rows`] compiled as the AVX-512F head build inlines it.
///
/// # Safety
/// AVX-512F.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f"))]
unsafe fn zmm_dense(y: &mut [f32], w: usize, c: &[f32], k: usize, src: &[f32]) {
    // SAFETY: AVX-512F (this function's contract).
    unsafe { rows::Zmm::dense_rows(y, w, c, k, src) }
}

/// [`rows::Zmm::dots_lower`] compiled as the AVX-512F head build inlines it.
///
/// # Safety
/// AVX-512F.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f"))]
unsafe fn zmm_dots(dots: &mut [f32], xs: &[f32], dk: usize, kt: &[f32], n: usize) {
    // SAFETY: AVX-512F (this function's contract).
    unsafe { rows::Zmm::dots_lower(dots, xs, dk, kt, n) }
}

#[test]
fn row_builds_are_bitwise_one_term_at_a_time() {
    let mut r = rand::rngs::StdRng::seed_from_u64(11);
    let mut vals = |n: usize| {
        (0..n)
            .map(|_| r.gen_range(-1.0f32..1.0))
            .collect::<Vec<_>>()
    };
    let avx512 = runs("delta-rule-avx512", crate::kernels::capabilities().avx512f);
    for (rows, w, k) in [
        (1, 16, 3),
        (4, 64, 0),
        (4, 64, 64),
        (7, 128, 128),
        (9, 200, 37),
        (64, 40, 5),
    ] {
        let (y0, c, src) = (vals(rows * w), vals(rows * k), vals(k * w));
        dense_builds_agree(&y0, (w, &c, k, &src), avx512);
    }
    let ks = rows::KEY_STRIDE;
    // Row counts that are and are not multiples of four, up to 64 keys.
    for (rows, n, dk) in [
        (1, 1, 8),
        (5, 5, 16),
        (22, 22, 128),
        (50, 50, 16),
        (64, 17, 8),
        (64, 64, 128),
        (64, 37, 24),
    ] {
        let (mut xs, mut kt) = (vals(rows * dk), vals(dk * ks));
        // A zero row against non-positive keys: every product is −0.0, so a
        // dot starting from −0.0 stays −0.0 and one starting from +0.0 does not.
        xs[..dk].iter_mut().for_each(|v| *v = 0.0);
        kt.iter_mut().step_by(ks).for_each(|v| *v = -v.abs());
        let dot =
            |i: usize, j: usize| -> f32 { (0..dk).map(|a| xs[i * dk + a] * kt[a * ks + j]).sum() };
        let mut builds: Vec<(&str, Vec<f32>)> = Vec::new();
        let mut d = vec![f32::NAN; rows * ks];
        // SAFETY: `Lanes` is plain Rust.
        unsafe { rows::Lanes::dots_lower(&mut d, &xs, dk, &kt, n) };
        builds.push(("lanes", d));
        if avx512 {
            let mut d = vec![f32::NAN; rows * ks];
            // SAFETY: the CPU has AVX-512F.
            unsafe { zmm_dots(&mut d, &xs, dk, &kt, n) };
            builds.push(("zmm", d));
        }
        assert_eq!(dot(0, 0).to_bits(), (-0.0f32).to_bits(), "the −0.0 case");
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

/// Row updates, scalings and products whose operands are subnormal (the
/// coefficients, the rows, or both), zero or large give plain f32
/// arithmetic's bits in both row builds: the terms `Zmm` takes through f64 to
/// spare the assists round as the f32 operations do.
#[test]
fn guarded_updates_are_bitwise_through_subnormal_operands() {
    let mut r = rand::rngs::StdRng::seed_from_u64(31);
    let avx512 = runs("delta-rule-avx512", crate::kernels::capabilities().avx512f);
    let (mut subnormal_operands, mut operands) = (0, 0);
    for (w, n) in [(64, 5), (128, 40), (200, 9), (16, 3)] {
        for _ in 0..10 {
            // Rows of subnormal and tiny values, then rows of ordinary ones.
            let mut src = wide(n * w, &mut r, (-149, -100));
            let half = n / 2 * w;
            src[half..].copy_from_slice(&wide(n * w - half, &mut r, (-10, 10)));
            let y0 = wide(w, &mut r, (-140, -110));
            let c = wide(n, &mut r, (-149, 40));
            let terms: Vec<(usize, f32)> = c.iter().copied().enumerate().collect();
            let mut want = y0.clone();
            for &(j, cj) in &terms {
                for (y, &x) in want.iter_mut().zip(&src[j * w..(j + 1) * w]) {
                    *y += cj * x;
                }
            }
            let ranges = rows::ranges(&src, w, n);
            let mut got = y0.clone();
            // SAFETY: `Lanes` is plain Rust.
            unsafe { rows::Lanes::axpy_terms(&mut got, terms.iter().copied(), &src, &ranges) };
            assert_eq!(bits(&got), bits(&want), "lanes axpy w={w} n={n}");
            for (j, &cj) in c.iter().enumerate() {
                let mut want_row = src[j * w..(j + 1) * w].to_vec();
                want_row.iter_mut().for_each(|x| *x *= cj);
                let mut got_row = src[j * w..(j + 1) * w].to_vec();
                if avx512 {
                    // SAFETY: the CPU has AVX-512F (`avx512` is set).
                    unsafe { zmm_scale(&mut got_row, cj) };
                    assert_eq!(bits(&got_row), bits(&want_row), "zmm scale w={w} c={cj:e}");
                }
                for &x in &src[j * w..(j + 1) * w] {
                    if avx512 {
                        // SAFETY: as above.
                        let got = unsafe { zmm_mul(x, cj) };
                        assert_eq!(got.to_bits(), (x * cj).to_bits(), "zmm mul {x:e}·{cj:e}");
                    }
                    let sub = |v: f32| v.is_subnormal() && cj != 0.0 && x != 0.0;
                    subnormal_operands += usize::from(sub(x) || sub(cj) || (x * cj).is_subnormal());
                    operands += 1;
                }
            }
            if avx512 {
                let mut got = y0.clone();
                // SAFETY: the CPU has AVX-512F.
                unsafe { zmm_axpy(&mut got, &terms, &src, &ranges) };
                assert_eq!(bits(&got), bits(&want), "zmm axpy w={w} n={n}");
            }
        }
    }
    // The inputs reach what the test is about: products that take an assist.
    assert!(
        subnormal_operands * 4 > operands,
        "{subnormal_operands} of {operands} products with a subnormal operand or result"
    );
}

/// [`rows::Zmm::axpy_terms`] compiled as the AVX-512F head build inlines it.
///
/// # Safety
/// AVX-512F.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f"))]
unsafe fn zmm_axpy(y: &mut [f32], terms: &[(usize, f32)], src: &[f32], ranges: &[(f32, f32)]) {
    // SAFETY: AVX-512F (this function's contract).
    unsafe { rows::Zmm::axpy_terms(y, terms.iter().copied(), src, ranges) }
}

/// [`rows::Zmm::scale`] compiled as the AVX-512F head build inlines it.
///
/// # Safety
/// AVX-512F.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f"))]
unsafe fn zmm_scale(y: &mut [f32], c: f32) {
    // SAFETY: AVX-512F (this function's contract).
    unsafe { rows::Zmm::scale(y, c) }
}

/// [`rows::Zmm::mul`] compiled as the AVX-512F head build inlines it.
///
/// # Safety
/// AVX-512F.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f"))]
unsafe fn zmm_mul(a: f32, b: f32) -> f32 {
    // SAFETY: AVX-512F (this function's contract).
    unsafe { rows::Zmm::mul(a, b) }
}
