//! `hsparity diff A.safetensors B.safetensors`: parity between two dumps
//! captured anywhere (hsparity, `tools/dump_hidden_states.py` on a training
//! machine, another runtime), with the same metrics and verdicts as `compare`.

use std::path::{Path, PathBuf};

use crate::dump::Dump;
use crate::error::Result;
use crate::parity::dumps::compare_dumps;
use crate::report::DiffReport;

/// Options of `diff`.
#[derive(Debug, Clone)]
pub struct DiffOptions {
    /// Reference dump.
    pub a: PathBuf,
    /// Compared dump.
    pub b: PathBuf,
    /// b's index = a's index + `tap_offset` (the other tap convention: ±1).
    pub tap_offset: i64,
    /// The command line, for the report.
    pub command_line: String,
}

/// Reads both dumps and compares them. Errors: unreadable or malformed dump,
/// different prompts (input-equality gate), a tap offset with no overlap.
pub fn run(opts: &DiffOptions) -> Result<DiffReport> {
    let (a, b) = (opts.a.as_path(), opts.b.as_path());
    let da = Dump::read(a)?;
    let db = Dump::read(b)?;
    let name = |p: &Path, d: &Dump| {
        d.metadata
            .get("loading_path")
            .map(|lp| format!("{} ({lp})", p.display()))
            .unwrap_or_else(|| p.display().to_string())
    };
    let (na, nb) = (name(a, &da), name(b, &db));
    let c = compare_dumps(&da, &db, &na, &nb, opts.tap_offset)?;
    Ok(crate::report::diff::build(
        c,
        (&na, &nb),
        vec![da.metadata, db.metadata],
        opts.command_line.clone(),
    ))
}
