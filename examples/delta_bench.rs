//! The chunked delta rule's time per chunk-head on this CPU, at ordinary
//! log decays and at ones that reach the subnormal range inside a chunk
//! (transformers' initialisation draws `A` in (0, 16), so a random
//! checkpoint's decays do), in µs (docs/performance.md, "The delta rule's
//! subnormal operands").
//!
//! ```sh
//! RAYON_NUM_THREADS=1 cargo run --release --example delta_bench
//! ```
//!
//! Each row: 16 heads of 128 tokens (two chunks each), `dk = dv = 128`, the
//! best of 7 runs of 25 calls after one warm-up, on the rayon pool (one
//! head per task); the time is the pool's wall time per chunk-head times
//! its threads.

use std::time::Instant;

use hsparity::kernels;
use hsparity::models::qwen3_5::gated_delta_net::{chunked, DeltaRuleInputs};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Deterministic values in [lo, hi).
fn values(n: usize, seed: u64, (lo, hi): (f32, f32)) -> Vec<f32> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(lo..hi)).collect()
}

fn main() {
    let (t, heads, d) = (128, 16, 128);
    let threads = rayon::current_num_threads();
    println!(
        "{} threads; kernels' CPU features {:?}",
        threads,
        kernels::capabilities().cpu_features()
    );
    println!("log decays in   µs per chunk-head");
    for g_min in [-0.5f32, -2.0, -6.0, -12.0, -30.0] {
        let inp = DeltaRuleInputs {
            t,
            heads,
            dk: d,
            dv: d,
            q: values(t * heads * d, 1, (-1.0, 1.0)),
            k: values(t * heads * d, 2, (-1.0, 1.0)),
            v: values(t * heads * d, 3, (-1.0, 1.0)),
            g: values(t * heads, 4, (g_min, 0.0)),
            beta: values(t * heads, 5, (0.0, 1.0)),
        };
        let s0 = values(heads * d * d, 6, (-0.5, 0.5));
        let run = || {
            for _ in 0..25 {
                let mut s = s0.clone();
                std::hint::black_box(chunked(&inp, &mut s));
            }
        };
        run();
        let best = (0..7)
            .map(|_| {
                let t0 = Instant::now();
                run();
                t0.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        let chunk_heads = (25 * heads * t.div_ceil(64)) as f64;
        println!(
            "({g_min:>5}, 0)    {:8.1}",
            best / chunk_heads * threads as f64 * 1e6
        );
    }
}
