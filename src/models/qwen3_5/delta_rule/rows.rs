//! The row updates of the chunked head, in two builds that give the same
//! bits for every result that is not a NaN.
//!
//! - [`Lanes`]: loops the compiler vectorises, one output row at a time. It
//!   is inlined into the portable, AVX2 and AVX-512F head builds alike.
//! - [`Zmm`]: AVX-512F registers holding blocks of four output rows, so that
//!   each load of a source row serves four of them. A head's state is
//!   64 KiB, past L1, and the row-at-a-time form waits on L2 for it. Only the
//!   AVX-512F head build uses it (off x86-64 it is [`Lanes`]). It also
//!   computes in f64 the terms, scalings and products that would take a
//!   microcode assist in f32 ([`subnormal`]), to the same bits.
//!
//! In both, every element adds its terms in the same order, with one
//! rounding per product and per addition (no fused multiply-add).

/// f32 columns of each output row that one register block holds (4 zmm × 16).
const L: usize = 64;

/// The row stride of the transposed keys and of the dot products
/// ([`RowOps::dots_lower`]): a chunk's keys, at most four vectors of 16.
pub(super) const KEY_STRIDE: usize = 64;

// `Zmm::dots_lower` computes at most four vectors of 16 keys.
const _: () = assert!(KEY_STRIDE == 4 * 16);

/// `y += c·x` elementwise (`y -= l·x` is `axpy(y, -l, x)`: `y + (−l)·x`
/// rounds exactly as `y − l·x`). Independent lanes, so it vectorises without
/// changing any result.
#[inline(always)]
fn axpy(y: &mut [f32], c: f32, x: &[f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += c * xi;
    }
}

/// `y += c·rows[j]` for each term `(j, c)` in order (`rows` row-major,
/// `y.len()` wide): bitwise `for (j, c) in terms { axpy(y, c, row j) }`
/// (each element adds its terms in that order, one rounding per product
/// and per addition), with a block of `y` held in registers across the
/// terms instead of stored and loaded once per term.
#[inline(always)]
fn axpy_terms(y: &mut [f32], terms: impl Iterator<Item = (usize, f32)> + Clone, rows: &[f32]) {
    let w = y.len();
    let mut x0 = 0;
    while x0 + L <= w {
        let mut acc = [0f32; L];
        acc.copy_from_slice(&y[x0..x0 + L]);
        for (j, c) in terms.clone() {
            let r = &rows[j * w + x0..j * w + x0 + L];
            for (yl, &rl) in acc.iter_mut().zip(r) {
                *yl += c * rl;
            }
        }
        y[x0..x0 + L].copy_from_slice(&acc);
        x0 += L;
    }
    if x0 < w {
        for (j, c) in terms {
            axpy(&mut y[x0..], c, &rows[j * w + x0..(j + 1) * w]);
        }
    }
}

/// The chunked head's row updates, in one build.
pub(super) trait RowOps {
    /// Whether the build computes the terms that would take an assist in
    /// f64 (and so reads the rows' [`ranges`]).
    const GUARDS: bool;

    /// `y += c·rows[j]` for each term `(j, c)` in order (`rows` row-major,
    /// `y.len()` wide), bitwise the plain [`axpy_terms`]. `ranges[j]` is row
    /// j's [`ranges`] where the build [`GUARDS`](Self::GUARDS) (else unread).
    ///
    /// # Safety
    /// The CPU runs the build's instruction set.
    unsafe fn axpy_terms(
        y: &mut [f32],
        terms: impl Iterator<Item = (usize, f32)> + Clone,
        rows: &[f32],
        ranges: &[(f32, f32)],
    );

    /// `a · b`, bitwise f32 multiplication.
    ///
    /// # Safety
    /// The CPU runs the build's instruction set.
    unsafe fn mul(a: f32, b: f32) -> f32;

