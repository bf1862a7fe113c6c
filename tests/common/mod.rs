//! Helpers shared by the integration tests: fixtures, sparse checkpoints,
//! the `hsparity` command, and the one closeness check with named tolerances.

pub mod bad_inputs;
pub mod captures;
pub mod moe;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

/// Repository root (for fixtures).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `(name, dtype, shape)` of one tensor to write.
pub type Spec = (String, String, Vec<usize>);

fn bytes_of(dtype: &str) -> u64 {
    match dtype {
        "F32" => 4,
        "BF16" | "F16" => 2,
        "F64" => 8,
        other => panic!("test helper: dtype {other}"),
    }
}

/// Writes one sparse safetensors file: header with contiguous data_offsets in
/// the given order, then `set_len` to the full size (no data written).
/// Returns the total data bytes.
pub fn write_sparse_shard(path: &Path, tensors: &[Spec]) -> u64 {
    let mut header = Map::new();
    let mut off = 0u64;
    for (name, dtype, shape) in tensors {
        let n: u64 = shape.iter().map(|&d| d as u64).product::<u64>() * bytes_of(dtype);
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}),
        );
        off += n;
    }
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut f = File::create(path).unwrap();
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    f.set_len(8 + h.len() as u64 + off).unwrap();
    off
}

/// Writes a sparse sharded checkpoint (`model-0000i-of-0000n.safetensors` +
/// `model.safetensors.index.json` + `config.json`) into `dir`, distributing
/// `tensors` in order over `n_shards` shards.
pub fn write_sparse_checkpoint(dir: &Path, config: &Value, tensors: &[Spec], n_shards: usize) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(config).unwrap(),
    )
    .unwrap();
    let per = tensors.len().div_ceil(n_shards);
    let mut weight_map = Map::new();
    let mut total = 0u64;
    for (i, chunk) in tensors.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, n_shards);
        total += write_sparse_shard(&dir.join(&file), chunk);
        for (name, _, _) in chunk {
            weight_map.insert(name.clone(), Value::String(file.clone()));
        }
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec_pretty(&index).unwrap(),
    )
    .unwrap();
}

/// The 27B fixture: `(config.json, tensor list)` with BF16 dtype.
pub fn load_27b() -> (Value, Vec<Spec>) {
    let d = repo_root().join("fixtures/qwen3.6-27b");
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap();
    let t: Value = serde_json::from_slice(&std::fs::read(d.join("tensors.json")).unwrap()).unwrap();
    let dtype = t["dtype"].as_str().unwrap_or("BF16").to_string();
    let specs = t["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                dtype.clone(),
                e["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize)
                    .collect(),
            )
        })
        .collect();
    (cfg, specs)
}

/// Copies the tiny fixture's top-level files into `dst`.
pub fn copy_tiny(dst: &Path) {
    let src = repo_root().join("fixtures/tiny-qwen3_5");
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
}

/// A commit hash used by the fake hub cache.
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// Lays out the tiny fixture as hf-hub / huggingface_hub cache it:
/// `<cache>/models--{org}--{name}/{refs/main, blobs/<etag>, snapshots/<commit>/<file> -> ../../blobs/<etag>}`.
pub fn fake_hub_cache(cache: &Path, repo_id: &str) -> PathBuf {
    let repo = cache.join(format!("models--{}", repo_id.replace('/', "--")));
    let src = repo_root().join("fixtures/tiny-qwen3_5");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    let snap = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(repo.join("refs/main"), COMMIT).unwrap();
    for (i, e) in std::fs::read_dir(&src).unwrap().enumerate() {
        let e = e.unwrap();
        if !e.file_type().unwrap().is_file() {
            continue;
        }
        let etag = format!("{:064x}", i + 1);
        std::fs::copy(e.path(), repo.join("blobs").join(&etag)).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(
            PathBuf::from("../../blobs").join(&etag),
            snap.join(e.file_name()),
        )
        .unwrap();
        #[cfg(not(unix))]
        std::fs::copy(e.path(), snap.join(e.file_name())).unwrap();
    }
    repo
}

