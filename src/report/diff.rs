//! `diff`'s report: two dumps' metadata and their per-index parity, with the
//! dtype-noise column when their dtypes differ, the indices one dump holds
//! alone, and (`--align`) the best-matching index of a for every index of b.

use crate::width::Width;
use std::collections::BTreeMap;

use serde::Serialize;

use super::compare::has_departures;
use super::format::{cos, max_abs_at, noise_floor_line, noise_ratio, sci, yes_no};
use super::tabular::{Cell, Column, Row, Sinks, Table};
use super::{Body, Environment, Kind, Report};
use crate::error::Result;
use crate::parity::align::Alignment;
use crate::parity::conventions::ConventionFinding;
use crate::parity::dumps::{DtypeNoiseRow, DumpComparison, Skipped};
use crate::parity::{PairReport, Verdict};
use crate::precision::Precision;
use crate::report::localisation::departure_cell;

/// `diff`'s report: the envelope around [`Diff`].
pub type DiffReport = Report<Diff>;

/// The members `diff`'s report adds to the envelope.
#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    /// `__metadata__` of dump a and dump b.
    pub dumps: Vec<BTreeMap<String, String>>,
    /// One pair: a vs b.
    pub pairs: Vec<PairReport>,
    /// b's index = a's index + tap_offset.
    pub tap_offset: i64,
    /// When the dumps' dtypes differ: the lower one.
    pub lower_dtype: Option<Precision>,
    /// Per row, whether the difference is dtype noise (dtypes differ).
    pub dtype_noise: Vec<DtypeNoiseRow>,
    /// `hidden_states` indices held by one dump only (not compared).
    pub skipped: Skipped,
    /// False when a dump has no `input_ids`: the inputs could not be verified.
    pub inputs_verified: bool,
    /// `--align`: for every index of b, the index of a it matches best.
    pub alignment: Option<AlignSection>,
    /// A failing state another convention explains (b's last state pre-norm).
    pub convention: Option<ConventionFinding>,
}

/// The `--align` result with its one-line diagnosis.
#[derive(Debug, Clone, Serialize)]
pub struct AlignSection {
    /// One line: the common offset and what it means, or the disagreement.
    pub diagnosis: String,
    /// Rows and the common offset.
    #[serde(flatten)]
    pub alignment: Alignment,
}

/// The run's verdict: the rows and logits, the last layer output when
/// compared, and an alignment that is not at offset 0.
fn verdict_of(c: &DumpComparison) -> Verdict {
    let last = c.pair.last_layer_verdict();
    let aligned = c.alignment.as_ref().map(|a| {
        if a.offset == Some(0) {
            Verdict::Pass
        } else {
            Verdict::Fail
        }
    });
    [Some(c.pair.verdict()), last, aligned]
        .into_iter()
        .flatten()
        .max_by_key(|v| *v as u8)
        .unwrap_or(Verdict::Pass)
}

/// What the summary adds for partial and engine dumps.
fn partial_summary(c: &DumpComparison) -> String {
    let mut s = String::new();
    if let (Some(m), Some(v)) = (&c.pair.last_layer_output, c.pair.last_layer_verdict()) {
        if v == Verdict::Pass {
            s.push_str(&format!("; last_layer_output {}", v.as_str()));
        } else {
            // The rows may all agree: say what does not, and what it is.
            let rows_pass = c.pair.verdict() == Verdict::Pass;
            s.push_str(&format!(
                "; {}last_layer_output (the pre-norm output of the last decoder layer) does not agree: {} (cos_min {}, rel L2 {:.3e}){}",
                if rows_pass { "but " } else { "" },
                v.as_str().to_uppercase(),
                cos(m.cos_min),
                m.rel_l2,
                if rows_pass {
                    " — the last layer's output before the final norm differs while every compared hidden state agrees (a capture of another tensor there, or a norm the two runs place differently)"
                } else {
                    ""
                }
            ));
        }
    }
    let n = c.skipped.a.len() + c.skipped.b.len();
    if n > 0 && c.partial {
        s.push_str(&format!(
            "; {} held by one dump only skipped",
            crate::text::counted(n, "index", Some("indices"))
        ));
    }
    if !c.inputs_verified {
        s.push_str("; inputs not verified (no input_ids)");
    }
    if let Some(a) = &c.alignment {
        s.push_str(&format!("; align: {}", a.diagnosis()));
    }
    s
}

