//! The one [`Report`] value of a run and its renderers. Renderers never
//! compute: every number is in the report (hyperfine's `export/` pattern).
//!
//! - [`table`] renders for the terminal (comfy-table),
//! - [`json`] for `--json` and `report.json` (DESIGN §2 contract),
//! - [`markdown`] for `report.md` (bug tickets),
//! - [`inventory`] for the inventory table.

pub mod inventory;
pub mod json;
pub mod markdown;
pub mod table;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::loading::{Inventory, NonFinite};
use crate::parity::{PairReport, Verdict};

/// Version of the JSON schema (`schema_version`).
pub const SCHEMA_VERSION: u32 = 1;

/// How taps map to `hidden_states` (stated in every report).
pub const TAP_CONVENTION: &str =
    "tap L = output of decoder layer L = hidden_states[L+1] (DFlash / SpecForge convention)";

/// Facts needed to reproduce a run.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    /// `hsparity x.y.z`.
    pub hsparity_version: String,
    /// Checkpoint argument.
    pub checkpoint: String,
    /// Hub revision/commit when resolved from the cache.
    pub revision: Option<String>,
    /// sha256 of `config.json` (hex, first 16 chars).
    pub config_sha256: String,
    /// sha256 over the prompts' token ids (hex, first 16 chars).
    pub prompts_sha256: String,
    /// Compute device (`cpu`).
    pub device: String,
    /// Worker threads used by the matmuls.
    pub threads: usize,
    /// Gated DeltaNet form (`chunked` = what transformers runs for prefill).
    pub gdn_form: String,
}

/// One loading path as run.
#[derive(Debug, Clone, Serialize)]
pub struct PathRun {
    /// Loading path name.
    pub name: String,
    /// Class transformers builds.
    pub class: String,
    /// dtype transformers would load with.
    pub dtype: String,
    /// Why that dtype.
    pub dtype_reason: String,
    /// dtype hsparity computed in.
    pub compute_dtype: String,
    /// Newly initialised (missing) tensors on this path.
    pub missing: usize,
    /// True when `lm_head.weight` is tied to the embedding on this path.
    pub tie: bool,
    /// Where the logits come from: `checkpoint`, `tied to embed_tokens`,
    /// `MISSING -> random init`, or `none` (no LM head on this class).
    pub lm_head: String,
    /// Checkpoint tensors read by this path that hold NaN or ±Inf.
    pub non_finite_weights: BTreeMap<String, NonFinite>,
}

/// One prompt as run.
#[derive(Debug, Clone, Serialize)]
pub struct PromptInfo {
    /// Prompt index `k` (dump keys `p{k}.*`).
    pub index: usize,
    /// `text`, `ids`, or `builtin`.
    pub source: String,
    /// Number of tokens.
    pub tokens: usize,
    /// The first characters of the text, when there is one.
    pub preview: Option<String>,
}

/// The result of `compare` (JSON: DESIGN §2 `compare --json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// `pass` or `fail`.
    pub verdict: Verdict,
    /// One sentence that says it all.
    pub summary: String,
    /// Exit code the run ends with (0 pass, 1 fail).
    pub exit_code: i32,
    /// Reproduction facts.
    pub environment: Environment,
    /// The exact command line.
    pub command: String,
    /// Tap convention sentence ([`TAP_CONVENTION`]).
    pub tap_convention: String,
    /// Drafter tap layers (`--taps`), decoder-layer indices.
    pub taps: Vec<usize>,
    /// Inventory of every compared path.
    pub inventory: Inventory,
    /// Paths as run.
    pub paths: Vec<PathRun>,
    /// Prompts as run.
    pub prompts: Vec<PromptInfo>,
    /// `(paths[0], paths[j])` comparisons.
    pub pairs: Vec<PairReport>,
    /// Notes for the reader (dtype emulation limits, missing tensors, ...).
    pub notes: Vec<String>,
    /// Drafter evaluation (`compare --drafter`), DESIGN §2 `drafter` member.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drafter: Option<crate::drafter_eval::DrafterReport>,
}

impl Report {
    /// True when `hidden_states[index]` is a drafter tap (`index = L + 1`).
    pub fn is_tap(&self, index: usize) -> bool {
        index > 0 && self.taps.contains(&(index - 1))
    }
}

/// The verdict sentence: `PASS: causal-lm and vlm agree bitwise at all 7 hidden states`
/// or `FAIL: …`.
pub fn summarize(pairs: &[PairReport], paths: &[PathRun]) -> (Verdict, String) {
    let missing: Vec<String> = paths
        .iter()
        .filter(|p| p.missing > 0)
        .map(|p| {
            format!(
                "{} has {} missing (randomly initialised) tensors",
                p.name, p.missing
            )
        })
        .collect();
    let mut parts = Vec::new();
    let mut verdict = if missing.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail
    };
    for p in pairs {
        let n = p.hidden_states.len();
        let v = p.verdict();
        let dtypes = if p.dtype_a != p.dtype_b {
            format!(" (dtype {} vs {})", p.dtype_a, p.dtype_b)
        } else {
            String::new()
        };
        if v != Verdict::Pass {
            verdict = Verdict::Fail;
        }
        parts.push(match (v, p.first_non_bitwise, p.first_divergent) {
            (Verdict::Pass, None, _) => {
                format!("{} and {} agree bitwise at all {n} hidden states", p.a, p.b)
            }
            (Verdict::Pass, Some(i), _) => format!(
                "{} and {} agree within tolerance at all {n} hidden states (not bitwise from hidden_states[{i}])",
                p.a, p.b
            ),
            (_, _, Some(i)) => {
                let row = &p.hidden_states.iter().find(|r| r.index == i);
                let detail = row
                    .map(|r| {
                        let m = &r.metrics;
                        if m.nan_count + m.inf_count > 0 {
                            format!(" ({} NaN, {} Inf values)", m.nan_count, m.inf_count)
                        } else {
                            format!(" (cos_min {:.6}, max_abs {:.3e})", m.cos_min, m.max_abs)
                        }
                    })
                    .unwrap_or_default();
                format!("{} and {} diverge from hidden_states[{i}]{dtypes}{detail}", p.a, p.b)
            }
            (_, _, None) => format!("{} and {} differ in the logits{dtypes}", p.a, p.b),
        });
    }
    parts.extend(missing);
    for p in paths {
        if let Some((name, nf)) = p.non_finite_weights.iter().next() {
            verdict = Verdict::Fail;
            parts.push(format!(
                "{} reads {} weight tensor(s) with NaN/Inf (first: {name}: {} NaN, {} Inf)",
                p.name,
                p.non_finite_weights.len(),
                nf.nan,
                nf.inf
            ));
        }
    }
    let tag = if verdict == Verdict::Pass {
        "PASS"
    } else {
        "FAIL"
    };
    (verdict, format!("{tag}: {}", parts.join("; ")))
}
