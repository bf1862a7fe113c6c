//! The delta-rule kernels of [`super::gated_delta_net`]: the recurrent and the
//! chunked form of `modeling_qwen3_5.py`'s `torch_recurrent_gated_delta_rule`
//! and `torch_chunk_gated_delta_rule` over f32 buffers, one rayon task per
//! head. Each head's loop is compiled three times, portable, for AVX2 and for
//! AVX-512F, and the widest build the CPU has runs
//! ([`crate::kernels::capabilities`], recorded as `delta-rule-avx512` or
//! `delta-rule-avx2`; `HSPARITY_NO_AVX512_DELTA` keeps it to AVX2). Every
//! build gives each element the same operations in the same order, each
//! rounded to f32 once (rustc never lets LLVM contract a multiply and an add
//! into an FMA, even where the target feature has one, and no sum is
//! reassociated), so every build gives bitwise the same values, NaNs'
//! payloads aside (tested in `delta_rule/tests.rs`; a disassembly of the
//! AVX-512F build shows zmm arithmetic and no `vfmadd`). The AVX-512F build
//! computes the operations that would take a microcode assist in f64, each
//! rounded to f32 as the f32 operation rounds it ([`rows`]). In that build
//! the chunked head's dense updates (`U − W S`, `(Q e^γ) S`, the state's) and its dot products
//! with the chunk's keys run on blocks of four output rows ([`rows::Zmm`]):
//! each element gets the same terms in the same order as one row at a time,
//! and each source row is loaded once per four output rows.

use rayon::prelude::*;

use self::rows::{Lanes, RowOps};
use super::gated_delta_net::{DeltaRuleInputs, CHUNK_SIZE};

// kt holds a chunk's keys as the first CHUNK_SIZE of KEY_STRIDE columns.
const _: () = assert!(CHUNK_SIZE <= rows::KEY_STRIDE);

/// One head's q, k, v, g, β (see [`per_head`]).
type Head = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

/// Per row, the coefficient magnitudes whose products with it take an
/// assist ([`rows::ranges`]).
type Ranges = Vec<(f32, f32)>;

/// `(T, dk, dv)`.
type Dims = (usize, usize, usize);

/// A head kernel: the head's inputs, its state (in and out), the dims; its outputs `[T·dv]`.
type HeadKernel = fn(&Head, &mut [f32], Dims) -> Vec<f32>;

/// A head kernel compiled for an instruction set (call only where the CPU has it).
type WideKernel = unsafe fn(&Head, &mut [f32], Dims) -> Vec<f32>;

/// One head kernel in its three builds: portable, AVX2, AVX-512F (off
/// x86-64 only the portable one runs).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Builds {
    portable: HeadKernel,
    avx2: WideKernel,
    avx512: WideKernel,
}

/// The widest build this CPU runs: AVX-512F, else AVX2, else portable.
#[inline(always)]
fn on_widest(k: Builds, h: &Head, s: &mut [f32], d: Dims) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    {
        let caps = crate::kernels::capabilities();
        if caps.avx512f && !caps.no_avx512_delta {
            crate::kernels::Kernel::DeltaRuleAvx512.record();
            // SAFETY: the CPU has AVX-512F (read from CPUID with the capabilities).
            return unsafe { (k.avx512)(h, s, d) };
        }
        if caps.avx2 {
            crate::kernels::Kernel::DeltaRuleAvx2.record();
            // SAFETY: the CPU has AVX2 (read from CPUID with the capabilities).
            return unsafe { (k.avx2)(h, s, d) };
        }
    }
    (k.portable)(h, s, d)
}

/// `kernel` on every head of `inp` (one rayon task per head; heads are
/// independent), `state` split per head; the outputs as `[T, heads, dv]`.
fn over_heads(inp: &DeltaRuleInputs, state: &mut [f32], k: Builds) -> Vec<f32> {
    let (t, dk, dv) = (inp.t, inp.dk, inp.dv);
    let per: Vec<Vec<f32>> = per_head(inp)
        .par_iter()
        .zip(state.par_chunks_mut(dk * dv))
        .map(|(h, s)| on_widest(k, h, s, (t, dk, dv)))
        .collect();
    interleave_heads(&per, t, dv)
}

