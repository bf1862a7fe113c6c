//! The verbs of the CLI as library functions: options in, a result value out.
//! `main.rs` only parses arguments, calls these and prints.

pub mod compare;
pub mod diff;
pub mod drafter;
pub mod dump;
pub mod inventory;
pub mod triage;

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::checkpoint::Checkpoint;
use crate::device::DeviceSpec;
use crate::error::{Error, Result};
use crate::loading::{self, LoadingPath, ResolvedPath};
use crate::models::precision::Precision;
use crate::models::qwen3_5::TextModelSpec;
use crate::models::WeightSource;
use crate::prompts::{self, Prompt, PromptLimits, PromptOptions};

/// A checkpoint opened with its loading paths resolved and prompts tokenised:
/// what `compare`, `dump`, `drafter` and `triage` share.
pub struct Session {
    /// The checkpoint (headers read, weights mapped lazily).
    pub ckpt: Checkpoint,
    /// Resolved paths, in the order asked.
    pub paths: Vec<ResolvedPath>,
    /// Model geometry (from the first path's text config).
    pub spec: TextModelSpec,
    /// Prompts as run.
    pub prompts: Vec<Prompt>,
    /// The device every path computes on (`--device`).
    pub device: DeviceSpec,
}

impl Session {
    /// Opens `checkpoint`, resolves `paths` (seeding missing-tensor init with
    /// `seed`) and the prompt set, computing on `device`.
    ///
    /// Errors: anything [`Checkpoint::open`], [`loading::resolve`],
    /// [`prompts::resolve`] or [`DeviceSpec::open`] return.
    pub fn open(
        checkpoint: &str,
        paths: &[LoadingPath],
        prompt_opts: &PromptOptions,
        seed: u64,
        device: DeviceSpec,
    ) -> Result<Self> {
        let dev = device.open()?;
        let ckpt = Checkpoint::open(checkpoint)?;
        let paths = paths
            .iter()
            .map(|&p| {
                let mut r = loading::resolve(&ckpt, p)?;
                r.view = r.view.with_seed(seed).with_device(dev.clone());
                Ok(r)
            })
            .collect::<Result<Vec<_>>>()?;
        let first = paths
            .first()
            .ok_or_else(|| Error::Input("no loading path given".into()))?;
        let spec = TextModelSpec::new(&first.text_config)?.with_device(dev);
        let limits = PromptLimits {
            vocab_size: first.text_config.vocab_size,
            max_tokens: first.text_config.max_position_embeddings,
        };
        let prompts = prompts::resolve(prompt_opts, ckpt.tokenizer.as_deref(), limits)?;
        Ok(Self {
            ckpt,
            paths,
            spec,
            prompts,
            device,
        })
    }

    /// Token ids of every prompt.
    pub fn prompt_ids(&self) -> Vec<Vec<u32>> {
        self.prompts.iter().map(|p| p.ids.clone()).collect()
    }
}

/// What a loading path computes with, as a comparable key: its dtype and the
/// identity ([`WeightSource::identity`]) of every text-model tensor, plus
/// `lm_head.weight` from `head` when given. Two paths with equal keys give
/// bitwise-equal results (every kernel is deterministic), so one run serves both.
pub fn weights_key(
    spec: &TextModelSpec,
    src: &dyn WeightSource,
    head: Option<&dyn WeightSource>,
    prec: Precision,
) -> (Precision, Vec<String>) {
    let mut ids: Vec<String> = (0..spec.num_layers())
        .flat_map(|l| spec.layer_tensor_names(l))
        .chain(["embed_tokens.weight".to_string(), "norm.weight".to_string()])
        .map(|n| src.identity(&n))
        .collect();
    if let Some(h) = head {
        ids.push(h.identity("lm_head.weight"));
    }
    (prec, ids)
}

/// Parses `causal-lm,vlm`. Errors: unknown or repeated path name.
pub fn parse_paths(s: &str) -> Result<Vec<LoadingPath>> {
    let mut out: Vec<LoadingPath> = Vec::new();
    for name in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        let p: LoadingPath = name.parse()?;
        if out.contains(&p) {
            return Err(Error::Input(format!("--paths names {name} twice")));
        }
        out.push(p);
    }
    Ok(out)
}

/// First 16 hex chars of the sha256 of `bytes`.
pub fn short_sha256(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// sha256 of a file (first 16 hex chars). Errors: unreadable file.
pub fn file_sha256(path: &Path) -> Result<String> {
    Ok(short_sha256(
        &std::fs::read(path).map_err(|e| Error::io(path, e))?,
    ))
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

/// `YYYYMMDD-HHMMSS` in UTC, for default report names.
pub fn utc_stamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}
