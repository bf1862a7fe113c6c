//! A bf16 tensor's bytes to its [`crate::kernels::Pairs`] words with
//! AVX-512BW: 32 values per step, the NaN and Inf counts from two 16-bit
//! compares, the words from one 32-bit rotate. The same words and counts as
//! [`crate::kernels::pairs`]'s scalar loop (tested there on random bytes).

use std::arch::x86_64::*;

/// `row` (little-endian bf16, `2K` bytes) into `out` (`K.div_ceil(2)`
/// words), returning its (NaN, Inf) counts; `rest` converts what is left
/// after the last whole 64 bytes.
///
/// # Safety
/// AVX-512F and AVX-512BW; `out.len() == row.len().div_ceil(4)`.
#[target_feature(enable = "avx512f,avx512bw,popcnt")]
pub(in crate::kernels) unsafe fn words(
    out: &mut [u32],
    row: &[u8],
    rest: fn(&mut [u32], &[u8]) -> (usize, usize),
) -> (usize, usize) {
    let exp = _mm512_set1_epi16(0x7f80);
    let mant = _mm512_set1_epi16(0x007f);
    let whole = row.len() / 64;
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