/// [`recurrent_head`] compiled for AVX2 (call only where the CPU has it).
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2"))]
unsafe fn recurrent_head_avx2(h: &Head, s: &mut [f32], d: Dims) -> Vec<f32> {
    recurrent_head(h, s, d)
}

/// [`chunked_head`] compiled for AVX2 (call only where the CPU has it).
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx2"))]
unsafe fn chunked_head_avx2(h: &Head, s: &mut [f32], d: Dims) -> Vec<f32> {
    // SAFETY: `Lanes` is plain Rust.
    unsafe { chunked_head::<Lanes>(h, s, d) }
}

/// [`recurrent_head`] compiled for AVX-512F (call only where the CPU has it).
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f"))]
unsafe fn recurrent_head_avx512(h: &Head, s: &mut [f32], d: Dims) -> Vec<f32> {
    recurrent_head(h, s, d)
}

/// [`chunked_head`] compiled for AVX-512F (call only where the CPU has it).
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f"))]
unsafe fn chunked_head_avx512(h: &Head, s: &mut [f32], d: Dims) -> Vec<f32> {
    // SAFETY: the CPU has AVX-512F (this function's contract).
    unsafe { chunked_head::<rows::Zmm>(h, s, d) }
}

/// The recurrent head's builds.
const RECURRENT: Builds = Builds {
    portable: recurrent_head,
    avx2: recurrent_head_avx2,
    avx512: recurrent_head_avx512,
};

/// [`chunked_head`] in plain Rust.
fn chunked_head_portable(h: &Head, s: &mut [f32], d: Dims) -> Vec<f32> {
    // SAFETY: `Lanes` is plain Rust.
    unsafe { chunked_head::<Lanes>(h, s, d) }
}

/// The chunked head's builds.
const CHUNKED: Builds = Builds {
    portable: chunked_head_portable,
    avx2: chunked_head_avx2,
    avx512: chunked_head_avx512,
};

/// `x · rsqrt(Σx² + 1e-6)` in place (transformers' `l2norm`, eps fixed at 1e-6).
fn l2norm(x: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let r = 1.0 / (ss + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= r);
}

/// Per-head copies of q (normalised and scaled by `dk^-1/2`), k (normalised),
/// v, g, β: `[heads][T·d]`.
fn per_head(inp: &DeltaRuleInputs) -> Vec<Head> {
    let (t, nh, dk, dv) = (inp.t, inp.heads, inp.dk, inp.dv);
    let scale = 1.0 / (dk as f32).sqrt();
    (0..nh)
        .into_par_iter()
        .map(|h| {
            let mut q = Vec::with_capacity(t * dk);
            let mut k = Vec::with_capacity(t * dk);
            let mut v = Vec::with_capacity(t * dv);
            for i in 0..t {
                let off = (i * nh + h) * dk;
                let mut qi = inp.q[off..off + dk].to_vec();
                l2norm(&mut qi);
                qi.iter_mut().for_each(|x| *x *= scale);
                q.extend_from_slice(&qi);
                let mut ki = inp.k[off..off + dk].to_vec();
                l2norm(&mut ki);
                k.extend_from_slice(&ki);
                let voff = (i * nh + h) * dv;
                v.extend_from_slice(&inp.v[voff..voff + dv]);
            }
            let g = (0..t).map(|i| inp.g[i * nh + h]).collect();
            let b = (0..t).map(|i| inp.beta[i * nh + h]).collect();
            (q, k, v, g, b)
        })
        .collect()
}

/// Recurrent form (`torch_recurrent_gated_delta_rule`): per head, with state
/// `S ∈ R^{dk×dv}`, for each token
/// `S ← e^{g}S; u = Sᵀk; S ← S + k ⊗ β(v − u); o = Sᵀq`.
///
/// `state`: `[heads, dk, dv]`, read as the initial state and overwritten with
/// the final one. Returns `o`: `[T, heads, dv]`.
pub fn recurrent(inp: &DeltaRuleInputs, state: &mut [f32]) -> Vec<f32> {
    over_heads(inp, state, RECURRENT)
}

