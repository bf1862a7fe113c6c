//! `x · Wᵀ` on bf16 operands with Intel AMX tiles (AMX-BF16 `TDPBF16PS`):
//! the products of a model computing in bf16, at the tile unit's rate.
//!
//! **Its sums are not candle's.** `TDPBF16PS` adds the 32 products of one
//! tile step (16 bf16 pairs) to an f32 accumulator its own way: measured by
//! `examples/amx_probe.rs`, it sums a step's products into one value (small
//! terms kept together, a tiny term lost next to a large one) before one
//! rounded addition, where candle adds each exact product with its own
//! rounding. No order of candle's exists that the tiles compute
//! (`docs/performance.md`, "Can an AMX kernel keep candle's sums?"), so this
//! kernel's outputs part from the AVX512-BF16 kernel's and candle's by the
//! reordering of f32 sums — the difference the noise floor measures
//! (`docs/noise-floor.md`) — and a report says it ran
//! (`environment.kernels.ran`: `bf16-gemm-amx`). `HSPARITY_NO_AMX=1` turns
//! it off, giving candle's sums on every CPU.
//!
//! Like `vdpbf16ps` (the AVX512-BF16 kernel), the instruction treats
//! subnormal inputs and results as zero where candle's FMA keeps them: a
//! bf16 subnormal (below 1.2e-38 in magnitude, which no checkpoint weight or
//! normalised activation is in practice) gives 0.
//!
//! Its own order, the one its reference test computes one tile at a time
//! (`tests/amx_kernel.rs`): each output starts at +0 and takes the
//! weight's k-pairs 16 at a time in increasing k (the last step padded with
//! zero products), one `TDPBF16PS` per step, with the two bf16 values of a
//! pair in the order [`Pairs`] holds them; the result does not depend on
//! the shape, the tiling, the threads or the rows beside it, so stacked
//! sequences get the same bits as alone.
//!
//! Layout: `TDPBF16PS` multiplies an A tile (16 rows × 16 bf16 pairs) by a
//! B tile (16 pairs × 16 columns, pair-interleaved); the weight's rows are
//! A tiles as [`Pairs`] holds them (row stride `K/2` words, no copy), and
//! the input is packed into B tiles once per call, so each C tile is
//! 16 weight rows × 16 tokens, written transposed into the `[m, n]` output.
//! Four C tiles (32 rows × 32 tokens) stay in tile registers over the whole
//! k loop; the weight rows are split over the threads and the tokens walked
//! in chunks of [`M_CHUNK`].
//!
//! Linux hands a process the tile state on request only
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, made once in
//! [`detect`]); elsewhere the kernel is never planned.

use std::arch::asm;

use rayon::prelude::*;

use super::tiles;
use crate::kernels::Pairs;

/// Tokens per chunk: each chunk's weight pass reads every weight row once
/// for this many tokens, and its packed input (`M_CHUNK × K` bf16, 1 MiB at
/// K = 1024) stays in L2 while the threads pass their rows over it
/// (`examples/gemm_bench.rs` on the Sapphire Rapids VM: 512 beat 128 by
/// 4–15 % and 2048 on 2048 rows by 19 %).
const M_CHUNK: usize = 512;
/// Weight rows per task: two A tiles.
const ROWS: usize = 32;