/// The summary's first clause: bitwise, within tolerance, where the dumps
/// part (with the convention, boundary or NaN/Inf that explains it), or
/// the logits.
fn headline(c: &DumpComparison, (na, nb): (&str, &str)) -> String {
    let rows_verdict = c.pair.verdict();
    match (
        rows_verdict,
        c.pair.first_non_bitwise,
        c.pair.first_divergent,
    ) {
        _ if c.pair.hidden_states.is_empty() => {
            format!("{na} and {nb} hold no common hidden state")
        }
        (Verdict::Pass, None, _) => format!(
            "{na} and {nb} agree bitwise at all {} hidden states",
            c.pair.hidden_states.len()
        ),
        (Verdict::Pass, Some(i), _) => {
            let beyond = c.pair.beyond_floor();
            let beyond = match beyond.len() {
                0 => String::new(),
                n => format!(
                    ", {} beyond the measured noise floor (see the note)",
                    crate::text::counted(n, "compared state", None)
                ),
            };
            format!(
                "{na} and {nb} agree {} (not bitwise from hidden_states[{i}]){beyond}",
                c.pair.agreement()
            )
        }
        (_, _, Some(i)) => match (&c.convention, &c.pair.localisation) {
            (Some(f), _) => format!("{na} and {nb} differ at hidden_states[{i}]: {}", f.sentence),
            (None, _) if c.non_finite.is_some() => {
                let [x, y] = c.non_finite.unwrap_or_default();
                let bitwise = c
                    .pair
                    .hidden_states
                    .iter()
                    .find(|r| r.index == i)
                    .is_some_and(|r| r.metrics.bitwise);
                let holds = match (x, y) {
                    (0, n) => format!(
                        "{nb} holds {}",
                        crate::text::counted(n, "NaN/Inf value", None)
                    ),
                    (n, 0) => format!(
                        "{na} holds {}",
                        crate::text::counted(n, "NaN/Inf value", None)
                    ),
                    (n, m) => format!("{na} holds {n} and {nb} {m} NaN/Inf values"),
                };
                if bitwise {
                    format!(
                        "{na} and {nb} agree bitwise, but both hold NaN/Inf from hidden_states[{i}] ({holds}): the run that wrote them overflowed or read NaN/Inf weights"
                    )
                } else {
                    format!(
                        "{na} and {nb} diverge from hidden_states[{i}], where NaN/Inf appear ({holds} there): the run that holds them overflowed or read NaN/Inf weights"
                    )
                }
            }
            (None, Some(l)) => format!(
                "{na} and {nb} diverge from hidden_states[{i}] ({}{})",
                l.sentence
                    .trim_start_matches(&format!("hidden_states[{i}]: ")),
                l.boundary
                    .as_ref()
                    .map(|b| format!("; {}", b.label()))
                    .unwrap_or_default()
            ),
            (None, None) => format!("{na} and {nb} diverge from hidden_states[{i}]"),
        },
        (_, _, None) => format!("{na} and {nb} differ in the logits"),
    }
}

/// A note when one dump's bf16 products were summed on AMX tiles and the
/// other's in candle's order (their `kernels` metadata, written by
/// `hsparity dump`): such dumps agree to the noise floor, not bitwise.
fn kernels_note(dumps: &[BTreeMap<String, String>], (na, nb): (&str, &str)) -> Option<String> {
    let amx = |i: usize| {
        let kernels = dumps.get(i)?.get("kernels")?;
        Some(kernels.split(',').any(|k| k == "bf16-gemm-amx"))
    };
    let (with, without) = match (amx(0)?, amx(1)?) {
        (true, false) => (na, nb),
        (false, true) => (nb, na),
        _ => return None,
    };
    Some(format!(
        "kernels: {with}'s bf16 products were summed on AMX tiles (bf16-gemm-amx), {without}'s \
         in candle's order, so the two agree to the noise floor, not bitwise \
         (docs/performance.md, \"Kernels\"; HSPARITY_NO_AMX=1 when dumping gives candle's sums)"
    ))
}

