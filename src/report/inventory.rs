//! The `inventory` verb's report ([`InventoryReport`]: the envelope, with the
//! inventory's members beside it as `inventory --json` always printed them)
//! and the inventory
//! table (its terminal output, and the inventory section of `compare`'s
//! `report.md`). Renders only; all numbers come from
//! [`crate::loading::inventory()`].

use crate::width::Width;
use serde::Serialize;

use super::format::{group_digits, yes_no};
use super::tabular::{Cell, Column, Row, Sinks, Table};
use super::{Body, Environment, Kind, Report};
use crate::loading::{Inventory, PathInventory};
use crate::parity::Verdict;

/// The body of `inventory`'s report: the inventory, whose members the JSON
/// carries at the top level beside the envelope's (its `schema_version` is
/// the envelope's own), as `inventory --json` printed them before it had the
/// envelope.
#[derive(Debug, Clone)]
pub struct InventoryBody {
    /// What each loading path loads.
    pub inventory: Inventory,
}

impl Serialize for InventoryBody {
    /// The inventory's members in their order, less `schema_version` (the
    /// envelope's).
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        /// [`Inventory`]'s members after `schema_version`, borrowed (the
        /// unit test below checks they are all of them, in order).
        #[derive(Serialize)]
        struct Members<'a> {
            checkpoint: &'a String,
            source: &'a crate::checkpoint::resolve::ResolvedSource,
            model_type: &'a String,
            checkpoint_tensors: usize,
            checkpoint_params: u64,
            shards: usize,
            checkpoint_dtypes: &'a std::collections::BTreeMap<String, usize>,
            paths: &'a [PathInventory],
            not_applicable: &'a [String],
        }
        let i = &self.inventory;
        Members {
            checkpoint: &i.checkpoint,
            source: &i.source,
            model_type: &i.model_type,
            checkpoint_tensors: i.checkpoint_tensors,
            checkpoint_params: i.checkpoint_params,
            shards: i.shards,
            checkpoint_dtypes: &i.checkpoint_dtypes,
            paths: &i.paths,
            not_applicable: &i.not_applicable,
        }
        .serialize(s)
    }
}

/// `inventory`'s report.
pub type InventoryReport = Report<InventoryBody>;

/// The report of `inv`: a finding (exit 1) when a path has MISSING tensors
/// (randomly initialised where transformers loads it), which the summary
/// names path by path.
pub fn build(inv: Inventory, environment: Environment, command: String) -> InventoryReport {
    let missing: Vec<String> = inv
        .paths
        .iter()
        .filter(|p| p.missing > 0)
        .map(|p| {
            let first = p.missing_names.first().map(String::as_str).unwrap_or("?");
            let more = if p.missing > 1 { ", …" } else { "" };
            format!(
                "{} has {} MISSING tensor{} (randomly initialised: {first}{more})",
                p.name,
                p.missing,
                if p.missing == 1 { "" } else { "s" },
            )
        })
        .collect();
    let names: Vec<&str> = inv.paths.iter().map(|p| p.name.as_str()).collect();
    let (verdict, summary) = if missing.is_empty() {
        let what = format!("{} load every tensor they expect", names.join(", "));
        (Verdict::Pass, what)
    } else {
        (Verdict::Fail, missing.join("; "))
    };
    let body = InventoryBody { inventory: inv };
    Report::new(
        Kind::Inventory,
        verdict,
        &summary,
        environment,
        command,
        Vec::new(),
        body,
    )
}

impl Body for InventoryBody {
    fn terminal(report: &Report<Self>, width: Width) -> String {
        format!(
            "{}
",
            report.summary
        ) + &render_inventory_table(&report.body.inventory, width)
    }
}

/// One row per loading path: path, class and dtype (terminal), tensors,
/// consumed, renamed (Markdown), converted (checkpoint keys → parameters;
/// only when a path has an expert conversion), dropped by rule, unexpected,
/// missing, tied.
pub fn inventory_table(paths: &[PathInventory]) -> Table {
    let converted = paths.iter().any(|p| p.converted.is_some());
    let mut cols = vec![
        Column::new("path"),
        Column::new("class").only(Sinks::Terminal),
        Column::new("dtype (reason)").only(Sinks::Terminal),
        Column::new("tensors"),
        Column::new("consumed"),
        Column::new("renamed").only(Sinks::Markdown),
    ];
    if converted {
        cols.push(Column::new("converted (keys → params)"));
    }
    cols.extend([
        Column::new("dropped by rule"),
        Column::new("unexpected"),
        Column::new("missing"),
        Column::new("tied lm_head"),
    ]);
    let mut t = Table::new(cols);
    for p in paths {
        let mut cells: Vec<Cell> = vec![
            Cell::code(&p.name),
            format!("{}\n({})", p.class, p.auto_class).into(),
            format!("{}\n({})", p.dtype, p.dtype_reason).into(),
            p.tensors.to_string().into(),
            p.consumed.to_string().into(),
            p.renamed.to_string().into(),
        ];
        if converted {
            cells.push(
                p.converted
                    .as_ref()
                    .map(|c| c.cell())
                    .unwrap_or_else(|| "-".into())
                    .into(),
            );
        }
        cells.extend([
            p.dropped_by_rule.to_string().into(),
            p.unexpected.to_string().into(),
            p.missing.to_string().into(),
            yes_no(p.tied_lm_head).into(),
        ]);
        t.push(Row::new(cells));
    }
    t
}

/// How many missing / unexpected / dropped names are listed per path.
pub const NAMES_SHOWN: usize = 5;

/// Renders `inv` as: a header line (checkpoint, tensor count, shards), one
/// table row per loading path (path, class, dtype (reason), tensors,
/// consumed, dropped by rule, unexpected, missing, tied lm_head), then per
/// path its rules and the first [`NAMES_SHOWN`] unexpected / missing names.
pub fn render_inventory_table(inv: &Inventory, width: Width) -> String {
    let mut out = format!(
        "checkpoint {} ({}): {} tensors, {} parameters, {} shard{}\n",
        inv.checkpoint,
        inv.model_type,
        inv.checkpoint_tensors,
        group_digits(inv.checkpoint_params),
        inv.shards,
        if inv.shards == 1 { "" } else { "s" }
    );
    let table = inventory_table(&inv.paths).render(width);
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
        if let Some(c) = &p.converted {
            out.push_str(&format!("  {}\n", c.describe()));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `inventory --json` carries the inventory's JSON text as it was, less
    /// its `schema_version`: every member, in order, nested ones included.
    #[test]
    fn the_body_is_the_inventory_less_its_schema_version() {
        let ckpt = crate::checkpoint::Checkpoint::open(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/moe/per-expert"
        ))
        .unwrap();
        let inv = crate::loading::inventory(&ckpt, &[]).unwrap();
        let whole = serde_json::to_string(&inv).unwrap();
        let want = whole.replacen("\"schema_version\":1,", "", 1);
        assert_ne!(whole, want, "the inventory starts with its schema_version");
        let body = serde_json::to_string(&InventoryBody { inventory: inv }).unwrap();
        assert_eq!(body, want);
    }
}
