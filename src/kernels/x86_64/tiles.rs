//! The blocked layout the two blocked kernels share (`bf16_gemm`,
//! `f32_gemm`): the input packed 16 rows per vector (one lane per
//! row), register tiles of `MV` row vectors × up to [`NR`] output columns,
//! column tiles split over the threads, rows walked in cache blocks of
//! [`MB`]. Where candle's f32 GEMM takes its blocked kernel
//! ([`crate::kernels::Route::Blocked`]), a kernel that sums in the same
//! k-blocks, one rounded addition per k in increasing k, gives its bits
//! whatever the tile shape.

/// Output columns per register tile here (lanes are rows: 16 per vector).
pub(super) const NR: usize = 12;
/// Row vectors per register tile (16 rows each).
pub(super) const MV: usize = 2;
/// Rows per cache block (their packed values stay in L2 while a thread's
/// column tiles pass over them).
const MB: usize = 128;

/// `$kernel::<V, C>($a, $b, $c, $t)` for the tile's `V = $t.gv` row
/// vectors (1 or [`MV`]) and `C = $t.nc` columns (1 to [`NR`]): the kernels
/// take their tile shape as const parameters, so the loops unroll.
macro_rules! by_shape {
    ($kernel:ident, $a:expr, $b:expr, $c:expr, $t:expr) => {
        match $t.gv {
            1 => $crate::kernels::x86_64::tiles::cols!($kernel, 1, $a, $b, $c, $t),
            _ => $crate::kernels::x86_64::tiles::cols!($kernel, 2, $a, $b, $c, $t),
        }
    };
}

/// [`by_shape`] for `V` row vectors.
macro_rules! cols {
    ($kernel:ident, $v:literal, $a:expr, $b:expr, $c:expr, $t:expr) => {
        $crate::kernels::x86_64::tiles::cols!(@ $kernel, $v, $a, $b, $c, $t; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
    };
    (@ $kernel:ident, $v:literal, $a:expr, $b:expr, $c:expr, $t:expr; $($n:literal),*) => {
        match $t.nc {
            $( $n => $kernel::<$v, $n>($a, $b, $c, $t), )*
            _ => unreachable!("nc <= NR"),
        }
    };
}
pub(super) use {by_shape, cols};

/// One register tile's place: row groups `g..g+gv`, columns `n0..n0+nc`,
/// of an `[m, k] · [n, k]ᵀ` product summed in k-blocks of `kc`; the call
/// sums the blocks from `k0` (a block's start) to `k1`.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) kc: usize,
    pub(super) k0: usize,
    pub(super) k1: usize,
    pub(super) g: usize,
    pub(super) gv: usize,
    pub(super) n0: usize,
    pub(super) nc: usize,
}

/// The output, shared by the threads, each writing its own columns.
#[derive(Clone, Copy)]
pub(super) struct Out(pub(super) *mut f32);
// SAFETY: threads write disjoint elements (their own column tiles).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// The pointer (a method, so closures capture the `Send` wrapper whole).
    pub(super) fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// How [`each_tile`] walks a product's tiles.
#[derive(Clone, Copy)]
struct Walk {
    /// Runs of widened columns ([`product_by_columns`]); else each row
    /// block passes over all of a thread's column tiles.
    runs: bool,
    /// A pass per k-block where a row block's packed input takes more than
    /// [`ROWS_BYTES`].
    k_passes: bool,
}

/// The `[m, n]` output of a product, made by `tile(t, c)` on every
/// register tile `t` of it (`c`: the output), column tiles split over the
/// threads; `k_passes`: each k-block a pass of its own where a row
/// block's packed input would not stay in L2 ([`each_tile`]).
///
/// # Safety
/// `k ≥ 1`; `tile(t, c)` writes only tile `t` of `c`, sums the k-blocks
/// from `t.k0` to `t.k1`, and stores each of its elements (its first
/// k-block) before reading any.
pub(super) unsafe fn product(
    dims: (usize, usize, usize),
    kc: usize,
    k_passes: bool,
    tile: impl Fn(Tile, *mut f32) + Sync,
) -> Vec<f32> {
    let walk = Walk {
        runs: false,
        k_passes,
    };
    // SAFETY: the caller's contract.
    unsafe { blocked(dims, kc, walk, |_: &mut (), _, _| (), |_, t, c| tile(t, c)) }
}

