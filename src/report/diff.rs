//! Terminal rendering of a [`DiffReport`].

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use super::table::{cos, max_abs_at, sci};
use crate::commands::diff::DiffReport;

/// Summary, then one row per compared hidden state (with the dtype-noise
/// column when the dumps' dtypes differ).
pub fn render(r: &DiffReport) -> String {
    let mut out = format!("{}\n\n", r.summary);
    for p in &r.pairs {
        let mut t = Table::new();
        t.load_style(UTF8_FULL_CONDENSED);
        let mut header = vec![
            "hs",
            "cos min",
            "cos mean",
            "max abs diff",
            "rel L2",
            "bitwise",
            "verdict",
        ];
        if r.lower_dtype.is_some() {
            header.push("dtype noise");
        }
        t.set_header(header);
        for row in &p.hidden_states {
            let m = &row.metrics;
            let mut cells = vec![
                row.index.to_string(),
                cos(m.cos_min),
                cos(m.cos_mean),
                max_abs_at(m),
                sci(m.rel_l2),
                if m.bitwise { "yes" } else { "no" }.to_string(),
                row.verdict.as_str().to_uppercase(),
            ];
            if r.lower_dtype.is_some() {
                let n = r.dtype_noise.iter().find(|n| n.index == row.index);
                cells.push(match n {
                    Some(n) if n.dtype_noise => {
                        format!("yes (rel L2 {} after cast)", sci(n.rel_l2_after_cast))
                    }
                    Some(n) => format!("no (rel L2 {} after cast)", sci(n.rel_l2_after_cast)),
                    None => "-".into(),
                });
            }
            t.add_row(cells);
        }
        out.push_str(&t.to_string());
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

/// Markdown rendering (`report.md` of `diff`): verdict sentence, both dumps'
/// metadata, the per-index table with the dtype-noise column, the command.
pub fn markdown(r: &DiffReport) -> String {
    let mut md = format!("{}\n\n## Dumps\n\n| | format | checkpoint | loading path | class | dtype | layers | written by |\n|---|---|---|---|---|---|---|---|\n", r.summary);
    for (name, m) in ["a", "b"].iter().zip(&r.dumps) {
        let g = |k: &str| m.get(k).cloned().unwrap_or_else(|| "-".into());
        md.push_str(&format!(
            "| {name} | {} | `{}` | `{}` | `{}` | {} | {} | {} |\n",
            g("format"),
            g("checkpoint"),
            g("loading_path"),
            g("class"),
            g("dtype"),
            g("num_layers"),
            g("tool_version")
        ));
    }
    for p in &r.pairs {
        md.push_str(&format!(
            "\n## `{}` vs `{}`\n\n| hs | cos min | cos mean | max abs diff | rel L2 | bitwise | verdict |{}\n|---|---|---|---|---|---|---|{}\n",
            p.a,
            p.b,
            if r.lower_dtype.is_some() { " dtype noise |" } else { "" },
            if r.lower_dtype.is_some() { "---|" } else { "" }
        ));
        for row in &p.hidden_states {
            let m = &row.metrics;
            let hl = if p.first_divergent == Some(row.index) {
                "**"
            } else {
                ""
            };
            let noise = match r.dtype_noise.iter().find(|n| n.index == row.index) {
                Some(n) => format!(" {} |", if n.dtype_noise { "yes" } else { "no" }),
                None if r.lower_dtype.is_some() => " - |".into(),
                None => String::new(),
            };
            md.push_str(&format!(
                "| {hl}{}{hl} | {} | {} | {} | {} | {} | {hl}{}{hl} |{noise}\n",
                row.index,
                cos(m.cos_min),
                cos(m.cos_mean),
                max_abs_at(m),
                sci(m.rel_l2),
                if m.bitwise { "yes" } else { "no" },
                row.verdict.as_str()
            ));
        }
    }
    for n in &r.notes {
        md.push_str(&format!("\n- {n}"));
    }
    md.push_str(&format!("\n\n## Reproduce\n\n```\n{}\n```\n", r.command));
    md
}