/// `ldtilecfg`'s 64-byte palette-1 configuration.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// Every tile this kernel uses (0–7) at 16 rows × 64 bytes: C tiles 0–3
/// (16 × 16 f32), A tiles 4–5 (16 rows × 16 pairs), B tiles 6–7 (16 pairs ×
/// 16 columns).
///
/// # Safety
/// The process holds the tile state ([`detect`]).
unsafe fn configure() {
    let mut cfg = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    for t in 0..8 {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    asm!("ldtilecfg [{}]", in(reg) &cfg as *const TileConfig, options(nostack, readonly));
}

/// `(ready, refused)`: ready when the CPU has AMX-BF16 and AMX-TILE (CPUID
/// leaf 7, EDX bits 22 and 24), Linux granted the tile state, and a tile
/// product of known values gives the exact sum (the tiles work here);
/// refused when the CPU has them but the OS did not grant the state (a
/// kernel before Linux 5.16, a sandbox, another OS).
pub(super) fn detect() -> (bool, bool) {
    use std::arch::x86_64::__cpuid_count;
    // Leaf 7 is read only when the maximum leaf reaches it.
    let has = __cpuid_count(0, 0).eax >= 7 && {
        let edx = __cpuid_count(7, 0).edx;
        edx & (1 << 22) != 0 && edx & (1 << 24) != 0
    };
    if !has {
        return (false, false);
    }
    if !request_tiles() {
        return (false, true);
    }
    // SAFETY: the tile state is granted before the probe's tile instructions.
    (unsafe { exact_on_known_values() }, false)
}

/// Asks Linux for the tile data state, which a process must hold before its
/// first tile instruction.
#[cfg(target_os = "linux")]
fn request_tiles() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: the syscall takes two integers and touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tiles() -> bool {
    false
}

/// One tile product whose sums are exact in f32 (rows of small integers):
/// row `i` of A holds `i + 1` in every element, column `j` of B holds
/// `j − 8` in every element, so output `(i, j)` is `32·(i + 1)·(j − 8)`.
///
/// # Safety
/// The process holds the tile state.
unsafe fn exact_on_known_values() -> bool {
    let bf = |v: f32| u32::from(half::bf16::from_f32(v).to_bits());
    let a: Vec<u32> = (0..256)
        .map(|e| bf((e / 16 + 1) as f32) * 0x1_0001)
        .collect();
    let b: Vec<u32> = (0..256)
        .map(|e| bf((e % 16) as f32 - 8.0) * 0x1_0001)
        .collect();
    let mut c = [0f32; 256];
    configure();
    asm!(
        "tilezero tmm0",
        "tileloadd tmm4, [{a} + {s}*1]",
        "tileloadd tmm6, [{b} + {s}*1]",
        "tdpbf16ps tmm0, tmm4, tmm6",
        "tilestored [{c} + {s}*1], tmm0",
        a = in(reg) a.as_ptr(),
        b = in(reg) b.as_ptr(),
        c = in(reg) c.as_mut_ptr(),
        s = in(reg) 64usize,
        options(nostack),
    );
    asm!("tilerelease", options(nostack, nomem));
    (0..256).all(|e| c[e] == (32 * (e / 16 + 1)) as f32 * ((e % 16) as f32 - 8.0))
}

/// `x [m, k]` (f32 holding bf16 values) `· w [n, k]ᵀ` (its pairs) → `[m, n]`
/// f32, not rounded, in this kernel's order (the module's docs). `None`
/// when an input value is not a bf16 value.
///
/// # Safety
/// [`detect`] returned true in this process; `x` holds `m·k` values and `w`
/// is `[n, k]`.
pub(super) unsafe fn matmul_nt(
    x: &[f32],
    w: &Pairs,
    (m, n, k): (usize, usize, usize),
) -> Option<Vec<f32>> {
    debug_assert!(
        m > 0 && n > 0 && k > 0,
        "planned only on candle's blocked route"
    );
    let pairs = k.div_ceil(2);
    let steps = pairs.div_ceil(16);
    // Tokens in groups of 16 (a B tile's columns), an even number of groups.
    let groups = m.div_ceil(16).next_multiple_of(2);
    let b = tiles::pack_pairs(x, (m, k), groups, steps * 16)?;
    let mut out = vec![0f32; m * n];
    let o = tiles::Out(out.as_mut_ptr());
    let shape = Shape { m, n, pairs, steps };
    for g0 in (0..groups).step_by(M_CHUNK / 16) {
        let g1 = (g0 + M_CHUNK / 16).min(groups);
        (0..n.div_ceil(ROWS)).into_par_iter().for_each(|task| {
            let rows = Rows::of(w, task * ROWS, shape);
            // SAFETY: the caller's contract; `rows` and `b` hold every tile
            // the task loads, and the task writes only its own columns.
            unsafe { task_tiles(&rows, &b, (g0, g1), shape, o.ptr()) };
        });
    }
    Some(out)
}

/// A product's dimensions as the tasks see them.
#[derive(Clone, Copy)]
struct Shape {
    m: usize,
    n: usize,
    /// k-pairs per weight row.
    pairs: usize,
    /// Tile steps over k (16 pairs each).
    steps: usize,
}

/// A task's 32 weight rows as A tiles: in place (row stride `pairs` words)
/// when the task holds 32 rows and the last step is whole; a zero-padded
/// copy of the rows, or of the last step, otherwise.
struct Rows<'a> {
    /// The first row.
    r0: usize,
    /// The weight's words from row `r0` on, `pairs` per row.
    words: &'a [u32],
    pairs: usize,
    /// Fewer than 32 rows: all of them, `steps·16` words per row, zero past
    /// the weight's rows and pairs.
    padded: Option<Vec<u32>>,
    /// The last step when it is partial: 32 rows × 16 words, zero past the
    /// row's end.
    tail: Option<Vec<u32>>,
}

