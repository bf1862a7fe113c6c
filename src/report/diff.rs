//! `diff`'s report: two dumps' metadata and their per-index parity, with the
//! dtype-noise column when their dtypes differ.

use std::collections::BTreeMap;

use serde::Serialize;

use super::format::{cos, max_abs_at, sci, yes_no};
use super::tabular::{Cell, Column, Row, Table};
use super::{Document, Environment, Kind, Report};
use crate::error::Result;
use crate::parity::dumps::{DtypeNoiseRow, DumpComparison};
use crate::parity::{PairReport, Verdict};
use crate::precision::Precision;

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
}

/// The report of comparison `c` between dumps named `na` and `nb` with the
/// given metadata.
pub fn build(
    c: DumpComparison,
    (na, nb): (&str, &str),
    dumps: Vec<BTreeMap<String, String>>,
    command: String,
) -> DiffReport {
    let verdict = c.pair.verdict();
    let noise_rows = c.dtype_noise.iter().filter(|r| r.dtype_noise).count();
    let mut summary = match (verdict, c.pair.first_non_bitwise, c.pair.first_divergent) {
        (Verdict::Pass, None, _) => format!(
            "{na} and {nb} agree bitwise at all {} hidden states",
            c.pair.hidden_states.len()
        ),
        (Verdict::Pass, Some(i), _) => {
            format!("{na} and {nb} agree within tolerance (not bitwise from hidden_states[{i}])")
        }
        (_, _, Some(i)) => format!("{na} and {nb} diverge from hidden_states[{i}]"),
        (_, _, None) => format!("{na} and {nb} differ in the logits"),
    };
    if let Some(l) = c.lower_dtype {
        summary.push_str(&format!(
            "; dtypes {} vs {}: {noise_rows} of {} hidden states differ only by {l} rounding (dtype noise)",
            c.pair.dtype_a,
            c.pair.dtype_b,
            c.dtype_noise.len()
        ));
    }
    let mut notes = Vec::new();
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
        },
    )
}

/// The per-index table of `p` (with the dtype-noise column when the dumps'
/// dtypes differ); the first divergent row highlighted.
pub fn index_table(r: &Diff, p: &PairReport) -> Table {
    let mut cols = vec![
        Column::new("hs").strong(),
        Column::new("cos min"),
        Column::new("cos mean"),
        Column::new("max abs diff"),
        Column::new("rel L2"),
        Column::new("bitwise"),
        Column::new("verdict").strong(),
    ];
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
            Cell::verdict(row.verdict),
        ];
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
pub fn render(r: &DiffReport) -> String {
    let mut out = format!("{}\n\n", r.summary);
    for p in &r.pairs {
        out.push_str(&index_table(r, p).terminal().to_string());
        out.push('\n');
        if let Some(l) = &p.logits {
            out.push_str(&format!(
                "logits: cos min {}, max abs diff {}, argmax agreement {:.4}\n",
                cos(l.cos_min),
                max_abs_at(l),
                p.argmax_agreement.unwrap_or(f64::NAN)
            ));
        }
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
    }
    for n in &r.notes {
        md.push_str(&format!("\n- {n}"));
    }
    md.push_str(&format!("\n\n## Reproduce\n\n```\n{}\n```\n", r.command));
    md
}

impl Document for DiffReport {
    const FILES: &'static [&'static str] = &["report.md", "report.json"];

    fn terminal(&self) -> String {
        render(self)
    }

    fn files(&self) -> Result<Vec<(&'static str, String)>> {
        Ok(vec![("report.md", markdown(self))])
    }

    fn exit_code(&self) -> u8 {
        self.exit_code as u8
    }
}
