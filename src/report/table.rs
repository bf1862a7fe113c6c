//! Terminal rendering of a [`Report`] with comfy-table: the verdict sentence,
//! the paths, then one table per pair with a row per `hidden_states` index.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Attribute, Cell, CellAlignment, Color, Table};

use super::Report;
use crate::drafter_eval::DrafterReport;
use crate::parity::{HiddenStateRow, Metrics, PairReport, Verdict};

/// `1.234e-5` style, or `0` for exact zero.
pub fn sci(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.3e}")
    }
}

/// Cosine with enough digits to see f32 round-off (`0.99999994`).
pub fn cos(x: f64) -> String {
    format!("{x:.8}")
}

/// `max_abs @ p0 t12 f3`.
pub fn max_abs_at(m: &Metrics) -> String {
    match m.max_abs_at {
        Some(at) if m.max_abs > 0.0 => {
            format!(
                "{} @p{} t{} f{}",
                sci(m.max_abs),
                at.prompt,
                at.token,
                at.feature
            )
        }
        _ => sci(m.max_abs),
    }
}

/// `L3` for the output of decoder layer 3 (`hidden_states[4]`), `emb`, `norm`.
pub fn layer_label(row: &HiddenStateRow) -> String {
    match row.layer_type.as_str() {
        "embedding" => "emb".into(),
        "final_norm" => format!("L{} +norm", row.index - 1),
        _ => format!("L{}", row.index - 1),
    }
}

/// Layer type, plus the paths whose weights here are randomly initialised.
pub fn type_label(row: &HiddenStateRow) -> String {
    if row.random_init.is_empty() {
        row.layer_type.clone()
    } else {
        format!(
            "{} (RANDOM INIT on {})",
            row.layer_type,
            row.random_init.join(", ")
        )
    }
}

fn verdict_cell(v: Verdict) -> Cell {
    let c = Cell::new(v.as_str().to_uppercase());
    match v {
        Verdict::Pass => c.fg(Color::Green),
        Verdict::Warn => c.fg(Color::Yellow).add_attribute(Attribute::Bold),
        Verdict::Fail => c.fg(Color::Red).add_attribute(Attribute::Bold),
    }
}

fn pair_table(report: &Report, pair: &PairReport) -> Table {
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "hs",
        "layer",
        "type",
        "tap",
        "cos min",
        "cos mean",
        "max abs diff",
        "rel L2",
        "bitwise",
        "local cos min",
        "verdict",
    ]);
    for r in &pair.hidden_states {
        let m = &r.metrics;
        let first = pair.first_divergent == Some(r.index);
        let mut idx = Cell::new(r.index).set_alignment(CellAlignment::Right);
        if first {
            idx = idx.add_attribute(Attribute::Bold).fg(Color::Red);
        }
        t.add_row(vec![
            idx,
            Cell::new(layer_label(r)),
            Cell::new(type_label(r)),
            Cell::new(if report.is_tap(r.index) { "◆" } else { "" }),
            Cell::new(cos(m.cos_min)),
            Cell::new(cos(m.cos_mean)),
            Cell::new(max_abs_at(m)),
            Cell::new(sci(m.rel_l2)),
            Cell::new(if m.bitwise { "yes" } else { "no" }),
            Cell::new(
                r.local
                    .as_ref()
                    .map(|l| cos(l.cos_min))
                    .unwrap_or_else(|| "-".into()),
            ),
            verdict_cell(r.verdict),
        ]);
    }
    t
}

