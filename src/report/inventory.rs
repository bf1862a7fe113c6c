//! Terminal rendering of an [`Inventory`] (comfy-table). Renders only; all
//! numbers come from [`crate::loading::inventory()`].

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};

use crate::loading::Inventory;

/// How many missing / unexpected / dropped names are listed per path.
pub const NAMES_SHOWN: usize = 5;

/// Renders `inv` as: a header line (checkpoint, tensor count, shards), one
/// table row per loading path (path, class, dtype (reason), tensors,
/// consumed, dropped by rule, unexpected, missing, tied lm_head), then per
/// path its rules and the first [`NAMES_SHOWN`] unexpected / missing names.
pub fn render_inventory_table(inv: &Inventory) -> String {
    let mut out = format!(
        "checkpoint {} ({}): {} tensors, {} parameters, {} shard{}\n",
        inv.checkpoint,
        inv.model_type,
        inv.checkpoint_tensors,
        group_digits(inv.checkpoint_params),
        inv.shards,
        if inv.shards == 1 { "" } else { "s" }
    );
    let mut table = Table::new();
    table.load_style(UTF8_FULL_CONDENSED);
    table.set_header(vec![
        "path",
        "class",
        "dtype (reason)",
        "tensors",
        "consumed",
        "dropped by rule",
        "unexpected",
        "missing",
        "tied lm_head",
    ]);
    for p in &inv.paths {
        table.add_row(vec![
            p.name.clone(),
            format!("{}\n({})", p.class, p.auto_class),
            format!("{}\n({})", p.dtype, p.dtype_reason),
            p.tensors.to_string(),
            p.consumed.to_string(),
            p.dropped_by_rule.to_string(),
            p.unexpected.to_string(),
            p.missing.to_string(),
            if p.tied_lm_head { "yes" } else { "no" }.to_string(),
        ]);
    }
    out.push_str(&table.to_string());
    out.push('\n');
    for n in &inv.not_applicable {
        out.push_str(&format!("not applicable: {n}\n"));
    }
    for p in &inv.paths {
        out.push_str(&format!(
            "\n{} ({} parameters): {}\n",
            p.name,
            group_digits(p.params),
            p.rules.join("; ")
        ));
        let list = |label: &str, names: &[String], out: &mut String| {
            if names.is_empty() {
                return;
            }
            let shown: Vec<&str> = names.iter().take(NAMES_SHOWN).map(String::as_str).collect();
            let more = names.len().saturating_sub(NAMES_SHOWN);
            out.push_str(&format!(
                "  {label} ({}): {}{}\n",
                names.len(),
                shown.join(", "),
                if more > 0 {
                    format!(", … {more} more")
                } else {
                    String::new()
                }
            ));
        };
        list("UNEXPECTED", &p.unexpected_names, &mut out);
        let missing: Vec<String> = p
            .missing_names
            .iter()
            .map(|n| match p.missing_init.get(n) {
                Some(init) => format!("{n} [{init}]"),
                None => n.clone(),
            })
            .collect();
        list("MISSING (newly initialised)", &missing, &mut out);
        for n in &p.notes {
            out.push_str(&format!("  note: {n}\n"));
        }
    }
    out
}

fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::group_digits;

    #[test]
    fn digits() {
        assert_eq!(group_digits(27781427952), "27,781,427,952");
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
    }
}
