//! Which terms of a row update would make the CPU take a microcode assist,
//! so that `Zmm` computes them in f64 (`zmm::add_mul_f64`) to the same bits.
//! On an Intel Xeon of CPUID model 207 (measured, 64 lanes per term) an f32
//! multiply takes one, about 360 ns against 7–13 ns, when its product is
//! subnormal, or when one operand is subnormal and the other is not zero
//! (even where the product is normal); an add takes none for a subnormal
//! operand. A product of normal values that rounds to zero takes none and is
//! not flagged; a sum cancelling to a subnormal takes one and is not
//! guarded. The chunked delta rule makes many: decays `e^{γ}` far below
//! 2⁻¹²⁶ scale whole rows of its coefficients, and the rows they scale are
//! then subnormal themselves.

/// The smallest normal f32, 2⁻¹²⁶, in f64.
const MIN_NORMAL: f64 = 1.0 / (1u128 << 126) as f64;
/// Half the smallest subnormal f32, 2⁻¹⁵⁰: a product below it rounds to zero.
const HALF_MIN_SUB: f64 = MIN_NORMAL / (1u64 << 24) as f64;

/// All bits but the sign.
const ABS: u32 = 0x7fff_ffff;
/// The bits of +∞: a magnitude's bits below them are a finite value's.
const INF_BITS: u32 = 0x7f80_0000;

/// Per source row of `src` (`k` rows of `w`): the magnitudes `(lo, hi)` of
/// a coefficient `c` for which `c · x` takes an assist for some finite `x`
/// of the row, with `lo ≤ |c| < hi` (and [`is_tiny`] adds any subnormal `c`
/// on a row with a non-zero value). Where the row has a subnormal value,
/// every non-zero `c` (the whole range above zero). Otherwise, those whose
/// product with some value lands in the subnormal range (2⁻¹⁵⁰ to 2⁻¹²⁶):
/// the quotients of those bounds by the row's largest and smallest non-zero
/// finite magnitudes, computed in f64 and rounded outward to f32, so that
/// the flags need no f32 arithmetic, only comparisons. A row with no
/// non-zero finite value gets an empty range.
#[inline(always)]
pub(in crate::models::qwen3_5::delta_rule) fn ranges(
    src: &[f32],
    w: usize,
    k: usize,
) -> Vec<(f32, f32)> {
    // A plain loop: an iterator adapter's `fold` can be left out of line,
    // compiled without the caller's AVX-512F, where the integer min and max
    // do not vectorise.
    let mut out = Vec::with_capacity(k);
    for row in src.chunks_exact(w).take(k) {
        out.push(row_range(row));
    }
    out
}

/// [`ranges`] of one row.
#[inline(always)]
pub(in crate::models::qwen3_5::delta_rule) fn row_range(row: &[f32]) -> (f32, f32) {
    // The magnitudes' bit patterns, whose integer order is their order as
    // values: lanes of 16 of integer min and max, which vectorise (the f32
    // min and max, with their NaN rules, did not).
    let (mut lo, mut hi) = ([u32::MAX; 16], [0u32; 16]);
    for part in row.chunks(16) {
        for ((l, h), &x) in lo.iter_mut().zip(hi.iter_mut()).zip(part) {
            let a = x.to_bits() & ABS;
            let finite = a < INF_BITS;
            *h = if finite { (*h).max(a) } else { *h };
            *l = if finite && a > 0 { (*l).min(a) } else { *l };
        }
    }
    let lo = f32::from_bits(lo.iter().copied().fold(u32::MAX, u32::min));
    let hi = f32::from_bits(hi.iter().copied().fold(0, u32::max));
    if hi == 0.0 {
        return (f32::INFINITY, 0.0);
    }
    if lo < f32::MIN_POSITIVE {
        return (f32::from_bits(1), f32::INFINITY);
    }
    (
        down(HALF_MIN_SUB / f64::from(hi)),
        up(MIN_NORMAL / f64::from(lo)),
    )
}

/// Whether `c` times a row of range `(lo, hi)` ([`ranges`]) may take an
/// assist: `c` is not zero (a zero one takes none, whatever the row holds)
/// and `lo ≤ |c| < hi`, or `c` is subnormal and the row not empty
/// (`lo < hi`).
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) fn is_tiny(c: f32, (lo, hi): (f32, f32)) -> bool {
    let a = c.abs();
    let in_range = (a >= lo) & (a < hi);
    let subnormal = (a < f32::MIN_POSITIVE) & (lo < hi);
    (a > 0.0) & (in_range | subnormal)
}