/// One head of [`recurrent`]: `s` is its `[dk, dv]` state.
#[inline(always)]
fn recurrent_head((q, k, v, g, b): &Head, s: &mut [f32], (t, dk, dv): Dims) -> Vec<f32> {
    let mut oh = vec![0f32; t * dv];
    let mut u = vec![0f32; dv];
    for i in 0..t {
        let decay = g[i].exp();
        s.iter_mut().for_each(|x| *x *= decay);
        let ki = &k[i * dk..(i + 1) * dk];
        let qi = &q[i * dk..(i + 1) * dk];
        let vi = &v[i * dv..(i + 1) * dv];
        u.iter_mut().for_each(|x| *x = 0.0);
        for (a, &kv) in ki.iter().enumerate() {
            let row = &s[a * dv..(a + 1) * dv];
            for (uj, &sj) in u.iter_mut().zip(row) {
                *uj += sj * kv;
            }
        }
        for (uj, &vj) in u.iter_mut().zip(vi) {
            *uj = (vj - *uj) * b[i];
        }
        for (a, &kv) in ki.iter().enumerate() {
            let row = &mut s[a * dv..(a + 1) * dv];
            for (sj, &dj) in row.iter_mut().zip(&u) {
                *sj += kv * dj;
            }
        }
        let o = &mut oh[i * dv..(i + 1) * dv];
        for (a, &qv) in qi.iter().enumerate() {
            let row = &s[a * dv..(a + 1) * dv];
            for (oj, &sj) in o.iter_mut().zip(row) {
                *oj += sj * qv;
            }
        }
    }
    oh
}

/// Per-head outputs `[heads][T·dv]` → `[T, heads, dv]`.
fn interleave_heads(per: &[Vec<f32>], t: usize, dv: usize) -> Vec<f32> {
    let nh = per.len();
    let mut out = vec![0f32; t * nh * dv];
    out.par_chunks_mut((nh * dv).max(1))
        .enumerate()
        .for_each(|(i, row)| {
            for (h, oh) in per.iter().enumerate() {
                row[h * dv..(h + 1) * dv].copy_from_slice(&oh[i * dv..(i + 1) * dv]);
            }
        });
    out
}

/// Chunked form (`torch_chunk_gated_delta_rule`, transformers 5.23.0): the
/// sequence is cut into chunks of [`CHUNK_SIZE`]; inside a chunk, with
/// `γ = cumsum(g)`, `Γ_ij = e^{γ_i−γ_j}` (j ≤ i) and
/// `L = strict_lower((β⊙K)Kᵀ ⊙ Γ)`, it solves `(I+L)U = β⊙V`,
/// `(I+L)W = β⊙K⊙e^{γ}` by forward substitution (the reference calls
/// `solve_triangular`), then per chunk `v_new = U − WS`,
/// `o = (Q⊙e^{γ})S + ((QKᵀ)⊙Γ)v_new`, `S ← e^{γ_L}S + (K⊙e^{γ_L−γ})ᵀ v_new`.
/// A short last chunk is processed at its length: zero padding, as in the
/// reference, changes neither outputs nor the final state.
///
/// `state`: `[heads, dk, dv]`, initial state in, final state out. Returns
/// `o`: `[T, heads, dv]`.
pub fn chunked(inp: &DeltaRuleInputs, state: &mut [f32]) -> Vec<f32> {
    over_heads(inp, state, CHUNKED)
}