/// The report of comparison `c` between dumps named `na` and `nb` with the
/// given metadata.
pub fn build(
    c: DumpComparison,
    (na, nb): (&str, &str),
    dumps: Vec<BTreeMap<String, String>>,
    command: String,
) -> DiffReport {
    let verdict = verdict_of(&c);
    let noise_rows = c.dtype_noise.iter().filter(|r| r.dtype_noise).count();
    let mut summary = headline(&c, (na, nb));
    if let Some(policy) = c.pair.policy() {
        summary.push_str(&format!("; {policy}"));
    }
    if let Some(l) = c.lower_dtype {
        summary.push_str(&format!(
            "; dtypes {} vs {}: {noise_rows} of {} hidden states differ only by {l} rounding (dtype noise)",
            c.pair.dtype_a,
            c.pair.dtype_b,
            c.dtype_noise.len()
        ));
    }
    summary.push_str(&partial_summary(&c));
    let mut notes = c.notes.clone();
    if let Some(f) = &c.convention {
        notes.insert(0, format!("fix: {}", f.fix));
    } else if let Some(cause) = c.pair.localisation.as_ref().and_then(|l| l.cause.clone()) {
        notes.insert(0, format!("cause: {cause}"));
    }
    notes.extend(super::compare::router_summary(&c.pair));
    notes.extend(kernels_note(&dumps, (na, nb)));
    let offset = c
        .alignment
        .as_ref()
        .and_then(|a| a.offset)
        .filter(|&o| o != 0);
    if let Some(o) = offset {
        let source = dumps
            .get(1)
            .and_then(|m| m.get("source_format"))
            .map(String::as_str);
        notes.push(convention_note(o, source));
    }
    if c.tap_offset != 0 {
        summary.push_str(&format!("; b shifted by tap offset {:+}", c.tap_offset));
        notes.push(format!(
            "rows compare a's hidden_states[i] with b's hidden_states[i{:+}] (the other tap convention)",
            c.tap_offset
        ));
    }
    Report::new(
        Kind::Diff,
        verdict,
        &summary,
        Environment::host(),
        command,
        notes,
        Diff {
            dumps,
            pairs: vec![c.pair],
            tap_offset: c.tap_offset,
            lower_dtype: c.lower_dtype,
            dtype_noise: c.dtype_noise,
            skipped: c.skipped,
            inputs_verified: c.inputs_verified,
            convention: c.convention,
            alignment: c.alignment.map(|alignment| AlignSection {
                diagnosis: alignment.diagnosis(),
                alignment,
            }),
        },
    )
}

/// `--align`'s table: per index of b, the best index of a, the offset, how well.
pub fn align_table(a: &AlignSection) -> Table {
    let mut t = Table::new(vec![
        Column::new("b index").strong(),
        Column::new("best a index").strong(),
        Column::new("offset"),
        Column::new("cos mean"),
        Column::new("cos min"),
        Column::new("rel L2"),
        Column::new("cos mean at a's same index"),
        Column::new("runner-up (cos mean)"),
    ]);
    for r in &a.alignment.rows {
        t.push(Row {
            cells: vec![
                r.compared.to_string().into(),
                r.best.to_string().into(),
                format!("{:+}", r.offset).into(),
                cos(r.cos_mean).into(),
                cos(r.cos_min).into(),
                sci(r.rel_l2).into(),
                r.same_index_cos_mean
                    .map(cos)
                    .unwrap_or_else(|| "-".into())
                    .into(),
                r.runner_up
                    .map(|(i, c)| format!("{i} ({})", cos(c)))
                    .unwrap_or_else(|| "-".into())
                    .into(),
            ],
            highlight: r.offset != 0,
        });
    }
    t
}