/// `x` rounded to an f32 no larger.
fn down(x: f64) -> f32 {
    let f = x as f32;
    if f64::from(f) > x {
        f.next_down()
    } else {
        f
    }
}

/// `x` rounded to an f32 no smaller.
fn up(x: f64) -> f32 {
    let f = x as f32;
    if f64::from(f) < x {
        f.next_up()
    } else {
        f
    }
}

/// `tiny[t]`: whether a coefficient of term `t` in the rows of `c`
/// (`[rows, k]`) times source row `t` may take an assist ([`is_tiny`] on the
/// rows' [`ranges`]).
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) fn flag_terms(c: &[f32], k: usize, ranges: &[(f32, f32)], tiny: &mut [bool]) {
    tiny.iter_mut().for_each(|f| *f = false);
    if k == 0 {
        return;
    }
    for row in c.chunks_exact(k) {
        for ((f, &ct), &r) in tiny.iter_mut().zip(row).zip(ranges) {
            *f |= is_tiny(ct, r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_follow_the_subnormal_range() {
        assert_eq!(MIN_NORMAL, f64::from(f32::MIN_POSITIVE));
        assert_eq!(HALF_MIN_SUB, f64::from(f32::from_bits(1)) / 2.0);
        // Outward rounding: 1/3 lies between two f32 values.
        assert!(f64::from(down(1.0 / 3.0)) < 1.0 / 3.0 && f64::from(up(1.0 / 3.0)) > 1.0 / 3.0);
        let src = [
            0.0,
            -0.5,
            2.0,
            f32::NAN, // row 0
            0.0,
            0.0,
            0.0,
            f32::INFINITY, // row 1: no finite non-zero value
            2f32.powi(-10),
            0.0,
            -0.0,
            0.0, // row 2
        ];
        let r = ranges(&src, 4, 3);
        let p = |e: i32| 2f32.powi(e);
        // Row 0: 2⁻¹⁵⁰/2 (0 in f32) and 2⁻¹²⁶/0.5; row 1: empty; row 2:
        // 2⁻¹⁴⁰ and 2⁻¹¹⁶.
        assert_eq!(
            r,
            vec![(p(-151), p(-125)), (f32::INFINITY, 0.0), (p(-140), p(-116))]
        );
        let mut tiny = [true; 3];
        // 2⁻¹³⁰ · 0.5 is subnormal; nothing times a row of zeros is; 1 · 2⁻¹⁰ is normal.
        flag_terms(&[2f32.powi(-130), 1.0, 1.0], 3, &r, &mut tiny);
        assert_eq!(tiny, [true, false, false]);
        // 2⁻¹²⁴ · 0.5 is normal; 2⁻¹³⁰ on a row of zeros; 2⁻¹⁴⁹ · 2⁻¹⁰ rounds
        // to zero, but 2⁻¹⁴⁹ is itself subnormal (an assist all the same).
        let c = [2f32.powi(-124), 2f32.powi(-130), f32::from_bits(1)];
        flag_terms(&c, 3, &r, &mut tiny);
        assert_eq!(tiny, [false, false, true]);
        // A subnormal coefficient flags no term on an empty row, and a zero
        // one none at all (row 0's lower bound, 2⁻¹⁵¹, rounds down to 0).
        assert!(!is_tiny(f32::from_bits(1), r[1]) && r[0].0 == 0.0);
        assert!(!is_tiny(-0.0, r[0]) && !is_tiny(0.0, r[2]));
        // Any row of the block flags a term: 2⁻¹²⁰ · 2⁻¹⁰ is subnormal.
        let c = [1.0, 0.0, 1.0, 1.0, 0.0, 2f32.powi(-120)];
        flag_terms(&c, 3, &r, &mut tiny);
        assert_eq!(tiny, [false, false, true]);
        // A row with a subnormal value: every non-zero coefficient, however
        // large its product, and no zero one.
        let sub = ranges(&[1.0, f32::from_bits(7), -3.0, 0.0], 4, 1)[0];
        assert_eq!(sub, (f32::from_bits(1), f32::INFINITY));
        for (c, want) in [
            (1e30, true),
            (-1.0, true),
            (f32::from_bits(1), true),
            (0.0, false),
        ] {
            assert_eq!(is_tiny(c, sub), want, "{c:e}");
        }
    }
}