/// [`product`] with a per-thread scratch `S` that `column(s, n0, nc)` fills
/// for a run of `nc` columns from `n0` before the register tiles of those
/// columns run (on the thread that runs them) and that each of them reads:
/// the weight's columns widened into a panel, for a weight not held in f32.
/// A run is one column tile when the rows fit one cache block, and else as
/// many as fit [`PANEL_BYTES`] (`k` f32 values per column), so that each
/// value is widened once per product, not once per block of rows; always
/// with [`product`]'s `k_passes` on.
///
/// # Safety
/// As [`product`].
pub(super) unsafe fn product_by_columns<S: Default>(
    dims: (usize, usize, usize),
    kc: usize,
    column: impl Fn(&mut S, usize, usize) + Sync,
    tile: impl Fn(&S, Tile, *mut f32) + Sync,
) -> Vec<f32> {
    let walk = Walk {
        runs: true,
        k_passes: true,
    };
    // SAFETY: the caller's contract.
    unsafe { blocked(dims, kc, walk, column, tile) }
}

/// [`product`] or [`product_by_columns`], as `walk` says.
///
/// # Safety
/// As [`product`].
unsafe fn blocked<S: Default>(
    dims: (usize, usize, usize),
    kc: usize,
    walk: Walk,
    column: impl Fn(&mut S, usize, usize) + Sync,
    tile: impl Fn(&S, Tile, *mut f32) + Sync,
) -> Vec<f32> {
    // With k = 0 no tile would store its elements (no plan has it: the
    // blocked route takes k > 2).
    debug_assert!(dims.2 > 0, "a blocked product over k = 0");
    let mut c: Vec<f32> = Vec::with_capacity(dims.0 * dims.1);
    let out = Out(c.as_mut_ptr());
    each_tile(dims, kc, walk, &column, |p, t| tile(p, t, out.ptr()));
    // SAFETY: the tiles cover the output and each stored all its elements.
    unsafe { c.set_len(dims.0 * dims.1) };
    c
}

/// The most bytes of widened columns a thread holds at once where the rows
/// take more than one cache block ([`product_by_columns`]; at least one
/// column tile's). Measured, not derived: runs of 512 KiB and of 2 MiB
/// gave rates within 5 % of these (`examples/gemm_bench.rs`).
const PANEL_BYTES: usize = 1 << 20;

/// The most bytes of a row block's packed input (`MB` rows, or fewer, ×
/// `k`, as f32) that one call per tile reads whole; past it each k-block
/// is a call of its own ([`each_tile`]). Half the 2 MiB L2 of the Xeon
/// it was measured on (`examples/gemm_bench.rs`); not tuned for others.
const ROWS_BYTES: usize = 1 << 20;

