//! `e^{−x}` for 16 f32 values at a time with AVX-512F, giving the bits of
//! glibc's `expf` (`sysdeps/ieee754/flt-32/e_expf.c`, `__expf`, as its
//! x86-64 FMA build `__expf_fma` computes it), which candle's `silu` calls
//! once per value.
//!
//! glibc's algorithm, in double precision: `k = round(x · 32/ln 2)` by the
//! add-and-subtract of `0x1.8p52`, `r = x · 32/ln 2 − k`, and
//! `e^x = 2^{k/32} · (C0 r³ + C1 r² + C2 r + 1)`, with `2^{k/32}` made from a
//! 32-entry table (`__exp2f_data.tab`: `2^{i/32}`'s bits less `i << 47`) and
//! `k`'s high bits added to the exponent, then one rounding to f32. The FMA
//! build fuses `x · 32/ln 2 + 0x1.8p52`, `x · 32/ln 2 − k` and each
//! polynomial step into single FMAs; here each lane takes the same
//! operations, so the same roundings. Values of magnitude 2^6 · 1.375 (88)
//! and more, NaN and ±Inf, which glibc sends to its special-case branch
//! (most of them on to its overflow and underflow paths), are left to libm
//! one at a time.
//!
//! Whether a given libm computes exactly this is not known from its name,
//! so [`matches_libm`] compares this build with `f32::exp` on a spread of
//! values once per process and the callers take libm's `expf` wherever it
//! does not agree.

use std::arch::x86_64::*;
use std::sync::OnceLock;

/// `0x1.71547652b82fep+5`: 32/ln 2 (`__exp2f_data.invln2_scaled`).
const INV_LN2_N: u64 = 0x4047_1547_652b_82fe;
/// `0x1.8p52`: adding it rounds a double of magnitude below 2^51 to an
/// integer, held in the low mantissa bits (`__exp2f_data.shift`).
const SHIFT: u64 = 0x4338_0000_0000_0000;
/// The polynomial's coefficients scaled by 32^-3, 32^-2 and 32^-1
/// (`__exp2f_data.poly_scaled`).
const POLY: [u64; 3] = [
    0x3ebc_6af8_4b91_2394,
    0x3f2e_bfce_50fa_c4f3,
    0x3f96_2e42_ff0c_52d6,
];
/// The top 12 bits (sign cleared) from which glibc leaves its main path:
/// those of 88.0f.
const SPECIAL_TOP: u32 = 0x42b;

/// `2^{i/32}` (rounded to double) as bits, less `i << 47`, so that adding
/// `k << 47` gives `2^{k/32}` for every integer `k` in range
/// (`__exp2f_data.tab`).
const TABLE: [u64; 32] = [
    0x3ff0_0000_0000_0000,
    0x3fef_d9b0_d315_8574,
    0x3fef_b558_6cf9_890f,
    0x3fef_9301_d012_5b51,
    0x3fef_72b8_3c7d_517b,
    0x3fef_5487_3168_b9aa,
    0x3fef_387a_6e75_6238,
    0x3fef_1e9d_f51f_dee1,
    0x3fef_06fe_0a31_b715,
    0x3fee_f1a7_373a_a9cb,
    0x3fee_dea6_4c12_3422,
    0x3fee_ce08_6061_892d,
    0x3fee_bfda_d536_2a27,
    0x3fee_b42b_569d_4f82,
    0x3fee_ab07_dd48_5429,
    0x3fee_a47e_b03a_5585,
    0x3fee_a09e_667f_3bcd,
    0x3fee_9f75_e8ec_5f74,
    0x3fee_a114_73eb_0187,
    0x3fee_a589_994c_ce13,
    0x3fee_ace5_422a_a0db,
    0x3fee_b737_b0cd_c5e5,
    0x3fee_c491_82a3_f090,
    0x3fee_d503_b23e_255d,
    0x3fee_e89f_995a_d3ad,
    0x3fee_ff76_f2fb_5e47,
    0x3fef_199b_dd85_529c,
    0x3fef_3720_dcef_9069,
    0x3fef_5818_dcfb_a487,
    0x3fef_7c97_337b_9b5f,
    0x3fef_a4af_a2a4_90da,
    0x3fef_d076_5b6e_4540,
];

/// Whether [`exp_negated`] gives libm's `expf` bits on this process's libm:
/// checked once, on every f32 of a stride through the whole range of
/// patterns (a quarter of a million values, both signs, every exponent),
/// the edges of glibc's paths and the values that tell its FMA build from
/// one that rounds a product on its own.
pub(crate) fn matches_libm() -> bool {
    static M: OnceLock<bool> = OnceLock::new();
    if !crate::kernels::capabilities().avx512f {
        return false;
    }
    *M.get_or_init(|| {
        const STRIDE: u32 = 16_411;
        // With the two f32 (as bits) whose result changes when the FMA
        // build's `x · 32/ln 2 − k` is not fused: the only ones, found by
        // running every pattern through each of the five builds that leave
        // one of its FMAs unfused (the other four change no result).
        let edges = [
            0.0f32, -0.0, 1.0, -1.0, 87.99, -87.99, 88.0, -88.0, 88.72, -103.97,
        ]
        .into_iter()
        .chain([0x427c_65d9, 0xc202_422f].map(f32::from_bits));
        let xs: Vec<f32> = (0..=u32::MAX / STRIDE)
            .map(|i| f32::from_bits(i * STRIDE))
            .chain(edges)
            .collect();
        let mut got = vec![0f32; xs.len()];
        // SAFETY: the CPU has AVX-512F (checked above); `got` holds a
        // value per x.
        unsafe { exp_negated(&xs, &mut got) };
        xs.iter()
            .zip(&got)
            .all(|(x, g)| (-x).exp().to_bits() == g.to_bits())
    })
}