    /// `y[i] *= c` for every element, bitwise f32 multiplication.
    ///
    /// # Safety
    /// The CPU runs the build's instruction set.
    unsafe fn scale(y: &mut [f32], c: f32);

    /// `y[r] += Σ_t c[r·k + t] · src[t]` for every row `r` of `y` (rows `w`
    /// wide, `src` `k` rows of `w`), the terms `t = 0..k` in order: bitwise
    /// [`axpy_terms`] on each row with the terms `(t, c[r·k + t])`.
    ///
    /// # Safety
    /// The CPU runs the build's instruction set.
    ///
    /// # Panics
    /// When `w` is 0 or `c` or `src` is shorter than that.
    unsafe fn dense_rows(y: &mut [f32], w: usize, c: &[f32], k: usize, src: &[f32]);

    /// `dots[i·KEY_STRIDE + j] = xs[i] · key_j` for every row `i` of `xs`
    /// (`dk` wide) and every key `j ≤ min(i, n − 1)` (more of a row may be
    /// written), the keys being the first `n` ≤ [`KEY_STRIDE`] columns of
    /// `kt` (`[dk, KEY_STRIDE]`; a column past `n` may hold anything). Each
    /// dot sums its products in index order from −0.0, exactly as
    /// `x.iter().zip(key).map(|(a, b)| a * b).sum()` (f32 `Sum` starts at
    /// −0.0), so every dot product is bitwise that one.
    ///
    /// # Safety
    /// The CPU runs the build's instruction set.
    ///
    /// # Panics
    /// When `dk` is 0, `n` > [`KEY_STRIDE`], or `kt` or `dots` is shorter
    /// than that.
    unsafe fn dots_lower(dots: &mut [f32], xs: &[f32], dk: usize, kt: &[f32], n: usize);
}

/// Whether `m · n` values fit in `len` (false when the product overflows).
#[cfg(target_arch = "x86_64")]
fn fits(m: usize, n: usize, len: usize) -> bool {
    m.checked_mul(n).is_some_and(|p| p <= len)
}

/// One output row at a time, in loops the compiler vectorises.
pub(super) struct Lanes;

impl RowOps for Lanes {
    const GUARDS: bool = false;

    #[inline(always)]
    unsafe fn axpy_terms(
        y: &mut [f32],
        terms: impl Iterator<Item = (usize, f32)> + Clone,
        rows: &[f32],
        _ranges: &[(f32, f32)],
    ) {
        axpy_terms(y, terms, rows);
    }

    #[inline(always)]
    unsafe fn mul(a: f32, b: f32) -> f32 {
        a * b
    }

    #[inline(always)]
    unsafe fn scale(y: &mut [f32], c: f32) {
        y.iter_mut().for_each(|x| *x *= c);
    }

    #[inline(always)]
    unsafe fn dense_rows(y: &mut [f32], w: usize, c: &[f32], k: usize, src: &[f32]) {
        for (r, yr) in y.chunks_exact_mut(w).enumerate() {
            axpy_terms(yr, c[r * k..(r + 1) * k].iter().copied().enumerate(), src);
        }
    }

    #[inline(always)]
    unsafe fn dots_lower(dots: &mut [f32], xs: &[f32], dk: usize, kt: &[f32], n: usize) {
        for (i, x) in xs.chunks_exact(dk).enumerate() {
            let m = (i + 1).min(n);
            let d = &mut dots[i * KEY_STRIDE..i * KEY_STRIDE + m];
            d.iter_mut().for_each(|v| *v = -0.0);
            for (a, &xa) in x.iter().enumerate() {
                for (dj, &kv) in d.iter_mut().zip(&kt[a * KEY_STRIDE..a * KEY_STRIDE + m]) {
                    *dj += xa * kv;
                }
            }
        }
    }
}

/// Blocks of four output rows in AVX-512F registers.
#[cfg(target_arch = "x86_64")]
pub(super) struct Zmm;

/// Off x86-64 the AVX-512F head build is the portable one.
#[cfg(not(target_arch = "x86_64"))]
pub(super) type Zmm = Lanes;

