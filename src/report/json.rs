//! JSON rendering (`--json`, `report.json`): the [`Report`] serialised as is.

use super::Report;
use crate::error::{Error, Result};

/// Pretty JSON of `report`, newline-terminated.
pub fn render(report: &Report) -> Result<String> {
    serde_json::to_string_pretty(report)
        .map(|s| s + "\n")
        .map_err(|e| Error::Format(format!("serialising report: {e}")))
}
