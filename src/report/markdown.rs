//! Markdown rendering for bug tickets (`reports/<name>/report.md`), for a
//! reader who has run nothing: the verdict sentence first, the plot
//! (`parity.svg`) and why each pair differs, then the environment, the
//! inventory diff, one per-layer table per pair (taps marked, the first
//! divergent row in bold, folded in `<details>` when long, with its key rows
//! shown above the fold), the drafter's τ table, notes and the command that
//! reproduces the run.

use super::table::{cos, layer_label, max_abs_at, sci, type_label};
use super::{dropped_by_rule, hidden_state_label, Report};
use crate::parity::{HiddenStateRow, PairReport};

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

const TABLE_HEAD: &str = "| hs | layer | type | tap | cos min | cos mean | max abs diff | rel L2 | bitwise | local cos min | verdict |\n|---:|---|---|---|---|---|---|---|---|---|---|\n";

fn table_row(report: &Report, pair: &PairReport, r: &HiddenStateRow) -> String {
    let m = &r.metrics;
    let first = pair.first_divergent == Some(r.index);
    let hl = if first { "**" } else { "" };
    format!(
        "| {hl}{}{hl} | {hl}{}{hl} | {} | {} | {} | {} | {} | {} | {} | {} | {hl}{}{}{hl} |\n",
        r.index,
        layer_label(r),
        type_label(r),
        if report.is_tap(r.index) {
            format!("◆ {}", r.index - 1)
        } else {
            String::new()
        },
        cos(m.cos_min),
        cos(m.cos_mean),
        max_abs_at(m),
        sci(m.rel_l2),
        if m.bitwise { "yes" } else { "no" },
        r.local
            .as_ref()
            .map(|l| cos(l.cos_min))
            .unwrap_or_else(|| "-".into()),
        r.verdict.as_str(),
        if first { " ← first divergent" } else { "" }
    )
}