#[cfg(target_arch = "x86_64")]
impl RowOps for Zmm {
    const GUARDS: bool = true;

    #[inline(always)]
    unsafe fn axpy_terms(
        y: &mut [f32],
        terms: impl Iterator<Item = (usize, f32)> + Clone,
        rows: &[f32],
        ranges: &[(f32, f32)],
    ) {
        let w = y.len();
        let full = w / L * L;
        for x0 in (0..full).step_by(L) {
            // SAFETY: AVX-512F (the caller's contract).
            unsafe { zmm::axpy_block(&mut y[x0..x0 + L], terms.clone(), (rows, w, x0), ranges) };
        }
        if full < w {
            for (j, c) in terms {
                axpy(&mut y[full..], c, &rows[j * w + full..(j + 1) * w]);
            }
        }
    }

    #[inline(always)]
    unsafe fn mul(a: f32, b: f32) -> f32 {
        // SAFETY: AVX-512F implies SSE2 (the caller's contract).
        unsafe { zmm::mul_f64_scalar(a, b) }
    }

    #[inline(always)]
    unsafe fn scale(y: &mut [f32], c: f32) {
        if !subnormal::is_tiny(c, subnormal::row_range(y)) {
            y.iter_mut().for_each(|x| *x *= c);
            return;
        }
        let mut parts = y.chunks_exact_mut(16);
        for part in &mut parts {
            // SAFETY: AVX-512F (the caller's contract).
            unsafe { zmm::scale_f64(part, c) };
        }
        for x in parts.into_remainder() {
            // SAFETY: as above.
            *x = unsafe { zmm::mul_f64_scalar(*x, c) };
        }
    }