impl<'a> Rows<'a> {
    fn of(w: &'a Pairs, r0: usize, s: Shape) -> Rows<'a> {
        let words = &w.words()[r0 * s.pairs..];
        let have = ROWS.min(s.n - r0);
        let padded = (have < ROWS).then(|| {
            let stride = s.steps * 16;
            let mut copy = vec![0u32; ROWS * stride];
            for (r, row) in words.chunks(s.pairs).take(have).enumerate() {
                copy[r * stride..r * stride + s.pairs].copy_from_slice(row);
            }
            copy
        });
        let tail = (padded.is_none() && !s.pairs.is_multiple_of(16)).then(|| {
            let (from, len) = ((s.steps - 1) * 16, s.pairs % 16);
            let mut t = vec![0u32; ROWS * 16];
            for (r, row) in words.chunks(s.pairs).take(ROWS).enumerate() {
                t[r * 16..r * 16 + len].copy_from_slice(&row[from..from + len]);
            }
            t
        });
        Rows {
            r0,
            words,
            pairs: s.pairs,
            padded,
            tail,
        }
    }

    /// A tile `half` (0: rows 0–15, 1: rows 16–31) of step `step`: its
    /// first word and its row stride in bytes.
    fn tile(&self, half: usize, step: usize, steps: usize) -> (*const u32, usize) {
        match (&self.padded, &self.tail) {
            (Some(p), _) => (p[half * 16 * steps * 16 + step * 16..].as_ptr(), steps * 64),
            (None, Some(t)) if step + 1 == steps => (t[half * 256..].as_ptr(), 64),
            _ => (
                self.words[half * 16 * self.pairs + step * 16..].as_ptr(),
                self.pairs * 4,
            ),
        }
    }
}

/// One task: its 32 weight rows against token groups `g0..g1`, two groups
/// (32 tokens) at a time, four C tiles over the whole k loop.
///
/// # Safety
/// As [`matmul_nt`]; `b` is [`tiles::pack_pairs`]' output for `groups ≥ g1`
/// (an even number) and `steps·16` pairs; `out` is the `[m, n]` output.
#[inline(never)]
unsafe fn task_tiles(
    rows: &Rows<'_>,
    b: &[u32],
    (g0, g1): (usize, usize),
    s: Shape,
    out: *mut f32,
) {
    configure();
    let group_words = s.steps * 16 * 16;
    let mut c = [0f32; 4 * 256];
    for g in (g0..g1).step_by(2) {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        for step in 0..s.steps {
            let (a0, sa0) = rows.tile(0, step, s.steps);
            let (a1, sa1) = rows.tile(1, step, s.steps);
            let b0 = b[g * group_words + step * 256..].as_ptr();
            let b1 = b[(g + 1) * group_words + step * 256..].as_ptr();
            asm!(
                "tileloadd tmm4, [{a0} + {sa0}*1]",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{b1} + {sb}*1]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{a1} + {sa1}*1]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a0,
                sa0 = in(reg) sa0,
                a1 = in(reg) a1,
                sa1 = in(reg) sa1,
                b0 = in(reg) b0,
                b1 = in(reg) b1,
                sb = in(reg) 64usize,
                options(nostack, readonly),
            );
        }
        asm!(
            "tilestored [{c} + {s}*1], tmm0",
            "tilestored [{c1} + {s}*1], tmm1",
            "tilestored [{c2} + {s}*1], tmm2",
            "tilestored [{c3} + {s}*1], tmm3",
            c = in(reg) c.as_mut_ptr(),
            c1 = in(reg) c.as_mut_ptr().add(256),
            c2 = in(reg) c.as_mut_ptr().add(512),
            c3 = in(reg) c.as_mut_ptr().add(768),
            s = in(reg) 64usize,
            options(nostack),
        );
        // Tile (half, col): rows r0 + 16·half + i, tokens 16·(g + col) + j.
        for (t, tile) in c.chunks_exact(256).enumerate() {
            let (half, col) = (t / 2, t % 2);
            let r = rows.r0 + 16 * half;
            let cols = 16.min(s.n.saturating_sub(r));
            for j in 0..16 {
                let token = 16 * (g + col) + j;
                if token >= s.m {
                    break;
                }
                let o = out.add(token * s.n + r);
                for i in 0..cols {
                    *o.add(i) = tile[i * 16 + j];
                }
            }
        }
    }
    // Hand the tile state back (Intel's advice: a thread holding it has it
    // saved on every context switch).
    asm!("tilerelease", options(nostack, nomem));
}
