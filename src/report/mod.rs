//! The one [`Report`] value of a run and its renderers. Renderers never
//! compute: every number is in the report (hyperfine's `export/` pattern).
//!
//! - [`table`] renders for the terminal (comfy-table),
//! - [`json`] for `--json` and `report.json` (DESIGN §2 contract),
//! - [`markdown`] for `report.md` (bug tickets),
//! - [`svg`] for `parity.svg` (the per-layer plot `report.md` links),
//! - [`inventory`] for the inventory table,
//! - [`diff`] for `diff`'s terminal table.
//!
//! The JSON shape is documented field by field in `docs/report-schema.md` and
//! checked against `docs/report.schema.json` by `tests/report_schema.rs`.

pub mod diff;
pub mod inventory;
pub mod json;
pub mod markdown;
pub mod svg;
pub mod table;
pub mod triage;

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
    /// Peak resident memory of the run in bytes (VmHWM from the OS, after
    /// the run; `null` where the OS does not say).
    pub peak_rss_bytes: Option<u64>,
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
///
/// Serialised with `"kind": "compare"` first: every verb's report shares the
/// top-level members `kind`, `schema_version`, `verdict`, `summary`,
/// `exit_code`, `environment`, `command`, `notes` (docs/report-schema.md).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename = "compare")]
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
    /// "Prefill vs incremental": per path, a cached decode against the full
    /// forward (empty when skipped, see `notes`).
    pub incremental: Vec<IncrementalCheck>,
}

/// One path's cached decode (prefill, then single-token steps with the KV
/// cache and Gated DeltaNet state) against its own full forward, compared on
/// the final-normed hidden states of the stepped tokens.
#[derive(Debug, Clone, Serialize)]
pub struct IncrementalCheck {
    /// Loading path.
    pub path: String,
    /// Prompt index used.
    pub prompt: usize,
    /// Tokens in the prefill.
    pub prefill_tokens: usize,
    /// Single-token steps after it.
    pub steps: usize,
    /// Metrics of the stepped rows (decode vs full forward).
    pub metrics: crate::parity::Metrics,
    /// Verdict under the path dtype's tolerance.
    pub verdict: Verdict,
}

impl Report {
    /// True when `hidden_states[index]` is a drafter tap (`index = L + 1`).
    pub fn is_tap(&self, index: usize) -> bool {
        index > 0 && self.taps.contains(&(index - 1))
    }

    /// The path run named `name`.
    pub fn path(&self, name: &str) -> Option<&PathRun> {
        self.paths.iter().find(|p| p.name == name)
    }