    #[inline(always)]
    unsafe fn dense_rows(y: &mut [f32], w: usize, c: &[f32], k: usize, src: &[f32]) {
        let rows = y.len() / w;
        assert!(
            fits(rows, k, c.len()) && fits(k, w, src.len()),
            "dense_rows operands"
        );
        let full = w / L * L;
        let ranges = subnormal::ranges(src, w, k);
        let mut tiny = vec![false; k];
        let mut r0 = 0;
        while r0 < rows {
            let nr = if rows - r0 >= 4 { 4 } else { 1 };
            let (yb, cb) = (&mut y[r0 * w..(r0 + nr) * w], &c[r0 * k..(r0 + nr) * k]);
            subnormal::flag_terms(cb, k, &ranges, &mut tiny);
            for x0 in (0..full).step_by(L) {
                // SAFETY: AVX-512F (the caller's contract); the block's rows,
                // lanes x0..x0 + L ≤ w, and terms lie inside y, c and src.
                unsafe {
                    match nr {
                        4 => zmm::dense_block::<4>(yb, (w, x0), cb, (k, &tiny), src),
                        _ => zmm::dense_block::<1>(yb, (w, x0), cb, (k, &tiny), src),
                    }
                }
            }
            r0 += nr;
        }
        if full < w {
            for (r, yr) in y.chunks_exact_mut(w).enumerate() {
                let terms = c[r * k..(r + 1) * k].iter().copied().enumerate();
                for (t, ct) in terms {
                    axpy(&mut yr[full..], ct, &src[t * w + full..(t + 1) * w]);
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn dots_lower(dots: &mut [f32], xs: &[f32], dk: usize, kt: &[f32], n: usize) {
        let rows = xs.len() / dk;
        assert!(
            n <= KEY_STRIDE && fits(dk, KEY_STRIDE, kt.len()) && fits(rows, KEY_STRIDE, dots.len()),
            "dots_lower operands"
        );
        let mut i0 = 0;
        while i0 < rows {
            let nr = if rows - i0 >= 4 { 4 } else { 1 };
            // Keys 0..=i for the block's last row i, in whole vectors of 16
            // (none when n is 0: the `(4, _)` arm, in bounds all the same).
            // A row alone always takes all four vectors.
            let groups = (i0 + nr).min(n).div_ceil(16);
            let (d, x) = (&mut dots[i0 * KEY_STRIDE..], &xs[i0 * dk..(i0 + nr) * dk]);
            // SAFETY: AVX-512F (the caller's contract); the rows' KEY_STRIDE
            // lanes lie inside dots, the keys' inside kt.
            unsafe {
                match (nr, groups) {
                    (4, 1) => zmm::dots_block::<4, 1>(d, x, dk, kt),
                    (4, 2) => zmm::dots_block::<4, 2>(d, x, dk, kt),
                    (4, 3) => zmm::dots_block::<4, 3>(d, x, dk, kt),
                    (4, _) => zmm::dots_block::<4, 4>(d, x, dk, kt),
                    _ => zmm::dots_block::<1, 4>(d, x, dk, kt),
                }
            }
            i0 += nr;
        }
    }
}

mod subnormal;

pub(super) use subnormal::{ranges, row_range};

#[cfg(target_arch = "x86_64")]
mod zmm {
    use std::arch::x86_64::{
        __m512, __m512d, _mm256_castpd_ps, _mm256_castps_pd, _mm512_add_pd, _mm512_add_ps,
        _mm512_castpd_ps, _mm512_castps256_ps512, _mm512_castps512_ps256, _mm512_castps_pd,
        _mm512_cvtpd_ps, _mm512_cvtps_pd, _mm512_extractf64x4_pd, _mm512_insertf64x4,
        _mm512_loadu_ps, _mm512_mul_pd, _mm512_mul_ps, _mm512_set1_pd, _mm512_set1_ps,
        _mm512_storeu_ps, _mm_cvtsd_ss, _mm_cvtss_f32, _mm_set_sd, _mm_setzero_ps,
    };

    use super::{subnormal, KEY_STRIDE, L};

    /// Vectors of 16 lanes in a block of [`L`].
    const V: usize = L / 16;

    /// `a + c·s` on 16 f32 lanes, each operation rounded to f32 as
    /// `_mm512_add_ps(a, _mm512_mul_ps(c, s))` rounds it, computed in f64
    /// halves: the product of two f32 values is exact in f64 and one
    /// conversion rounds it; the sum of two f32 values rounded to f64 and
    /// then to f32 is the sum rounded to f32 once (53 ≥ 2·24 + 2: Figueroa,
    /// "When is double rounding innocuous?", 1995; a sum whose result is
    /// subnormal is exact in f64). Conversions to and from f32 take no
    /// microcode assist on subnormal values, where an f32 multiply with a
    /// subnormal operand or result takes one ([`subnormal`]'s measurements).
    ///
    /// # Safety
    /// AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn add_mul_f64(a: __m512, c: f32, s: __m512) -> __m512 {
        let cd = _mm512_set1_pd(f64::from(c));
        let (a_lo, a_hi) = widen(a);
        let (s_lo, s_hi) = widen(s);
        let p_lo = _mm512_cvtps_pd(_mm512_cvtpd_ps(_mm512_mul_pd(cd, s_lo)));
        let p_hi = _mm512_cvtps_pd(_mm512_cvtpd_ps(_mm512_mul_pd(cd, s_hi)));
        let lo = _mm512_cvtpd_ps(_mm512_add_pd(a_lo, p_lo));
        let hi = _mm512_cvtpd_ps(_mm512_add_pd(a_hi, p_hi));
        _mm512_castpd_ps(_mm512_insertf64x4(
            _mm512_castps_pd(_mm512_castps256_ps512(lo)),
            _mm256_castps_pd(hi),
            1,
        ))
    }

    /// `a · b` rounded to f32 as f32 multiplication rounds it, computed in
    /// f64 (exact) and converted once by `cvtsd2ss`, an instruction LLVM
    /// keeps (a plain `(a as f64 * b as f64) as f32` it folds back into an
    /// f32 multiply, assist included).
    ///
    /// # Safety
    /// SSE2.
    #[inline]
    #[target_feature(enable = "sse2")]
    pub(super) unsafe fn mul_f64_scalar(a: f32, b: f32) -> f32 {
        let p = _mm_set_sd(f64::from(a) * f64::from(b));
        _mm_cvtss_f32(_mm_cvtsd_ss(_mm_setzero_ps(), p))
    }

    /// The 16 values of `y` times `c`, each rounded to f32 as f32
    /// multiplication rounds it, computed in f64 as [`add_mul_f64`]'s product.
    ///
    /// # Safety
    /// AVX-512F.
    ///
    /// # Panics
    /// When `y` holds fewer than 16 values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scale_f64(y: &mut [f32], c: f32) {
        assert!(y.len() >= 16, "scale_f64 lanes");
        let cd = _mm512_set1_pd(f64::from(c));
        // SAFETY: y holds 16 values (asserted).
        let (lo, hi) = widen(unsafe { _mm512_loadu_ps(y.as_ptr()) });
        let lo = _mm512_cvtpd_ps(_mm512_mul_pd(cd, lo));
        let hi = _mm512_cvtpd_ps(_mm512_mul_pd(cd, hi));
        let out = _mm512_castpd_ps(_mm512_insertf64x4(
            _mm512_castps_pd(_mm512_castps256_ps512(lo)),
            _mm256_castps_pd(hi),
            1,
        ));
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(y.as_mut_ptr(), out) };
    }

    /// 16 f32 lanes as two vectors of 8 f64, low and high (exact).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn widen(x: __m512) -> (__m512d, __m512d) {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
        (
            _mm512_cvtps_pd(_mm512_castps512_ps256(x)),
            _mm512_cvtps_pd(hi),
        )
    }

