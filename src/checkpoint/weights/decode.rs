//! A tensor's little-endian bytes as f32 values, rounded to the compute
//! dtype where asked: each piece widened and rounded while it is in cache,
//! written once into the output (not zeroed first), pieces in parallel, the
//! loops compiled for AVX-512F where the CPU has it.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::memory::assume_init;
use crate::precision::Precision;

/// Floating-point storage dtypes the weights come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stored {
    Bf16,
    F16,
    F32,
    F64,
}

impl Stored {
    /// The dtype a safetensors header names, if floating point.
    pub(super) fn of(dtype: &str) -> Option<Self> {
        match dtype {
            "BF16" => Some(Stored::Bf16),
            "F16" => Some(Stored::F16),
            "F32" => Some(Stored::F32),
            "F64" => Some(Stored::F64),
            _ => None,
        }
    }

    /// Bytes per value.
    pub(super) fn width(self) -> usize {
        match self {
            Stored::Bf16 | Stored::F16 => 2,
            Stored::F32 => 4,
            Stored::F64 => 8,
        }
    }
}

/// Values per piece: 64 KiB of f32, rounded while still in L2.
const PIECE: usize = 1 << 14;

/// The values of `src` (stored as `dtype`, little-endian) as f32, each
/// rounded to `prec` where given (`Precision::round_slice`); bytes past the
/// last whole value are ignored. bf16 and f16 widen exactly (a NaN gets
/// its quiet bit, as the half crate's `to_f32` gives it); f64 narrows with
/// `as f32`. With the NaN and ±Inf counts of the widened values, taken
/// before the rounding (which may overflow a finite value to Inf) while each
/// piece is in cache: the counts `Weights::count_non_finite` reads from the
/// bytes (for f64, those of the `as f32` cast).
pub(super) fn convert(
    src: &[u8],
    dtype: Stored,
    prec: Option<Precision>,
) -> (Vec<f32>, (usize, usize)) {
    let width = dtype.width();
    let n = src.len() / width;
    let mut out: Vec<f32> = Vec::with_capacity(n);
    let counts = out.spare_capacity_mut()[..n]
        .par_chunks_mut(PIECE)
        .zip(src[..n * width].par_chunks(PIECE * width))
        .map(|(o, s)| {
            let o = widen(dtype, s, o);
            let counts = non_finite(o);
            if let Some(p) = prec {
                p.round_slice(o);
            }
            counts
        })
        .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    // SAFETY: the two sides split n values into the same pieces (PIECE
    // values, and PIECE·width of the n·width bytes), so the pieces cover the
    // first n values, and `widen` wrote each value of its piece. A panic in
    // a piece leaves the parallel loop before this line.
    unsafe { out.set_len(n) };
    (out, counts)
}

/// NaN and ±Inf counts of `v`, on the bits (a loop that vectorises).
fn non_finite(v: &[f32]) -> (usize, usize) {
    const INF: u32 = 0x7F80_0000;
    v.iter().fold((0, 0), |n, x| {
        let a = x.to_bits() & 0x7FFF_FFFF;
        (n.0 + usize::from(a > INF), n.1 + usize::from(a == INF))
    })
}

/// `o.len()` values decoded from `s` (`o.len()` values of `dtype`) into `o`,
/// returned as written.
fn widen<'o>(dtype: Stored, s: &[u8], o: &'o mut [MaybeUninit<f32>]) -> &'o mut [f32] {
    assert_eq!(
        s.len(),
        o.len() * dtype.width(),
        "a piece's bytes hold its values"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::capabilities().avx512f {
        // SAFETY: the CPU has AVX-512F (read from CPUID with the
        // capabilities), and `s` holds `o.len()` values (asserted above).
        unsafe { widen_avx512(dtype, s, o) };
        // SAFETY: `widen_avx512` wrote every value of `o`.
        return unsafe { assume_init(o) };
    }
    widen_lanes(dtype, s, o);
    // SAFETY: `widen_lanes` wrote every value of `o`.
    unsafe { assume_init(o) }
}

