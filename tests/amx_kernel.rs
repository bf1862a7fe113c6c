//! The AMX kernel (`bf16-gemm-amx`, `src/kernels/x86_64/amx.rs`), whose
//! bf16 sums are the tile unit's, not candle's:
//! - bit for bit its stated reference: `TDPBF16PS` applied one 16 × 16 tile
//!   at a time in the kernel's order (each output from +0, the weight's
//!   k-pairs 16 per step in increasing k, zeros past the last pair), computed
//!   here with its own packing and no blocking or threads, on listed shapes
//!   (every tile remainder, odd k, a partial last step, one step, many);
//! - within 2⁻²¹ of the exact sum, relative to the sum of |products|;
//! - the same bits for a row alone and stacked under others;
//! - end to end, a bf16 dump made with it agrees with candle's sums
//!   (`HSPARITY_NO_AMX=1`) to the noise floor (`diff` PASS), and the dump's
//!   metadata says which kernels ran.
//!
//! On a CPU without AMX-BF16 each test says so on stderr (`SKIPPED …`) and
//! passes, unless `HSPARITY_REQUIRE_KERNELS` names `bf16-gemm-amx`.

use crate::common::{self, matrix};
use crate::kernels::runs_here;

use hsparity::kernels::{self, Kernel, Stored, Weight};
use hsparity::models::layers::pairs_of;

