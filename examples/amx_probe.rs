//! Can an AMX kernel make candle's bf16 sums bit for bit? A probe of
//! `TDPBF16PS` (Intel AMX-BF16) on this CPU: the order and rounding of its
//! additions, then a small tile GEMM in candle's order (k-blocks of `kc`,
//! one rounded addition per exact product in increasing k, the block sums
//! added in order: `src/kernels/x86_64/bf16_gemm.rs`) checked bitwise
//! against that order computed by scalar code and against candle's f32
//! matmul on the widened values (docs/performance.md, "bf16 products on
//! AMX").
//!
//! ```sh
//! cargo run --release --example amx_probe
//! ```
//!
//! Prints what the instruction does and, per shape, how many outputs differ
//! (0 everywhere would mean an AMX kernel could keep candle's sums; on the
//! Sapphire Rapids VM it measured 22–86 %, which is why `bf16-gemm-amx`,
//! `src/kernels/x86_64/amx.rs`, sums in the tile unit's own order). Exits 2
//! on a CPU without AMX-BF16, or where Linux refuses the tile state.

#[cfg(target_arch = "x86_64")]
mod probe {
    use std::arch::asm;

    use candle_core::{Device, Tensor};

    /// `ldtilecfg`'s 64-byte palette-1 configuration.
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    /// Asks Linux for the AMX tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM,
    /// XFEATURE_XTILEDATA)`), which a process must hold before its first tile
    /// instruction.
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

    /// Tiles 0 and 3: C (16 × 16 f32); tile 1: A (16 rows × 32 bf16); tile 2: B
    /// (16 k-pairs × 16 columns × 2 bf16).
    fn configure() {
        let mut cfg = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..4 {
            cfg.colsb[t] = 64;
            cfg.rows[t] = 16;
        }
        // SAFETY: a valid palette-1 configuration; the tile state was granted.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg as *const TileConfig, options(nostack)) };
    }

    /// `c[i] += Σ_k a[i][k] · b[k][j]` on one 16 × 16 tile of f32 (`c`, row
    /// stride 64 bytes): `a` 16 rows × 32 bf16 (row stride 64 bytes), `b` 16
    /// rows of 16 bf16 pairs (row stride 64 bytes), starting from `c`'s values.
    fn tile_dot(c: &mut [f32; 256], a: &[u16; 512], b: &[u16; 512]) {
        // SAFETY: configured tiles of 16 rows × 64 bytes; every buffer holds
        // 16 rows of 64 bytes.
        unsafe {
            asm!(
                "tileloadd tmm0, [{c} + {s}*1]",
                "tileloadd tmm1, [{a} + {s}*1]",
                "tileloadd tmm2, [{b} + {s}*1]",
                "tdpbf16ps tmm0, tmm1, tmm2",
                "tilestored [{c} + {s}*1], tmm0",
                c = in(reg) c.as_mut_ptr(),
                a = in(reg) a.as_ptr(),
                b = in(reg) b.as_ptr(),
                s = in(reg) 64usize,
                options(nostack),
            )
        };
    }

    fn bf(v: f32) -> u16 {
        half::bf16::from_f32(v).to_bits()
    }

    /// Output (0, 0) of one `tile_dot` from `c0`, with row 0 of A holding
    /// `pairs` (in k order) and B's column 0 all ones.
    fn dot_of(c0: f32, pairs: &[(f32, f32)]) -> f32 {
        let (mut c, mut a, mut b) = ([0f32; 256], [0u16; 512], [0u16; 512]);
        c[0] = c0;
        for (p, &(lo, hi)) in pairs.iter().enumerate() {
            a[2 * p] = bf(lo);
            a[2 * p + 1] = bf(hi);
            b[32 * p] = bf(1.0);
            b[32 * p + 1] = bf(1.0);
        }
        tile_dot(&mut c, &a, &b);
        c[0]
    }

    /// What the instruction does with one output, from values where the order
    /// and rounding of its additions show (`2^-24` is half an ulp of 1, `2^-25`
    /// a quarter): each case, what rounded additions in k order (candle's order)
    /// give, and what the instruction gives.
    fn probe() -> Vec<(&'static str, f32, f32)> {
        let tiny = 2f32.powi(-24);
        let tinier = 2f32.powi(-25);
        vec![
            ("1 + (-1, 2^-24)", tiny, dot_of(1.0, &[(-1.0, tiny)])),
            ("1 + (2^-24, 2^-24)", 1.0, dot_of(1.0, &[(tiny, tiny)])),
            (
                "1 + (-1, 0) + (2^-25, 0)",
                tinier,
                dot_of(1.0, &[(-1.0, 0.0), (tinier, 0.0)]),
            ),
            (
                "1 + 16 pairs (2^-24, 0)",
                1.0,
                dot_of(1.0, &[(tiny, 0.0); 16]),
            ),
            (
                "1 + 16 pairs (2^-24, 2^-24)",
                1.0,
                dot_of(1.0, &[(tiny, tiny); 16]),
            ),
            (
                "2^-24 + (1, 0) + (-1, 0)",
                tiny,
                dot_of(tiny, &[(1.0, 0.0), (-1.0, 0.0)]),
            ),
        ]
    }