/// [`widen`]'s loops, inlined into each build; f16 through the half crate's
/// slice conversion here (F16C where the CPU has it, 8 values at a time;
/// the AVX-512F build converts 16 at a time).
#[inline(always)]
fn widen_lanes(dtype: Stored, s: &[u8], o: &mut [MaybeUninit<f32>]) {
    match dtype {
        Stored::Bf16 => {
            for (x, c) in o.iter_mut().zip(s.chunks_exact(2)) {
                let b = u32::from(u16::from_le_bytes([c[0], c[1]])) << 16;
                // A NaN gets its quiet bit, as `half::bf16::to_f32` gives it.
                let quiet = if b & 0x7FFF_FFFF > 0x7F80_0000 {
                    0x0040_0000
                } else {
                    0
                };
                x.write(f32::from_bits(b | quiet));
            }
        }
        Stored::F16 => {
            use half::slice::HalfFloatSliceExt;
            let (mut h, mut f) = ([half::f16::ZERO; 1024], [0f32; 1024]);
            for (oc, sc) in o.chunks_mut(h.len()).zip(s.chunks(2 * h.len())) {
                let (h, f) = (&mut h[..oc.len()], &mut f[..oc.len()]);
                for (x, c) in h.iter_mut().zip(sc.chunks_exact(2)) {
                    *x = half::f16::from_le_bytes([c[0], c[1]]);
                }
                h.convert_to_f32_slice(f);
                for (x, &v) in oc.iter_mut().zip(f.iter()) {
                    x.write(v);
                }
            }
        }
        Stored::F32 => {
            for (x, c) in o.iter_mut().zip(s.chunks_exact(4)) {
                x.write(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
        }
        Stored::F64 => {
            for (x, c) in o.iter_mut().zip(s.chunks_exact(8)) {
                x.write(f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32);
            }
        }
    }
}

/// [`widen_lanes`] compiled for AVX-512F, f16 through `vcvtph2ps` 16 values
/// at a time (the instruction half's slice conversion uses 8 at a time
/// where the CPU has F16C).
///
/// # Safety
/// The CPU has AVX-512F; `s` holds `o.len()` values of `dtype`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn widen_avx512(dtype: Stored, s: &[u8], o: &mut [MaybeUninit<f32>]) {
    use std::arch::x86_64::*;
    if dtype != Stored::F16 {
        return widen_lanes(dtype, s, o);
    }
    let whole = o.len() / 16 * 16;
    for i in (0..whole).step_by(16) {
        // SAFETY: values i..i+16 lie inside `o` and their 32 bytes inside `s`.
        unsafe {
            let h = _mm256_loadu_si256(s.as_ptr().add(2 * i) as *const __m256i);
            _mm512_storeu_ps(o.as_mut_ptr().add(i) as *mut f32, _mm512_cvtph_ps(h));
        }
    }
    widen_lanes(dtype, &s[2 * whole..], &mut o[whole..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every bf16 and f16 bit pattern, in a scrambled order (a bijection of
    /// the 65 536), so that NaNs, subnormals and zeros fall at many lane and
    /// piece positions.
    fn all_halves() -> Vec<u16> {
        (0..=u16::MAX).map(|i| i.wrapping_mul(40503)).collect()
    }

    /// The half crate's widening of one value.
    fn widened(dtype: Stored, bits: u16) -> f32 {
        match dtype {
            Stored::Bf16 => half::bf16::from_bits(bits).to_f32(),
            _ => half::f16::from_bits(bits).to_f32(),
        }
    }

    /// `build` (a widening loop) on every pattern, against the half crate.
    fn check_build(name: &str, build: impl Fn(Stored, &[u8], &mut [MaybeUninit<f32>])) {
        let halves = all_halves();
        let bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
        for dtype in [Stored::Bf16, Stored::F16] {
            let mut out = vec![MaybeUninit::new(f32::NAN); halves.len()];
            build(dtype, &bytes, &mut out);
            for (o, &h) in out.iter().zip(&halves) {
                // SAFETY: every value was initialised above.
                let got = unsafe { o.assume_init() };
                let want = widened(dtype, h);
                assert_eq!(got.to_bits(), want.to_bits(), "{name}: {dtype:?} {h:#06x}");
            }
        }
    }

    /// Both builds of the widening, each on all 65 536 bf16 and f16
    /// patterns: the baseline loops (f16 through the half crate's slice
    /// conversion) and the AVX-512F one (f16 through `vcvtph2ps`).
    #[test]
    fn both_builds_widen_every_half_as_the_half_crate() {
        check_build("baseline", widen_lanes);
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::capabilities().avx512f {
            // SAFETY: the CPU has AVX-512F; `check_build` passes `s` holding
            // `o.len()` values.
            check_build("avx512f", |d, s, o| unsafe { widen_avx512(d, s, o) });
        } else {
            eprintln!("SKIPPED the AVX-512F build's half: no AVX-512F on this CPU");
        }
    }

    /// `convert` in every compute dtype gives each pattern's widening, then
    /// its rounding alone, on lengths that leave a partial 16-value vector
    /// and a partial piece, and ignores a trailing odd byte.
    #[test]
    fn halves_widen_and_round_as_each_value_alone() {
        let halves = all_halves();
        // One byte past the last value, which no length uses whole.
        let mut bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
        bytes.push(0x7F);
        for dtype in [Stored::Bf16, Stored::F16] {
            for prec in [
                None,
                Some(Precision::F32),
                Some(Precision::Bf16),
                Some(Precision::F16),
            ] {
                for n in [halves.len(), PIECE + 17, 15, 1, 0] {
                    let (got, counts) = convert(&bytes[..2 * n + 1], dtype, prec);
                    assert_eq!(got.len(), n, "{dtype:?}: the odd trailing byte is ignored");
                    // The stored values' counts, as read from the bytes.
                    let stored = match dtype {
                        Stored::Bf16 => {
                            crate::checkpoint::weights::bf16_non_finite(&bytes[..2 * n])
                        }
                        _ => crate::checkpoint::weights::non_finite_bits(
                            &bytes[..2 * n],
                            |b: [u8; 2]| u32::from(u16::from_le_bytes(b)),
                            10,
                            5,
                        ),
                    };
                    assert_eq!(counts, stored, "{dtype:?} to {prec:?}: NaN and Inf of {n}");
                    for (i, (g, &h)) in got.iter().zip(&halves).enumerate() {
                        let mut want = [widened(dtype, h)];
                        if let Some(p) = prec {
                            p.round_slice(&mut want);
                        }
                        assert_eq!(
                            g.to_bits(),
                            want[0].to_bits(),
                            "{dtype:?} {h:#06x} to {prec:?} at {i} of {n}"
                        );
                    }
                }
            }
        }
    }

    /// f32 values pass through (over several pieces) and f64 values narrow
    /// as `as f32` does, then round as one value alone; no bytes, no values.
    #[test]
    fn wide_values_convert_as_casts() {
        use rand::{Rng, SeedableRng};
        let mut r = rand::rngs::StdRng::seed_from_u64(43);
        let xs: Vec<f64> = [0.0, -0.0, 1.5, 1e-40, 3.4e39, f64::NAN, -1e-310, 0.1]
            .into_iter()
            .chain((0..2 * PIECE + 5).map(|_| f64::from(f32::from_bits(r.gen()))))
            .collect();
        let b64: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        let b32: Vec<u8> = xs.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect();
        for prec in [None, Some(Precision::Bf16)] {
            for (dtype, bytes) in [(Stored::F64, &b64), (Stored::F32, &b32)] {
                let (got, counts) = convert(bytes, dtype, prec);
                assert_eq!(got.len(), xs.len(), "{dtype:?}");
                // 3.4e39 narrows to Inf and counts as one; its bf16
                // rounding does not add one.
                let cast = xs.iter().map(|&x| x as f32);
                let want = (
                    cast.clone().filter(|x| x.is_nan()).count(),
                    cast.filter(|x| x.is_infinite()).count(),
                );
                assert_eq!(counts, want, "{dtype:?} to {prec:?}: NaN and Inf");
                for (i, (g, &x)) in got.iter().zip(&xs).enumerate() {
                    let mut want = [x as f32];
                    if let Some(p) = prec {
                        p.round_slice(&mut want);
                    }
                    assert_eq!(g.to_bits(), want[0].to_bits(), "{dtype:?} {x} at {i}");
                }
                assert!(convert(&bytes[..dtype.width() - 1], dtype, prec)
                    .0
                    .is_empty());
            }
        }
    }
}
