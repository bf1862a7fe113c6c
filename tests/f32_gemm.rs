//! The AVX-512 f32 matmul (`models::layers::f32_gemm`) gives candle's f32
//! GEMM bits for every shape it takes — one and several k-blocks, the
//! small-size block rule, every tile remainder, values whose products
//! round (not bf16 values) and subnormal ones — and refuses the shapes
//! candle sends down its other routes.

mod common;

use common::{bits, matrix, BLOCKED_SHAPES};

use candle_core::Tensor;
use hsparity::models::layers::{f32_gemm, routes};

#[test]
fn the_kernel_gives_the_bits_of_candles_gemm() {
    if !routes::avx512() {
        eprintln!("skipped: this CPU has no AVX-512F (linear keeps candle's GEMM)");
        return;
    }
    for &(m, n, k) in BLOCKED_SHAPES {
        assert!(
            f32_gemm::exact_for(m, n, k).is_some(),
            "[{m}, {n}, {k}] is taken"
        );
        let (x, w) = (
            matrix(m, k, 1 + m as u64, false),
            matrix(n, k, 7 + k as u64, false),
        );
        let got = f32_gemm::matmul_nt(&x, &w).unwrap();
        let want = x.matmul(&w.t().unwrap()).unwrap();
        assert!(bits(&got) == bits(&want), "[{m}, {n}, {k}]: bits differ");
    }
}

/// Products and sums down in the subnormal range: FMA keeps them, and so
/// must the kernel.
#[test]
fn subnormal_values_give_the_same_bits() {
    if !routes::avx512() {
        eprintln!("skipped: this CPU has no AVX-512F");
        return;
    }
    let tiny = |t: Tensor| (t * 1e-20).unwrap();
    let (x, w) = (
        tiny(matrix(33, 300, 3, false)),
        tiny(matrix(70, 300, 4, false)),
    );
    let got = f32_gemm::matmul_nt(&x, &w).unwrap();
    let want = x.matmul(&w.t().unwrap()).unwrap();
    let v = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert!(
        v.iter().any(|x| x.is_subnormal()),
        "the test reaches subnormals"
    );
    assert!(bits(&got) == bits(&want));
}

#[test]
fn shapes_on_candles_other_routes_are_refused() {
    for (m, n, k) in [(1, 512, 512), (512, 1, 512), (16, 16, 64), (300, 300, 2)] {
        assert!(f32_gemm::exact_for(m, n, k).is_none(), "[{m}, {n}, {k}]");
        let (x, w) = (matrix(m, k, 1, false), matrix(n, k, 2, false));
        assert!(f32_gemm::matmul_nt(&x, &w).is_err(), "[{m}, {n}, {k}]");
    }
    let (x, w) = (matrix(40, 64, 1, false), matrix(40, 65, 2, false));
    assert!(f32_gemm::matmul_nt(&x, &w).is_err(), "k differs");
}

/// `compare --json` without the environment block (which holds the peak RSS).
fn report(args: &[&str], candle_only: bool) -> serde_json::Value {
    let mut cmd = common::hsparity();
    cmd.args(["compare", "--json", "--no-report", "--quiet"])
        .args(args);
    if candle_only {
        cmd.env("HSPARITY_NO_AVX512_GEMM", "1")
            .env("HSPARITY_NO_BF16_DOT", "1");
    }
    let out = cmd.output().unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_object_mut().unwrap().remove("environment");
    v
}

/// End to end, every kernel of hsparity's own against candle's GEMM
/// everywhere: the same report, figure for figure, in f32, bf16 and the
/// fp16-on-disk pair that diverges (bf16 against f16).
#[test]
fn compare_gives_the_same_report_with_candles_gemm_everywhere() {
    let cases: [&[&str]; 3] = [
        &["fixtures/tiny-qwen3_5", "--dtype", "f32"],
        &["fixtures/tiny-qwen3_5", "--dtype", "bf16"],
        &["fixtures/divergence/fp16-disk", "--paths", "causal-lm,vlm"],
    ];
    for args in cases {
        let ours = report(args, false);
        assert!(
            ours["pairs"].as_array().is_some_and(|p| !p.is_empty()),
            "{args:?}"
        );
        assert_eq!(ours, report(args, true), "{args:?}");
    }
}
