//! The one JSON printer (`--json`, `report.json`): a report serialised as is,
//! pretty, newline-terminated.

use serde::Serialize;

use crate::error::{Error, Result};

/// Pretty JSON of `value`, newline-terminated.
///
/// Errors ([`Error::Format`]): a value serde cannot serialise.
pub fn render<T: Serialize + ?Sized>(value: &T) -> Result<String> {
    serde_json::to_string_pretty(value)
        .map(|s| s + "\n")
        .map_err(|e| Error::Format(format!("serialising report: {e}")))
}
