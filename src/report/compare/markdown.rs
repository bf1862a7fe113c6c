//! Markdown rendering for bug tickets (`reports/<name>/report.md`), for a
//! reader who has run nothing: the verdict sentence first, the plot
//! (`parity.svg`) and why each pair differs, then the environment, the
//! inventory diff, one per-layer table per pair (taps marked, the first
//! divergent row in bold, folded in `<details>` when long, with its key rows
//! shown above the fold), the drafter's τ table, notes and the command that
//! reproduces the run.

use super::{
    dropped_by_rule, hidden_state_label, incremental_table, pair_row, pair_table, CompareReport,
};
use crate::parity::{HiddenStateRow, PairReport};
use crate::report::format::{cos, gib, max_abs_at, sci, yes_no};
use crate::report::tabular::{md_cell, Cell, Column, Row, Table};

/// Rows above which the per-layer table is folded in `<details>`.
pub const FOLD_ROWS: usize = 24;

/// Names listed per inventory category (the rest are counted).
pub const NAMES_SHOWN: usize = 5;

/// The plot `report.md` links (written next to it).
pub const PLOT_FILE: &str = "parity.svg";

fn names_line(names: &[&String]) -> String {
    let shown: Vec<String> = names
        .iter()
        .take(NAMES_SHOWN)
        .map(|n| format!("`{n}`"))
        .collect();
    let more = names.len().saturating_sub(NAMES_SHOWN);
    format!(
        "{}{}",
        shown.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )
}

/// The Markdown document: summary, plot, causes, environment, inventory,
/// one section per pair, the incremental checks, the drafter, notes, the
/// command.
pub fn render(report: &CompareReport) -> String {
    let mut md = format!("{}\n\n", report.summary);
    md.push_str(&format!(
        "![per-layer parity: 1 − cos_min and rel L2 per hidden state, log scale]({PLOT_FILE})\n\n"
    ));
    md.push_str(&causes(report));
    md.push_str(&environment(report));
    md.push_str(&inventory(report));
    for pair in &report.pairs {
        md.push_str(&pair_section(report, pair));
    }
    if !report.incremental.is_empty() {
        md.push_str("\n## Prefill vs incremental\n\n");
        md.push_str(&incremental_table(&report.incremental).markdown());
    }
    if let Some(d) = &report.drafter {
        md.push_str(&crate::report::drafter::markdown(d));
    }
    md.push_str(&format!("\n{}.\n", report.tap_convention));
    if !report.notes.is_empty() {
        md.push_str("\n## Notes\n\n");
        for n in &report.notes {
            md.push_str(&format!("- {n}\n"));
        }
    }
    md.push_str(&format!("\n## Reproduce\n\n```\n{}\n```\n", report.command));
    md
}

/// "Loading differences, `a` vs `b`", per pair whose paths load differently.
fn causes(report: &CompareReport) -> String {
    let mut md = String::new();
    for pair in &report.pairs {
        let causes = report.causes(pair);
        if causes.is_empty() {
            continue;
        }
        md.push_str(&format!(
            "Loading differences, `{}` vs `{}`:\n\n",
            pair.a, pair.b
        ));
        for c in causes {
            md.push_str(&format!("- {c}\n"));
        }
        md.push('\n');
    }
    md
}

/// The environment table and the paths as run.
fn environment(report: &CompareReport) -> String {
    let e = &report.environment;
    let t = e.target.as_ref();
    let mut md = String::from("## Environment\n\n");
    md.push_str(&format!(
        "| | |\n|---|---|\n| hsparity | {} |\n| checkpoint | `{}`{} |\n| config.json sha256 | `{}` |\n| prompts | {} ({} tokens), sha256 `{}` |\n| device | {} ({} threads), peak RSS {} |\n| Gated DeltaNet form | {} |\n| drafter taps | {} |\n",
        e.hsparity_version,
        md_cell(t.map(|t| t.checkpoint.as_str()).unwrap_or("-")),
        t.and_then(|t| t.revision.as_ref()).map(|r| format!(" @ `{}`", md_cell(r))).unwrap_or_default(),
        t.map(|t| t.config_sha256.as_str()).unwrap_or("-"),
        report.prompts.len(),
        report.prompts.iter().map(|p| p.tokens.to_string()).collect::<Vec<_>>().join(", "),
        t.map(|t| t.prompts_sha256.as_str()).unwrap_or("-"),
        e.device,
        e.threads,
        e.peak_rss_bytes.map(gib).unwrap_or_else(|| "unknown".into()),
        e.gdn_form.map(|f| f.describe()).unwrap_or("-"),
        if report.taps.is_empty() {
            "none marked".to_string()
        } else {
            format!("{:?} (◆ in the tables)", report.taps)
        }
    ));
    if let Some(line) = e.rendering_line() {
        md.push_str(&format!("| prompt rendering | {} |\n", md_cell(&line)));
    }
    md.push('\n');
    let mut paths = Table::new(vec![
        Column::new("path"),
        Column::new("class"),
        Column::new("dtype (reason)"),
        Column::new("computed in"),
        Column::new("lm_head"),
    ]);
    for p in &report.paths {
        paths.push(Row::new(vec![
            Cell::code(p.name.name()),
            Cell::code(&p.class),
            format!("{} ({})", p.dtype, p.dtype_reason).into(),
            p.compute_dtype.name().into(),
            p.lm_head.to_string().into(),
        ]));
    }
    md.push_str(&paths.markdown());
    md
}

