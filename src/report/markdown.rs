//! Markdown rendering for bug tickets (`reports/<name>/report.md`): verdict
//! sentence first, then environment, inventory, the per-layer table (folded
//! when long) and the command that reproduces the run.

use super::table::{cos, layer_label, max_abs_at, sci, type_label};
use super::Report;

/// Rows above which the per-layer table is folded in `<details>`.
pub const FOLD_ROWS: usize = 24;

/// The Markdown document.
pub fn render(report: &Report) -> String {
    let e = &report.environment;
    let mut md = format!("{}\n\n", report.summary);
    md.push_str("## Environment\n\n");
    md.push_str(&format!(
        "| | |\n|---|---|\n| hsparity | {} |\n| checkpoint | `{}`{} |\n| config.json sha256 | `{}` |\n| prompts | {} ({} tokens), sha256 `{}` |\n| device | {} ({} threads) |\n| Gated DeltaNet form | {} |\n\n",
        e.hsparity_version,
        e.checkpoint,
        e.revision.as_ref().map(|r| format!(" @ `{r}`")).unwrap_or_default(),
        e.config_sha256,
        report.prompts.len(),
        report.prompts.iter().map(|p| p.tokens.to_string()).collect::<Vec<_>>().join(", "),
        e.prompts_sha256,
        e.device,
        e.threads,
        e.gdn_form
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
        "Checkpoint: {} tensors in {} shard(s).\n\n| path | tensors | consumed | dropped by rule | unexpected | missing | tied lm_head |\n|---|---|---|---|---|---|---|\n",
        report.inventory.checkpoint_tensors, report.inventory.shards
    ));
    for p in &report.inventory.paths {
        md.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} |\n",
            p.name,
            p.tensors,
            p.consumed,
            p.dropped_by_rule,
            p.unexpected,
            p.missing,
            if p.tied_lm_head { "yes" } else { "no" }
        ));
    }
    md.push('\n');
    for p in &report.inventory.paths {
        md.push_str(&format!("- `{}`: {}\n", p.name, p.rules.join("; ")));
        for (label, names) in [
            ("unexpected", &p.unexpected_names),
            ("missing", &p.missing_names),
        ] {
            if !names.is_empty() {
                let shown: Vec<String> = names.iter().take(5).map(|n| format!("`{n}`")).collect();
                let more = names.len().saturating_sub(5);
                md.push_str(&format!(
                    "  - {label}: {}{}\n",
                    shown.join(", "),
                    if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    }
                ));
            }
        }
    }
    for pair in &report.pairs {
        md.push_str(&format!("\n## `{}` vs `{}`\n\n", pair.a, pair.b));
        match pair.first_divergent {
            Some(i) => md.push_str(&format!("First divergent hidden state: **{i}**.\n\n")),
            None => md.push_str("No divergent hidden state.\n\n"),
        }
        let mut rows = String::from(
            "| hs | layer | type | tap | cos min | cos mean | max abs diff | rel L2 | bitwise | local cos min | verdict |\n|---:|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for r in &pair.hidden_states {
            let m = &r.metrics;
            let hl = if pair.first_divergent == Some(r.index) {
                "**"
            } else {
                ""
            };
            rows.push_str(&format!(
                "| {hl}{}{hl} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {hl}{}{hl} |\n",
                r.index,
                layer_label(r),
                type_label(r),
                if report.is_tap(r.index) { "◆" } else { "" },
                cos(m.cos_min),
                cos(m.cos_mean),
                max_abs_at(m),
                sci(m.rel_l2),
                if m.bitwise { "yes" } else { "no" },
                r.local
                    .as_ref()
                    .map(|l| cos(l.cos_min))
                    .unwrap_or_else(|| "-".into()),
                r.verdict.as_str()
            ));
        }
        if pair.hidden_states.len() > FOLD_ROWS {
            md.push_str(&format!(
                "<details><summary>{} hidden states</summary>\n\n{rows}\n</details>\n",
                pair.hidden_states.len()
            ));
        } else {
            md.push_str(&rows);
        }
        if let Some(l) = &pair.logits {
            md.push_str(&format!(
                "\nLogits: cos min {}, max abs diff {}, rel L2 {}, bitwise {}, argmax agreement {:.4}.\n",
                cos(l.cos_min),
                max_abs_at(l),
                sci(l.rel_l2),
                if l.bitwise { "yes" } else { "no" },
                pair.argmax_agreement.unwrap_or(f64::NAN)
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
