//! hsparity's own CPU kernels (`hsparity::kernels`) give candle's bits:
//! the f32 blocked kernel (on f32 weights, and on bf16 pairs read as their
//! f32 or f16 values), the bf16 dot-product kernel (on the widened
//! values) and the single-row kernel, on listed shapes (one and several
//! k-blocks, odd k, the small-size block rule, every tile remainder,
//! subnormals) and on generated ones (empty and `k = 0` included); the one
//! dispatch policy (`kernels::plan`) follows candle's routes; `Matrix`
//! gives `linear`'s bits on every shape, kernel or not; and `compare`'s
//! report is the same with candle's GEMM everywhere.
//!
//! A test whose kernel this CPU lacks says so on stderr (`SKIPPED …`, not
//! captured by the test harness) and passes, unless `HSPARITY_REQUIRE_KERNELS`
//! names that kernel (`.ci/run` sets it from the CPU's features): then it
//! fails, so a CI machine with AVX-512 cannot pass on the fallback alone.

use std::io::Write;

use crate::common::{self, bits, matrix, BLOCKED_SHAPES};

use candle_core::Tensor;
use hsparity::kernels::{self, Capabilities, Kernel, Pairs, Route, Stored, Weight};
use hsparity::models::layers::{linear, pairs_of, Matrix};
use hsparity::precision::{Precision, ProductRounding};
use proptest::prelude::*;

/// True when `kernel` may run here. Otherwise writes `SKIPPED test: why` to
/// the process's stderr and returns false, or fails the test when
/// `HSPARITY_REQUIRE_KERNELS` (comma-separated names) lists the kernel.
pub(crate) fn runs_here(kernel: Kernel, test: &str) -> bool {
    let caps = kernels::capabilities();
    if caps.available().contains(&kernel.name()) {
        return true;
    }
    let required = std::env::var("HSPARITY_REQUIRE_KERNELS").unwrap_or_default();
    let names: Vec<&str> = Kernel::ALL.iter().map(|k| k.name()).collect();
    for r in required.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        assert!(
            names.contains(&r),
            "HSPARITY_REQUIRE_KERNELS names {r:?}, not a kernel ({names:?})"
        );
    }
    let off = caps.disabled_by();
    let why = format!(
        "{} cannot run here (CPU features {:?}, switched off by {:?}; avx512bf16 counts only \
         where the start-up probe of vdpbf16ps's addition order passed)",
        kernel.name(),
        caps.cpu_features(),
        off
    );
    let required = required.split(',').any(|r| r.trim() == kernel.name());
    assert!(
        !required,
        "{test}: HSPARITY_REQUIRE_KERNELS names it, but {why}"
    );
    let _ = writeln!(std::io::stderr(), "SKIPPED kernels::{test}: {why}");
    false
}

/// Every kernel's capability on, as on a CPU with all of them.
fn every_kernel() -> Capabilities {
    Capabilities {
        avx2: true,
        avx512f: true,
        avx512bf16: true,
        ..Capabilities::none()
    }
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// This process's capabilities with the AMX kernel off: the kernels that
/// give candle's bits (the AMX kernel's sums are its own, tested in
/// `amx_kernel.rs`).
/// The bf16 kernel is planned even where its instruction is slow (the f32
/// kernel would take its products), so that it is tested wherever it can run.
fn candle_order() -> Capabilities {
    Capabilities {
        no_amx: true,
        bf16_dot_slow: false,
        ..*kernels::capabilities()
    }
}

/// `plan` (under [`candle_order`]) then `run` on tensors: `[m, n]`, or
/// `None` when no kernel is planned or the bf16 kernel declines the input.
fn by_kernel(x: &Tensor, w: &Tensor, stored: Stored) -> Option<Tensor> {
    let ((m, k), (n, _)) = (x.dims2().unwrap(), w.dims2().unwrap());
    let plan = kernels::plan(m, n, k, stored, &candle_order())?;
    let (xv, wv) = (values(x), values(w));
    let pairs = pairs_of(w).ok();
    let weight = match stored {
        Stored::F32 => Weight::F32(&wv),
        Stored::Bf16 => Weight::Bf16(pairs.as_ref().expect("bf16 weight values")),
    };
    let y = plan.run(&xv, weight).unwrap()?;
    Some(Tensor::from_vec(y, (m, n), x.device()).unwrap())
}

/// Row by row, as a decode step computes it: `x_r.matmul(&w.t())`.
fn one_by_one(x: &Tensor, w: &Tensor) -> Tensor {
    let rows: Vec<Tensor> = (0..x.dim(0).unwrap())
        .map(|r| x.narrow(0, r, 1).unwrap().matmul(&w.t().unwrap()).unwrap())
        .collect();
    Tensor::cat(&rows, 0).unwrap()
}

// ---- a checkpoint's bf16 bytes as pairs -----------------------------------

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// A row of bf16 bytes becomes its pairs (`w[2p] << 16 | w[2p + 1]`,
    /// the last `w[K−1] << 16` when K is odd) with its NaN and Inf counts as
    /// `half` reads the values: on rows long enough for the AVX-512BW body
    /// (64 bytes a step) and for the scalar tail after it, half of the values
    /// drawn with the exponent all ones (NaN and Inf of either sign).
    #[test]
    fn bf16_bytes_become_their_pairs_and_counts(
        values in prop::collection::vec(
            prop_oneof![
                any::<u16>(),
                (any::<bool>(), 0u16..0x80).prop_map(|(s, m)| u16::from(s) << 15 | 0x7f80 | m),
            ],
            0..300,
        )
    ) {
        let k = values.len();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut got = vec![0u32; k.div_ceil(2)];
        let counts = kernels::words_from_bytes(&mut got, &bytes);
        let want: Vec<u32> = values
            .chunks(2)
            .map(|p| u32::from(p[0]) << 16 | u32::from(p.get(1).copied().unwrap_or(0)))
            .collect();
        prop_assert_eq!(got, want);
        let bf = values.iter().map(|&v| half::bf16::from_bits(v));
        let nan = bf.clone().filter(|x| x.is_nan()).count();
        let inf = bf.filter(|x| x.is_infinite()).count();
        prop_assert_eq!(counts, (nan, inf));
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// A checkpoint tensor's NaN and Inf counts read from its bytes
    /// (`Weights::count_non_finite`, what a resident model's and a
    /// drafter's weights are checked with) are those of its values as
    /// loaded in f32, in each stored dtype; half of the values are drawn
    /// with the exponent all ones.
    #[test]
    fn non_finite_counts_from_bytes_are_the_loaded_values(
        draws in prop::collection::vec((any::<u64>(), any::<bool>()), 1..5000),
    ) {
        use candle_core::Device;
        use hsparity::checkpoint::{HeaderIndex, Weights};
        let dev = Device::Cpu;
        // Each draw's bits, with the exponent set to all ones when `on`.
        let ones = |on: bool, mask: u64| if on { mask } else { 0 };
        let bits = |shift: u32, mask: u64| {
            draws.iter().map(move |&(b, on)| b >> shift | ones(on, mask))
        };
        let bf16 = bits(0, 0x7f80).map(|v| half::bf16::from_bits(v as u16));
        let f16 = bits(16, 0x7c00).map(|v| half::f16::from_bits(v as u16));
        let f32s = bits(32, 0x7f80_0000).map(|v| f32::from_bits(v as u32));
        let f64s = bits(0, 0x7ff0_0000_0000_0000).map(f64::from_bits);
        let tensors = std::collections::HashMap::from([
            ("bf16".to_string(), Tensor::from_iter(bf16, &dev).unwrap()),
            ("f16".to_string(), Tensor::from_iter(f16, &dev).unwrap()),
            ("f32".to_string(), Tensor::from_iter(f32s, &dev).unwrap()),
            ("f64".to_string(), Tensor::from_iter(f64s, &dev).unwrap()),
        ]);
        let tmp = tempfile::tempdir().unwrap();
        candle_core::safetensors::save(&tensors, tmp.path().join("model.safetensors")).unwrap();
        let w = Weights::new(std::sync::Arc::new(HeaderIndex::read_dir(tmp.path()).unwrap()));
        for name in tensors.keys() {
            let loaded = w.load_f32_rounded(name, Precision::F32).unwrap();
            let loaded = loaded.to_vec1::<f32>().unwrap();
            let want = (
                loaded.iter().filter(|x| x.is_nan()).count(),
                loaded.iter().filter(|x| x.is_infinite()).count(),
            );
            prop_assert_eq!(w.count_non_finite(name).unwrap(), want, "{}", name);
        }
    }
}

// ---- the dispatch policy -------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// One policy for every kernel: the single-row kernel exactly on
    /// candle's gemv route for one row, a blocked kernel exactly on its
    /// blocked route (bf16 only where a k-block holds whole pairs), nothing
    /// elsewhere or without the capability.
    #[test]
    fn plans_follow_candles_routes(m in 0usize..300, n in 0usize..600, k in 0usize..1200) {
        let all = every_kernel();
        for stored in [Stored::F32, Stored::Bf16] {
            let got = kernels::plan(m, n, k, stored, &all).map(|p| (p.kernel(), p.kc()));
            let want = match kernels::route(m, n, k) {
                Route::Gemv if m == 1 => Some((Kernel::Gemv, k)),
                Route::Blocked { kc, .. } if stored == Stored::Bf16 && (kc % 2 == 0 || kc >= k) => {
                    Some((Kernel::Bf16Gemm, kc))
                }
                Route::Blocked { kc, .. } => Some((Kernel::F32Gemm, kc)),
                _ => None,
            };
            prop_assert_eq!(got, want, "[{}, {}, {}] {:?}", m, n, k, stored);
            // Where the bf16 instruction is slow the f32 kernel takes what it
            // would (the same sums), unless the f32 kernel is switched off.
            let slow = Capabilities { bf16_dot_slow: true, ..all };
            let got = kernels::plan(m, n, k, stored, &slow).map(|p| (p.kernel(), p.kc()));
            let want_slow = want.map(|(kernel, kc)| match kernel {
                Kernel::Bf16Gemm => (Kernel::F32Gemm, kc),
                other => (other, kc),
            });
            prop_assert_eq!(got, want_slow, "slow dot: [{}, {}, {}] {:?}", m, n, k, stored);
            let forced = Capabilities { force_bf16_dot: true, ..slow };
            let got = kernels::plan(m, n, k, stored, &forced).map(|p| (p.kernel(), p.kc()));
            prop_assert_eq!(got, want, "forced dot: [{}, {}, {}] {:?}", m, n, k, stored);
            let f32_off = Capabilities { no_avx512_gemm: true, ..slow };
            let got = kernels::plan(m, n, k, stored, &f32_off).map(|p| p.kernel());
            let bf16_only = want.filter(|(kernel, _)| *kernel == Kernel::Bf16Gemm);
            prop_assert_eq!(got, bf16_only.map(|(kernel, _)| kernel), "[{}, {}, {}]", m, n, k);
            prop_assert!(kernels::plan(m, n, k, stored, &Capabilities::none()).is_none());
            let switched = Capabilities { no_avx512_gemm: true, no_bf16_dot: true, ..all };
            prop_assert!(kernels::plan(m, n, k, stored, &switched).is_none());
        }
    }
}