    /// Lanes `x0..x0+L` of `N` rows of `y` (`w` wide) gain
    /// `Σ_t c[r·k + t] · src[t]`, `t` in order; a term `t` with `tiny[t]`
    /// set (one of its products may take an assist, `subnormal::flag_terms`)
    /// is computed in f64 ([`add_mul_f64`]), to the same bits.
    ///
    /// # Safety
    /// AVX-512F; `y` holds `N·w`, `c` `N·k`, `tiny` `k` and `src` `k·w`
    /// values, `x0 + L ≤ w`.
    #[inline(always)]
    pub(super) unsafe fn dense_block<const N: usize>(
        y: &mut [f32],
        (w, x0): (usize, usize),
        c: &[f32],
        (k, tiny): (usize, &[bool]),
        src: &[f32],
    ) {
        let (yp, cp, sp) = (y.as_mut_ptr(), c.as_ptr(), src.as_ptr());
        // SAFETY: the caller's contract bounds every offset below.
        unsafe {
            let mut acc: [[__m512; V]; N] = std::array::from_fn(|r| {
                std::array::from_fn(|v| _mm512_loadu_ps(yp.add(r * w + x0 + 16 * v)))
            });
            for t in 0..k {
                let s: [__m512; V] =
                    std::array::from_fn(|v| _mm512_loadu_ps(sp.add(t * w + x0 + 16 * v)));
                if *tiny.get_unchecked(t) {
                    for (r, ar) in acc.iter_mut().enumerate() {
                        let cr = *cp.add(r * k + t);
                        for (a, &sv) in ar.iter_mut().zip(&s) {
                            *a = add_mul_f64(*a, cr, sv);
                        }
                    }
                    continue;
                }
                for (r, ar) in acc.iter_mut().enumerate() {
                    let cr = _mm512_set1_ps(*cp.add(r * k + t));
                    for (a, &sv) in ar.iter_mut().zip(&s) {
                        *a = _mm512_add_ps(*a, _mm512_mul_ps(cr, sv));
                    }
                }
            }
            for (r, ar) in acc.iter().enumerate() {
                for (v, &a) in ar.iter().enumerate() {
                    _mm512_storeu_ps(yp.add(r * w + x0 + 16 * v), a);
                }
            }
        }
    }