/// The last-layer-output line (partial dumps), when compared.
fn last_line(p: &PairReport) -> Option<String> {
    let (m, v) = (p.last_layer_output.as_ref()?, p.last_layer_verdict()?);
    let floor = match p.last_layer_noise() {
        Some(c) if !m.bitwise => format!(", × floor {}", noise_ratio(Some(&c), m.bitwise)),
        Some(_) => String::new(),
        None => String::new(),
    };
    Some(format!(
        "last_layer_output (pre-norm): cos min {}, max abs diff {}, rel L2 {}{floor}, {}",
        cos(m.cos_min),
        max_abs_at(m),
        sci(m.rel_l2),
        v.as_str()
    ))
}

/// The per-index table of `p` (with the dtype-noise column when the dumps'
/// dtypes differ); the first divergent row highlighted.
pub fn index_table(r: &Diff, p: &PairReport) -> Table {
    // With the floor's column the terminal leaves out the mean cosine (the
    // Markdown and the JSON keep it), so the table fits 100 columns.
    let cos_mean = match p.noise_floor {
        Some(_) => Column::new("cos mean").only(Sinks::Markdown),
        None => Column::new("cos mean"),
    };
    let mut cols = vec![
        Column::new("hs").strong(),
        Column::new("cos min"),
        cos_mean,
        Column::new("max abs diff"),
        Column::new("rel L2"),
        Column::new("bitwise"),
    ];
    let departures = has_departures(p);
    if departures {
        cols.push(Column::new("departs at"));
    }
    let router = super::compare::has_router(p);
    if router {
        cols.push(Column::new(super::compare::ROUTER_COLUMN));
    }
    if p.noise_floor.is_some() {
        cols.push(Column::new("× floor"));
    }
    cols.push(Column::new("verdict").strong());
    if r.lower_dtype.is_some() {
        cols.push(Column::new("dtype noise"));
    }
    let mut t = Table::new(cols);
    for row in &p.hidden_states {
        let m = &row.metrics;
        let mut cells: Vec<Cell> = vec![
            row.index.to_string().into(),
            cos(m.cos_min).into(),
            cos(m.cos_mean).into(),
            max_abs_at(m).into(),
            sci(m.rel_l2).into(),
            yes_no(m.bitwise).into(),
        ];
        if departures {
            cells.push(departure_cell(&row.prompts).into());
        }
        if router {
            cells.push(super::compare::router_cell(row).into());
        }
        if p.noise_floor.is_some() {
            cells.push(noise_ratio(row.noise.as_ref(), m.bitwise).into());
        }
        cells.push(Cell::verdict(row.verdict));
        if r.lower_dtype.is_some() {
            let n = r.dtype_noise.iter().find(|n| n.index == row.index);
            cells.push(
                match n {
                    Some(n) => format!(
                        "{} (rel L2 {} after cast)",
                        yes_no(n.dtype_noise),
                        sci(n.rel_l2_after_cast)
                    ),
                    None => "-".into(),
                }
                .into(),
            );
        }
        t.push(Row {
            cells,
            highlight: p.first_divergent == Some(row.index),
        });
    }
    t
}