/// The start-up timing of `vdpbf16ps` against the FMA measures something:
/// a rate between 0.1 and 8 (an instruction of two multiply-adds per lane
/// against one; a loop optimised away would give 0 or infinity), the same
/// side of the threshold in repeated timings, and the side this process's
/// capabilities took. `None` where the CPU lacks the instruction.
#[test]
fn the_bf16_dot_rate_is_a_measured_rate() {
    let caps = kernels::capabilities();
    let Some(first) = kernels::bf16_dot_rate() else {
        assert!(!caps.avx512bf16, "the instruction was probed, yet no rate");
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED kernels::the_bf16_dot_rate_is_a_measured_rate: no AVX512-BF16 on this CPU"
        );
        return;
    };
    let rates: Vec<f64> = std::iter::once(first)
        .chain((0..4).filter_map(|_| kernels::bf16_dot_rate()))
        .collect();
    for r in &rates {
        assert!(
            r.is_finite() && (0.1..8.0).contains(r),
            "rate {r} ({rates:?})"
        );
    }
    let slow: Vec<bool> = rates.iter().map(|r| *r < kernels::DOT_RATE_PAYS).collect();
    assert!(slow.iter().all(|s| *s == slow[0]), "{rates:?}");
    if caps.avx512bf16 {
        assert_eq!(caps.bf16_dot_slow, slow[0], "{rates:?}");
    }
}

/// The switches turn kernels off but not the CPU's ability the incremental
/// check is decided from.
#[test]
fn switches_change_which_kernel_runs_not_what_the_cpu_can_do() {
    let all = every_kernel();
    let off = Capabilities {
        no_avx512_gemm: true,
        no_bf16_dot: true,
        no_avx512_delta: true,
        ..all
    };
    assert!(all.avx512_gemm() && all.bf16_gemm());
    assert!(!off.avx512_gemm() && !off.bf16_gemm());
    assert_eq!(off.available(), vec!["delta-rule-avx2"]);
    assert!(all.available().contains(&"delta-rule-avx512"));
    assert!(off.cpu_reads_weights_once());
    assert!(!Capabilities::none().cpu_reads_weights_once());
}

// ---- the blocked kernels -------------------------------------------------

#[test]
fn the_f32_kernel_gives_the_bits_of_candles_gemm() {
    if !runs_here(
        Kernel::F32Gemm,
        "the_f32_kernel_gives_the_bits_of_candles_gemm",
    ) {
        return;
    }
    for &(m, n, k) in BLOCKED_SHAPES {
        let (x, w) = (
            matrix(m, k, 1 + m as u64, false),
            matrix(n, k, 7 + k as u64, false),
        );
        let got = by_kernel(&x, &w, Stored::F32).expect("planned");
        let want = x.matmul(&w.t().unwrap()).unwrap();
        assert!(bits(&got) == bits(&want), "[{m}, {n}, {k}]: bits differ");
    }
}

