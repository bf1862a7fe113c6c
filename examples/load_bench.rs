//! How fast a checkpoint's tensors become f32 values in each compute dtype
//! (`Weights::load_f32_rounded`: the bytes read from the page cache, widened,
//! rounded, written to a fresh buffer), in ns per value (docs/performance.md,
//! "Buffers written once").
//!
//! ```sh
//! cargo run --release --example load_bench -- target/bench/mid-divergent-qwen3_5
//! ```
//!
//! Every floating-point tensor of over 100 000 values, in the order of the
//! shards; each row the best of 5 passes over all of them after one warm-up
//! (which also brings the shards into the page cache), on the rayon pool
//! (`RAYON_NUM_THREADS`, else all cores); the time is wall time. Memory
//! comes as the binary has it: its allocator (large blocks on huge pages,
//! `hsparity::memory::LargePages`) and, on glibc, its heap settings
//! (`hsparity::memory::reuse_freed_buffers`).

use std::sync::Arc;
use std::time::Instant;

use hsparity::checkpoint::headers::HeaderIndex;
use hsparity::checkpoint::weights::Weights;
use hsparity::precision::Precision;

/// The binary's allocator.
#[global_allocator]
static ALLOC: hsparity::memory::LargePages = hsparity::memory::LargePages;

fn main() {
    hsparity::memory::reuse_freed_buffers();
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: load_bench CHECKPOINT_DIR");
        std::process::exit(2);
    };
    let index = Arc::new(HeaderIndex::read_dir(std::path::Path::new(&dir)).expect("headers"));
    let names: Vec<&str> = index
        .tensors
        .iter()
        .filter(|t| t.is_floating() && t.numel() > 100_000)
        .map(|t| t.name.as_str())
        .collect();
    let weights = Weights::new(index.clone());
    println!(
        "{dir}: {} tensors; {} threads",
        names.len(),
        rayon::current_num_threads()
    );
    for prec in [Precision::F32, Precision::Bf16, Precision::F16] {
        let pass = || {
            let t = Instant::now();
            let mut values = 0;
            for name in &names {
                values += weights
                    .load_f32_rounded(name, prec)
                    .expect("loads")
                    .elem_count();
            }
            (t.elapsed().as_secs_f64(), values)
        };
        pass();
        let (best, values) = (0..5)
            .map(|_| pass())
            .fold((f64::INFINITY, 0), |(b, _), (s, v)| (b.min(s), v));
        println!(
            "{:>5}: {values} values, best {best:.3} s, {:.2} ns per value",
            format!("{prec:?}"),
            best * 1e9 / values as f64
        );
    }
}
