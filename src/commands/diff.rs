//! `hsparity diff A.safetensors B.safetensors`: parity between two dumps
//! captured anywhere (hsparity, `tools/dump_hidden_states.py` on a training
//! machine, an engine's capture converted by `hsparity import`), with the
//! same metrics and verdicts as `compare`; `--align` finds, for every index
//! of B, the index of A it matches best.

use std::path::{Path, PathBuf};

use crate::dump::Dump;
use crate::error::Result;
use crate::parity::dumps::{compare_dumps, DiffSettings};
use crate::report::DiffReport;

/// Options of `diff`.
#[derive(Debug, Clone)]
pub struct DiffOptions {
    /// Reference dump.
    pub a: PathBuf,
    /// Compared dump.
    pub b: PathBuf,
    /// What to compare (tap offset, `--align`, b's last-state convention).
    pub settings: DiffSettings,
    /// The command line, for the report.
    pub command_line: String,
}

/// How a dump is named in the report: its path and what wrote it.
fn name(p: &Path, d: &Dump) -> String {
    match (
        d.metadata.get("loading_path"),
        d.metadata.get("source_format"),
    ) {
        (Some(lp), _) => format!("{} ({lp})", p.display()),
        (None, Some(engine)) => format!("{} ({engine})", p.display()),
        _ => p.display().to_string(),
    }
}

/// Reads both dumps and compares them. Errors: unreadable or malformed dump,
/// different prompts (input-equality gate), nothing in common to compare.
pub fn run(opts: &DiffOptions) -> Result<DiffReport> {
    let (a, b) = (opts.a.as_path(), opts.b.as_path());
    let da = Dump::read(a)?;
    let db = Dump::read(b)?;
    let (na, nb) = (name(a, &da), name(b, &db));
    let c = compare_dumps(&da, &db, &na, &nb, opts.settings)?;
    Ok(crate::report::diff::build(
        c,
        (&na, &nb),
        vec![da.metadata, db.metadata],
        opts.command_line.clone(),
    ))
}

/// Compares two checkpoints' tensors (`diff CKPT_A CKPT_B`): headers first,
/// then each common tensor streamed.
///
/// Errors: a checkpoint that cannot be resolved or whose headers are bad.
pub fn run_weights(
    a: &str,
    b: &str,
    command_line: String,
) -> Result<crate::report::weights::WeightsReport> {
    use crate::checkpoint::{compare, headers::HeaderIndex, resolve, weights::Weights};
    use std::sync::Arc;
    let open = |arg: &str| -> Result<(String, Weights)> {
        let src = resolve::resolve(arg)?;
        let index = Arc::new(HeaderIndex::read_dir(&src.dir)?);
        Ok((src.display, Weights::new(index)))
    };
    let ((na, wa), (nb, wb)) = (open(a)?, open(b)?);
    let geometry = architecture_differences(&resolve::resolve(a)?.dir, &resolve::resolve(b)?.dir);
    let c = compare::compare(&wa, &wb)?;
    Ok(crate::report::weights::build(
        c,
        (&na, &nb),
        [wa.index().len(), wb.index().len()],
        &geometry,
        command_line,
    ))
}

/// The config facts that make two checkpoints different models
/// (`hidden_size 32 vs 64`), read from each `config.json` (its
/// `text_config` where it has one); empty when they agree or a config is
/// absent or unreadable (the tensors then speak alone).
fn architecture_differences(a: &std::path::Path, b: &std::path::Path) -> Vec<String> {
    let read = |d: &std::path::Path| -> std::result::Result<serde_json::Value, String> {
        let p = d.join("config.json");
        let text = crate::input::read(&p)
            .map_err(|_| format!("{} has no readable config.json", d.display()))?;
        serde_json::from_slice(&text)
            .map_err(|e| format!("{}: config.json is not JSON ({e})", d.display()))
    };
    let (ca, cb) = match (read(a), read(b)) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => {
            return vec![format!("architectures not compared: {e}")];
        }
    };
    let field = |c: &serde_json::Value, f: &str| {
        c.get("text_config")
            .and_then(|t| t.get(f))
            .or_else(|| c.get(f))
            .cloned()
    };
    [
        "model_type",
        "hidden_size",
        "num_hidden_layers",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "layer_types",
    ]
    .iter()
    .filter_map(|f| {
        let (x, y) = (field(&ca, f)?, field(&cb, f)?);
        (x != y).then(|| match (x.as_array(), y.as_array()) {
            (Some(_), Some(_)) => format!("{f} differ"),
            _ => format!("{f} {x} vs {y}"),
        })
    })
    .collect()
}