/// Products and sums down in the subnormal range: FMA keeps them, and so
/// must the kernel.
#[test]
fn subnormal_values_give_the_same_bits() {
    if !runs_here(Kernel::F32Gemm, "subnormal_values_give_the_same_bits") {
        return;
    }
    let tiny = |t: Tensor| (t * 1e-20).unwrap();
    let (x, w) = (
        tiny(matrix(33, 300, 3, false)),
        tiny(matrix(70, 300, 4, false)),
    );
    let got = by_kernel(&x, &w, Stored::F32).expect("planned");
    let want = x.matmul(&w.t().unwrap()).unwrap();
    assert!(
        values(&want).iter().any(|x| x.is_subnormal()),
        "the test reaches subnormals"
    );
    assert!(bits(&got) == bits(&want));
}

/// Bit for bit candle's `x.matmul(&w.t())` on the same values.
#[test]
fn the_bf16_kernel_gives_the_bits_of_the_f32_gemm() {
    if !runs_here(
        Kernel::Bf16Gemm,
        "the_bf16_kernel_gives_the_bits_of_the_f32_gemm",
    ) {
        return;
    }
    for &(m, n, k) in BLOCKED_SHAPES {
        let (x, w) = (
            matrix(m, k, 1 + m as u64, true),
            matrix(n, k, 7 + k as u64, true),
        );
        let plan = kernels::plan(m, n, k, Stored::Bf16, &candle_order()).unwrap();
        assert_eq!(plan.kernel(), Kernel::Bf16Gemm, "[{m}, {n}, {k}] is taken");
        let got = by_kernel(&x, &w, Stored::Bf16).expect("bf16 inputs");
        let want = x.matmul(&w.t().unwrap()).unwrap();
        assert!(
            bits(&got) == bits(&want),
            "[{m}, {k}] x [{n}, {k}]: bits differ from the f32 GEMM"
        );
        let widened = pairs_of(&w).unwrap().widen();
        assert!(
            widened.iter().map(|v| v.to_bits()).collect::<Vec<_>>() == bits(&w),
            "[{n}, {k}]: widening is exact"
        );
    }
}

/// A bf16 weight whose magnitudes reach down into f16's subnormals (from 4
/// to about 4e-6), so that rounding to f16 changes some values.
fn bf16_weight_across_f16s_range(n: usize, k: usize, seed: u64) -> Tensor {
    let scales: Vec<f32> = (0..n * k)
        .map(|i| 10f32.powi(-2 * (i % 4) as i32))
        .collect();
    let scales = Tensor::from_vec(scales, (n, k), &candle_core::Device::Cpu).unwrap();
    let w = (matrix(n, k, seed, false) * scales).unwrap();
    Precision::Bf16.round(&w).unwrap()
}

/// The f32 kernel reading a weight's bf16 pairs (a bf16 checkpoint in an
/// f32 or f16 model) gives candle's bits on the weight's f32 values, and,
/// reading them as f16 values, candle's bits on the weight rounded to f16
/// (`Precision::F16`, as the parameter loads): the widening and the f16
/// rounding in the kernel's panels change no value.
#[test]
fn the_f32_kernel_reads_bf16_pairs_as_their_f32_or_f16_values() {
    let name = "the_f32_kernel_reads_bf16_pairs_as_their_f32_or_f16_values";
    if !runs_here(Kernel::F32Gemm, name) {
        return;
    }
    // On pools of 1 to 3 threads, whatever this host has: each thread then
    // widens several runs of columns of the 140 × 290 × 8192 shape.
    for threads in 1..=3 {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            for &(m, n, k) in BLOCKED_SHAPES {
                let x = matrix(m, k, 2 + m as u64, false);
                let w = bf16_weight_across_f16s_range(n, k, 5 + k as u64);
                let w16 = Precision::F16.round(&w).unwrap();
                assert!(bits(&w16) != bits(&w), "[{n}, {k}]: f16 rounds some value");
                let pairs = pairs_of(&w).unwrap();
                let plan = kernels::plan(m, n, k, Stored::F32, &candle_order()).unwrap();
                assert_eq!(plan.kernel(), Kernel::F32Gemm);
                for (weight, values_of) in [
                    (Weight::Bf16(&pairs), &w),
                    (Weight::Bf16InF16(&pairs), &w16),
                ] {
                    let got = plan.run(&values(&x), weight).unwrap().unwrap();
                    let got = Tensor::from_vec(got, (m, n), x.device()).unwrap();
                    let want = x.matmul(&values_of.t().unwrap()).unwrap();
                    assert!(
                        bits(&got) == bits(&want),
                        "[{m}, {k}] x [{n}, {k}], f16 values {}, {threads} threads: bits differ",
                        matches!(weight, Weight::Bf16InF16(_))
                    );
                }
            }
        });
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// On generated shapes (empty ones and `k = 0` among them), `Matrix`
    /// gives `linear`'s bits — or the same refusal — whichever kernel the
    /// shape plans, in f32 and bf16, for f32 weights and bf16 pairs.
    #[test]
    fn matrix_gives_linears_bits_on_generated_shapes(
        m in prop_oneof![Just(0usize), Just(1usize), 2usize..90],
        n in prop_oneof![Just(0usize), Just(1usize), 2usize..300],
        k in prop_oneof![Just(0usize), 1usize..3, 3usize..700],
        seed in 0u64..1000,
    ) {
        let (x, w) = (matrix(m, k, seed, true), matrix(n, k, seed + 1, true));
        for prec in [Precision::F32, Precision::Bf16] {
            let want = linear(&x, &w, prec).map(|t| bits(&t)).map_err(|e| e.to_string());
            let plain = Matrix::new(w.clone()).unwrap();
            let got = plain.linear(&x, prec).map(|t| bits(&t)).map_err(|e| e.to_string());
            prop_assert_eq!(&got, &want, "[{}, {}, {}] {:?} f32 weight", m, n, k, prec);
            let packed = Matrix::bf16(&w).unwrap();
            let got = packed.linear(&x, prec).map(|t| bits(&t)).map_err(|e| e.to_string());
            let want_packed = packed_want(&x, &w, prec).map(|t| bits(&t)).map_err(|e| e.to_string());
            prop_assert_eq!(&got, &want_packed, "[{}, {}, {}] {:?} bf16 pairs", m, n, k, prec);
            if m > 0 {
                let rows = plain.linear_each_row(&x, prec).map(|t| bits(&t)).map_err(|e| e.to_string());
                let one: std::result::Result<Vec<u32>, String> = (0..m)
                    .map(|r| linear(&x.narrow(0, r, 1).unwrap(), &w, prec).map(|t| bits(&t)).map_err(|e| e.to_string()))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map(|v| v.concat());
                prop_assert_eq!(rows, one, "[{}, {}, {}] {:?} row by row", m, n, k, prec);
            }
        }
    }
}