/// One head of [`chunked`]: `s` is its `[dk, dv]` state.
///
/// # Safety
/// The CPU runs `O`'s instruction set.
#[inline(always)]
unsafe fn chunked_head<O: RowOps>(
    (q, k, v, g, b): &Head,
    s: &mut [f32],
    (t, dk, dv): Dims,
) -> Vec<f32> {
    let mut oh = vec![0f32; t * dv];
    let c = CHUNK_SIZE;
    // Per-chunk scratch, made once per head: every element a chunk reads it
    // writes first (dots, decay and L at j ≤ i and j < i, U and W row by
    // row, the coefficient rows whole); kt's columns past a short chunk's
    // length are read by the dot blocks and never used.
    let mut kt = vec![0f32; dk * rows::KEY_STRIDE];
    let (mut gam_buf, mut kf_buf) = (vec![0f32; c], vec![0f32; dk]);
    let (mut decay_buf, mut l_buf) = (vec![0f32; c * c], vec![0f32; c * c]);
    let mut dots_buf = vec![0f32; c * rows::KEY_STRIDE];
    let (mut u_buf, mut w_buf) = (vec![0f32; c * dv], vec![0f32; c * dk]);
    let mut coef = vec![0f32; c * dk];
    // Per row of U and W, where its products may take an assist; a row's
    // terms (its substitution's, then its v_new terms in o).
    let (mut u_rng, mut w_rng) = (Vec::with_capacity(c), Vec::with_capacity(c));
    let mut terms = Vec::with_capacity(c);
    let mut start = 0;
    while start < t {
        let n = CHUNK_SIZE.min(t - start);
        let qc = &q[start * dk..(start + n) * dk];
        let kc = &k[start * dk..(start + n) * dk];
        let vc = &v[start * dv..(start + n) * dv];
        let bc = &b[start..start + n];
        let gam = &mut gam_buf[..n];
        let mut acc = 0f32;
        for i in 0..n {
            acc += g[start + i];
            gam[i] = acc;
        }
        // kt = kcᵀ ([dk, KEY_STRIDE]): the dot products of a row with every
        // key of the chunk run in parallel lanes.
        for j in 0..n {
            for a in 0..dk {
                kt[a * rows::KEY_STRIDE + j] = kc[j * dk + a];
            }
        }
        let dots = &mut dots_buf[..n * rows::KEY_STRIDE];
        // SAFETY: the CPU runs O's instruction set (this function's contract).
        unsafe { O::dots_lower(dots, kc, dk, &kt, n) };
        let (decay, l) = (&mut decay_buf[..n * n], &mut l_buf[..n * n]);
        // SAFETY: the CPU runs O's instruction set (this function's contract).
        unsafe { decay_and_l::<O>(gam, dots, bc, decay, l) };
        let u = &mut u_buf[..n * dv];
        let w = &mut w_buf[..n * dk];
        let scratch = (&mut u_rng, &mut w_rng, &mut terms);
        // SAFETY: as above.
        unsafe { substitute::<O>((u, w), (vc, kc, bc, gam), l, scratch) };
        // v_new = U − W S: row i's terms are (a, −W[i][a]).
        let v_new = u;
        let cw = &mut coef[..n * dk];
        cw.iter_mut().zip(w.iter()).for_each(|(c, &wa)| *c = -wa);
        // SAFETY: as above.
        unsafe { O::dense_rows(v_new, dv, cw, dk, s) };
        // o = (Q e^γ) S + ((Q Kᵀ) ⊙ Γ) v_new: row i's terms are first
        // (a, Q[i][a] e^{γ_i}) on S, then (j, (q_i·k_j) Γ_ij) on v_new.
        let o = &mut oh[start * dv..(start + n) * dv];
        let cq = &mut coef[..n * dk];
        for ((cr, qr), &gi) in cq
            .chunks_exact_mut(dk)
            .zip(qc.chunks_exact(dk))
            .zip(gam.iter())
        {
            cr.copy_from_slice(qr);
            // SAFETY: as above.
            unsafe { O::scale(cr, gi.exp()) };
        }
        // SAFETY: as above. The query·key dot products take the place of
        // the key·key ones, which L has used.
        unsafe {
            O::dense_rows(o, dv, cq, dk, s);
            O::dots_lower(dots, qc, dk, &kt, n);
        }
        let vn_rng = if O::GUARDS {
            rows::ranges(v_new, dv, n)
        } else {
            Vec::new()
        };
        for i in 0..n {
            // Row i's coefficients once (each lane block of the row reads them).
            let d = &dots[i * rows::KEY_STRIDE..];
            terms.clear();
            // SAFETY (`mul`): as above.
            terms.extend((0..=i).map(|j| (j, unsafe { O::mul(d[j], decay[i * n + j]) })));
            let row = &mut o[i * dv..(i + 1) * dv];
            // SAFETY: as above.
            unsafe { O::axpy_terms(row, terms.iter().copied(), v_new, &vn_rng) };
        }
        // S ← e^{γ_last} S + Σ_i (k_i e^{γ_last−γ_i}) ⊗ v_new_i: row a's
        // terms are (i, K[i][a] e^{γ_last−γ_i}).
        let glast = gam[n - 1];
        // SAFETY: as above.
        unsafe { O::scale(s, glast.exp()) };
        let cs = &mut coef[..dk * n];
        let kf = &mut kf_buf[..dk];
        for (i, (kr, &gi)) in kc.chunks_exact(dk).zip(gam.iter()).enumerate() {
            kf.copy_from_slice(kr);
            // SAFETY: as above.
            unsafe { O::scale(kf, (glast - gi).exp()) };
            for (a, &x) in kf.iter().enumerate() {
                cs[a * n + i] = x;
            }
        }
        // SAFETY: as above.
        unsafe { O::dense_rows(s, dv, cs, n, v_new) };
        start += n;
    }
    oh
}

