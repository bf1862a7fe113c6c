//! Terminal rendering of `compare`'s report: the verdict sentence, the
//! paths, then one table per pair with a row per `hidden_states` index, the
//! prefill-vs-incremental checks and the drafter's τ table.

use super::{incremental_table, pair_table, router_summary, CompareReport};
use crate::report::format::{cos, gib, max_abs_at, noise_floor_line, sci, yes_no};
use crate::width::Width;

/// The whole terminal report.
pub fn render(report: &CompareReport, width: Width) -> String {
    let mut out = String::new();
    out.push_str(&report.summary);
    out.push_str("\n\n");
    for p in &report.paths {
        out.push_str(&format!(
            "  {:<20} {:<34} dtype {} ({}), computed in {}; lm_head: {}{}\n",
            p.name,
            p.class,
            p.dtype,
            p.dtype_reason,
            p.compute_dtype,
            p.lm_head,
            if p.missing > 0 {
                format!(
                    ", {} MISSING (random init)",
                    crate::text::counted(p.missing, "tensor", None)
                )
            } else {
                String::new()
            }
        ));
    }
    out.push_str(&inventory_lines(report));
    let toks: Vec<String> = report
        .prompts
        .iter()
        .map(|p| p.tokens.to_string())
        .collect();
    out.push_str(&format!(
        "  prompts: {} ({} tokens); delta rule: {}\n",
        report.prompts.len(),
        toks.join(", "),
        report
            .environment
            .gdn_form
            .map(|f| f.describe())
            .unwrap_or("-")
    ));
    if let Some(line) = report.environment.rendering_line() {
        out.push_str(&format!("  prompts rendered with: {line}\n"));
    }
    for pair in &report.pairs {
        out.push_str(&format!(
            "\n{a} vs {b} (rel L2 = ‖{a} − {b}‖/‖{b}‖; local = {b}'s layer fed {a}'s input; max abs diff @p1 t42 f3 = at prompt 1, token 42, feature 3)\n",
            a = pair.a,
            b = pair.b
        ));
        out.push_str(&pair_table(report, pair).render(width));
        out.push('\n');
        if let Some(l) = noise_floor_line(pair) {
            out.push_str(&format!("{}\n", crate::width::fill(&l, width)));
        }
        for r in router_summary(pair) {
            out.push_str(&format!("{}\n", crate::width::fill(&r, width)));
        }
        if let Some(l) = &pair.logits {
            out.push_str(&format!(
                "logits: cos min {}, max abs diff {}, rel L2 {}, bitwise {}, argmax agreement {:.4}\n",
                cos(l.cos_min),
                max_abs_at(l),
                sci(l.rel_l2),
                yes_no(l.bitwise),
                pair.argmax_agreement.unwrap_or(f64::NAN)
            ));
        }
        if !pair.logits_random_init.is_empty() {
            out.push_str(&format!(
                "logits of {} come from a randomly initialised lm_head (MISSING in the checkpoint)\n",
                pair.logits_random_init.join(", ")
            ));
        }
        out.push_str(&would_pass(pair));
        let causes = report.causes(pair);
        if !causes.is_empty() {
            out.push_str(&format!("loading differences, {} vs {}:\n", pair.a, pair.b));
            for c in causes {
                out.push_str(&format!("  - {c}\n"));
            }
        }
    }
    if !report.taps.is_empty() {
        out.push_str(&format!(
            "\n◆ drafter taps {:?}: {}\n",
            report.taps, report.tap_convention
        ));
    }
    for n in &report.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    if !report.incremental.is_empty() {
        out.push_str("prefill vs incremental (a prefill, then cached single-token steps, against the full forward):\n");
        out.push_str(&incremental_table(&report.incremental).render(width));
        out.push('\n');
    }
    if let Some(d) = &report.drafter {
        out.push('\n');
        out.push_str(&crate::report::drafter::render(d, width));
    }
    if let Some(b) = report.environment.peak_rss_bytes {
        out.push_str(&format!("peak RSS {}\n", gib(b)));
    }
    out
}

/// One line per path: tensors = consumed + missing, converted, dropped, unexpected.
fn inventory_lines(report: &CompareReport) -> String {
    let mut out = String::new();
    for p in &report.inventory.paths {
        out.push_str(&format!(
            "  {:<20} inventory: {} tensors = {} consumed{} + {} missing; {}{} dropped by rule, {} unexpected{}\n",
            p.name,
            p.tensors,
            p.consumed,
            if p.tied_lm_head {
                " (lm_head.weight tied: it reads the embedding's key)"
            } else {
                ""
            },
            p.missing,
            p.converted
                .as_ref()
                .map(|c| format!("converted {} keys → {} params; ", c.checkpoint_keys, c.parameters))
                .unwrap_or_default(),
            p.dropped_by_rule,
            p.unexpected,
            if p.unexpected_names.is_empty() {
                String::new()
            } else {
                format!(" ({})", p.unexpected_names.iter().take(3).cloned().collect::<Vec<_>>().join(", "))
            }
        ));
    }
    out
}

/// What each row that does not pass would need, in index order (every
/// WARN and FAIL row: the verdict column marks them, this says by how much).
fn would_pass(pair: &crate::parity::PairReport) -> String {
    let mut out = String::new();
    for r in pair
        .hidden_states
        .iter()
        .filter(|r| r.needed_to_pass.is_some())
    {
        out.push_str(&format!(
            "hidden_states[{}] ({}) {}\n",
            r.index,
            r.verdict.label(),
            pass_sentence(r)
        ));
    }
    out
}

/// Why a row does not pass, as a plain sentence where no tolerance would
/// help (randomly initialised weights, NaN/Inf values), else the tolerance
/// that would have passed it.
pub fn pass_sentence(r: &crate::parity::HiddenStateRow) -> String {
    let m = &r.metrics;
    if !r.random_init.is_empty() {
        format!(
            "reads randomly initialised weights on {}: no tolerance makes them agree",
            r.random_init.join(", ")
        )
    } else if m.nan_count + m.inf_count > 0 {
        format!(
            "holds {} NaN and {} Inf values: no tolerance makes it pass",
            m.nan_count, m.inf_count
        )
    } else {
        format!(
            "would pass with {}",
            r.needed_to_pass.as_deref().unwrap_or("")
        )
    }
}