    /// Deterministic bf16-valued inputs.
    fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                half::bf16::from_f32(u * scale).to_f32()
            })
            .collect()
    }

    /// candle's order, by scalar code: per output, k-blocks of `kc`, within a
    /// block one accumulator from +0 adding each exact product in increasing
    /// k, the block sums added to the output in order.
    fn candle_order(x: &[f32], w: &[f32], (m, n, k): (usize, usize, usize), kc: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                for k0 in (0..k).step_by(kc) {
                    let mut acc = 0f32;
                    for kk in k0..(k0 + kc).min(k) {
                        acc += x[i * k + kk] * w[j * k + kk];
                    }
                    out[i * n + j] += acc;
                }
            }
        }
        out
    }

    /// The same sums with the tile instruction: per 16 × 16 output tile and
    /// k-block, a zeroed accumulator takes the block 32 values at a time, then
    /// is added to the output.
    fn amx_order(x: &[f32], w: &[f32], (m, n, k): (usize, usize, usize), kc: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i0 in (0..m).step_by(16) {
            for j0 in (0..n).step_by(16) {
                for k0 in (0..k).step_by(kc) {
                    let mut c = [0f32; 256];
                    for kb in (k0..(k0 + kc).min(k)).step_by(32) {
                        let (mut a, mut b) = ([0u16; 512], [0u16; 512]);
                        for r in 0..16 {
                            for t in 0..32 {
                                a[r * 32 + t] = bf(x[(i0 + r) * k + kb + t]);
                            }
                        }
                        for p in 0..16 {
                            for col in 0..16 {
                                for h in 0..2 {
                                    b[p * 32 + col * 2 + h] =
                                        bf(w[(j0 + col) * k + kb + 2 * p + h]);
                                }
                            }
                        }
                        tile_dot(&mut c, &a, &b);
                    }
                    for r in 0..16 {
                        for col in 0..16 {
                            out[(i0 + r) * n + j0 + col] += c[r * 16 + col];
                        }
                    }
                }
            }
        }
        out
    }

    fn differing(a: &[f32], b: &[f32]) -> usize {
        a.iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count()
    }

    pub fn main() {
        // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE (std's detection
        // of them is not stable yet).
        let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
        let amx = edx & (1 << 22) != 0 && edx & (1 << 24) != 0;
        if !amx {
            eprintln!("error: this CPU has no AMX-BF16 (amx_bf16, amx_tile in /proc/cpuinfo)");
            std::process::exit(2);
        }
        if !request_tiles() {
            eprintln!("error: Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)");
            std::process::exit(2);
        }
        configure();
        println!("TDPBF16PS on this CPU (accumulator + products): candle's order gives / the instruction gives");
        for (what, candle, amx) in probe() {
            let same = if candle.to_bits() == amx.to_bits() {
                "same"
            } else {
                "DIFFERENT"
            };
            println!("  {what:<30} {candle:e} / {amx:e}  {same}");
        }
        println!("candle's order (k-blocks of kc) by AMX tiles, against scalar code and candle's f32 matmul:");
        for (m, n, k) in [
            (32, 16, 64),
            (32, 32, 512),
            (64, 48, 1024),
            (48, 64, 2048),
            (128, 128, 4096),
        ] {
            let x = values(m * k, 1 + k as u64, 1.0);
            let w = values(n * k, 2 + k as u64, 1.0 / (k as f32).sqrt());
            let kc = match hsparity::kernels::route(m, n, k) {
                hsparity::kernels::Route::Blocked { kc, .. } => kc,
                other => {
                    println!("  {m} × {n} × {k}: candle routes it {other:?}; skipped");
                    continue;
                }
            };
            if kc % 32 != 0 && kc < k {
                println!("  {m} × {n} × {k}: kc {kc} is not a multiple of 32; skipped");
                continue;
            }
            let scalar = candle_order(&x, &w, (m, n, k), kc);
            let tiles = amx_order(&x, &w, (m, n, k), kc);
            let dev = Device::Cpu;
            let xt = Tensor::from_slice(&x, (m, k), &dev).expect("x");
            let wt = Tensor::from_slice(&w, (n, k), &dev).expect("w");
            let candle: Vec<f32> = xt
                .matmul(&wt.t().expect("t"))
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1())
                .expect("matmul");
            println!(
                "  {m} × {n} × {k} (kc {kc}): AMX vs scalar {} of {} differ; scalar vs candle {}",
                differing(&tiles, &scalar),
                m * n,
                differing(&scalar, &candle)
            );
        }
        // SAFETY: releases the tile state this thread configured.
        unsafe { asm!("tilerelease", options(nostack)) };
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    probe::main();
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("error: AMX is an x86-64 extension; this probe runs on x86-64 CPUs only");
    std::process::exit(2);
}
