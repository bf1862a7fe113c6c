//! `hsparity diff A.safetensors B.safetensors`: parity between two dumps
//! captured anywhere (hsparity, `tools/dump_hidden_states.py` on a training
//! machine, another runtime), with the same metrics and verdicts as `compare`.

use std::path::Path;

use serde::Serialize;

use crate::dump::Dump;
use crate::error::Result;
use crate::parity::dumps::{compare_dumps, DtypeNoiseRow};
use crate::parity::{PairReport, Verdict};

/// `diff --json`: the `compare` top-level shape (schema_version, verdict,
/// summary, exit_code, command, pairs, notes) plus the dumps' metadata.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename = "diff")]
pub struct DiffReport {
    pub schema_version: u32,
    pub verdict: Verdict,
    pub summary: String,
    pub exit_code: i32,
    pub command: String,
    /// `__metadata__` of dump a and dump b.
    pub dumps: Vec<std::collections::BTreeMap<String, String>>,
    /// One pair: a vs b.
    pub pairs: Vec<PairReport>,
    /// b's index = a's index + tap_offset.
    pub tap_offset: i64,
    /// When the dumps' dtypes differ: the lower one, and per row whether the
    /// difference is dtype noise.
    pub lower_dtype: Option<String>,
    pub dtype_noise: Vec<DtypeNoiseRow>,
    pub notes: Vec<String>,
}

/// Reads both dumps and compares them. Errors: unreadable or malformed dump,
/// different prompts (input-equality gate), a tap offset with no overlap.
pub fn run(a: &Path, b: &Path, tap_offset: i64, command: &str) -> Result<DiffReport> {
    let da = Dump::read(a)?;
    let db = Dump::read(b)?;
    let name = |p: &Path, d: &Dump| {
        d.metadata
            .get("loading_path")
            .map(|lp| format!("{} ({lp})", p.display()))
            .unwrap_or_else(|| p.display().to_string())
    };
    let (na, nb) = (name(a, &da), name(b, &db));
    let c = compare_dumps(&da, &db, &na, &nb, tap_offset)?;
    let verdict = c.pair.verdict();
    let noise_rows = c.dtype_noise.iter().filter(|r| r.dtype_noise).count();
    let mut summary = match (verdict, c.pair.first_non_bitwise, c.pair.first_divergent) {
        (Verdict::Pass, None, _) => format!(
            "PASS: {na} and {nb} agree bitwise at all {} hidden states",
            c.pair.hidden_states.len()
        ),
        (Verdict::Pass, Some(i), _) => format!(
            "PASS: {na} and {nb} agree within tolerance (not bitwise from hidden_states[{i}])"
        ),
        (_, _, Some(i)) => format!("FAIL: {na} and {nb} diverge from hidden_states[{i}]"),
        (_, _, None) => format!("FAIL: {na} and {nb} differ in the logits"),
    };
    if let Some(l) = &c.lower_dtype {
        summary.push_str(&format!(
            "; dtypes {} vs {}: {noise_rows} of {} hidden states differ only by {l} rounding (dtype noise)",
            c.pair.dtype_a,
            c.pair.dtype_b,
            c.dtype_noise.len()
        ));
    }
    if tap_offset != 0 {
        summary.push_str(&format!("; b shifted by tap offset {tap_offset:+}"));
    }
    let mut notes = Vec::new();
    if tap_offset != 0 {
        notes.push(format!(
            "rows compare a's hidden_states[i] with b's hidden_states[i{tap_offset:+}] (the other tap convention)"
        ));
    }
    Ok(DiffReport {
        schema_version: crate::report::SCHEMA_VERSION,
        verdict: if verdict == Verdict::Pass {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
        summary,
        exit_code: if verdict == Verdict::Pass { 0 } else { 1 },
        command: command.to_string(),
        dumps: vec![da.metadata, db.metadata],
        pairs: vec![c.pair],
        tap_offset,
        lower_dtype: c.lower_dtype,
        dtype_noise: c.dtype_noise,
        notes,
    })
}