    /// Why `pair` differs, one sentence per loading difference found between
    /// its two paths (dtype and its reason, lm_head tie and origin, missing
    /// tensors, NaN/Inf weights), then whether the first divergent hidden
    /// state differs by itself (local comparison) or only inherits its input.
    /// Empty when the pair is bitwise identical and nothing differs.
    pub fn causes(&self, pair: &PairReport) -> Vec<String> {
        let mut out = Vec::new();
        let (a, b) = (self.path(&pair.a), self.path(&pair.b));
        if pair.dtype_a != pair.dtype_b {
            let why = |p: Option<&PathRun>| {
                p.map(|p| format!(" ({})", p.dtype_reason))
                    .unwrap_or_default()
            };
            out.push(format!(
                "dtype: {} computes in {}{}, {} in {}{}",
                pair.a,
                pair.dtype_a,
                why(a),
                pair.b,
                pair.dtype_b,
                why(b)
            ));
        }
        if let (Some(a), Some(b)) = (a, b) {
            if a.lm_head != b.lm_head && a.lm_head != "none" && b.lm_head != "none" {
                out.push(format!(
                    "lm_head: {} uses {}, {} uses {}",
                    a.name, a.lm_head, b.name, b.lm_head
                ));
            } else if a.tie != b.tie {
                let tied = if a.tie { &a.name } else { &b.name };
                out.push(format!(
                    "tie: lm_head is tied to the embedding on {tied} only"
                ));
            }
            for p in [a, b] {
                if p.missing > 0 {
                    let first = self
                        .inventory
                        .paths
                        .iter()
                        .find(|i| i.name == p.name)
                        .and_then(|i| i.missing_names.first())
                        .map(|n| format!(", first {n}"))
                        .unwrap_or_default();
                    out.push(format!(
                        "missing: {} initialises {} tensor(s) randomly (its checkpoint names do not match the class{first})",
                        p.name, p.missing
                    ));
                }
                if !p.non_finite_weights.is_empty() {
                    out.push(format!(
                        "weights: {} reads {} tensor(s) holding NaN/Inf",
                        p.name,
                        p.non_finite_weights.len()
                    ));
                }
            }
        }
        let loading_differences = out.len();
        if let Some(row) = pair
            .first_divergent
            .and_then(|i| pair.hidden_states.iter().find(|r| r.index == i))
        {
            let at = hidden_state_label(row.index, &row.layer_type);
            match (&row.local, row.local_verdict) {
                (Some(l), Some(Verdict::Pass)) => out.push(format!(
                    "hidden_states[{}] ({at}) passes when {}'s layer is fed {}'s input (local cos_min {:.8}): the difference is inherited",
                    row.index, pair.b, pair.a, l.cos_min
                )),
                (Some(l), Some(_)) => out.push(format!(
                    "hidden_states[{}] ({at}) differs even when both layers get the same input (local cos_min {:.8}): the layer itself computes differently",
                    row.index, l.cos_min
                )),
                _ => {}
            }
            if loading_differences == 0 {
                out.insert(
                    0,
                    "no loading difference found (same dtype, lm_head and tensors): a numerical difference".into(),
                );
            }
        }
        out
    }
}

/// `embeddings`, `output of layer 2, full attention`, `output of layer 5 after the final norm`.
pub fn hidden_state_label(index: usize, layer_type: &str) -> String {
    match layer_type {
        "embedding" => "embeddings".into(),
        "final_norm" => format!("output of layer {} after the final norm", index - 1),
        t => format!("output of layer {}, {}", index - 1, t.replace('_', " ")),
    }
}

/// Checkpoint keys of `dropped` that the ignore rule `rule` (`"ignore ^mtp.*"`,
/// as in [`crate::loading::PathInventory::rules`]) matches: `.` is a wildcard,
/// as in transformers' `_keys_to_ignore_on_load_unexpected` regexes. `None`
/// when `rule` is not an ignore rule.
pub fn dropped_by_rule<'a>(rule: &str, dropped: &'a [String]) -> Option<Vec<&'a String>> {
    let pat = rule.strip_prefix("ignore ")?;
    Some(
        dropped
            .iter()
            .filter(|k| crate::loading::inventory::ignore_matches(pat, k))
            .collect(),
    )
}

/// The verdict and the body of its sentence (`causal-lm and vlm agree bitwise
/// at all 7 hidden states`, …); [`tagged`] puts `PASS:` / `FAIL:` before it
/// once every check of the run has added its part.
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
            format!("; dtype {} vs {}", p.dtype_a, p.dtype_b)
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
                let (at, detail) = row
                    .map(|r| {
                        let m = &r.metrics;
                        let d = if m.nan_count + m.inf_count > 0 {
                            format!("; {} NaN, {} Inf values", m.nan_count, m.inf_count)
                        } else {
                            format!("; cos_min {:.6}, max_abs {:.3e}", m.cos_min, m.max_abs)
                        };
                        (hidden_state_label(r.index, &r.layer_type), d)
                    })
                    .unwrap_or_default();
                format!(
                    "{} and {} diverge from hidden_states[{i}] ({at}{dtypes}{detail})",
                    p.a, p.b
                )
            }
            (_, _, None) => {
                let why = if dtypes.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", &dtypes[2..])
                };
                format!("{} and {} differ in the logits{why}", p.a, p.b)
            }
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
    (verdict, parts.join("; "))
}

/// The summary line: `PASS: …` or `FAIL: …` before `body`.
pub fn tagged(verdict: Verdict, body: &str) -> String {
    let tag = if verdict == Verdict::Pass {
        "PASS"
    } else {
        "FAIL"
    };
    format!("{tag}: {body}")
}
