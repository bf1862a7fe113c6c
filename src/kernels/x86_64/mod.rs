//! The x86-64 kernels: AVX-512 FMA for f32 products and single rows,
//! AVX512-BF16 for bf16 pairs, sharing one tile scheduler ([`tiles`]), and
//! AMX tiles for bf16 pairs ([`amx`]).
//! The products are entered only through [`super::Plan::run`], so every
//! one runs on a CPU [`detect`] found its features on; the conversion of a
//! checkpoint's bf16 bytes ([`words_from_bytes`]) detects AVX-512BW itself,
//! and the silu's `e^{−x}` ([`expf`], through [`super::exp_negated`]) runs
//! where the capabilities have AVX-512F and it reproduces this libm.

mod amx;
mod bf16_gemm;
pub(crate) mod expf;
mod f32_gemm;
mod gemv;
mod tiles;
mod words;

use super::{Capabilities, Kernel, Plan, Weight};

/// The CPU's features (CPUID), the bf16 instruction's addition order probed.
pub(super) fn detect() -> Capabilities {
    let avx2 = is_x86_feature_detected!("avx2");
    let avx512f = avx2 && is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx512f");
    let avx512bf16 = avx512f
        && is_x86_feature_detected!("avx512bf16")
        // SAFETY: the features it needs were just detected.
        && unsafe { bf16_gemm::adds_as_assumed() };
    let bf16_dot_slow = avx512bf16 && bf16_dot_rate().is_some_and(|r| r < super::DOT_RATE_PAYS);
    let (amx_bf16, amx_refused) = amx::detect();
    Capabilities {
        avx2,
        avx512f,
        avx512bf16,
        bf16_dot_slow,
        amx_bf16,
        amx_refused,
        ..Capabilities::default()
    }
}

/// [`super::fma_rate`].
pub(super) fn fma_rate() -> Option<f64> {
    // SAFETY: AVX-512F is detected first.
    is_x86_feature_detected!("avx512f").then(|| unsafe { bf16_gemm::fma_rate() })
}

/// [`super::bf16_dot_rate`].
pub(super) fn bf16_dot_rate() -> Option<f64> {
    let here = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16");
    // SAFETY: the features it needs were just detected.
    here.then(|| unsafe { bf16_gemm::dot_rate() })
}

/// [`super::pairs::words_from_bytes`] with AVX-512BW where this CPU has it
/// (`None` where it does not: the caller's scalar loop runs).
pub(super) fn words_from_bytes(
    out: &mut [u32],
    row: &[u8],
    rest: fn(&mut [u32], &[u8]) -> (usize, usize),
) -> Option<(usize, usize)> {
    let here = super::capabilities().avx512f && is_x86_feature_detected!("avx512bw");
    // SAFETY: the features it needs were just detected; the caller passes
    // `out` of `row.len().div_ceil(4)` words.
    here.then(|| unsafe { words::words(out, row, rest) })
}

/// Runs `plan` (shapes and operands checked by the caller).
pub(super) fn run(plan: &Plan, x: &[f32], w: Weight<'_>) -> Option<Vec<f32>> {
    let [m, n, k] = plan.dims();
    // SAFETY: `Plan::run` checked that this CPU (`super::capabilities()`,
    // read from CPUID) has the kernel's features and that `x` and `w` hold
    // the planned shapes.
    unsafe {
        match (plan.kernel(), w) {
            (Kernel::F32Gemm, w) => Some(f32_gemm::matmul_nt(x, w, (m, n, k), plan.kc())),
            (Kernel::Bf16Gemm, Weight::Bf16(p)) => bf16_gemm::matmul_nt(x, p, (m, n, k), plan.kc()),
            (Kernel::Bf16Amx, Weight::Bf16(p)) => amx::matmul_nt(x, p, (m, n, k)),
            (Kernel::Gemv, w) => Some(gemv::rows_times(x, w, n, k)),
            // Refused by `Plan::run` before this point.
            _ => None,
        }
    }
}