/// Copies `fixtures/tiny-qwen3_5` into `dst` as one `model.safetensors` after
/// `edit` changed its tensors (config and tokenizer copied as they are).
pub fn rewrite_tiny_fixture(
    dst: &Path,
    edit: impl FnOnce(&mut std::collections::HashMap<String, candle_core::Tensor>),
) {
    let src = repo_root().join("fixtures/tiny-qwen3_5");
    let mut all = std::collections::HashMap::new();
    for i in 1..=3 {
        let f = src.join(format!("model-0000{i}-of-00003.safetensors"));
        all.extend(candle_core::safetensors::load(&f, &candle_core::Device::Cpu).unwrap());
    }
    edit(&mut all);
    candle_core::safetensors::save(&all, dst.join("model.safetensors")).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
}

/// [`rewrite_tiny_fixture`] with NaN and +Inf as the first two values of `key`.
pub fn tiny_fixture_with_non_finite(dst: &Path, key: &str) {
    rewrite_tiny_fixture(dst, |all| {
        let t = &all[key];
        let mut v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v[0] = f32::NAN;
        v[1] = f32::INFINITY;
        let t = candle_core::Tensor::from_vec(v, t.dims(), &candle_core::Device::Cpu).unwrap();
        all.insert(key.into(), t);
    });
}

/// Path of the `hsparity` binary under test (what its reports show as argv[0]).
pub const BIN: &str = env!("CARGO_BIN_EXE_hsparity");

/// The `hsparity` binary, run from the repository root, killed after 15 minutes.
pub fn hsparity() -> assert_cmd::Command {
    let mut c = assert_cmd::Command::new(BIN);
    c.current_dir(repo_root());
    // No run may hang the suite: each is killed (and its test fails) after this.
    c.timeout(std::time::Duration::from_secs(900));
    // Terminal output unbounded (as when piped), whatever the shell exports:
    // tests that lay it out for a width set COLUMNS themselves.
    c.env_remove("COLUMNS");
    c
}

/// Runs `cmd`, which must exit 0, and parses its stdout as JSON (`--json`).
pub fn json_of(cmd: &mut assert_cmd::Command) -> serde_json::Value {
    json_exit(cmd, 0)
}