/// Forward substitution: `U = (I+L)^{-1} βV` and `W = (I+L)^{-1} βK e^γ`
/// into `u` `[n, dv]` and `w` `[n, dk]`, row by row, from the chunk's values,
/// keys, β and γ and its `L` (`[n, n]`); where `O` guards, the two
/// [`Ranges`] get each finished row's [`rows::ranges`]. `terms` is scratch.
///
/// # Safety
/// The CPU runs `O`'s instruction set.
#[inline(always)]
unsafe fn substitute<O: RowOps>(
    (u, w): (&mut [f32], &mut [f32]),
    (vc, kc, bc, gam): (&[f32], &[f32], &[f32], &[f32]),
    l: &[f32],
    (u_rng, w_rng, terms): (&mut Ranges, &mut Ranges, &mut Vec<(usize, f32)>),
) {
    let n = gam.len();
    let (dv, dk) = (u.len() / n, w.len() / n);
    u_rng.clear();
    w_rng.clear();
    for i in 0..n {
        let bi = bc[i];
        let (ur, vr) = (&mut u[i * dv..(i + 1) * dv], &vc[i * dv..(i + 1) * dv]);
        ur.iter_mut().zip(vr).for_each(|(x, &vx)| *x = bi * vx);
        let (wr, kr) = (&mut w[i * dk..(i + 1) * dk], &kc[i * dk..(i + 1) * dk]);
        wr.iter_mut().zip(kr).for_each(|(x, &kx)| *x = bi * kx);
        // SAFETY: the CPU runs O's instruction set (this function's contract).
        unsafe { O::scale(wr, gam[i].exp()) };
        // The earlier rows with a non-zero L[i][j] (a zero one is skipped:
        // adding its product could turn a −0 into +0).
        terms.clear();
        terms.extend(
            (0..i)
                .filter(|&j| l[i * n + j] != 0.0)
                .map(|j| (j, -l[i * n + j])),
        );
        let (ub, ui) = u.split_at_mut(i * dv);
        // SAFETY: as above.
        unsafe { O::axpy_terms(&mut ui[..dv], terms.iter().copied(), ub, u_rng) };
        let (wb, wi) = w.split_at_mut(i * dk);
        // SAFETY: as above.
        unsafe { O::axpy_terms(&mut wi[..dk], terms.iter().copied(), wb, w_rng) };
        if O::GUARDS {
            u_rng.push(rows::row_range(&ui[..dv]));
            w_rng.push(rows::row_range(&wi[..dk]));
        }
    }
}

/// `decay[i][j] = exp(γ_i − γ_j)` for j ≤ i, and
/// `L[i][j] = β_i (k_i·k_j) Γ_ij` for j < i from the keys' dot products
/// (rows of [`rows::KEY_STRIDE`]); both `[n, n]` for a chunk of `n = γ.len()`.
///
/// # Safety
/// The CPU runs `O`'s instruction set.
#[inline(always)]
unsafe fn decay_and_l<O: RowOps>(
    gam: &[f32],
    dots: &[f32],
    bc: &[f32],
    decay: &mut [f32],
    l: &mut [f32],
) {
    let n = gam.len();
    for i in 0..n {
        for j in 0..=i {
            decay[i * n + j] = (gam[i] - gam[j]).exp();
        }
    }
    for i in 0..n {
        for j in 0..i {
            // SAFETY: the CPU runs O's instruction set (this function's contract).
            l[i * n + j] = unsafe {
                O::mul(
                    O::mul(bc[i], dots[i * rows::KEY_STRIDE + j]),
                    decay[i * n + j],
                )
            };
        }
    }
}

mod rows;

#[cfg(test)]
mod tests;
