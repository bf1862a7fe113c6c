//! A bf16 weight as the bf16 kernels read it: per row, its values in
//! swapped 32-bit pairs (the first of each pair in the high half), so one
//! `vdpbf16ps` lane adds the pair's two products in candle's order (the
//! x86-64 kernel's module docs say why).

use std::sync::Arc;

use rayon::prelude::*;

use crate::error::Result;

/// A bf16 weight's words as [`Pairs`] hold them: shared, so the models that
/// read one checkpoint tensor in the same sweep (in bf16, f32 and f16, on
/// any loading path) hold one copy of it.
pub type Words = Arc<Vec<u32>>;

/// A bf16 weight `[N, K]`: per row, its pairs `w[2p] << 16 | w[2p + 1]`
/// (the last one `w[K−1] << 16` when K is odd), made once per weight;
/// clones share the words.
#[derive(Debug, Clone)]
pub struct Pairs {
    n: usize,
    k: usize,
    words: Words,
}

fn refused(msg: String) -> crate::error::Error {
    candle_core::Error::Msg(msg).into()
}

impl Pairs {
    /// The pairs of a row-major `[n, k]` weight holding bf16 values in f32
    /// (a parameter rounded to bf16), rows in parallel.
    ///
    /// Errors: `values` does not hold `[n, k]`, or a value is not bf16.
    pub fn of(values: &[f32], [n, k]: [usize; 2]) -> Result<Self> {
        if values.len() != n * k {
            return Err(refused(format!(
                "bf16 pairs: {} values do not hold [{n}, {k}]",
                values.len()
            )));
        }
        let pairs = k.div_ceil(2);
        let mut words = vec![0u32; n * pairs];
        let ok = words
            .par_chunks_mut(pairs.max(1))
            .zip(values.par_chunks(k.max(1)))
            .all(|(out, row)| row_pairs(row, out));
        if !ok {
            return Err(refused(
                "bf16 dot-product matmul: a weight value is not a bf16 value".into(),
            ));
        }
        Ok(Self {
            n,
            k,
            words: Arc::new(words),
        })
    }

    /// Pairs as a checkpoint's bf16 bytes give them (`WeightSource::bf16_pairs`).
    ///
    /// Errors: `words` does not hold `dims`.
    pub fn from_words([n, k]: [usize; 2], words: Words) -> Result<Self> {
        if words.len() != n * k.div_ceil(2) {
            return Err(refused(format!(
                "bf16 pairs: {} words do not hold [{n}, {k}]",
                words.len()
            )));
        }
        Ok(Self { n, k, words })
    }

    /// `[N, K]`.
    pub fn dims(&self) -> [usize; 2] {
        [self.n, self.k]
    }

    /// The words, row after row (`K.div_ceil(2)` per row).
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// The weight widened back to f32, row-major `[N, K]` (exact), rows in
    /// parallel.
    pub fn widen(&self) -> Vec<f32> {
        self.widen_rows(&(0..self.n).collect::<Vec<_>>())
    }

    /// Rows `rows` (each below `N`) widened to f32, row-major `[rows, K]`
    /// (exact), rows in parallel.
    pub fn widen_rows(&self, rows: &[usize]) -> Vec<f32> {
        let (k, pairs) = (self.k, self.k.div_ceil(2));
        let mut v = vec![0f32; rows.len() * k];
        v.par_chunks_mut(k.max(1))
            .zip(rows.par_iter())
            .for_each(|(out, &j)| {
                let row = &self.words[j * pairs..(j + 1) * pairs];
                for (i, &w) in row.iter().enumerate() {
                    out[2 * i] = f32::from_bits(w & 0xffff_0000);
                    if 2 * i + 1 < k {
                        out[2 * i + 1] = f32::from_bits(w << 16);
                    }
                }
            });
        v
    }

    /// Element `e` of row `j`, widened.
    #[inline(always)]
    pub fn at(&self, j: usize, e: usize) -> f32 {
        let word = self.words[j * self.k.div_ceil(2) + e / 2];
        f32::from_bits(if e.is_multiple_of(2) {
            word & 0xffff_0000
        } else {
            word << 16
        })
    }
}

/// One row of a bf16 tensor as its little-endian bytes (`2K` bytes) into its
/// [`Pairs`] words (`out`: `K.div_ceil(2)` of them, the last `w[K−1] << 16`
/// when K is odd), returning its (NaN, Inf) counts: what a checkpoint's
/// bf16 weight is read as, in one pass over its bytes (AVX-512BW where the
/// CPU has it, else a scalar loop; the same words and counts).
///
/// # Panics
/// `row` has an odd length or `out` is not `row.len().div_ceil(4)` words.
pub fn words_from_bytes(out: &mut [u32], row: &[u8]) -> (usize, usize) {
    assert!(
        row.len().is_multiple_of(2) && out.len() == row.len().div_ceil(4),
        "bf16 pairs: {} bytes do not make {} words",
        row.len(),
        out.len()
    );
    #[cfg(target_arch = "x86_64")]
    if let Some(counts) = super::x86_64::words_from_bytes(out, row, scalar_words) {
        return counts;
    }
    scalar_words(out, row)
}

