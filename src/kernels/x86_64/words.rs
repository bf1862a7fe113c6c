//! A bf16 tensor's bytes to its [`crate::kernels::Pairs`] words with
//! AVX-512BW: 32 values per step, the NaN and Inf counts from two 16-bit
//! compares, the words from one 32-bit rotate. The same words and counts as
//! [`crate::kernels::pairs`]'s scalar loop (tested against it below, and
//! against `half` in `tests/kernels.rs`).

use std::arch::x86_64::*;

/// `row` (little-endian bf16, `2K` bytes) into `out` (`K.div_ceil(2)`
/// words), returning its (NaN, Inf) counts; `rest` converts what is left
/// after the last whole 64 bytes.
///
/// # Safety
/// AVX-512F and AVX-512BW; `out.len() == row.len().div_ceil(4)`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(in crate::kernels) unsafe fn words(
    out: &mut [u32],
    row: &[u8],
    rest: fn(&mut [u32], &[u8]) -> (usize, usize),
) -> (usize, usize) {
    let exp = _mm512_set1_epi16(0x7f80);
    let mant = _mm512_set1_epi16(0x007f);
    // Whole steps inside both slices, whatever the caller passed (a
    // mismatch then panics in the tail's slicing, never writes past `out`).
    let whole = (row.len() / 64).min(out.len() / 16);
    let (mut nan, mut inf) = (0u64, 0u64);
    for i in 0..whole {
        // SAFETY: bytes 64i..64i+64 lie in `row`, words 16i..16i+16 in
        // `out` (16 words per 64 bytes); both accesses are unaligned.
        unsafe {
            let v = _mm512_loadu_si512(row.as_ptr().add(64 * i).cast());
            let ones = _mm512_cmpeq_epi16_mask(_mm512_and_si512(v, exp), exp);
            let frac = _mm512_test_epi16_mask(v, mant);
            nan += u64::from((ones & frac).count_ones());
            inf += u64::from((ones & !frac).count_ones());
            _mm512_storeu_si512(out.as_mut_ptr().add(16 * i).cast(), _mm512_rol_epi32(v, 16));
        }
    }
    let (n, f) = rest(&mut out[16 * whole..], &row[64 * whole..]);
    (nan as usize + n, inf as usize + f)
}

#[cfg(test)]
mod tests {
    use crate::kernels::pairs::scalar_words;

    /// Rows of every length from 0 to 96 values (3 steps of 64 bytes, every
    /// tail length after them) cut across all 65 536 bf16 values, and one
    /// row of all of them: the AVX-512BW words and counts are the scalar
    /// loop's.
    #[test]
    fn words_are_the_scalar_loops() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")) {
            eprintln!("skipped: this CPU has no AVX-512BW, the scalar loop runs alone");
            return;
        }
        let values: Vec<u16> = (0..=u16::MAX).collect();
        for k in 0..=96usize {
            for start in (0..values.len() - k).step_by(61 + k) {
                let chunk = &values[start..start + k];
                let row: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
                let (mut a, mut b) = (
                    vec![0u32; row.len().div_ceil(4)],
                    vec![7u32; row.len().div_ceil(4)],
                );
                let want = scalar_words(&mut a, &row);
                // SAFETY: the features were detected above; `b` holds
                // `row.len().div_ceil(4)` words.
                let got = unsafe { super::words(&mut b, &row, scalar_words) };
                assert_eq!((got, &b), (want, &a), "K = {k}");
            }
        }
        // All 65 536 values in one row: every pattern in the vector body.
        let row: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let (mut a, mut b) = (vec![0u32; row.len() / 4], vec![0u32; row.len() / 4]);
        let want = scalar_words(&mut a, &row);
        // SAFETY: as above.
        let got = unsafe { super::words(&mut b, &row, scalar_words) };
        assert_eq!((got, b), (want, a));
        // 254 NaNs (either sign, exponent all ones, 127 non-zero fractions)
        // and 2 Infs.
        assert_eq!(want, (254, 2));
    }
}