/// What `Matrix::linear` on bf16 pairs gives: `linear` on the f32 weight,
/// except where this process plans the AMX kernel for the shape (its sums
/// are the tile unit's, tested against the instruction tile by tile in
/// `amx_kernel.rs`): there that kernel's sums, rounded to `prec`.
fn packed_want(x: &Tensor, w: &Tensor, prec: Precision) -> hsparity::error::Result<Tensor> {
    if let (Ok((m, k)), Ok((n, _))) = (x.dims2(), w.dims2()) {
        let amx = kernels::plan(m, n, k, Stored::Bf16, kernels::capabilities())
            .filter(|p| p.kernel() == Kernel::Bf16Amx);
        if let (Some(plan), Ok(pairs)) = (amx, pairs_of(w)) {
            if let Some(y) = plan.run(&values(x), Weight::Bf16(&pairs))? {
                let y = Tensor::from_vec(y, (m, n), x.device())?;
                return prec.round_products(&y, k, ProductRounding::Nearest);
            }
        }
    }
    linear(x, w, prec)
}

/// `Matrix::linear` equals `linear` on the f32 weight for the kernels'
/// shapes and for those they leave to candle (one row, one column,
/// `m·n <= 256`, `k <= 2`), in bf16 and f32 (bf16 pairs: the AMX kernel's
/// sums where it runs, [`packed_want`]).
#[test]
fn a_bf16_matrix_gives_the_bits_of_linear_on_every_shape() {
    let others = [
        (1, 300, 64),
        (300, 1, 64),
        (8, 30, 64),
        (50, 50, 2),
        (1, 3072, 1024),
    ];
    for &(m, n, k) in BLOCKED_SHAPES.iter().chain(&others) {
        let (x, w) = (
            matrix(m, k, 3 + n as u64, true),
            matrix(n, k, 5 + m as u64, true),
        );
        for prec in [Precision::Bf16, Precision::F32] {
            let want = linear(&x, &w, prec).unwrap();
            let plain = Matrix::new(w.clone()).unwrap();
            assert!(bits(&plain.linear(&x, prec).unwrap()) == bits(&want));
            let packed = Matrix::bf16(&w).unwrap();
            assert!(
                bits(&packed.linear(&x, prec).unwrap())
                    == bits(&packed_want(&x, &w, prec).unwrap()),
                "[{m}, {k}] x [{n}, {k}] {prec:?}: bits differ from linear"
            );
        }
    }
    forced_bf16_kernel_ran();
}

/// In a process whose bf16 kernel is forced (the child of
/// [`matrices_run_the_bf16_kernel_where_its_instruction_is_slow`]), that
/// kernel took products.
fn forced_bf16_kernel_ran() {
    let forced = std::env::var_os("HSPARITY_FORCE_BF16_DOT").is_some();
    if forced && kernels::capabilities().bf16_gemm() && !kernels::capabilities().bf16_amx() {
        let ran = kernels::ran();
        assert!(ran.contains(&Kernel::Bf16Gemm.name()), "{ran:?}");
    }
}