/// The Markdown document.
pub fn render(report: &Report) -> String {
    let e = &report.environment;
    let mut md = format!("{}\n\n", report.summary);
    md.push_str(&format!(
        "![per-layer parity: 1 − cos_min and rel L2 per hidden state, log scale]({PLOT_FILE})\n\n"
    ));
    for pair in &report.pairs {
        let causes = report.causes(pair);
        if causes.is_empty() {
            continue;
        }
        md.push_str(&format!("Why `{}` and `{}` differ:\n\n", pair.a, pair.b));
        for c in causes {
            md.push_str(&format!("- {c}\n"));
        }
        md.push('\n');
    }
    md.push_str("## Environment\n\n");
    md.push_str(&format!(
        "| | |\n|---|---|\n| hsparity | {} |\n| checkpoint | `{}`{} |\n| config.json sha256 | `{}` |\n| prompts | {} ({} tokens), sha256 `{}` |\n| device | {} ({} threads), peak RSS {} |\n| Gated DeltaNet form | {} |\n| drafter taps | {} |\n\n",
        e.hsparity_version,
        e.checkpoint,
        e.revision.as_ref().map(|r| format!(" @ `{r}`")).unwrap_or_default(),
        e.config_sha256,
        report.prompts.len(),
        report.prompts.iter().map(|p| p.tokens.to_string()).collect::<Vec<_>>().join(", "),
        e.prompts_sha256,
        e.device,
        e.threads,
        e.peak_rss_bytes
            .map(|b| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_else(|| "unknown".into()),
        e.gdn_form,
        if report.taps.is_empty() {
            "none marked".to_string()
        } else {
            format!("{:?} (◆ in the tables)", report.taps)
        }
    ));
    md.push_str(
        "| path | class | dtype (reason) | computed in | lm_head |\n|---|---|---|---|---|\n",
    );
    for p in &report.paths {
        md.push_str(&format!(
            "| `{}` | `{}` | {} ({}) | {} | {} |\n",
            p.name, p.class, p.dtype, p.dtype_reason, p.compute_dtype, p.lm_head
        ));
    }
    md.push_str("\n## Inventory\n\n");
    md.push_str(&format!(
        "Checkpoint: {} tensors in {} shard(s).\n\n| path | tensors | consumed | renamed | dropped by rule | unexpected | missing | tied lm_head |\n|---|---|---|---|---|---|---|---|\n",
        report.inventory.checkpoint_tensors, report.inventory.shards
    ));
    for p in &report.inventory.paths {
        md.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} | {} |\n",
            p.name,
            p.tensors,
            p.consumed,
            p.renamed,
            p.dropped_by_rule,
            p.unexpected,
            p.missing,
            if p.tied_lm_head { "yes" } else { "no" }
        ));
    }
    md.push('\n');
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
    for pair in &report.pairs {
        md.push_str(&format!(
            "\n## `{}` vs `{}` (computed in {} vs {})\n\n",
            pair.a, pair.b, pair.dtype_a, pair.dtype_b
        ));
        let t = &pair.tolerance;
        md.push_str(&format!(
            "Tolerance: pass when bitwise or cos_min ≥ {} and rel L2 ≤ {:.0e}; warn down to cos_min {} / rel L2 {:.0e}.\n\n",
            t.pass_cos, t.pass_rel_l2, t.warn_cos, t.warn_rel_l2
        ));
        let first = pair
            .first_divergent
            .and_then(|i| pair.hidden_states.iter().find(|r| r.index == i));
        match first {
            Some(r) => md.push_str(&format!(
                "First divergent hidden state: **hidden_states[{}]** ({}), {}{}.\n\n",
                r.index,
                hidden_state_label(r.index, &r.layer_type),
                r.verdict.as_str(),
                r.needed_to_pass
                    .as_ref()
                    .map(|n| format!("; it would pass with {n}"))
                    .unwrap_or_default()
            )),
            None => match pair.first_non_bitwise {
                Some(i) => md.push_str(&format!(
                    "No divergent hidden state (within tolerance; not bitwise from hidden_states[{i}]).\n\n"
                )),
                None => md.push_str("No divergent hidden state: bitwise identical throughout.\n\n"),
            },
        }
        let mut rows = String::from(TABLE_HEAD);
        for r in &pair.hidden_states {
            rows.push_str(&table_row(report, pair, r));
        }
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
            md.push_str(TABLE_HEAD);
            for r in key {
                md.push_str(&table_row(report, pair, r));
            }
            md.push_str(&format!(
                "\n<details><summary>All {} hidden states</summary>\n\n{rows}\n</details>\n",
                pair.hidden_states.len()
            ));
        } else {
            md.push_str(&rows);
        }
        if let Some(l) = &pair.logits {
            md.push_str(&format!(
                "\nLogits: cos min {}, max abs diff {}, rel L2 {}, bitwise {}, argmax agreement {:.4}{}.\n",
                cos(l.cos_min),
                max_abs_at(l),
                sci(l.rel_l2),
                if l.bitwise { "yes" } else { "no" },
                pair.argmax_agreement.unwrap_or(f64::NAN),
                pair.logits_verdict
                    .map(|v| format!(" ({})", v.as_str()))
                    .unwrap_or_default()
            ));
        }
    }
    if !report.incremental.is_empty() {
        md.push_str("\n## Prefill vs incremental\n\n| path | prefill + steps | max abs diff | cos min | verdict |\n|---|---|---|---|---|\n");
        for c in &report.incremental {
            md.push_str(&format!(
                "| `{}` | {} + {} | {} | {} | {} |\n",
                c.path,
                c.prefill_tokens,
                c.steps,
                sci(c.metrics.max_abs),
                cos(c.metrics.cos_min),
                c.verdict.as_str()
            ));
        }
    }
    if let Some(d) = &report.drafter {
        md.push_str(&render_drafter(d));
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

/// The drafter section: τ per loading path side by side, cross runs.
pub fn render_drafter(d: &crate::drafter_eval::DrafterReport) -> String {
    let budget = d.paths.first().map(|p| p.ddtree.budget).unwrap_or(0);
    let mut md = format!(
        "\n## Drafter τ\n\n{}\n\nDrafter `{}`: taps {:?}, block size {}, mask token {}, computed in {}; {} new tokens per prompt.\n\n| path | dtype | τ (macro) | τ (pooled) | DDTree-{budget} τ | lm_head |\n|---|---|---|---|---|---|\n",
        d.summary,
        d.drafter.source,
        d.drafter.target_layer_ids,
        d.drafter.block_size,
        d.drafter.mask_token_id,
        d.drafter.dtype,
        d.max_new_tokens
    );
    for p in &d.paths {
        md.push_str(&format!(
            "| `{}` | {} | {:.3} | {:.3} | {:.3} | {} |\n",
            p.name,
            p.dtype,
            p.summary.tau_macro,
            p.summary.tau_pooled,
            p.ddtree.tau_macro,
            p.lm_head_from
        ));
    }
    for c in &d.cross {
        md.push_str(&format!(
            "| `{}` features on `{}` trajectory | - | {:.3} | {:.3} | {:.3} | - |\n",
            c.features, c.trajectory, c.tau_macro, c.tau_pooled, c.ddtree_tau_macro
        ));
    }
    md.push_str(&format!("\nτ rule: {}.\n", d.end_rule));
    md
}