/// The whole terminal report.
pub fn render(report: &Report) -> String {
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
                format!(", {} MISSING tensors (random init)", p.missing)
            } else {
                String::new()
            }
        ));
    }
    for p in &report.inventory.paths {
        out.push_str(&format!(
            "  {:<20} inventory: {} tensors = {} consumed + {} missing; {} dropped by rule, {} unexpected{}\n",
            p.name,
            p.tensors,
            p.consumed,
            p.missing,
            p.dropped_by_rule,
            p.unexpected,
            if p.unexpected_names.is_empty() {
                String::new()
            } else {
                format!(" ({})", p.unexpected_names.iter().take(3).cloned().collect::<Vec<_>>().join(", "))
            }
        ));
    }
    let toks: Vec<String> = report
        .prompts
        .iter()
        .map(|p| p.tokens.to_string())
        .collect();
    out.push_str(&format!(
        "  prompts: {} ({} tokens); delta rule: {}\n",
        report.prompts.len(),
        toks.join(", "),
        report.environment.gdn_form
    ));
    for pair in &report.pairs {
        out.push_str(&format!(
            "\n{} vs {} (rel L2 = ‖a−b‖/‖b‖; local = {}'s layer fed {}'s input)\n",
            pair.a, pair.b, pair.b, pair.a
        ));
        out.push_str(&pair_table(report, pair).to_string());
        out.push('\n');
        if let Some(l) = &pair.logits {
            out.push_str(&format!(
                "logits: cos min {}, max abs diff {}, rel L2 {}, bitwise {}, argmax agreement {:.4}\n",
                cos(l.cos_min),
                max_abs_at(l),
                sci(l.rel_l2),
                if l.bitwise { "yes" } else { "no" },
                pair.argmax_agreement.unwrap_or(f64::NAN)
            ));
        }
        if !pair.logits_random_init.is_empty() {
            out.push_str(&format!(
                "logits of {} come from a randomly initialised lm_head (MISSING in the checkpoint)\n",
                pair.logits_random_init.join(", ")
            ));
        }
        for r in pair
            .hidden_states
            .iter()
            .filter(|r| r.needed_to_pass.is_some())
            .take(3)
        {
            out.push_str(&format!(
                "hidden_states[{}] would pass with {}\n",
                r.index,
                r.needed_to_pass.as_deref().unwrap_or("")
            ));
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
    for c in &report.incremental {
        out.push_str(&format!(
            "prefill vs incremental ({}: prefill {} + {} cached steps vs full forward): max abs diff {}, cos min {}, {}\n",
            c.path,
            c.prefill_tokens,
            c.steps,
            sci(c.metrics.max_abs),
            cos(c.metrics.cos_min),
            c.verdict.as_str().to_uppercase()
        ));
    }
    if let Some(d) = &report.drafter {
        out.push('\n');
        out.push_str(&render_drafter(d));
    }
    if let Some(b) = report.environment.peak_rss_bytes {
        out.push_str(&format!(
            "peak RSS {:.2} GiB\n",
            b as f64 / (1u64 << 30) as f64
        ));
    }
    out
}

/// The τ table of a drafter evaluation: one row per loading path, then the
/// cross runs.
pub fn render_drafter(d: &DrafterReport) -> String {
    let mut out = format!(
        "{}\ndrafter {}: taps {:?}, block size {}, mask token {}, computed in {}; {} new tokens per prompt\n",
        d.summary,
        d.drafter.source,
        d.drafter.target_layer_ids,
        d.drafter.block_size,
        d.drafter.mask_token_id,
        d.drafter.dtype,
        d.max_new_tokens
    );
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED);
    let budget = d.paths.first().map(|p| p.ddtree.budget).unwrap_or(0);
    t.set_header(vec![
        "path".to_string(),
        "dtype".into(),
        "τ (macro)".into(),
        "τ (pooled)".into(),
        format!("DDTree-{budget} τ"),
        "rounds".into(),
        "accept@1..".into(),
        "lm_head".into(),
    ]);
    for p in &d.paths {
        let rounds: usize = p
            .per_prompt
            .iter()
            .map(|x| x.acceptance_lengths.len())
            .sum();
        let acc: Vec<String> = p
            .summary
            .per_position_acceptance
            .iter()
            .map(|a| format!("{a:.2}"))
            .collect();
        t.add_row(vec![
            p.name.clone(),
            p.dtype.clone(),
            format!("{:.3}", p.summary.tau_macro),
            format!("{:.3}", p.summary.tau_pooled),
            format!("{:.3}", p.ddtree.tau_macro),
            rounds.to_string(),
            acc.join(" "),
            p.lm_head_from.clone(),
        ]);
    }
    for c in &d.cross {
        t.add_row(vec![
            format!("{} features on {} trajectory", c.features, c.trajectory),
            "-".into(),
            format!("{:.3}", c.tau_macro),
            format!("{:.3}", c.tau_pooled),
            format!("{:.3}", c.ddtree_tau_macro),
            "-".into(),
            "-".into(),
            "-".into(),
        ]);
    }
    out.push_str(&t.to_string());
    out.push_str(&format!("\nτ rule: {}\n", d.end_rule));
    for n in &d.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}