/// `out[i] = e^{−x[i]}` with glibc `expf`'s bits (the module docs), 16
/// values at a time; a partial last vector through masked loads and
/// stores.
///
/// # Safety
/// AVX-512F; `out` holds at least `x.len()` values.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn exp_negated(x: &[f32], out: &mut [f32]) {
    assert!(out.len() >= x.len(), "an output per value");
    let tab: [__m512i; 4] =
        std::array::from_fn(|q| _mm512_loadu_si512(TABLE[8 * q..].as_ptr() as *const _));
    let mut i = 0;
    while i < x.len() {
        let n = (x.len() - i).min(16);
        let mask: __mmask16 = if n == 16 { 0xFFFF } else { (1u16 << n) - 1 };
        let v = _mm512_maskz_loadu_ps(mask, x.as_ptr().add(i));
        let v = _mm512_castsi512_ps(_mm512_xor_si512(
            _mm512_castps_si512(v),
            _mm512_set1_epi32(i32::MIN),
        ));
        let lo = exp8(_mm512_castps512_ps256(v), &tab);
        let hi = exp8(
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
            &tab,
        );
        let y = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castps_pd(_mm512_castps256_ps512(lo)),
            _mm256_castps_pd(hi),
        ));
        _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), mask, y);
        // glibc's other paths, one value at a time.
        let top = _mm512_and_si512(
            _mm512_srli_epi32::<20>(_mm512_castps_si512(v)),
            _mm512_set1_epi32(0x7ff),
        );
        let special =
            _mm512_mask_cmpge_epu32_mask(mask, top, _mm512_set1_epi32(SPECIAL_TOP as i32));
        if special != 0 {
            for j in (0..n).filter(|j| special >> j & 1 == 1) {
                out[i + j] = (-x[i + j]).exp();
            }
        }
        i += n;
    }
}

/// glibc's main path on 8 values.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp8(x: __m256, tab: &[__m512i; 4]) -> __m256 {
    let f = |b: u64| _mm512_set1_pd(f64::from_bits(b));
    let xd = _mm512_cvtps_pd(x);
    let kd = _mm512_fmadd_pd(f(INV_LN2_N), xd, f(SHIFT));
    let ki = _mm512_castpd_si512(kd);
    let kd = _mm512_sub_pd(kd, f(SHIFT));
    let r = _mm512_fmsub_pd(f(INV_LN2_N), xd, kd);
    // tab[ki % 32] + (ki << 47).
    let idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
    let low = _mm512_permutex2var_epi64(tab[0], idx, tab[1]);
    let high = _mm512_permutex2var_epi64(tab[2], idx, tab[3]);
    let upper = _mm512_test_epi64_mask(idx, _mm512_set1_epi64(16));
    let t = _mm512_mask_blend_epi64(upper, low, high);
    let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
    let z = _mm512_fmadd_pd(r, f(POLY[0]), f(POLY[1]));
    let r2 = _mm512_mul_pd(r, r);
    let y = _mm512_fmadd_pd(r, f(POLY[2]), _mm512_set1_pd(1.0));
    let y = _mm512_fmadd_pd(z, r2, y);
    _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
}

#[cfg(test)]
mod tests {
    /// Every f32 pattern against `f32::exp` (libm's `expf`), in pieces on
    /// every thread, each in two calls that end in partial vectors. Where the
    /// build does not reproduce this process's libm, the callers never
    /// take it ([`super::matches_libm`]), and this test says so.
    #[test]
    fn every_f32_gives_libms_expf_bits() {
        use rayon::prelude::*;
        if !crate::kernels::capabilities().avx512f {
            eprintln!("SKIPPED: no AVX-512F on this CPU, so the vector expf never runs");
            return;
        }
        // glibc's own expf is this build's reference: there it must agree
        // (a build that drifted would otherwise only be switched off).
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert!(
                super::matches_libm(),
                "the vector expf differs from glibc's"
            );
        } else if !super::matches_libm() {
            eprintln!("SKIPPED: this libm's expf is not glibc's; libm's runs instead");
            return;
        }
        const PIECE: u64 = 1 << 16;
        let bad = (0..(1u64 << 32) / PIECE).into_par_iter().find_any(|&p| {
            let xs: Vec<f32> = (p * PIECE..(p + 1) * PIECE)
                .map(|b| f32::from_bits(b as u32))
                .collect();
            let mut got = vec![0f32; xs.len()];
            // Two calls, each ending in a partial vector.
            let cut = 1 + (p % 15) as usize;
            let (g0, g1) = got.split_at_mut(cut);
            // SAFETY: the CPU has AVX-512F; each output holds a value per x.
            unsafe {
                super::exp_negated(&xs[..cut], g0);
                super::exp_negated(&xs[cut..], g1);
            }
            xs.iter()
                .zip(&got)
                .any(|(x, g)| (-x).exp().to_bits() != g.to_bits())
        });
        assert_eq!(
            bad, None,
            "a piece of patterns whose vector expf differs from libm's"
        );
    }
}
