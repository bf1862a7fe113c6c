//! The body of `compare`'s report ([`Compare`]): the paths as run, the
//! prompts, the per-pair parity, the prefill-vs-incremental checks and the
//! drafter evaluation; the sentences that explain a pair ([`Compare::causes`])
//! and the run's summary ([`summarize`]).

pub mod build;
pub mod markdown;
mod summary;
pub mod svg;
pub mod terminal;

pub use summary::summarize;

use crate::width::Width;
use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::format::{cos, max_abs_at, noise_ratio, sci, yes_no};
use super::tabular::{Cell, Column, Row, Sinks, Table};
use super::{Body, Report};
use crate::capture::HiddenKind;
use crate::error::Result;
use crate::loading::{Inventory, LoadingPath, NonFinite};
use crate::parity::routers::RouterFloor;
use crate::parity::{HiddenStateRow, PairReport, Verdict};
use crate::precision::Precision;
use crate::report::localisation::departure_cell;

/// `compare`'s report: the envelope around [`Compare`].
pub type CompareReport = Report<Compare>;

/// Where a path's logits come from (`paths[].lm_head`).
#[derive(Debug, Clone, PartialEq)]
pub enum LmHeadOrigin {
    /// The class has no LM head (`AutoModel`): `none`.
    None,
    /// Read from the checkpoint's `lm_head.weight`: `checkpoint`.
    Checkpoint,
    /// Tied to checkpoint key `key`: `tied to <key>`.
    Tied(String),
    /// MISSING, newly initialised with `init`: `MISSING -> random init (<init>)`.
    Missing(String),
}

impl fmt::Display for LmHeadOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LmHeadOrigin::None => f.write_str("none"),
            LmHeadOrigin::Checkpoint => f.write_str("checkpoint"),
            LmHeadOrigin::Tied(k) => write!(f, "tied to {k}"),
            LmHeadOrigin::Missing(init) => write!(f, "MISSING -> random init ({init})"),
        }
    }
}

impl Serialize for LmHeadOrigin {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One loading path as run.
#[derive(Debug, Clone, Serialize)]
pub struct PathRun {
    /// Loading path name.
    pub name: LoadingPath,
    /// Class transformers builds.
    pub class: String,
    /// dtype transformers would load with.
    pub dtype: Precision,
    /// Why that dtype.
    pub dtype_reason: String,
    /// dtype hsparity computed in.
    pub compute_dtype: Precision,
    /// Newly initialised (missing) tensors on this path.
    pub missing: usize,
    /// True when `lm_head.weight` is tied to the embedding on this path.
    pub tie: bool,
    /// Where the logits come from.
    pub lm_head: LmHeadOrigin,
    /// Checkpoint tensors read by this path that hold NaN or ±Inf.
    pub non_finite_weights: BTreeMap<String, NonFinite>,
}

/// One prompt as run.
#[derive(Debug, Clone, Serialize)]
pub struct PromptInfo {
    /// Prompt index `k` (dump keys `p{k}.*`).
    pub index: usize,
    /// `text`, `ids`, `builtin`, `messages` or `prompt-set`.
    pub source: crate::prompts::PromptKind,
    /// Number of tokens.
    pub tokens: usize,
    /// The first characters of the text tokenised (the chat template's
    /// rendering, else the text as given), when there is one.
    pub preview: Option<String>,
    /// Where it was given: `--prompt #1`, `prompts.jsonl:3`, `gsm8k row 1101`, …
    pub origin: String,
    /// True when the chat template rendered its text.
    pub chat: bool,
    /// sha256 (64 hex digits) of the text tokenised; `null` for token ids.
    pub rendered_sha256: Option<String>,
}

/// The members `compare`'s report adds to the envelope.
#[derive(Debug, Clone, Serialize)]
pub struct Compare {
    /// Tap convention sentence ([`super::TAP_CONVENTION`]).
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
    /// Drafter evaluation (`compare --drafter`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drafter: Option<super::DrafterReport>,
    /// "Prefill vs incremental": per path, a cached decode against the full
    /// forward (empty when skipped, see `notes`).
    pub incremental: Vec<IncrementalCheck>,
}

pub use crate::parity::IncrementalCheck;

impl Compare {
    /// True when `hidden_states[index]` is a drafter tap (`index = L + 1`).
    pub fn is_tap(&self, index: usize) -> bool {
        index > 0 && self.taps.contains(&(index - 1))
    }

