//! Which terms of a dense update may have a subnormal product, so that
//! `Zmm` computes them in f64 (`zmm::add_mul_f64`): on Intel cores an f32
//! multiply or add whose result is subnormal takes a microcode assist of
//! about 36 ns (0.5 ns otherwise), and the chunked delta rule makes many
//! (decays `e^{γ}` far below 2⁻¹²⁶ scale whole rows of its coefficients).

/// The smallest normal f32, 2⁻¹²⁶, in f64.
const MIN_NORMAL: f64 = 1.0 / (1u128 << 126) as f64;
/// Half the smallest subnormal f32, 2⁻¹⁵⁰: a product below it rounds to zero.
const HALF_MIN_SUB: f64 = MIN_NORMAL / (1u64 << 24) as f64;

/// Per source row of `src` (`k` rows of `w`): the bounds a coefficient's
/// magnitude must fall between for one of its products with the row's
/// finite values to land in the subnormal range (between 2⁻¹⁵⁰ and
/// 2⁻¹²⁶): `(lo, hi)` with a product possibly subnormal when
/// `lo ≤ |c| < hi`. The bounds are the quotients by the row's largest and
/// smallest non-zero finite magnitudes, computed in f64 and rounded outward
/// to f32, so that the flags need no f32 arithmetic, only comparisons (a row
/// with no non-zero finite value gets an empty range).
pub(super) fn ranges(src: &[f32], w: usize, k: usize) -> Vec<(f32, f32)> {
    src.chunks_exact(w)
        .take(k)
        .map(|row| {
            // Lanes of 16 so that the loop vectorises; min and max are exact in any order.
            let (mut lo, mut hi) = ([f32::INFINITY; 16], [0f32; 16]);
            for part in row.chunks(16) {
                for ((l, h), &x) in lo.iter_mut().zip(hi.iter_mut()).zip(part) {
                    let a = x.abs();
                    let finite = a < f32::INFINITY;
                    *h = if finite { h.max(a) } else { *h };
                    *l = if finite && a > 0.0 { l.min(a) } else { *l };
                }
            }
            let lo = lo.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = hi.iter().copied().fold(0f32, f32::max);
            if hi == 0.0 {
                return (f32::INFINITY, 0.0);
            }
            (
                down(HALF_MIN_SUB / f64::from(hi)),
                up(MIN_NORMAL / f64::from(lo)),
            )
        })
        .collect()
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
/// (`[rows, k]`) may have a product with source row `t` in the subnormal
/// range, from the rows' [`ranges`].
pub(super) fn flag_terms(c: &[f32], k: usize, ranges: &[(f32, f32)], tiny: &mut [bool]) {
    tiny.iter_mut().for_each(|f| *f = false);
    if k == 0 {
        return;
    }
    for row in c.chunks_exact(k) {
        for ((f, &ct), &(lo, hi)) in tiny.iter_mut().zip(row).zip(ranges) {
            let a = ct.abs();
            *f |= (a >= lo) & (a < hi);
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
        // Row 0: 2⁻¹⁵⁰/2 and 2⁻¹²⁶/0.5; row 1: empty; row 2: 2⁻¹⁴⁰ and 2⁻¹¹⁶.
        assert_eq!(
            r,
            vec![(p(-151), p(-125)), (f32::INFINITY, 0.0), (p(-140), p(-116))]
        );
        let mut tiny = [true; 3];
        // 2⁻¹³⁰ · 0.5 is subnormal; nothing times a row of zeros is; 1 · 2⁻¹⁰ is normal.
        flag_terms(&[2f32.powi(-130), 1.0, 1.0], 3, &r, &mut tiny);
        assert_eq!(tiny, [true, false, false]);
        // 2⁻¹²⁴ · 0.5 is normal; 2⁻¹⁴⁹ · 2⁻¹⁰ rounds to zero.
        let c = [2f32.powi(-124), 2f32.powi(-130), f32::from_bits(1)];
        flag_terms(&c, 3, &r, &mut tiny);
        assert_eq!(tiny, [false, false, false]);
        // Any row of the block flags a term: 2⁻¹²⁰ · 2⁻¹⁰ is subnormal.
        let c = [1.0, 0.0, 1.0, 1.0, 0.0, 2f32.powi(-120)];
        flag_terms(&c, 3, &r, &mut tiny);
        assert_eq!(tiny, [false, false, true]);
    }
}