    /// Lanes `x0..x0+L` of row-major `rows` (`w` wide): `y` (those `L`
    /// lanes of one output row) gains `c·rows[j]` for each term `(j, c)` in
    /// order; a term with [`subnormal::is_tiny`] on `ranges[j]` is computed
    /// in f64 ([`add_mul_f64`]), to the same bits.
    ///
    /// # Safety
    /// AVX-512F.
    ///
    /// # Panics
    /// When `y` holds fewer than `L` values, `x0 + L > w`, or a term names a
    /// row past `rows` or `ranges`.
    #[inline(always)]
    pub(super) unsafe fn axpy_block(
        y: &mut [f32],
        terms: impl Iterator<Item = (usize, f32)>,
        (rows, w, x0): (&[f32], usize, usize),
        ranges: &[(f32, f32)],
    ) {
        assert!(y.len() >= L && x0 + L <= w, "axpy_block lanes");
        let yp = y.as_mut_ptr();
        // SAFETY: AVX-512F (the caller's contract); y holds L values (asserted)
        // and each row's L lanes are a checked slice.
        unsafe {
            let mut acc: [__m512; V] = std::array::from_fn(|v| _mm512_loadu_ps(yp.add(16 * v)));
            for (j, c) in terms {
                let r = &rows[j * w + x0..j * w + x0 + L];
                let s: [__m512; V] =
                    std::array::from_fn(|v| _mm512_loadu_ps(r.as_ptr().add(16 * v)));
                if subnormal::is_tiny(c, ranges[j]) {
                    for (a, &sv) in acc.iter_mut().zip(&s) {
                        *a = add_mul_f64(*a, c, sv);
                    }
                } else {
                    let cv = _mm512_set1_ps(c);
                    for (a, &sv) in acc.iter_mut().zip(&s) {
                        *a = _mm512_add_ps(*a, _mm512_mul_ps(cv, sv));
                    }
                }
            }
            for (v, &a) in acc.iter().enumerate() {
                _mm512_storeu_ps(yp.add(16 * v), a);
            }
        }
    }

    /// The dot products of `N` rows of `xs` with the first `16·G` keys of
    /// `kt`, into rows of `dots` (stride [`KEY_STRIDE`]).
    ///
    /// # Safety
    /// AVX-512F; `xs` holds `N·dk` values, `kt` `dk·KEY_STRIDE`, `dots`
    /// `N·KEY_STRIDE` (the last row's lanes past 16·G excepted), `16·G ≤ KEY_STRIDE`.
    #[inline(always)]
    pub(super) unsafe fn dots_block<const N: usize, const G: usize>(
        dots: &mut [f32],
        xs: &[f32],
        dk: usize,
        kt: &[f32],
    ) {
        let (dp, xp, kp) = (dots.as_mut_ptr(), xs.as_ptr(), kt.as_ptr());
        // SAFETY: the caller's contract bounds every offset below.
        unsafe {
            let mut acc: [[__m512; G]; N] = [[_mm512_set1_ps(-0.0); G]; N];
            for a in 0..dk {
                let key: [__m512; G] =
                    std::array::from_fn(|g| _mm512_loadu_ps(kp.add(a * KEY_STRIDE + 16 * g)));
                for (r, ar) in acc.iter_mut().enumerate() {
                    let x = _mm512_set1_ps(*xp.add(r * dk + a));
                    for (d, &kv) in ar.iter_mut().zip(&key) {
                        *d = _mm512_add_ps(*d, _mm512_mul_ps(x, kv));
                    }
                }
            }
            for (r, ar) in acc.iter().enumerate() {
                for (g, &d) in ar.iter().enumerate() {
                    _mm512_storeu_ps(dp.add(r * KEY_STRIDE + 16 * g), d);
                }
            }
        }
    }
}