/// Calls `tile` on every register tile of an `[m, n]` output, column tiles
/// split over the threads (each thread's tiles write only its columns),
/// after `column(s, n0, nc)` on the thread's scratch for the run of column
/// tiles holding the tile (`runs`: [`product_by_columns`]'s runs; else one
/// run of all the thread's tiles, each row block over all of them). Where a
/// row block's packed values take more than [`ROWS_BYTES`], it passes over
/// the run's tiles once per k-block, a call per tile and block, so that
/// the values of one block (`MB × kc`) stay in L2 while the tiles read
/// them. Each thread makes a tile's blocks in increasing order, so the
/// first one is stored before the later ones are added.
fn each_tile<S: Default>(
    (m, n, k): (usize, usize, usize),
    kc: usize,
    walk: Walk,
    column: &(impl Fn(&mut S, usize, usize) + Sync),
    tile: impl Fn(&S, Tile) + Sync,
) {
    use rayon::prelude::*;
    let tiles = n.div_ceil(NR);
    let threads = rayon::current_num_threads().max(1);
    let per = tiles.div_ceil(threads).max(1);
    let groups = m.div_ceil(16);
    let run = if !walk.runs {
        per
    } else if groups <= MB / 16 {
        1
    } else {
        (PANEL_BYTES / (NR * k.max(1) * 4)).max(1)
    };
    // A call per k-block where a row block's packed values would not stay
    // in L2 whole; one call for all of k where they would.
    let step = if walk.k_passes && m.min(MB) * k * 4 > ROWS_BYTES {
        kc.max(1)
    } else {
        k.max(1)
    };
    (0..tiles.div_ceil(per)).into_par_iter().for_each(|chunk| {
        let (t0, t1) = (chunk * per, ((chunk + 1) * per).min(tiles));
        let mut s = S::default();
        for r0 in (t0..t1).step_by(run) {
            let r1 = (r0 + run).min(t1);
            column(&mut s, r0 * NR, (r1 * NR).min(n) - r0 * NR);
            for g0 in (0..groups).step_by(MB / 16) {
                let g1 = (g0 + MB / 16).min(groups);
                for k0 in (0..k.max(1)).step_by(step) {
                    let k1 = (k0 + step).min(k);
                    for t in r0..r1 {
                        let (n0, nc) = (t * NR, NR.min(n - t * NR));
                        for g in (g0..g1).step_by(MV) {
                            let gv = MV.min(g1 - g);
                            let t = Tile {
                                m,
                                n,
                                k,
                                kc,
                                k0,
                                k1,
                                g,
                                gv,
                                n0,
                                nc,
                            };
                            tile(&s, t);
                        }
                    }
                }
            }
        }
    });
}

/// Stores (the first k-block) or adds (the later ones) a tile's `16·V × C`
/// sums `acc[v][j]` (lane `l`: row `16(g+v)+l`) into `c`: each row vector
/// group transposed in registers ([`transpose16`]), so a row's `C` outputs
/// go to `c` in one masked vector store (an add: `c + sum`, as the scalar
/// store made it).
///
/// # Safety
/// AVX-512F; `c` is an `[m, n]` output holding the tile.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn store<const V: usize, const C: usize>(
    acc: &[[std::arch::x86_64::__m512; C]; V],
    c: *mut f32,
    t: Tile,
    first: bool,
) {
    use std::arch::x86_64::*;
    let mask: __mmask16 = ((1u32 << C) - 1) as __mmask16;
    for (v, av) in acc.iter().enumerate() {
        let rows = transpose16(std::array::from_fn(|j| {
            if j < C {
                av[j]
            } else {
                _mm512_setzero_ps()
            }
        }));
        for (l, row) in rows.iter().enumerate() {
            let r = (t.g + v) * 16 + l;
            if r >= t.m {
                break;
            }
            let o = c.add(r * t.n + t.n0);
            let s = if first {
                *row
            } else {
                _mm512_add_ps(_mm512_maskz_loadu_ps(mask, o), *row)
            };
            _mm512_mask_storeu_ps(o, mask, s);
        }
    }
}