/// The inventory table and, per path, its rules and what they drop, the
/// unexpected and missing names, notes.
fn inventory(report: &CompareReport) -> String {
    let mut md = format!(
        "\n## Inventory\n\nCheckpoint: {} tensors in {} shard(s).\n\n{}\n",
        report.inventory.checkpoint_tensors,
        report.inventory.shards,
        crate::report::inventory::inventory_table(&report.inventory.paths).markdown()
    );
    for p in &report.inventory.paths {
        md.push_str(&format!("- `{}` (`{}`):\n", p.name, p.class));
        for rule in &p.rules {
            match dropped_by_rule(rule, &p.dropped_names) {
                Some(hit) if !hit.is_empty() => md.push_str(&format!(
                    "  - rule `{rule}`: drops {}: {}\n",
                    hit.len(),
                    names_line(&hit)
                )),
                Some(_) => md.push_str(&format!("  - rule `{rule}`: drops nothing\n")),
                None => md.push_str(&format!("  - rule `{rule}`\n")),
            }
        }
        if let Some(c) = &p.converted {
            md.push_str(&format!("  - {}\n", c.describe()));
        }
        for (label, names) in [
            ("unexpected (dropped, reported)", &p.unexpected_names),
            ("missing (newly initialised)", &p.missing_names),
        ] {
            if !names.is_empty() {
                let names: Vec<&String> = names.iter().collect();
                md.push_str(&format!(
                    "  - {label}: {}: {}\n",
                    names.len(),
                    names_line(&names)
                ));
            }
        }
        for n in &p.notes {
            md.push_str(&format!("  - note: {n}\n"));
        }
    }
    md
}

/// One pair: tolerance, first divergence, the per-layer table (folded with
/// its key rows above the fold when long), the logits.
fn pair_section(report: &CompareReport, pair: &PairReport) -> String {
    let mut md = format!(
        "\n## `{}` vs `{}` (computed in {} vs {})\n\n",
        pair.a, pair.b, pair.dtype_a, pair.dtype_b
    );
    let t = &pair.tolerance;
    md.push_str(&format!(
        "Tolerance: pass when bitwise or cos_min ≥ {} and rel L2 ≤ {:.0e}; warn down to cos_min {} / rel L2 {:.0e}.\n\n",
        t.pass_cos, t.pass_rel_l2, t.warn_cos, t.warn_rel_l2
    ));
    let first = pair
        .first_divergent
        .and_then(|i| pair.hidden_states.iter().find(|r| r.index == i));
    md.push_str(&match (first, pair.first_non_bitwise) {
        (Some(r), _) => format!(
            "First divergent hidden state: **hidden_states[{}]** ({}), {}{}.\n\n",
            r.index,
            hidden_state_label(r.index, r.layer_type),
            r.verdict.as_str(),
            r.needed_to_pass
                .as_ref()
                .map(|_| format!("; it {}", super::terminal::pass_sentence(r)))
                .unwrap_or_default()
        ),
        (None, Some(i)) => format!(
            "No divergent hidden state (within tolerance; not bitwise from hidden_states[{i}]).\n\n"
        ),
        (None, None) => "No divergent hidden state: bitwise identical throughout.\n\n".into(),
    });
    let rows = pair_table(report, pair).markdown();
    if pair.hidden_states.len() > FOLD_ROWS {
        // Key rows above the fold: the first divergent one, the taps, the last.
        let last = pair.hidden_states.last().map(|r| r.index);
        let key: Vec<&HiddenStateRow> = pair
            .hidden_states
            .iter()
            .filter(|r| {
                Some(r.index) == pair.first_divergent
                    || report.is_tap(r.index)
                    || Some(r.index) == last
            })
            .collect();
        md.push_str("Key rows (first divergent, taps, last):\n\n");
        let mut key_table = pair_table(report, pair);
        key_table.rows = key.iter().map(|r| pair_row(report, pair, r)).collect();
        md.push_str(&key_table.markdown());
        md.push_str(&format!(
            "\n<details><summary>All {} hidden states</summary>\n\n{rows}\n</details>\n",
            pair.hidden_states.len()
        ));
    } else {
        md.push_str(&rows);
    }
    if let Some(l) = crate::report::format::noise_floor_line(pair) {
        md.push_str(&format!("\n{l}\n"));
    }
    for r in super::router_summary(pair) {
        md.push_str(&format!("\n{}.\n", r.trim_end_matches('.')));
    }
    md.push_str(&crate::report::localisation::markdown(pair).unwrap_or_default());
    if let Some(l) = &pair.logits {
        md.push_str(&format!(
            "\nLogits: cos min {}, max abs diff {}, rel L2 {}, bitwise {}, argmax agreement {:.4}{}.\n",
            cos(l.cos_min),
            max_abs_at(l),
            sci(l.rel_l2),
            yes_no(l.bitwise),
            pair.argmax_agreement.unwrap_or(f64::NAN),
            pair.logits_verdict
                .map(|v| format!(" ({})", v.as_str()))
                .unwrap_or_default()
        ));
    }
    md
}
