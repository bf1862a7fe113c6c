//! `import`'s report: what was read (file, format, the engine's convention),
//! where every stored layer was put in transformers' `hidden_states`, the
//! prompts, trimmed padding, and where the dump was written.

use crate::width::Width;
use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::tabular::{Cell, Column, Row, Table};
use super::{Body, Environment, Kind, Report};
use crate::import::{Format, Imported, LayerMapping, Trim};

/// `import`'s report: the envelope around [`ImportSummary`].
pub type ImportReport = Report<ImportSummary>;

/// One imported prompt.
#[derive(Debug, Clone, Serialize)]
pub struct ImportedPromptFacts {
    /// The file (or folder) it came from.
    pub source: String,
    /// Tokens (after trimming).
    pub tokens: usize,
    /// Whether the file gave a loss mask (a training record).
    pub loss_mask: bool,
}

/// The members `import`'s report adds to the envelope.
#[derive(Debug, Clone, Serialize)]
pub struct ImportSummary {
    /// The path given.
    pub source: String,
    /// The format read.
    pub format: Format,
    /// The engine's layer-index convention, in one sentence.
    pub convention: String,
    /// Stored layer → `hidden_states` index (or `last_layer_output`), in file order.
    pub layers: Vec<LayerMapping>,
    /// The `hidden_states` indices of the dump (a partial dump holds only these).
    pub hidden_states_indices: Vec<usize>,
    /// Prompts `p0, p1, …`.
    pub prompts: Vec<ImportedPromptFacts>,
    /// Hidden size H.
    pub hidden_size: usize,
    /// N, when known.
    pub num_layers: Option<usize>,
    /// The dtype the engine stored.
    pub stored_dtype: String,
    /// Trailing rows removed (SpecForge right-padding).
    pub trimmed: Vec<Trim>,
    /// The dump written (`--out`), if any.
    pub out: Option<String>,
    /// The dump's `__metadata__` (written or not).
    pub metadata: BTreeMap<String, String>,
}

/// The report of `imp`, written to `out` (when given).
pub fn build(imp: &Imported, out: Option<&Path>, command: String) -> ImportReport {
    let idx = imp.hidden_indices();
    let last = imp
        .indices()
        .contains(&crate::import::StateIndex::LastLayerOutput);
    let summary = format!(
        "{} ({}): {} prompt{}, hidden_states {:?}{}; {}",
        imp.path.display(),
        imp.format,
        imp.prompts.len(),
        if imp.prompts.len() == 1 { "" } else { "s" },
        idx,
        if last { " + last_layer_output" } else { "" },
        match out {
            Some(o) => format!("wrote {}", o.display()),
            None => "not written (pass --out FILE.safetensors)".into(),
        }
    );
    Report::ranking(
        Kind::Import,
        summary,
        Environment::host(),
        command,
        imp.notes.clone(),
        ImportSummary {
            source: imp.path.display().to_string(),
            format: imp.format,
            convention: imp.mapping.convention.clone(),
            layers: imp.mapping.layers.clone(),
            hidden_states_indices: idx,
            prompts: imp
                .prompts
                .iter()
                .map(|p| ImportedPromptFacts {
                    source: p.source.display().to_string(),
                    tokens: p.input_ids.len(),
                    loss_mask: p.loss_mask.is_some(),
                })
                .collect(),
            hidden_size: imp.hidden_size,
            num_layers: imp.num_layers,
            stored_dtype: imp.stored_dtype.clone(),
            trimmed: imp.trimmed.clone(),
            out: out.map(|o| o.display().to_string()),
            metadata: imp.metadata(),
        },
    )
}

/// The mapping table: stored as, the engine's id, the `hidden_states` index.
pub fn mapping_table(r: &ImportSummary) -> Table {
    let mut t = Table::new(vec![
        Column::new("stored as"),
        Column::new("engine id"),
        Column::new("transformers index").strong(),
    ]);
    for l in &r.layers {
        t.push(Row::new(vec![
            Cell::code(&l.stored_as),
            l.engine_id
                .map(|i| i.to_string())
                .unwrap_or_else(|| "-".into())
                .into(),
            l.index.to_string().into(),
        ]));
    }
    t
}

/// Terminal: summary, convention, mapping table, trims, notes.
pub fn render(r: &ImportReport, width: Width) -> String {
    let mut out = format!(
        "{}\nconvention: {}\n{}\n",
        r.summary,
        r.convention,
        mapping_table(r).render(width)
    );
    for t in &r.trimmed {
        out.push_str(&format!(
            "trimmed p{}: {} -> {} rows ({}; {})\n",
            t.prompt,
            t.rows_in_file,
            t.rows_kept,
            t.reason,
            t.source.display()
        ));
    }
    for n in &r.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

impl Body for ImportSummary {
    fn terminal(report: &Report<Self>, width: Width) -> String {
        render(report, width)
    }
}
