//! `diff CKPT_A CKPT_B`'s report: two checkpoints' tensors compared
//! (`crate::checkpoint::compare`), the findings first, then every tensor
//! that differs. Renders only.

use serde::Serialize;

use super::format::sci;
use super::tabular::{Column, Row, Table};
use super::{Body, Environment, Kind, Report};
use crate::checkpoint::compare::{Finding, Relation, WeightsComparison};
use crate::error::Result;
use crate::parity::Verdict;
use crate::width::Width;

/// The weights comparison's report.
pub type WeightsReport = Report<Weights>;

/// The members the weights comparison adds to the envelope.
#[derive(Debug, Clone, Serialize)]
pub struct Weights {
    /// Checkpoint a (the reference) and b, as given.
    pub checkpoints: [String; 2],
    /// Tensors each holds.
    pub tensors: [usize; 2],
    /// The differing tensors grouped by relation, with what each means.
    pub findings: Vec<Finding>,
    /// Every comparison that is not bitwise equality, and the keys one side lacks.
    #[serde(flatten)]
    pub comparison: WeightsComparison,
}

/// Rows shown on the terminal (all of them are in report.json and report.md).
const SHOWN: usize = 30;

/// The report of `c` between checkpoints `a` and `b` (holding `tensors` each).
pub fn build(
    c: WeightsComparison,
    (a, b): (&str, &str),
    tensors: [usize; 2],
    geometry: &[String],
    command: String,
) -> WeightsReport {
    let findings = c.findings();
    // An unreadable config is said, not a finding about the tensors.
    let (unread, geometry): (Vec<&String>, Vec<&String>) = geometry
        .iter()
        .partition(|g| g.starts_with("architectures not compared"));
    let geometry: Vec<String> = geometry.into_iter().cloned().collect();
    let fails = findings.iter().any(|f| f.fails) || !geometry.is_empty();
    let summary = if findings.is_empty() {
        format!(
            "{a} and {b} hold the same {} tensors, bitwise equal",
            c.equal
        )
    } else {
        let parts: Vec<String> = findings
            .iter()
            .map(|f| {
                // `1 differs`, `74 differ`; `1 shape differs`, `22 shapes differ`.
                let n = f.names.len();
                let relation = match (n, f.relation.as_str()) {
                    (1, r) => r.to_string(),
                    (_, "differs") => "differ".to_string(),
                    (_, "shape differs") => "shapes differ".to_string(),
                    (_, r) => r.to_string(),
                };
                format!("{n} {relation}")
            })
            .collect();
        format!(
            "{a} and {b}: {} of {} common tensors equal; {}",
            c.equal,
            c.equal + c.differing.len(),
            parts.join(", ")
        )
    };
    let summary = match unread.first() {
        Some(u) => format!("{summary}; {u}"),
        None => summary,
    };
    let summary = match geometry.is_empty() {
        true => summary,
        false => format!(
            "{a} and {b} are different architectures ({}): two models' tensors, not one model's converted, so the counts say little; {}",
            geometry.join(", "),
            summary.trim_start_matches(&format!("{a} and {b}: "))
        ),
    };
    Report::new(
        Kind::Weights,
        if fails { Verdict::Fail } else { Verdict::Pass },
        &summary,
        Environment::host(),
        command,
        Vec::new(),
        Weights {
            checkpoints: [a.to_string(), b.to_string()],
            tensors,
            findings,
            comparison: c,
        },
    )
}

/// The table of differing tensors (`limit`: at most that many rows).
fn table(w: &Weights, limit: usize) -> Table {
    let mut t = Table::new(vec![
        Column::new("tensor").strong().key(),
        Column::new("dtype a → b"),
        Column::new("shape a → b"),
        Column::new("relation").strong(),
    ]);
    for d in w.comparison.differing.iter().take(limit) {
        let rel = match &d.relation {
            Relation::Differs { rel_l2, max_abs } => {
                format!(
                    "differs (rel L2 {}, max abs {})",
                    sci(*rel_l2),
                    sci(*max_abs)
                )
            }
            r => r.label(),
        };
        let arrow = |x: String, y: String| if x == y { x } else { format!("{x} → {y}") };
        t.push(Row {
            cells: vec![
                d.name.clone().into(),
                arrow(d.dtype_a.clone(), d.dtype_b.clone()).into(),
                arrow(format!("{:?}", d.shape_a), format!("{:?}", d.shape_b)).into(),
                rel.into(),
            ],
            highlight: false,
        });
    }
    t
}

/// `a, b, c and 10 more`.
fn names(v: &[String], shown: usize) -> String {
    let mut s = v.iter().take(shown).cloned().collect::<Vec<_>>().join(", ");
    if v.len() > shown {
        s.push_str(&format!(" and {} more", v.len() - shown));
    }
    s
}

impl Body for Weights {
    const FILES: &'static [&'static str] = &["report.md", "report.json"];

    fn terminal(r: &Report<Self>, width: Width) -> String {
        let w = &r.body;
        let mut out = format!("{}\n\n", r.summary);
        for f in &w.findings {
            out.push_str(&format!("- {}: {}\n", f.sentence, names(&f.names, 4)));
        }
        if !w.comparison.differing.is_empty() {
            out.push('\n');
            out.push_str(&table(w, SHOWN).render(width));
            out.push('\n');
            if w.comparison.differing.len() > SHOWN {
                out.push_str(&format!(
                    "… and {} more (--json lists every tensor, and report.md where one is written)\n",
                    w.comparison.differing.len() - SHOWN
                ));
            }
        }
        out
    }

    fn files(r: &Report<Self>) -> Result<Vec<(&'static str, String)>> {
        let w = &r.body;
        let mut md = format!(
            "# hsparity diff (weights)\n\n**{}**\n\n`{}` ({} tensors) vs `{}` ({} tensors).\n\n",
            r.summary, w.checkpoints[0], w.tensors[0], w.checkpoints[1], w.tensors[1]
        );
        for f in &w.findings {
            md.push_str(&format!(
                "- {}: {}\n",
                f.sentence,
                names(&f.names, usize::MAX)
            ));
        }
        if !w.comparison.differing.is_empty() {
            md.push('\n');
            md.push_str(&table(w, usize::MAX).markdown());
        }
        md.push_str(&format!("\n## Reproduce\n\n```\n{}\n```\n", r.command));
        Ok(vec![("report.md", md)])
    }
}