/// [`words_from_bytes`]' scalar loop: CPUs without AVX-512BW, and the tail
/// after the AVX-512BW loop's last whole 64 bytes. Branch-free, but built
/// for baseline x86-64 it assembles each word from byte loads (11 % of a
/// 27B triage before the AVX-512BW loop, docs/performance.md).
pub(in crate::kernels) fn scalar_words(out: &mut [u32], row: &[u8]) -> (usize, usize) {
    // bf16 NaN: exponent all ones, mantissa non-zero; Inf: mantissa zero.
    let class = |v: u32| {
        let ones = usize::from(v & 0x7f80 == 0x7f80);
        let mant = usize::from(v & 0x007f != 0);
        (ones & mant, ones & (1 - mant))
    };
    let (mut nan, mut inf) = (0usize, 0usize);
    let body = row.chunks_exact(4);
    let odd = body.remainder();
    for (o, four) in out.iter_mut().zip(body) {
        // Little-endian: the pair's first value in the low half.
        let w = u32::from_le_bytes([four[0], four[1], four[2], four[3]]);
        let (a, b) = class(w & 0xffff);
        let (c, d) = class(w >> 16);
        nan += a + c;
        inf += b + d;
        *o = w.rotate_left(16);
    }
    if let [lo, hi] = *odd {
        let v = u16::from_le_bytes([lo, hi]);
        let (a, b) = class(u32::from(v));
        nan += a;
        inf += b;
        if let Some(last) = out.last_mut() {
            *last = u32::from(v) << 16;
        }
    }
    (nan, inf)
}

/// One row's pairs into `out` (`row.len().div_ceil(2)` words), as
/// [`pair_of`] gives each; false when a value is not bf16 (then `out` is
/// not meaningful). The loop compiled for AVX-512F where the CPU has it, the
/// same bit operations either way.
fn row_pairs(row: &[f32], out: &mut [u32]) -> bool {
    /// [`row_pairs_lanes`] compiled for AVX-512F.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(row: &[f32], out: &mut [u32]) -> bool {
        row_pairs_lanes(row, out)
    }
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::capabilities().avx512f {
        // SAFETY: the CPU has AVX-512F (read from CPUID with the capabilities).
        return unsafe { avx512(row, out) };
    }
    row_pairs_lanes(row, out)
}

/// [`row_pairs`]' loop, branch-free so that it vectorises: a pair's word
/// is the first value's high half over the second's, and the values' low
/// halves are or-ed together to be checked once at the end.
#[inline(always)]
fn row_pairs_lanes(row: &[f32], out: &mut [u32]) -> bool {
    assert_eq!(out.len(), row.len().div_ceil(2), "a row's pairs");
    let whole = row.chunks_exact(2);
    let tail = whole.remainder();
    let mut low = 0u32;
    for (two, o) in whole.zip(out.iter_mut()) {
        let (a, b) = (two[0].to_bits(), two[1].to_bits());
        low |= (a | b) & 0xFFFF;
        *o = (a & 0xFFFF_0000) | (b >> 16);
    }
    if let (&[a], Some(o)) = (tail, out.last_mut()) {
        let a = a.to_bits();
        low |= a & 0xFFFF;
        *o = a & 0xFFFF_0000;
    }
    low == 0
}

/// One or two f32 values holding bf16 values as a swapped pair: the first
/// in the high half, the second (0 when absent) in the low half. `None`
/// when a value is not a bf16 value (its low 16 bits are not zero).
pub(crate) fn pair_of(two: &[f32]) -> Option<u32> {
    let bf = |v: f32| {
        let b = v.to_bits();
        (b & 0xffff == 0).then_some(b >> 16)
    };
    let lo = match two.get(1) {
        Some(&v) => bf(v)?,
        None => 0,
    };
    Some(bf(*two.first()?)? << 16 | lo)
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    /// Rows of bf16 values (odd and even lengths, one shorter than a
    /// vector, signed zeros, NaN and Inf among them) give [`pair_of`]'s
    /// words in both builds; a value with a low half set anywhere in a row,
    /// its odd last one included, is refused.
    #[test]
    fn a_rows_pairs_are_pair_ofs_words_in_both_builds() {
        let mut r = rand::rngs::StdRng::seed_from_u64(5);
        for k in [1, 2, 7, 31, 32, 33, 100] {
            let row: Vec<f32> = (0..k)
                .map(|i| match i % 9 {
                    0 => -0.0,
                    1 => f32::NAN,
                    2 => f32::NEG_INFINITY,
                    _ => f32::from_bits(r.gen::<u32>() & 0xFFFF_0000),
                })
                .collect();
            let want: Vec<u32> = row.chunks(2).map(|t| pair_of(t).unwrap()).collect();
            let mut got = vec![0u32; want.len()];
            assert!(row_pairs(&row, &mut got) && got == want, "k {k}");
            let mut got = vec![0u32; want.len()];
            assert!(
                row_pairs_lanes(&row, &mut got) && got == want,
                "k {k}, baseline"
            );
            assert_eq!(Pairs::of(&row, [1, k]).unwrap().words(), &want[..]);
            for at in [0, k / 2, k - 1] {
                let mut bad = row.clone();
                bad[at] = f32::from_bits(bad[at].to_bits() | 1);
                assert!(!row_pairs(&bad, &mut got), "k {k}: a low bit at {at}");
                assert!(!row_pairs_lanes(&bad, &mut got), "k {k}: a low bit at {at}");
                assert!(Pairs::of(&bad, [1, k]).is_err());
            }
        }
    }
}