/// Shapes on candle's blocked route (the only route planned here): row and
/// column remainders of 16 and 32, odd k, a last step of 1 pair, one step,
/// several, and the mid checkpoint's down projection.
const SHAPES: &[(usize, usize, usize)] = &[
    (2, 200, 3),
    (5, 61, 31),
    (17, 25, 100),
    (33, 48, 64),
    (40, 60, 1030),
    (65, 19, 1024),
    (130, 70, 2047),
    (300, 100, 66),
    (128, 1024, 3072),
];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn values(t: &candle_core::Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// The kernel through the one dispatch policy (`kernels::plan`, this
/// process's capabilities): `[m, n]`.
fn by_amx(x: &[f32], w: &[f32], (m, n, k): (usize, usize, usize)) -> Vec<f32> {
    let plan = kernels::plan(m, n, k, Stored::Bf16, kernels::capabilities()).expect("planned");
    assert_eq!(plan.kernel(), Kernel::Bf16Amx, "[{m}, {n}, {k}]");
    let wt = candle_core::Tensor::from_slice(w, (n, k), &candle_core::Device::Cpu).unwrap();
    let pairs = pairs_of(&wt).unwrap();
    plan.run(x, Weight::Bf16(&pairs))
        .unwrap()
        .expect("bf16 inputs")
}

#[cfg(target_arch = "x86_64")]
mod tile {
    use std::arch::asm;

    /// `ldtilecfg`'s palette-1 configuration.
    #[repr(C, align(64))]
    struct Config {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    /// `c (16 × 16 f32) += a (16 rows × 16 pairs) · b (16 pairs × 16
    /// columns)`: one `TDPBF16PS` on tiles 0 (C), 1 (A) and 2 (B).
    fn dot(c: &mut [f32; 256], a: &[u32; 256], b: &[u32; 256]) {
        let mut cfg = Config {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..3 {
            cfg.colsb[t] = 64;
            cfg.rows[t] = 16;
        }
        // SAFETY: the test ran only where `kernels::capabilities()` found
        // AMX-BF16 and Linux granted the tile state; every buffer holds 16
        // rows of 64 bytes.
        unsafe {
            asm!(
                "ldtilecfg [{cfg}]",
                "tileloadd tmm0, [{c} + {s}*1]",
                "tileloadd tmm1, [{a} + {s}*1]",
                "tileloadd tmm2, [{b} + {s}*1]",
                "tdpbf16ps tmm0, tmm1, tmm2",
                "tilestored [{c} + {s}*1], tmm0",
                cfg = in(reg) &cfg as *const Config,
                c = in(reg) c.as_mut_ptr(),
                a = in(reg) a.as_ptr(),
                b = in(reg) b.as_ptr(),
                s = in(reg) 64usize,
                options(nostack),
            )
        };
    }

    /// The kernel's order, one tile at a time: per 16 weight rows × 16
    /// tokens, a zero accumulator takes the k-pairs 16 per step, each pair
    /// `v[2p] << 16 | v[2p + 1]` of bf16 bits (0 past the row's end).
    pub fn reference(x: &[f32], w: &[f32], (m, n, k): (usize, usize, usize)) -> Vec<f32> {
        let bf = |v: f32| v.to_bits() >> 16;
        let word = |row: &[f32], p: usize| {
            let lo = if 2 * p + 1 < k { bf(row[2 * p + 1]) } else { 0 };
            bf(row[2 * p]) << 16 | lo
        };
        let pairs = k.div_ceil(2);
        let mut out = vec![0f32; m * n];
        for n0 in (0..n).step_by(16) {
            for m0 in (0..m).step_by(16) {
                let mut c = [0f32; 256];
                for p0 in (0..pairs).step_by(16) {
                    let (mut a, mut b) = ([0u32; 256], [0u32; 256]);
                    for i in 0..16 {
                        for q in (0..16).filter(|q| p0 + q < pairs) {
                            if n0 + i < n {
                                a[i * 16 + q] = word(&w[(n0 + i) * k..(n0 + i + 1) * k], p0 + q);
                            }
                            if m0 + i < m {
                                b[q * 16 + i] = word(&x[(m0 + i) * k..(m0 + i + 1) * k], p0 + q);
                            }
                        }
                    }
                    dot(&mut c, &a, &b);
                }
                for i in (0..16).filter(|i| n0 + i < n) {
                    for j in (0..16).filter(|j| m0 + j < m) {
                        out[(m0 + j) * n + n0 + i] = c[i * 16 + j];
                    }
                }
            }
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_amx_kernel_gives_its_references_bits() {
    if !runs_here(Kernel::Bf16Amx, "the_amx_kernel_gives_its_references_bits") {
        return;
    }
    for &(m, n, k) in SHAPES {
        let x = values(&matrix(m, k, 1 + m as u64, true));
        // Rows of weights scaled over 2⁻¹²..2¹², so that a tile step sums
        // products of very different sizes.
        let w: Vec<f32> = values(&matrix(n, k, 7 + k as u64, true))
            .iter()
            .enumerate()
            .map(|(e, v)| v * 2f32.powi((e / k % 25) as i32 - 12))
            .collect();
        let got = by_amx(&x, &w, (m, n, k));
        let want = tile::reference(&x, &w, (m, n, k));
        assert!(bits(&got) == bits(&want), "[{m}, {n}, {k}]: bits differ");
    }
    // An infinity at the start of a weight row: a kernel reading past the
    // end of the row before it (a partial last step, 66 = 2 × 16 + 1 pairs)
    // would turn that row's outputs into NaN.
    let (m, n, k) = (40, 64, 66);
    let x = values(&matrix(m, k, 21, true));
    let mut w = values(&matrix(n, k, 22, true));
    w[10 * k] = f32::INFINITY;
    let got = by_amx(&x, &w, (m, n, k));
    assert!(
        got.iter().skip(9).step_by(n).all(|v| v.is_finite()),
        "row 9 reads row 10"
    );
    assert!(bits(&got) == bits(&tile::reference(&x, &w, (m, n, k))));
}

/// Within 2⁻²¹ · Σ|products| of the exact sum (f64; measured worst here:
/// 2⁻²⁴·⁴), so a mispacked operand or a lost step cannot pass.
#[test]
fn the_amx_kernel_is_within_rounding_of_the_exact_sums() {
    if !runs_here(
        Kernel::Bf16Amx,
        "the_amx_kernel_is_within_rounding_of_the_exact_sums",
    ) {
        return;
    }
    for &(m, n, k) in SHAPES {
        let x = values(&matrix(m, k, 3 + n as u64, true));
        let w = values(&matrix(n, k, 5 + m as u64, true));
        let got = by_amx(&x, &w, (m, n, k));
        for i in 0..m {
            for j in 0..n {
                let (xi, wj) = (&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
                let p = xi
                    .iter()
                    .zip(wj)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b));
                let (exact, size) = p.fold((0f64, 0f64), |(s, a), v| (s + v, a + v.abs()));
                let err = (f64::from(got[i * n + j]) - exact).abs();
                assert!(
                    err <= size * 2f64.powi(-21),
                    "[{m}, {n}, {k}] ({i}, {j}): {} against {exact} (Σ|p| {size})",
                    got[i * n + j]
                );
            }
        }
    }
}

/// A row's sums do not depend on the rows beside it: the first rows of a
/// stack give the bits they give alone (what stacking independent
/// sequences, `models::layers::each_stacked`, relies on).
#[test]
fn the_amx_kernel_gives_a_row_the_same_bits_alone_and_stacked() {
    if !runs_here(
        Kernel::Bf16Amx,
        "the_amx_kernel_gives_a_row_the_same_bits_alone_and_stacked",
    ) {
        return;
    }
    let (n, k) = (300, 1030);
    let x = values(&matrix(150, k, 11, true));
    let w = values(&matrix(n, k, 12, true));
    let all = by_amx(&x, &w, (150, n, k));
    for m in [2, 17, 33, 129] {
        let alone = by_amx(&x[..m * k], &w, (m, n, k));
        assert!(
            bits(&alone) == bits(&all[..m * n]),
            "{m} rows alone differ from the same rows stacked"
        );
    }
}

/// `hsparity dump` of the tiny fixture's causal-lm path in bf16 into
/// `out`; the kernels its metadata says ran.
fn dump(out: &std::path::Path, no_amx: bool) -> String {
    let mut cmd = common::hsparity();
    if no_amx {
        cmd.env("HSPARITY_NO_AMX", "1");
    }
    let o = cmd
        .args(["dump", "fixtures/tiny-qwen3_5", "--path", "causal-lm"])
        .args(["--dtype", "bf16", "--quiet", "--out"])
        .arg(out)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let bytes = std::fs::read(out).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    meta.metadata().as_ref().unwrap()["kernels"].clone()
}

/// End to end: a bf16 dump computed with the AMX kernel and one computed
/// in candle's sums (`HSPARITY_NO_AMX=1`) differ (the sums are not the
/// same) and agree to the noise floor (`diff` PASS, every differing row
/// inside the band, a note saying which dump's sums are AMX's); each dump's
/// metadata names the kernels that ran.
#[test]
fn an_amx_run_agrees_with_candles_sums_to_the_noise_floor() {
    if !runs_here(
        Kernel::Bf16Amx,
        "an_amx_run_agrees_with_candles_sums_to_the_noise_floor",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (amx, candle) = (
        tmp.path().join("amx.safetensors"),
        tmp.path().join("candle.safetensors"),
    );
    let with = dump(&amx, false);
    assert!(with.split(',').any(|k| k == "bf16-gemm-amx"), "{with}");
    let without = dump(&candle, true);
    assert!(!without.contains("bf16-gemm-amx"), "{without}");
    let (code, v, stderr) = crate::diff::diff(&[candle.to_str().unwrap(), amx.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(v["verdict"], "pass");
    // The note says why the two are not bitwise, naming the AMX dump.
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("amx.safetensors (causal-lm)'s bf16 products were summed on AMX tiles"),
        "{notes}"
    );
    let rows = v["pairs"][0]["hidden_states"].as_array().expect("rows");
    let differing: Vec<&serde_json::Value> =
        rows.iter().filter(|r| r["bitwise"] == false).collect();
    assert!(
        !differing.is_empty(),
        "the two runs' sums are the same everywhere"
    );
    for r in differing {
        assert_eq!(r["noise"]["inside"], true, "{r}");
        assert!(
            r["noise"]["ratio"].as_f64().is_some_and(|x| x <= 1.0),
            "{r}"
        );
    }
}