/// Terminal: summary, then one row per compared hidden state.
pub fn render(r: &DiffReport, width: Width) -> String {
    let mut out = format!("{}\n\n", r.summary);
    for p in &r.pairs {
        if p.first_non_bitwise.is_some() {
            out.push_str("max abs diff @p1 t42 f3 = at prompt 1, token 42, feature 3\n");
        }
        out.push_str(&index_table(r, p).render(width));
        out.push('\n');
        if let Some(l) = noise_floor_line(p) {
            out.push_str(&format!("{}\n", crate::width::fill(&l, width)));
        }
        if let Some(l) = &p.logits {
            out.push_str(&format!(
                "logits: cos min {}, max abs diff {}, argmax agreement {:.4}\n",
                cos(l.cos_min),
                max_abs_at(l),
                p.argmax_agreement.unwrap_or(f64::NAN)
            ));
        }
        if let Some(l) = last_line(p) {
            out.push_str(&format!("{l}\n"));
        }
    }
    if let Some(a) = &r.alignment {
        out.push_str(&format!(
            "\n{}\nalign: {}\n",
            align_table(a).render(width),
            a.diagnosis
        ));
    }
    for n in &r.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// `report.md` of `diff`: verdict sentence, both dumps' metadata, the
/// per-index table, notes, the command.
pub fn markdown(r: &DiffReport) -> String {
    let mut dumps = Table::new(
        [
            "",
            "format",
            "checkpoint",
            "loading path",
            "class",
            "dtype",
            "layers",
            "written by",
        ]
        .into_iter()
        .map(Column::new)
        .collect(),
    );
    for (name, m) in ["a", "b"].iter().zip(&r.dumps) {
        let g = |k: &str| m.get(k).cloned().unwrap_or_else(|| "-".into());
        dumps.push(Row::new(vec![
            (*name).into(),
            g("format").into(),
            Cell::code(g("checkpoint")),
            Cell::code(g("loading_path")),
            Cell::code(g("class")),
            g("dtype").into(),
            g("num_layers").into(),
            g("tool_version").into(),
        ]));
    }
    let mut md = format!("{}\n\n## Dumps\n\n{}", r.summary, dumps.markdown());
    for p in &r.pairs {
        md.push_str(&format!(
            "\n## `{}` vs `{}`\n\n{}",
            p.a,
            p.b,
            index_table(r, p).markdown()
        ));
        if let Some(l) = noise_floor_line(p) {
            md.push_str(&format!("\n{l}\n"));
        }
        md.push_str(&super::localisation::markdown(p).unwrap_or_default());
        if let Some(l) = last_line(p) {
            md.push_str(&format!("\n{l}\n"));
        }
    }
    if let Some(a) = &r.alignment {
        md.push_str(&format!(
            "\n## Alignment (`--align`)\n\n{}\n{}\n",
            a.diagnosis,
            align_table(a).markdown()
        ));
    }
    for n in &r.notes {
        md.push_str(&format!("\n- {n}"));
    }
    md.push_str(&format!("\n\n## Reproduce\n\n```\n{}\n```\n", r.command));
    md
}

impl Body for Diff {
    const FILES: &'static [&'static str] = &["report.md", "report.json"];

    fn terminal(report: &Report<Self>, width: Width) -> String {
        render(report, width)
    }

    fn files(report: &Report<Self>) -> Result<Vec<(&'static str, String)>> {
        Ok(vec![("report.md", markdown(report))])
    }
}
/// What an `--align` offset `o` says about the tap-index conventions, by
/// where b came from (`source_format` of its metadata), with the option that
/// aligns it.
fn convention_note(o: i64, source: Option<&str>) -> String {
    if o.abs() != 1 {
        return format!(
            "b's states sit {o:+} from their indices: more than one layer, so not a tap convention (those \
             differ by one) but another numbering or another model's depth; `diff --tap-offset {:+}` compares \
             them aligned",
            -o
        );
    }
    let conventions = "DFlash/SpecForge tap L (target_layer_ids) = hidden_states[L+1], the output of layer L; \
                       vLLM/SGLang aux id k = hidden_states[k], the input to layer k (0 = embeddings)";
    match source {
        Some("vllm") => format!(
            "b is a vLLM capture whose states sit {o:+} from the ids it was read with: the run captured other \
             layers than its eagle_aux_hidden_state_layer_ids say (vLLM's blanket +1 over aux ids gives +1); \
             re-import it with every --layer-ids value shifted by {o:+} ({conventions})"
        ),
        Some("specforge") => format!(
            "b is a SpecForge capture whose states sit {o:+} from the taps it was read with: the ids given \
             (--target-layer-ids, or the drafter's config) follow the other convention; re-import it with every \
             id shifted by {o:+} ({conventions})"
        ),
        Some(f) => format!(
            "b ({f}) holds states {o:+} from the indices it was read with: its writer numbered layers in the \
             other convention ({conventions}); `diff --tap-offset {:+}` compares them aligned",
            -o
        ),
        None => format!(
            "b's states sit {o:+} from their indices: its writer numbered layers in the other convention \
             ({conventions}; a decoder-layer hook's output of layer L is hidden_states[L+1]); \
             `diff --tap-offset {:+}` compares them aligned, and a drafter fed these states reads taps one \
             layer {} (triage's tap-offset{o:+} row says what that costs)",
            -o,
            if o > 0 { "late" } else { "early" }
        ),
    }
}