    /// The path run named `name`.
    pub fn path(&self, name: &str) -> Option<&PathRun> {
        self.paths.iter().find(|p| p.name.name() == name)
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
                "dtype: {} computes in {}{}, {} in {}{}. Fix: set the top-level `dtype` in config.json (every Auto class reads it; the causal LM reads text_config.dtype first), or load with an explicit dtype (from_pretrained(…, dtype=torch.{})) in both harnesses",
                pair.a,
                pair.dtype_a,
                why(a),
                pair.b,
                pair.dtype_b,
                why(b),
                pair.dtype_a.torch_name()
            ));
        }
        if let (Some(a), Some(b)) = (a, b) {
            let has_head = |p: &PathRun| p.lm_head != LmHeadOrigin::None;
            if a.lm_head != b.lm_head && has_head(a) && has_head(b) {
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
                let inv = self
                    .inventory
                    .paths
                    .iter()
                    .find(|i| i.name == p.name.name());
                // The tie flag, when that is why lm_head.weight is missing.
                let untied = inv.and_then(|i| i.untied_lm_head.as_ref());
                if p.missing > 0 {
                    let first = inv
                        .and_then(|i| i.missing_names.first())
                        .map(|n| format!(", first {n}"))
                        .unwrap_or_default();
                    // The inventory's prefix diagnosis names the keys and the fix.
                    let prefix = inv.and_then(|i| {
                        i.notes
                            .iter()
                            .find(|n| n.contains("no rename rule maps"))
                            .cloned()
                    });
                    let why = match (untied, prefix) {
                        (Some(note), _) if p.missing == 1 => note.clone(),
                        (_, Some(note)) => note,
                        _ => format!("its checkpoint names do not match the class{first}; `hsparity inventory` lists them"),
                    };
                    out.push(format!(
                        "missing: {} initialises {} randomly ({why})",
                        p.name,
                        crate::text::counted(p.missing, "tensor", None)
                    ));
                }
                if !p.non_finite_weights.is_empty() {
                    out.push(format!(
                        "weights: {} reads {} holding NaN/Inf",
                        p.name,
                        crate::text::counted(p.non_finite_weights.len(), "tensor", None)
                    ));
                }
            }
        }
        let loading_differences = out.len();
        out.extend(router_cause(pair));
        out.extend(router_floor_note(pair));
        if let Some(row) = pair
            .first_divergent
            .and_then(|i| pair.hidden_states.iter().find(|r| r.index == i))
        {
            let at = hidden_state_label(row.index, row.layer_type);
            match (&row.local, row.local_verdict) {
                (Some(l), Some(Verdict::Pass)) => out.push(format!(
                    "hidden_states[{}] ({at}) passes when {}'s layer is fed {}'s input (local cos_min {:.8}): the difference is inherited",
                    row.index, pair.b, pair.a, l.cos_min
                )),
                (Some(l), Some(_)) if l.nan_count + l.inf_count > 0 => out.push(format!(
                    "hidden_states[{}] ({at}) holds NaN/Inf even when both layers get the same input ({} NaN, {} Inf values)",
                    row.index, l.nan_count, l.inf_count
                )),
                (Some(l), Some(_)) => out.push(format!(
                    "hidden_states[{}] ({at}) differs even when both layers get the same input (local cos_min {:.8}): the layer itself computes differently",
                    row.index, l.cos_min
                )),
                _ => {}
            }
            if let Some(l) = &pair.localisation {
                out.push(match &l.cause {
                    Some(c) => format!("where: {}; {c}", l.sentence),
                    None => format!("where: {}", l.sentence),
                });
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
pub fn hidden_state_label(index: usize, kind: HiddenKind) -> String {
    match kind {
        HiddenKind::Embedding => "embeddings".into(),
        HiddenKind::FinalNorm => format!("output of layer {} after the final norm", index - 1),
        t => format!(
            "output of layer {}, {}",
            index - 1,
            t.as_str().replace('_', " ")
        ),
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
            .filter(|k| crate::loading::resolve::ignore_matches(pat, k))
            .collect(),
    )
}

impl Body for Compare {
    const FILES: &'static [&'static str] = &["report.md", "report.json", markdown::PLOT_FILE];

    fn terminal(report: &Report<Self>, width: Width) -> String {
        terminal::render(report, width)
    }

    fn files(report: &Report<Self>) -> Result<Vec<(&'static str, String)>> {
        Ok(vec![
            ("report.md", markdown::render(report)),
            (markdown::PLOT_FILE, svg::render(report)?),
        ])
    }
}

/// `L3` for the output of decoder layer 3 (`hidden_states[4]`), `emb`, `L5 +norm`.
pub fn layer_label(row: &HiddenStateRow) -> String {
    match row.layer_type {
        HiddenKind::Embedding => "emb".into(),
        HiddenKind::FinalNorm => format!("L{} +norm", row.index - 1),
        _ => format!("L{}", row.index - 1),
    }
}

/// Layer type, plus the paths whose weights here are randomly initialised.
pub fn type_label(row: &HiddenStateRow) -> String {
    if row.random_init.is_empty() {
        row.layer_type.as_str().to_string()
    } else {
        format!(
            "{} (RANDOM INIT on {})",
            row.layer_type.as_str(),
            row.random_init.join(", ")
        )
    }
}

/// Whether a row of `pair` does not pass (the tables then show where each
/// prompt departs).
pub fn has_departures(pair: &PairReport) -> bool {
    pair.hidden_states
        .iter()
        .any(|r| r.verdict != Verdict::Pass)
}

/// The per-layer table of `pair`: one row per `hidden_states` index, taps
/// marked, the first divergent row highlighted; for an MoE pair, a column of
/// router choices that differ (token × slot, of all compared).
pub fn pair_table(report: &Compare, pair: &PairReport) -> Table {
    let mut cols = vec![
        Column::new("hs").right().strong().key(),
        Column::new("layer").strong().key(),
        Column::new("type"),
        Column::new("tap"),
        Column::new("cos min"),
        // With the floor's column the terminal leaves out the mean cosine
        // (the Markdown and the JSON keep it).
        match pair.noise_floor {
            Some(_) => Column::new("cos mean").only(Sinks::Markdown),
            None => Column::new("cos mean"),
        },
        Column::new("max abs diff"),
        Column::new("rel L2"),
        Column::new("bitwise"),
        Column::new("local cos min"),
    ];
    if has_departures(pair) {
        cols.push(Column::new("departs at"));
    }
    if has_router(pair) {
        cols.push(Column::new(ROUTER_COLUMN));
    }
    if pair.noise_floor.is_some() {
        cols.push(Column::new("× floor"));
    }
    cols.push(Column::new("verdict").strong());
    let mut t = Table::new(cols);
    for r in &pair.hidden_states {
        t.push(pair_row(report, pair, r));
    }
    t
}

/// True when the pair's layers are MoE layers (rows carry router agreements).
pub fn has_router(pair: &PairReport) -> bool {
    pair.router_totals().is_some()
}

/// The header of the router column of pair tables (`compare`, `diff`).
pub const ROUTER_COLUMN: &str = "router Δ";

/// A row's router cell: `-` on rows without a router.
pub fn router_cell(r: &HiddenStateRow) -> String {
    r.router.map_or_else(|| "-".into(), |a| a.cell())
}

/// The pair's routers over every MoE layer when some choice differs, as a
/// sentence naming the first layer (`None` when every choice agrees or the
/// pair is dense).
pub fn router_cause(pair: &PairReport) -> Option<String> {
    let t = pair.router_totals()?;
    let (l, first) = t.first?;
    let local = match first.local_slots_differing {
        Some(0) => format!(
            "; at layer {l}, fed {}'s input, {}'s router agrees: its flips are inherited",
            pair.a, pair.b
        ),
        Some(n) => {
            let remain = match (n, first.slots_differing) {
                (1, 1) => "its one flip remains".to_string(),
                (n, m) if n == m => format!("all {n} of its flips remain"),
                (n, m) => format!("{n} of its {m} flips remain"),
            };
            format!(
                "; at layer {l}, {remain} on {}'s input: that layer flips by itself",
                pair.a
            )
        }
        None => String::new(),
    };
    Some(format!(
        "router: {} routes differently from {} in {} of {} token×slot choices over {} MoE layers ({} with another \
         expert set), first at layer {l} (hs {}){local}",
        pair.b,
        pair.a,
        t.slots_differing,
        t.slots,
        t.layers,
        crate::text::counted(t.tokens_with_other_experts, "token", None),
        l + 1
    ))
}

/// The pair's router flips read against the noise floor's (`None` without
/// a floor that measured the routers, or when no choice differs).
pub fn router_floor_note(pair: &PairReport) -> Option<String> {
    pair.router_totals().filter(|t| t.slots_differing > 0)?;
    Some(match pair.routers_against_floor()? {
        RouterFloor::Within { noise, slots } => format!(
            "router floor: no MoE layer flips more choices than the noise floor allows (2 × (the noise shadow's \
             flips + 1); the shadow flips {noise} of {slots}): near-tie choices that rounding flips, not a finding"
        ),
        RouterFloor::Beyond { layer, agreement } => format!(
            "router floor: layer {layer} (hs {}) flips {} choices where the noise floor allows {:.0} (2 × ({} + 1)): \
             more than rounding flips; check that layer's router weight (mlp.gate.weight) and its input, or \
             compare in f32 (--dtype f32)",
            layer + 1,
            agreement.slots_differing,
            agreement.floor_allows().unwrap_or(0.0),
            agreement.noise_slots_differing.unwrap_or(0)
        ),
    })
}

/// The lines on the routers of an MoE pair (none for a dense pair): what
/// differs, or that every choice agrees; then the floor's reading.
pub fn router_summary(pair: &PairReport) -> Vec<String> {
    let Some(t) = pair.router_totals() else {
        return Vec::new();
    };
    let first = router_cause(pair).unwrap_or_else(|| {
        format!(
            "router: every top-k choice agrees ({} token×slot choices over {} MoE layers)",
            t.slots, t.layers
        )
    });
    std::iter::once(first)
        .chain(router_floor_note(pair))
        .collect()
}

/// One row of [`pair_table`].
pub fn pair_row(report: &Compare, pair: &PairReport, r: &HiddenStateRow) -> Row {
    let m = &r.metrics;
    let first = pair.first_divergent == Some(r.index);
    let mut row = Row {
        cells: vec![
            r.index.to_string().into(),
            layer_label(r).into(),
            type_label(r).into(),
            if report.is_tap(r.index) {
                format!("◆ {}", r.index - 1)
            } else {
                String::new()
            }
            .into(),
            cos(m.cos_min).into(),
            cos(m.cos_mean).into(),
            max_abs_at(m).into(),
            sci(m.rel_l2).into(),
            yes_no(m.bitwise).into(),
            r.local
                .as_ref()
                .map(|l| cos(l.cos_min))
                .unwrap_or_else(|| "-".into())
                .into(),
        ],
        highlight: first,
    };
    if has_departures(pair) {
        row.cells.push(departure_cell(&r.prompts).into());
    }
    if has_router(pair) {
        row.cells.push(router_cell(r).into());
    }
    if pair.noise_floor.is_some() {
        row.cells
            .push(noise_ratio(r.noise.as_ref(), r.metrics.bitwise).into());
    }
    row.cells.push(Cell::Verdict(
        r.verdict,
        if first { " ← first divergent" } else { "" }.into(),
    ));
    row
}

/// The prefill-vs-incremental table: one row per path, naming the prompt
/// it ran on (`p<index>`, as the parity table's positions do).
pub fn incremental_table(checks: &[IncrementalCheck]) -> Table {
    let mut t = Table::new(vec![
        Column::new("path"),
        Column::new("prompt"),
        Column::new("prefill + steps"),
        Column::new("max abs diff"),
        Column::new("cos min"),
        Column::new("verdict"),
    ]);
    for c in checks {
        t.push(Row::new(vec![
            Cell::code(c.path.name()),
            format!("p{}", c.prompt).into(),
            format!("{} + {}", c.prefill_tokens, c.steps).into(),
            sci(c.metrics.max_abs).into(),
            cos(c.metrics.cos_min).into(),
            Cell::verdict(c.verdict),
        ]));
    }
    t
}
