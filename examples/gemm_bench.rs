//! The product kernels' rates on this CPU: every kernel `kernels::plan`
//! can pick for `x [m, k] · w [n, k]ᵀ` on the mid checkpoint's shapes (and a
//! long prompt's), and on the 27B layout's with the rows of one 32-token
//! sequence and of seven stacked (a triage sweep's), against candle's GEMM,
//! in GFLOP/s (docs/performance.md, "Kernels"). The f32 kernel is timed on
//! an f32 weight and on bf16 pairs (a bf16 checkpoint in an f32 model).
//!
//! ```sh
//! cargo run --release --example gemm_bench
//! ```
//!
//! Each row: the best of 5 runs after one warm-up, on the rayon pool
//! (`RAYON_NUM_THREADS`, else all cores). A kernel this CPU or the
//! environment's switches rule out is shown as `-`. Before the table: one
//! thread's rate for f32 multiply-adds with their operands in registers
//! (AVX-512F), the most any f32 kernel can reach per thread here.

use std::time::Instant;

use candle_core::{Device, Tensor};
use hsparity::kernels::{self, Capabilities, Pairs, Stored, Weight};

/// Deterministic bf16-valued inputs in about [-scale, scale].
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

/// The best of 5 timed calls of `f`, after one untimed one, in seconds.
fn best(mut f: impl FnMut()) -> f64 {
    f();
    (0..5)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let caps = *kernels::capabilities();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    println!(
        "{cpu}; {} threads; kernels' CPU features {:?}; vdpbf16ps multiply-adds per second \
         over FMAs' {}",
        rayon::current_num_threads(),
        caps.cpu_features(),
        kernels::bf16_dot_rate().map_or("-".into(), |r| format!("{r:.2}"))
    );
    if let Some(peak) = kernels::fma_rate() {
        println!(
            "one thread's register-only FMA rate (kernels::fma_rate): {peak:.0} GFLOP/s; × {} \
             threads: {:.0}",
            rayon::current_num_threads(),
            peak * rayon::current_num_threads() as f64
        );
    }
    let no_amx = Capabilities {
        no_amx: true,
        ..caps
    };
    // The bf16 kernel timed even where the plan gives its products to the
    // f32 kernel (its instruction slow here).
    let bf16_dot = Capabilities {
        bf16_dot_slow: false,
        ..no_amx
    };
    println!(
        "{:>20} {:>10} {:>10} {:>11} {:>12} {:>10}",
        "m × n × k", "candle f32", "f32 kernel", "f32 on bf16", "bf16 avx512", "bf16 amx"
    );
    for (m, n, k) in [
        (512, 1024, 1024),
        (512, 3072, 1024),
        (512, 1024, 3072),
        (512, 4096, 1024),
        (2048, 3072, 1024),
        (32, 17408, 5120),
        (224, 17408, 5120),
        (32, 5120, 17408),
        (224, 5120, 17408),
    ] {
        let x = values(m * k, 1 + k as u64, 1.0);
        let w = values(n * k, 2 + n as u64, 1.0 / (k as f32).sqrt());
        let pairs = Pairs::of(&w, [n, k]).expect("bf16 values");
        let flops = 2.0 * (m * n * k) as f64;
        let rate = |s: f64| format!("{:.0}", flops / s / 1e9);
        let dev = Device::Cpu;
        let (xt, wt) = (
            Tensor::from_slice(&x, (m, k), &dev).expect("x"),
            Tensor::from_slice(&w, (n, k), &dev).expect("w"),
        );
        let wtt = wt.t().expect("t");
        let candle = rate(best(|| {
            xt.matmul(&wtt).expect("matmul");
        }));
        let run = |stored: Stored, c: &Capabilities, want: kernels::Kernel, wgt: Weight<'_>| {
            let plan = kernels::plan(m, n, k, stored, c).filter(|p| p.kernel() == want);
            plan.map_or("-".to_string(), |p| {
                rate(best(|| {
                    p.run(&x, wgt).expect("runs").expect("bf16 inputs");
                }))
            })
        };
        let (f32s, bf16s) = (Weight::F32(&w), Weight::Bf16(&pairs));
        println!(
            "{:>20} {candle:>10} {:>10} {:>11} {:>12} {:>10}",
            format!("{m} × {n} × {k}"),
            run(Stored::F32, &caps, kernels::Kernel::F32Gemm, f32s),
            run(Stored::F32, &caps, kernels::Kernel::F32Gemm, bf16s),
            run(Stored::Bf16, &bf16_dot, kernels::Kernel::Bf16Gemm, bf16s),
            run(Stored::Bf16, &caps, kernels::Kernel::Bf16Amx, bf16s),
        );
    }
}