/// The transpose of a 16 × 16 block held as 16 vectors: lane `j` of
/// output `l` is lane `l` of input `j` (interleaves of 32-bit, then
/// 64-bit elements inside each 128-bit block, then two exchanges of the
/// 128-bit blocks).
///
/// # Safety
/// AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn transpose16(
    r: [std::arch::x86_64::__m512; 16],
) -> [std::arch::x86_64::__m512; 16] {
    use std::arch::x86_64::*;
    // t[2i], t[2i+1]: rows 2i and 2i+1 interleaved, low and high halves.
    let t: [__m512; 16] = std::array::from_fn(|q| {
        let i = q / 2;
        if q % 2 == 0 {
            _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1])
        } else {
            _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1])
        }
    });
    // u[4i+e], block b: element 4b+e of rows 4i..4i+4.
    let u: [__m512; 16] = std::array::from_fn(|q| {
        let (i, e) = (q / 4, q % 4);
        let (x, y) = (t[4 * i + e / 2], t[4 * i + 2 + e / 2]);
        if e % 2 == 0 {
            _mm512_shuffle_ps::<0x44>(x, y)
        } else {
            _mm512_shuffle_ps::<0xEE>(x, y)
        }
    });
    // Output 4b+e: block b of u[e], u[4+e], u[8+e], u[12+e].
    let mut o = [_mm512_setzero_ps(); 16];
    for e in 0..4 {
        let x0 = _mm512_shuffle_f32x4::<0x88>(u[e], u[4 + e]);
        let x1 = _mm512_shuffle_f32x4::<0xDD>(u[e], u[4 + e]);
        let y0 = _mm512_shuffle_f32x4::<0x88>(u[8 + e], u[12 + e]);
        let y1 = _mm512_shuffle_f32x4::<0xDD>(u[8 + e], u[12 + e]);
        o[e] = _mm512_shuffle_f32x4::<0x88>(x0, y0);
        o[4 + e] = _mm512_shuffle_f32x4::<0x88>(x1, y1);
        o[8 + e] = _mm512_shuffle_f32x4::<0xDD>(x0, y0);
        o[12 + e] = _mm512_shuffle_f32x4::<0xDD>(x1, y1);
    }
    o
}

/// `x [m, k]` (f32 holding bf16 values) as swapped bf16 pairs, 16 rows per
/// group: `[group][pair][lane]` = `x[2p] << 16 | x[2p + 1]` of row
/// `16·group + lane` (as [`crate::kernels::Pairs`] holds a weight's), zero
/// past the last row or pair; `groups × pairs` of them (at least
/// `m.div_ceil(16)` and `k.div_ceil(2)`), groups in parallel. `None` when
/// a value is not bf16.
#[inline(never)]
pub(super) fn pack_pairs(
    x: &[f32],
    (m, k): (usize, usize),
    groups: usize,
    pairs: usize,
) -> Option<Vec<u32>> {
    use crate::kernels::pairs::pair_of;
    use rayon::prelude::*;
    let mut out = vec![0u32; groups * pairs * 16];
    let ok = out
        .par_chunks_mut((pairs * 16).max(1))
        .enumerate()
        .all(|(g, group)| {
            (g * 16..(g * 16 + 16).min(m)).all(|r| {
                let (row, lane) = (&x[r * k..(r + 1) * k], r % 16);
                row.chunks(2)
                    .enumerate()
                    .all(|(p, two)| pair_of(two).map(|w| group[p * 16 + lane] = w).is_some())
            })
        });
    ok.then_some(out)
}

#[cfg(test)]
mod tests {
    /// Lane `j` of output `l` is lane `l` of input `j`, for every pair.
    #[test]
    fn transpose16_moves_every_lane() {
        use std::arch::x86_64::*;
        if !is_x86_feature_detected!("avx512f") {
            eprintln!("SKIPPED transpose16_moves_every_lane: no AVX-512F on this CPU");
            return;
        }
        let input: [[f32; 16]; 16] =
            std::array::from_fn(|j| std::array::from_fn(|l| (100 * j + l) as f32));
        let mut out = [[0f32; 16]; 16];
        // SAFETY: AVX-512F was detected; every pointer is a 16-float array.
        unsafe {
            let rows =
                super::transpose16(std::array::from_fn(|j| _mm512_loadu_ps(input[j].as_ptr())));
            for (o, r) in out.iter_mut().zip(rows) {
                _mm512_storeu_ps(o.as_mut_ptr(), r);
            }
        }
        for (l, row) in out.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                assert_eq!(v, (100 * j + l) as f32, "output {l}, lane {j}");
            }
        }
    }
}
