//! The short sha256 fingerprints a report records (of files, of the
//! prompts' token ids).

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::Result;
use crate::prompts::Prompt;

/// First 16 hex chars of the sha256 of `bytes`.
pub fn short_sha256(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// sha256 of a file (first 16 hex chars). Errors: unreadable file.
pub fn file_sha256(path: &Path) -> Result<String> {
    Ok(short_sha256(&crate::input::read(path)?))
}

/// sha256 over the prompts' ids (little-endian u32, a separator per prompt).
pub fn prompts_sha256(prompts: &[Prompt]) -> String {
    let mut bytes = Vec::new();
    for p in prompts {
        for id in &p.ids {
            bytes.extend_from_slice(&id.to_le_bytes());
        }
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    }
    short_sha256(&bytes)
}
