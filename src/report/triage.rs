//! Rendering of a [`TriageReport`]: the ranked variant table (terminal and Markdown).

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use crate::commands::triage::TriageReport;

/// Index of the "seconds" column in [`rows`] / [`header`].
const SECONDS_COLUMN: usize = 7;

fn rows(r: &TriageReport) -> Vec<Vec<String>> {
    r.variants
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let mut row = vec![
                (i + 1).to_string(),
                v.name.clone(),
                v.first_divergent
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "-".into()),
                format!("{:.6}", v.cos_min_at_taps),
                format!("{:.3}", v.tau_macro),
                format!("{:+.3}", v.delta_tau),
                format!("{:.3}", v.ddtree_tau_macro),
                format!("{:.2}", v.wall_s),
            ];
            if r.observed_tau.is_some() {
                row.push(match v.consistent_with_observed {
                    Some(true) => "yes".into(),
                    _ => "".into(),
                });
            }
            row.push(v.description.clone());
            row
        })
        .collect()
}

fn header(r: &TriageReport) -> Vec<String> {
    let mut h: Vec<String> = [
        "rank",
        "variant",
        "first divergent hs",
        "cos min at taps",
        "τ",
        "Δτ",
        "DDTree τ",
        "seconds",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(o) = r.observed_tau {
        h.push(format!("≈ observed {o}"));
    }
    h.push("what it emulates".into());
    h
}

/// Terminal rendering.
pub fn render(r: &TriageReport) -> String {
    let mut out = format!(
        "{}\n\nbaseline: {} ({}, {} Gated DeltaNet, taps {:?}): τ {:.3}, DDTree τ {:.3}\n",
        r.summary,
        r.baseline.path,
        r.baseline.dtype,
        r.baseline.gdn_form,
        r.baseline.taps,
        r.baseline.tau_macro,
        r.baseline.ddtree_tau_macro
    );
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED);
    t.set_header(header(r));
    for row in rows(r) {
        t.add_row(row);
    }
    out.push_str(&t.to_string());
    out.push_str(&format!(
        "\nwall time {:.1} s (tap variants reuse the baseline forward)\n",
        r.wall_time_s
    ));
    for n in &r.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// Markdown rendering (`report.md` of `triage`). Timings stay in the JSON and
/// on the terminal: the Markdown is meant to be stable for tickets.
/// Timings stay in the JSON and on the terminal, so the Markdown is stable.
pub fn markdown(r: &TriageReport) -> String {
    let mut md = format!(
        "{}\n\nBaseline: `{}` ({}, {} Gated DeltaNet, taps {:?}): τ {:.3}, DDTree τ {:.3}.\n\n",
        r.summary,
        r.baseline.path,
        r.baseline.dtype,
        r.baseline.gdn_form,
        r.baseline.taps,
        r.baseline.tau_macro,
        r.baseline.ddtree_tau_macro
    );
    let drop_seconds = |v: Vec<String>| -> Vec<String> {
        v.into_iter()
            .enumerate()
            .filter(|(i, _)| *i != SECONDS_COLUMN)
            .map(|(_, c)| c)
            .collect()
    };
    let h = drop_seconds(header(r));
    md.push_str(&format!(
        "| {} |\n|{}\n",
        h.join(" | "),
        "---|".repeat(h.len())
    ));
    for row in rows(r) {
        md.push_str(&format!("| {} |\n", drop_seconds(row).join(" | ")));
    }
    for n in &r.notes {
        md.push_str(&format!("\n- {n}"));
    }
    md.push_str(&format!("\n\n## Reproduce\n\n```\n{}\n```\n", r.command));
    md
}