/// Where the bf16 instruction is slow, the matrices above take their bf16
/// products on the f32 kernel; they run again in a child process with the
/// bf16 kernel forced (`HSPARITY_FORCE_BF16_DOT`), so that kernel's path
/// through `Matrix` (and its way out for inputs that are not bf16 values)
/// is tested on such a CPU too.
#[test]
fn matrices_run_the_bf16_kernel_where_its_instruction_is_slow() {
    let name = "matrices_run_the_bf16_kernel_where_its_instruction_is_slow";
    let caps = kernels::capabilities();
    if !caps.bf16_dot_slow || caps.bf16_amx() {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED kernels::{name}: the bf16 products here already take the policy's \
             kernel in the tests above (CPU features {:?})",
            caps.cpu_features()
        );
        return;
    }
    if !runs_here(Kernel::Bf16Gemm, name) {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for test in [
        "kernels::a_bf16_matrix_gives_the_bits_of_linear_on_every_shape",
        "kernels::a_candle_sums_matrix_gives_the_bits_of_linear_everywhere",
    ] {
        let out = std::process::Command::new(&exe)
            .args([test, "--exact", "--test-threads", "1"])
            .env("HSPARITY_FORCE_BF16_DOT", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{test} with the bf16 kernel forced: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A matrix made for candle's sums (a drafter's) gives `linear`'s bits on
/// every shape, those the AMX kernel would take included, and widens its
/// pairs per call without keeping the f32 copy (inputs that are not bf16
/// values go to the f32 route).
#[test]
fn a_candle_sums_matrix_gives_the_bits_of_linear_everywhere() {
    for &(m, n, k) in BLOCKED_SHAPES
        .iter()
        .chain(&[(16, 512, 1024), (1, 300, 64)])
    {
        let w = matrix(n, k, 7 + m as u64, true);
        let held = Matrix::bf16(&w)
            .unwrap()
            .transient_widening()
            .with_candle_sums();
        for bf16_inputs in [true, false] {
            let x = matrix(m, k, 11 + n as u64, bf16_inputs);
            for prec in [Precision::Bf16, Precision::F32] {
                assert!(
                    bits(&held.linear(&x, prec).unwrap()) == bits(&linear(&x, &w, prec).unwrap()),
                    "[{m}, {k}] x [{n}, {k}] {prec:?}, bf16 inputs {bf16_inputs}: bits differ"
                );
            }
        }
        let widened = held.f32().unwrap();
        assert!(
            matches!(widened, std::borrow::Cow::Owned(_)),
            "a transient widening is never kept"
        );
    }
    forced_bf16_kernel_ran();
}

/// Inputs that are not bf16 values leave the bf16 kernel (never rounded
/// silently); weights that are not bf16 values, misfit operands and a
/// k-block that would split a pair are refused.
#[test]
fn refuses_what_it_cannot_compute_exactly() {
    let w = matrix(3, 8, 1, true);
    assert!(pairs_of(&(w.clone() + 1e-3).unwrap()).is_err());
    assert!(Pairs::from_words([3, 8], std::sync::Arc::new(vec![0; 11])).is_err());
    assert!(Pairs::of(&[0.0; 5], [2, 3]).is_err());
    let all = every_kernel();
    assert!(
        kernels::plan(1, 300, 64, Stored::Bf16, &all).is_some_and(|p| p.kernel() == Kernel::Gemv)
    );
    assert_eq!(kernels::plan(8, 30, 64, Stored::Bf16, &all), None);
    // A k-block of an odd number of values would split a pair: the f32
    // kernel instead. Its size depends on the L1 cache (kernel_params).
    for k in [1025, 1030, 2049, 3071] {
        let kc = gemm_common::cache::kernel_params(130, 70, k, 16, 6, 4).kc;
        let want = if kc.is_multiple_of(2) || kc >= k {
            Kernel::Bf16Gemm
        } else {
            Kernel::F32Gemm
        };
        let got = kernels::plan(130, 70, k, Stored::Bf16, &all)
            .unwrap()
            .kernel();
        assert_eq!(got, want, "k = {k}, kc = {kc}");
    }
    if !runs_here(Kernel::Bf16Gemm, "refuses_what_it_cannot_compute_exactly") {
        return;
    }
    let x = (matrix(300, 8, 2, true) + 1e-3).unwrap(); // not bf16 values
    let plan = kernels::plan(300, 3, 8, Stored::Bf16, &candle_order()).unwrap();
    let pairs = pairs_of(&w).unwrap();
    assert!(plan
        .run(&values(&x), Weight::Bf16(&pairs))
        .unwrap()
        .is_none());
    assert!(
        plan.run(&values(&x)[1..], Weight::Bf16(&pairs)).is_err(),
        "x's shape"
    );
    assert!(
        plan.run(&values(&x), Weight::F32(&values(&w))).is_err(),
        "f32 weight"
    );
    assert!(
        plan.run(&values(&x), Weight::Bf16InF16(&pairs)).is_err(),
        "pairs read as f16 values"
    );
    let other = pairs_of(&matrix(4, 8, 1, true)).unwrap();
    assert!(
        plan.run(&values(&x), Weight::Bf16(&other)).is_err(),
        "w's shape"
    );
    let packed = Matrix::bf16(&w).unwrap();
    let want = linear(&x, &w, Precision::Bf16).unwrap();
    assert!(bits(&packed.linear(&x, Precision::Bf16).unwrap()) == bits(&want));
}

/// The bf16 fixture's causal-lm session: its spec and its path's view.
fn bf16_session() -> hsparity::session::Session {
    use hsparity::loading::LoadingPath;
    let dir = "fixtures/divergence/bf16-auto";
    hsparity::session::Session::open(&common::target(dir, None), &[LoadingPath::CausalLm]).unwrap()
}

/// [`bf16_session`] and a resident copy of its path's weights.
fn bf16_resident() -> (
    hsparity::session::Session,
    hsparity::loading::resident::Resident,
) {
    let session = bf16_session();
    let view = &session.paths[0].view;
    let resident = hsparity::loading::resident::Resident::load(view, view.names()).unwrap();
    (session, resident)
}

/// A checkpoint stored in bf16 gives its linear weights' pairs straight from
/// the mapped bytes, equal to the parameter `tensor_in` loads (widened back,
/// bit for bit), for every linear weight of the model; an f32 checkpoint
/// gives none (its values need rounding first).
#[test]
fn pairs_from_a_bf16_checkpoint_equal_the_loaded_parameter() {
    use hsparity::loading::{LoadingPath, WeightSource};
    use hsparity::session::Session;
    let session = bf16_session();
    let view = &session.paths[0].view;
    let mut checked = 0;
    for l in 0..session.spec.num_layers() {
        for name in session.spec.layer_tensor_names(l) {
            let w = view.tensor_in(&name, Precision::Bf16).unwrap();
            let Some((dims, words)) = view.bf16_pairs(&name).unwrap() else {
                continue;
            };
            assert_eq!(&dims[..], w.dims(), "{name}");
            let pairs = Pairs::from_words(dims, words).unwrap();
            let widened: Vec<u32> = pairs.widen().iter().map(|v| v.to_bits()).collect();
            assert!(
                widened == bits(&w),
                "{name}: pairs differ from the parameter"
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} weights came as pairs");
    let f32_session = Session::open(
        &common::target("fixtures/tiny-qwen3_5", None),
        &[LoadingPath::CausalLm],
    )
    .unwrap();
    let f32_view = &f32_session.paths[0].view;
    let names = f32_session.spec.layer_tensor_names(0);
    let name = names
        .iter()
        .find(|n| f32_view.shape(n).is_some_and(|s| s.len() == 2))
        .unwrap();
    assert!(f32_view.bf16_pairs(name).unwrap().is_none(), "{name}");
}

/// A bf16 weight in a model computing in f32 or f16, on the single-row
/// route (decode steps, each row its own product): `Matrix` on the weight's
/// pairs gives the bits `linear` gives row by row on the parameter such a
/// model loads (the values widened, and rounded to f16 for f16): weights
/// below f16's normal range (scale 2⁻¹⁶: rounding them to f16 changes them)
/// and sums past its largest value (scale 512: they round to infinity)
/// included.
#[test]
fn bf16_pairs_in_f32_or_f16_give_linears_bits_row_by_row() {
    use hsparity::loading::WeightSource;
    struct Held(Tensor);
    impl WeightSource for Held {
        fn tensor(&self, _: &str) -> hsparity::error::Result<Tensor> {
            Ok(self.0.clone())
        }
        fn identity(&self, name: &str) -> String {
            format!("test:{name}")
        }
        fn bf16_pairs(&self, _: &str) -> hsparity::error::Result<hsparity::loading::PairWords> {
            let p = pairs_of(&self.0)?;
            Ok(Some((p.dims(), std::sync::Arc::new(p.words().to_vec()))))
        }
    }
    let (n, k) = (300, 1069);
    let mut overflowed = false;
    for scale in [1.0, 2f64.powi(-16), 512.0] {
        let w = (matrix(n, k, 5, true) * scale).unwrap();
        let src = Held(w.clone());
        for prec in [Precision::F32, Precision::F16] {
            let held = hsparity::models::layers::matrix(&src, "w", prec).unwrap();
            let param = prec.round(&w).unwrap();
            for s in [1, 5] {
                let x = prec.round(&matrix(s, k, 40 + s as u64, false)).unwrap();
                let got = held.linear_each_row(&x, prec).unwrap();
                for r in 0..s {
                    let want = linear(&x.narrow(0, r, 1).unwrap(), &param, prec).unwrap();
                    let row = got.narrow(0, r, 1).unwrap();
                    assert!(
                        bits(&row) == bits(&want),
                        "scale {scale} {prec:?}, row {r} of {s}"
                    );
                    overflowed |= bits(&want).iter().any(|b| f32::from_bits(*b).is_infinite());
                }
            }
        }
    }
    assert!(overflowed, "no sum went past f16's range");
}

/// An LM head's vocabulary chunk read as pairs from a bf16 checkpoint's
/// bytes (`matrix_rows`, `WeightSource::bf16_pair_rows`) is the chunk of the
/// whole tensor's pairs, and gives the bits of the chunk loaded and rounded
/// (`row_range`, `Matrix::of_param`); a range past the last row is refused.
#[test]
fn head_chunks_as_pairs_give_the_bits_of_the_loaded_rows() {
    use hsparity::loading::WeightSource;
    use hsparity::models::layers::matrix_rows;
    let session = bf16_session();
    let view = &session.paths[0].view;
    let name = "lm_head.weight";
    let (all_dims, all) = view.bf16_pairs(name).unwrap().expect("a bf16 lm_head");
    let [v, k] = all_dims;
    let per_row = k.div_ceil(2);
    for (start, len) in [(0, 1), (3, 17), (v - 5, 5)] {
        let (dims, words) = view.bf16_pair_rows(name, start, len).unwrap().unwrap();
        assert_eq!(dims, [len, k]);
        assert_eq!(words[..], all[start * per_row..(start + len) * per_row]);
        let got = matrix_rows(view, name, (start, len), Precision::Bf16).unwrap();
        let rows = view.row_range(name, start, len, Precision::Bf16).unwrap();
        let want = Matrix::of_param(rows, Precision::Bf16, true).unwrap();
        for m in [1, 7, 40] {
            let x = Precision::Bf16
                .round(&matrix(m, k, 29 + m as u64, false))
                .unwrap();
            let (g, w) = (
                got.linear(&x, Precision::Bf16),
                want.linear(&x, Precision::Bf16),
            );
            assert!(
                bits(&g.unwrap()) == bits(&w.unwrap()),
                "rows {start}+{len}, {m} rows"
            );
        }
    }
    let e = view.bf16_pair_rows(name, v - 2, 3).unwrap_err().to_string();
    assert!(e.contains("requested"), "{e}");
}

/// While a sweep holds its sources' pairs (`WeightSource::hold_pairs`), a
/// weight read again (by the view or a clone: another model of the sweep)
/// is the words read first, not a second read; once released, or never
/// held, every read is its own.
#[test]
fn held_pairs_are_read_once_until_released() {
    use hsparity::loading::WeightSource;
    use std::sync::Arc;
    let session = bf16_session();
    let view = &session.paths[0].view;
    let clone = view.clone();
    let name = (0..session.spec.num_layers())
        .flat_map(|l| session.spec.layer_tensor_names(l))
        .find(|n| view.bf16_pairs(n).unwrap().is_some())
        .expect("a linear weight stored in bf16");
    let read = |v: &dyn WeightSource| v.bf16_pairs(&name).unwrap().unwrap().1;
    let (a, b) = (read(view), read(view));
    assert!(!Arc::ptr_eq(&a, &b), "read twice without a hold");
    view.hold_pairs(true);
    let (c, d) = (read(view), read(&clone));
    assert!(Arc::ptr_eq(&c, &d), "a held weight was read again");
    assert_eq!(*c, *a, "the held words are the weight's");
    view.hold_pairs(false);
    let e = read(&clone);
    assert!(!Arc::ptr_eq(&c, &e), "released words handed out again");
    assert_eq!(*e, *a);
}

/// A resident copy (the drafter's and triage's memory plan when the target
/// fits) hands out the pairs of every 2-D weight it holds in bf16, whole and
/// by rows, as the mapped checkpoint does, word for word, without widening;
/// a weight it holds in another dtype, or does not hold, gives none.
#[test]
fn resident_pairs_are_the_checkpoints_words() {
    use hsparity::loading::resident::Resident;
    use hsparity::loading::WeightSource;
    let (session, resident) = bf16_resident();
    let view = &session.paths[0].view;
    let mut checked = 0;
    for name in view.names() {
        let Some((dims, want)) = view.bf16_pairs(name).unwrap() else {
            assert!(
                resident.bf16_pairs(name).unwrap().is_none(),
                "{name}: pairs where the checkpoint gives none"
            );
            continue;
        };
        let (got_dims, got) = resident.bf16_pairs(name).unwrap().expect(name);
        assert_eq!((got_dims, &*got), (dims, &*want), "{name}");
        let rows = dims[0] / 2;
        let (_, want) = view.bf16_pair_rows(name, 1, rows).unwrap().unwrap();
        let (_, got) = resident.bf16_pair_rows(name, 1, rows).unwrap().unwrap();
        assert_eq!(*got, *want, "{name}: rows 1..{}", 1 + rows);
        let past = resident.bf16_pair_rows(name, dims[0], 1).unwrap_err();
        assert!(past.to_string().contains(name.as_str()), "{past}");
        checked += 1;
    }
    assert!(checked >= 10, "{checked} bf16 weights");
    let f32_session = hsparity::session::Session::open(
        &common::target("fixtures/tiny-qwen3_5", None),
        &[hsparity::loading::LoadingPath::CausalLm],
    )
    .unwrap();
    let f32_view = &f32_session.paths[0].view;
    let f32_resident = Resident::load(f32_view, f32_view.names()).unwrap();
    assert!(f32_view
        .names()
        .iter()
        .all(|n| f32_resident.bf16_pairs(n).unwrap().is_none()));
}

/// A resident copy, which holds a bf16 checkpoint's 2-D weights as their
/// pairs only, widens them to the values the mapped checkpoint gives: whole,
/// by rows and by a range of rows, in each compute dtype, bit for bit; an
/// id or a range past the last row is refused with the tensor's name. (The
/// fixture's bf16 values are all f16 values too, so its f16 rounding is the
/// identity here.) A second loading path's copy shares the first's words.
#[test]
fn resident_values_are_the_checkpoints_values() {
    use hsparity::loading::resident::Resident;
    use hsparity::loading::WeightSource;
    let (session, resident) = bf16_resident();
    let view = &session.paths[0].view;
    let mut held_as_pairs = 0;
    for name in view.names() {
        let two_d = view.shape(name).is_some_and(|s| s.len() == 2);
        held_as_pairs += usize::from(resident.bf16_pairs(name).unwrap().is_some());
        for prec in [Precision::F32, Precision::Bf16, Precision::F16] {
            let (want, got) = (view.tensor_in(name, prec), resident.tensor_in(name, prec));
            assert!(
                bits(&got.unwrap()) == bits(&want.unwrap()),
                "{name} {prec:?}"
            );
            if !two_d {
                continue;
            }
            let n = view.shape(name).unwrap()[0];
            let ids = [2u32.min(n as u32 - 1), 0, 2u32.min(n as u32 - 1)];
            let (want, got) = (view.rows(name, &ids, prec), resident.rows(name, &ids, prec));
            assert!(
                bits(&got.unwrap()) == bits(&want.unwrap()),
                "{name} {prec:?} rows"
            );
            let len = n / 2;
            let want = view.row_range(name, 1, len, prec).unwrap();
            let got = resident.row_range(name, 1, len, prec).unwrap();
            assert!(
                bits(&got) == bits(&want),
                "{name} {prec:?} rows 1..{}",
                1 + len
            );
            let e = resident
                .rows(name, &[n as u32], prec)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(name.as_str()) && e.contains("out of range"),
                "{e}"
            );
            let e = resident
                .row_range(name, n, 1, prec)
                .unwrap_err()
                .to_string();
            assert!(e.contains(name.as_str()), "{e}");
        }
    }
    assert!(held_as_pairs >= 10, "{held_as_pairs} weights held as pairs");
    // Another loading path of the same checkpoint shares the held words
    // (the same allocation) and counts only what it adds.
    let both = hsparity::session::Session::open(
        &common::target("fixtures/divergence/bf16-auto", None),
        &[
            hsparity::loading::LoadingPath::CausalLm,
            hsparity::loading::LoadingPath::Vlm,
        ],
    )
    .unwrap();
    let (a, b) = (&both.paths[0].view, &both.paths[1].view);
    let first = Resident::load(a, a.names()).unwrap();
    let second = Resident::load_sharing(b, b.names(), Some(&first)).unwrap();
    let mut shared = 0;
    for name in b.names() {
        if let (Some((_, w1)), Some((_, w2))) = (
            first.bf16_pairs(name).unwrap(),
            second.bf16_pairs(name).unwrap(),
        ) {
            assert!(std::sync::Arc::ptr_eq(&w1, &w2), "{name}: words copied");
            shared += 1;
        }
    }
    assert!(shared >= 10, "{shared} weights shared");
    assert!(
        second.bytes() < first.bytes() / 10,
        "{} of {}",
        second.bytes(),
        first.bytes()
    );
}

/// A linear weight a bf16 checkpoint stores, loaded for a model computing
/// in f32 or f16 (`matrix`: its pairs, read by the f32 kernel), gives
/// `linear`'s bits on the parameter that model loads (`tensor_in`), on the
/// kernels' shapes, a single row and the shapes left to candle.
#[test]
fn a_bf16_checkpoint_in_f32_or_f16_gives_linears_bits_on_its_parameter() {
    use hsparity::loading::WeightSource;
    let session = bf16_session();
    let view = &session.paths[0].view;
    let mut checked = 0;
    for name in session.spec.layer_tensor_names(0) {
        if view.bf16_pairs(&name).unwrap().is_none() {
            continue;
        }
        for prec in [Precision::F32, Precision::F16] {
            let held = hsparity::models::layers::matrix(view, &name, prec).unwrap();
            let w = view.tensor_in(&name, prec).unwrap();
            let k = w.dim(1).unwrap();
            for m in [1, 7, 40, 130] {
                let x = prec.round(&matrix(m, k, 17 + m as u64, false)).unwrap();
                let want = linear(&x, &w, prec).unwrap();
                assert!(
                    bits(&held.linear(&x, prec).unwrap()) == bits(&want),
                    "{name} {prec:?}, {m} rows: bits differ from linear"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 4, "only {checked} weights came as pairs");
}

// ---- the single-row kernel -----------------------------------------------

/// `(s, n, k)` the single-row kernel takes.
const TAKEN: &[(usize, usize, usize)] = &[
    (2, 257, 3),     // k just above gevv's, n just above the horizontal kernel's
    (7, 300, 63),    // no 64-value block: 8-value groups and a tail only
    (5, 1024, 1024), // blocks only (the mid checkpoint's projections)
    (8, 513, 1069),  // blocks, groups and an odd tail
    (3, 600, 1096),  // blocks, then one group and no tail
];

/// Each row has the bits of its own single-row product, for an f32 weight,
/// for bf16 pairs (widened as they load), and for bf16 pairs read as their
/// f16 values (the product on the weight rounded to f16).
#[test]
fn each_row_has_the_bits_of_its_own_product() {
    if !runs_here(Kernel::Gemv, "each_row_has_the_bits_of_its_own_product") {
        return;
    }
    for &(s, n, k) in TAKEN {
        let x = matrix(s, k, 3 + k as u64, false);
        let plan = kernels::plan(1, n, k, Stored::F32, kernels::capabilities()).unwrap();
        assert_eq!(plan.kernel(), Kernel::Gemv);
        for form in ["f32", "bf16", "bf16 as f16"] {
            let w = match form {
                "f32" => matrix(n, k, 11 + n as u64, false),
                "bf16" => matrix(n, k, 11 + n as u64, true),
                _ => bf16_weight_across_f16s_range(n, k, 13 + n as u64),
            };
            let wv = values(&w);
            let pairs = (form != "f32").then(|| pairs_of(&w).unwrap());
            let (weight, want) = match (form, &pairs) {
                ("bf16", Some(p)) => (Weight::Bf16(p), one_by_one(&x, &w)),
                (_, Some(p)) => (
                    Weight::Bf16InF16(p),
                    one_by_one(&x, &Precision::F16.round(&w).unwrap()),
                ),
                (_, None) => (Weight::F32(&wv), one_by_one(&x, &w)),
            };
            let got = plan.run(&values(&x), weight).unwrap().unwrap();
            let got = Tensor::from_vec(got, (s, n), x.device()).unwrap();
            assert!(
                bits(&got) == bits(&want),
                "[{s}, {n}, {k}] {form}: rows differ from their own products"
            );
        }
    }
}

#[test]
fn shapes_off_the_single_row_route_are_not_planned() {
    let all = every_kernel();
    assert_eq!(
        kernels::plan(1, 256, 64, Stored::F32, &all),
        None,
        "n <= 256: the horizontal kernel"
    );
    assert_eq!(
        kernels::plan(1, 1024, 2, Stored::F32, &all),
        None,
        "k <= 2: gevv"
    );
    if !runs_here(
        Kernel::Gemv,
        "shapes_off_the_single_row_route_are_not_planned",
    ) {
        return;
    }
    let plan = kernels::plan(1, 300, 64, Stored::F32, kernels::capabilities()).unwrap();
    let (x, w) = (
        values(&matrix(3, 64, 1, false)),
        values(&matrix(300, 64, 3, false)),
    );
    assert!(
        plan.run(&x, Weight::F32(&w[..w.len() - 5])).is_err(),
        "values that do not fill whole rows"
    );
    assert!(
        plan.run(&x[..70], Weight::F32(&w)).is_err(),
        "rows that are not whole"
    );
    assert_eq!(
        plan.run(&[], Weight::F32(&w)).unwrap(),
        Some(Vec::new()),
        "no rows"
    );
}

/// Rows whose values are not adjacent (a transposed input) go row by row
/// through candle, whose single-row product of such a row is its blocked
/// route: the same bits as candle's.
#[test]
fn a_strided_input_gives_candles_bits_row_by_row() {
    let x = matrix(200, 3, 9, false).t().unwrap();
    let w = matrix(300, 200, 10, false);
    let m = Matrix::new(w.clone()).unwrap();
    let got = m.linear_each_row(&x, Precision::F32).unwrap();
    assert!(bits(&got) == bits(&one_by_one(&x, &w)));
}

#[test]
fn linear_each_row_gives_linear_row_by_row_on_every_shape() {
    let shapes = [(4, 1024, 1024), (3, 200, 64), (1, 512, 512), (6, 300, 2)];
    for (s, n, k) in shapes {
        let x = matrix(s, k, 5 + s as u64, true);
        for prec in [Precision::F32, Precision::Bf16] {
            let w = matrix(n, k, 17 + k as u64, true);
            let m = Matrix::of_param(w.clone(), prec, false).unwrap();
            // candle's product of each row alone, rounded.
            let want: Vec<Tensor> = (0..s)
                .map(|r| linear(&x.narrow(0, r, 1).unwrap(), &w, prec).unwrap())
                .collect();
            let want = Tensor::cat(&want, 0).unwrap();
            let got = m.linear_each_row(&x, prec).unwrap();
            assert!(
                bits(&got) == bits(&want),
                "[{s}, {n}, {k}] {prec:?}: linear_each_row differs from candle row by row \
                 (kernels here: {:?})",
                kernels::capabilities().available()
            );
            let one = m.linear(&x.narrow(0, 0, 1).unwrap(), prec).unwrap();
            assert!(
                bits(&one) == bits(&want.narrow(0, 0, 1).unwrap()),
                "[1, {n}, {k}] {prec:?}: Matrix::linear on one row differs from candle"
            );
        }
    }
}

// ---- end to end ----------------------------------------------------------

/// How a test run of `compare` picks its kernels.
#[derive(Clone, Copy, PartialEq)]
enum Pick {
    /// As this CPU and the policy choose.
    Policy,
    /// The bf16 kernel even where its instruction is slow
    /// (`HSPARITY_FORCE_BF16_DOT`).
    Bf16Dot,
    /// candle's GEMM everywhere, the delta rule's AVX2 build.
    CandleOnly,
}

/// `compare --json` under `pick`: the report without its environment, the
/// kernels the environment says ran, and the CPU features it lists.
fn report(args: &[&str], pick: Pick) -> (serde_json::Value, Vec<String>, Vec<String>) {
    let mut cmd = common::hsparity();
    cmd.args(["compare", "--json", "--no-report", "--quiet"])
        .args(args);
    // Both runs in candle's sums (the AMX kernel's are its own:
    // `amx_kernel.rs` compares its runs to the noise floor); no switch
    // inherited from the test's environment.
    for switch in [
        "HSPARITY_NO_AVX512_GEMM",
        "HSPARITY_NO_BF16_DOT",
        "HSPARITY_NO_AVX512_DELTA",
        "HSPARITY_FORCE_BF16_DOT",
    ] {
        cmd.env_remove(switch);
    }
    cmd.env("HSPARITY_NO_AMX", "1");
    match pick {
        Pick::Policy => {}
        Pick::Bf16Dot => {
            cmd.env("HSPARITY_FORCE_BF16_DOT", "1");
        }
        Pick::CandleOnly => {
            cmd.env("HSPARITY_NO_AVX512_GEMM", "1")
                .env("HSPARITY_NO_BF16_DOT", "1")
                .env("HSPARITY_NO_AVX512_DELTA", "1");
        }
    }
    let out = cmd.output().unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let env = v.as_object_mut().unwrap().remove("environment").unwrap();
    let names = |key: &str| -> Vec<String> {
        env["kernels"][key]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect()
    };
    (v, names("ran"), names("cpu_features"))
}

/// End to end, every kernel of hsparity's own against candle's GEMM
/// everywhere (and the delta rule's widest build against its AVX2 one): the
/// same report, figure for figure, in f32, bf16 and the fp16-on-disk pair
/// that diverges (bf16 against f16); and the two runs really ran different
/// kernels (the environment says which).
#[test]
fn compare_gives_the_same_report_with_candles_gemm_everywhere() {
    let cases: [(&[&str], Pick, Kernel); 6] = [
        (
            &["fixtures/tiny-qwen3_5", "--dtype", "f32"],
            Pick::Policy,
            Kernel::F32Gemm,
        ),
        // Where vdpbf16ps is slow the f32 kernel takes the bf16 products
        // (below); the bf16 kernel is run end to end there too.
        (
            &["fixtures/tiny-qwen3_5", "--dtype", "bf16"],
            Pick::Policy,
            Kernel::Bf16Gemm,
        ),
        (
            &["fixtures/tiny-qwen3_5", "--dtype", "bf16"],
            Pick::Bf16Dot,
            Kernel::Bf16Gemm,
        ),
        (
            &["fixtures/divergence/fp16-disk", "--paths", "causal-lm,vlm"],
            Pick::Policy,
            Kernel::F32Gemm,
        ),
        // A bf16 checkpoint in f32 and f16: the f32 kernel reads its pairs.
        (
            &["fixtures/divergence/bf16-auto", "--dtype", "f32"],
            Pick::Policy,
            Kernel::F32Gemm,
        ),
        (
            &["fixtures/divergence/bf16-auto", "--dtype", "f16"],
            Pick::Policy,
            Kernel::F32Gemm,
        ),
    ];
    for (args, pick, kernel) in cases {
        let (ours, ran, features) = report(args, pick);
        assert!(
            ours["pairs"].as_array().is_some_and(|p| !p.is_empty()),
            "{args:?}"
        );
        let (candle, candle_ran, _) = report(args, Pick::CandleOnly);
        assert_eq!(ours, candle, "{args:?}");
        assert!(
            !candle_ran
                .iter()
                .any(|k| k.contains("gemm") || k.contains("gemv")),
            "{args:?}: switched off, yet {candle_ran:?} ran"
        );
        let name = "compare_gives_the_same_report_with_candles_gemm_everywhere";
        // The delta rule: its widest build here against its AVX2 build (the
        // switched run), the same report.
        if runs_here(Kernel::DeltaRuleAvx512, name) {
            assert!(
                ran.iter().any(|k| k == Kernel::DeltaRuleAvx512.name()),
                "{ran:?}"
            );
        }
        if runs_here(Kernel::DeltaRuleAvx2, name) {
            let avx2 = Kernel::DeltaRuleAvx2.name();
            assert!(candle_ran.iter().any(|k| k == avx2), "{candle_ran:?}");
        }
        // The run's own timing of vdpbf16ps decided (its CPU features say).
        let slow = features.iter().any(|f| f == "avx512bf16-slow");
        let kernel = match (kernel, pick) {
            (Kernel::Bf16Gemm, Pick::Policy) if slow => Kernel::F32Gemm,
            _ => kernel,
        };
        if runs_here(kernel, name) {
            assert!(
                ran.iter().any(|k| k == kernel.name()),
                "{args:?}: {} did not run ({ran:?})",
                kernel.name()
            );
        }
        if slow && pick == Pick::Policy {
            let bf16 = Kernel::Bf16Gemm.name();
            assert!(!ran.iter().any(|k| k == bf16), "{args:?}: {ran:?}");
        }
    }
}

/// What turned kernels off, as reports list it: the switches set, and the
/// OS's refusal of AMX's tile state; where the OS refused it no product is
/// planned on AMX, and the AVX512-BF16 kernel takes bf16 pairs.
#[test]
fn disabled_by_names_the_switches_and_a_refused_tile_state() {
    let refused = Capabilities {
        amx_refused: true,
        no_amx: true,
        ..every_kernel()
    };
    assert_eq!(
        refused.disabled_by(),
        ["HSPARITY_NO_AMX", "ARCH_REQ_XCOMP_PERM refused"]
    );
    let unswitched = Capabilities {
        no_amx: false,
        ..refused
    };
    assert!(!unswitched.available().contains(&Kernel::Bf16Amx.name()));
    let plan = kernels::plan(300, 300, 64, Stored::Bf16, &unswitched).map(|p| p.kernel());
    assert_eq!(plan, Some(Kernel::Bf16Gemm));
    let granted = Capabilities {
        amx_bf16: true,
        ..every_kernel()
    };
    let plan = kernels::plan(300, 300, 64, Stored::Bf16, &granted).map(|p| p.kernel());
    assert_eq!(plan, Some(Kernel::Bf16Amx));
    assert!(granted.disabled_by().is_empty());
}

/// A plan made for capabilities this CPU lacks is refused when run, never
/// executed (the kernels' instructions may not exist here).
#[test]
fn a_plan_for_another_cpu_is_refused_here() {
    let caps = kernels::capabilities();
    let plan = kernels::plan(300, 300, 64, Stored::F32, &every_kernel()).unwrap();
    let (x, w) = (
        values(&matrix(300, 64, 1, false)),
        values(&matrix(300, 64, 2, false)),
    );
    let got = plan.run(&x, Weight::F32(&w));
    assert_eq!(got.is_ok(), caps.avx512f, "{got:?}");
}