/// Runs `cmd`, which must exit `code`, and parses its stdout as JSON.
pub fn json_exit(cmd: &mut assert_cmd::Command, code: i32) -> serde_json::Value {
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Each prompt's τ of a drafter report's path (`paths[].per_prompt[].tau`).
pub fn per_prompt_taus(path: &serde_json::Value) -> Vec<f64> {
    path["per_prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["tau"].as_f64().unwrap())
        .collect()
}

/// How close two captures of the same tensor must be, and why: per-token
/// cosine at least `cos_min`, and max |ours − want| at most `max_abs` ×
/// max(1, max |want|).
#[derive(Debug, Clone, Copy)]
pub struct Closeness {
    /// Name, for failure messages.
    pub name: &'static str,
    /// Smallest per-token cosine similarity allowed.
    pub cos_min: f64,
    /// Largest absolute difference, relative to max(1, max |want|).
    pub max_abs: f64,
    /// Why this bound.
    pub reason: &'static str,
}

/// One f32 kernel or a shallow model (a handful of matmuls) against
/// transformers: only summation order differs.
pub const F32_KERNEL: Closeness = Closeness {
    name: "f32 kernel",
    cos_min: 0.99999,
    max_abs: 1e-5,
    reason: "the same f32 math in another summation order: ~1e-7 relative per op",
};

/// A whole f32 model forward (drafter, cached decode) against its reference.
pub const F32_MODEL: Closeness = Closeness {
    name: "f32 model",
    cos_min: 0.99999,
    max_abs: 1e-4,
    reason: "f32 round-off accumulated over a few layers (softmax, norms, GEMMs in another order)",
};

/// A hybrid Qwen3.5 forward against transformers in f32: the chunked delta
/// rule (chunk 64) sums in another order than torch's einsums, and the
/// difference grows with depth and prompt length.
pub const F32_HYBRID: Closeness = Closeness {
    name: "f32 hybrid model",
    cos_min: 0.99999,
    max_abs: 1e-3,
    reason: "f32 chunked delta rule vs torch's: accumulated round-off over the layers (measured ~1e-5 relative)",
};

/// A bf16 / f16 forward against transformers' in the same dtype.
pub const HALF: Closeness = Closeness {
    name: "half precision",
    cos_min: 0.9999,
    max_abs: f64::INFINITY,
    reason: "GEMM accumulation order flips the odd last bit of a rounded intermediate, and one ulp of bf16 is 0.4%: only the cosine bounds it; the other half dtype (fp16-disk's bf16 vs f16 goldens) is 0.9994 away and fails",
};

/// Asserts `ours` is within `c` of `want` (`[T, X]` each); returns the
/// metrics (its max abs diff relative to max(1, max |want|) printed by callers).
pub fn assert_close(
    what: &str,
    ours: &candle_core::Tensor,
    want: &candle_core::Tensor,
    c: &Closeness,
) -> hsparity::parity::Metrics {
    let mut acc = hsparity::parity::Accumulator::default();
    acc.add(0, ours, want)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let m = acc.finish();
    let scale = m.max_ref_abs.max(1.0);
    assert!(
        m.cos_min >= c.cos_min && m.max_abs <= c.max_abs * scale,
        "{what}: cos_min {} (need {}), max_abs {} (need {} x {scale}): {} tolerance ({})",
        m.cos_min,
        c.cos_min,
        m.max_abs,
        c.max_abs,
        c.name,
        c.reason
    );
    m
}

/// The relative error [`assert_close`] bounds.
pub fn relative_max_abs(m: &hsparity::parity::Metrics) -> f64 {
    m.max_abs / m.max_ref_abs.max(1.0)
}

/// Asserts two prompts of dumps hold the same `hidden_states` indices; returns
/// `(index, a, b)` in index order.
pub fn paired_states<'a>(
    what: &str,
    a: &'a std::collections::BTreeMap<usize, candle_core::Tensor>,
    b: &'a std::collections::BTreeMap<usize, candle_core::Tensor>,
) -> Vec<(usize, &'a candle_core::Tensor, &'a candle_core::Tensor)> {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "{what}: hidden_states indices differ"
    );
    a.iter().map(|(i, x)| (*i, x, &b[i])).collect()
}

/// Asserts two lists have the same length before they are zipped.
pub fn same_len<A, B>(what: &str, a: &[A], b: &[B]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
}

/// A target: `ckpt` with the prompts of `prompts_file` (when given), seed 0, CPU.
pub fn target(ckpt: &str, prompts_file: Option<&str>) -> hsparity::session::Target {
    hsparity::session::Target {
        checkpoint: ckpt.into(),
        prompts: hsparity::prompts::PromptOptions {
            file: prompts_file.map(Into::into),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// `triage` settings for `drafter`: `max_new` new tokens under `rule`,
/// DDTree-8, no observed τ, the command line's defaults otherwise, quiet.
pub fn triage_settings(
    drafter: &str,
    max_new: usize,
    rule: hsparity::drafter::eval::EndRule,
) -> hsparity::triage::TriageSettings {
    hsparity::triage::TriageSettings {
        drafter: drafter.into(),
        replay: hsparity::drafter::Replay {
            max_new,
            budget: 8,
            rule,
        },
        observed_tau: None,
        engine_metrics: None,
        position_shift: 16,
        seed: 0,
        quiet: true,
        memory_budget: None,
        harness: Default::default(),
        trajectories: None,
        noise_floor: Default::default(),
    }
}

/// `drafter` options on `target` over `paths`: `max_new` new tokens under
/// z-lab GitHub main's end rule, DDTree-8, gap limit 0.05, quiet.
pub fn drafter_options(
    target: hsparity::session::Target,
    paths: &[hsparity::loading::LoadingPath],
    drafter: &str,
    max_new: usize,
) -> hsparity::commands::drafter::DrafterOptions {
    hsparity::commands::drafter::DrafterOptions {
        target,
        paths: paths.to_vec(),
        drafter: hsparity::drafter::DrafterSettings {
            source: drafter.into(),
            replay: hsparity::drafter::Replay {
                max_new,
                budget: 8,
                rule: hsparity::drafter::eval::EndRule::GithubMain,
            },
            max_tau_gap: 0.05,
            memory_budget: None,
            trajectories: None,
            engine_metrics: None,
        },
        quiet: true,
        command_line: String::new(),
    }
}

/// `n` deterministic values in [0, 1) from a 64-bit LCG seeded by `seed`
/// (test inputs with no RNG crate state).
pub fn uniform(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect()
}

/// A deterministic `[rows, cols]` matrix of values in about [-4, 4]: bf16
/// values (in f32) when `bf16`, else full 24-bit mantissas (products that
/// round). For the matmul kernels' tests.
pub fn matrix(rows: usize, cols: usize, seed: u64, bf16: bool) -> candle_core::Tensor {
    let v: Vec<f32> = uniform(rows * cols, seed)
        .into_iter()
        .map(|u| (u - 0.5) * 8.0)
        .map(|v| {
            if bf16 {
                half::bf16::from_f32(v).to_f32()
            } else {
                v
            }
        })
        .collect();
    candle_core::Tensor::from_vec(v, (rows, cols), &candle_core::Device::Cpu).unwrap()
}

/// `(m, n, k)` on candle's blocked route that every kernel reproducing it
/// is checked on: each tile remainder, one and several k-blocks, odd k, the
/// small-size rule.
pub const BLOCKED_SHAPES: &[(usize, usize, usize)] = &[
    (2, 200, 3),       // k just above gevv's
    (5, 61, 31),       // odd k, row and column remainders
    (17, 25, 100),     // small-size rule, one block
    (40, 60, 1030),    // small-size rule: blocks of 512, the last partial
    (65, 19, 1024),    // blocked kernel, several row groups
    (130, 70, 2047),   // odd k over two blocks
    (128, 1024, 3072), // the mid checkpoint's down projection
    (140, 290, 8192),  // 2 row blocks; runs of 2 column tiles, several per thread
    (130, 70, 2500),   // k-block passes (rows over 1 MiB), the last block shorter
];

/// Deterministic hidden states `[t, h]` in about [-2, 2], rounded to `prec`
/// (a layer's input in tests of its forward).
pub fn hidden_input(
    t: usize,
    h: usize,
    seed: u64,
    prec: hsparity::precision::Precision,
) -> candle_core::Tensor {
    let v: Vec<f32> = uniform(t * h, seed)
        .into_iter()
        .map(|u| (u - 0.5) * 4.0)
        .collect();
    prec.round(&candle_core::Tensor::from_vec(v, (t, h), &candle_core::Device::Cpu).unwrap())
        .unwrap()
}

/// The f32 bit patterns of a tensor, row-major (for bit-for-bit comparisons).
pub fn bits(t: &candle_core::Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

/// Five of the fifteen held-out prompts (0, 3, 6, 9, 12) in a JSONL file.
pub fn five_prompts(tmp: &std::path::Path) -> std::path::PathBuf {
    let lines: Vec<String> = std::fs::read_to_string("fixtures/toy-pair/prompts.jsonl")
        .unwrap()
        .lines()
        .step_by(3)
        .map(str::to_string)
        .collect();
    let f = tmp.join("p.jsonl");
    std::fs::write(&f, lines.join("\n")).unwrap();
    f
}

/// `n` token ids of the toy pair's text: its held-out prompts
/// (`fixtures/toy-pair/golden/reference_generate_gdn_crop.json`) one after
/// another, from token `skip` on, over again as often as `n` needs.
pub fn toy_pair_text(n: usize, skip: usize) -> Vec<u32> {
    let path = repo_root().join("fixtures/toy-pair/golden/reference_generate_gdn_crop.json");
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let text: Vec<u32> = g["sets"]["held_out"]["per_prompt"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|q| q["input_ids"].as_array().unwrap().clone())
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    text.iter().cycle().skip(skip).take(n).copied().collect()
}
