//! A run's opened target: the checkpoint with its loading paths resolved, the
//! prompts tokenised, and the device — what `compare`, `dump`, `drafter` and
//! `triage` start from.

use std::collections::{BTreeMap, HashSet};

use crate::checkpoint::Checkpoint;
use crate::device::DeviceSpec;
use crate::error::{Error, Result};
use crate::loading::{self, LoadingPath, NonFinite, ResolvedPath, WeightOrigin, WeightSource};
use crate::models::TextModelSpec;
use crate::precision::Precision;
use crate::prompts::{self, Prompt, PromptLimits, PromptOptions, Rendering};

/// What names the target of a run (the shared target flags): the
/// checkpoint, the prompts, the seed for tensors a loading path would
/// initialise randomly, and the compute device.
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// Checkpoint directory or Hub id `org/name[@rev]` in the local cache.
    pub checkpoint: String,
    /// Prompt options as given.
    pub prompts: PromptOptions,
    /// Seed for MISSING tensors (`--seed`).
    pub seed: u64,
    /// Compute device (`--device`).
    pub device: DeviceSpec,
    /// `--dtype`: every path computes in this dtype; `None` = each path in
    /// its own (what transformers would load it in). Resolved once, into
    /// each path's [`ResolvedPath::compute`], by [`Session::open`].
    pub dtype: Option<Precision>,
}

/// A checkpoint opened with its loading paths resolved and prompts tokenised.
pub struct Session {
    /// The checkpoint (headers read, weights mapped lazily).
    pub ckpt: Checkpoint,
    /// Resolved paths, in the order asked.
    pub paths: Vec<ResolvedPath>,
    /// Model geometry (from the first path's text config).
    pub spec: TextModelSpec,
    /// Prompts as run.
    pub prompts: Vec<Prompt>,
    /// How their text was made (chat template, thinking flag, system turn,
    /// prompt set).
    pub rendering: Rendering,
    /// The device every path computes on (`--device`).
    pub device: DeviceSpec,
}

impl Session {
    /// Opens `target`'s checkpoint, resolves `paths` (seeding missing-tensor
    /// init with its seed) and the prompt set, computing on its device.
    ///
    /// Errors: anything [`Checkpoint::open`], [`fn@loading::resolve`],
    /// [`prompts::resolve_in`] or [`DeviceSpec::open`] return; no path given.
    pub fn open(target: &Target, paths: &[LoadingPath]) -> Result<Self> {
        let dev = target.device.open()?;
        let ckpt = Checkpoint::open(&target.checkpoint)?;
        let paths = paths
            .iter()
            .map(|&p| {
                Ok(loading::resolve(&ckpt, p)?
                    .seeded(target.seed, &dev)
                    .computing_in(target.dtype))
            })
            .collect::<Result<Vec<_>>>()?;
        paths
            .iter()
            .try_for_each(|p| check_missing_backed(&ckpt, p))?;
        let first = paths
            .first()
            .ok_or_else(|| Error::Input("no loading path given".into()))?;
        let spec = TextModelSpec::new(&first.text_config)?.with_device(dev);
        let resolved = prompts::resolve_in(
            &target.prompts,
            Some(&ckpt.source.dir),
            ckpt.tokenizer.as_deref(),
            PromptLimits::of(&first.text_config),
        )?;
        Ok(Self {
            ckpt,
            paths,
            spec,
            prompts: resolved.prompts,
            rendering: resolved.rendering,
            device: target.device,
        })
    }

    /// Token ids of every prompt.
    pub fn prompt_ids(&self) -> Vec<Vec<u32>> {
        self.prompts.iter().map(|p| p.ids.clone()).collect()
    }

    /// Token count of every prompt.
    pub fn prompt_lens(&self) -> Vec<usize> {
        self.prompts.iter().map(|p| p.ids.len()).collect()
    }

    /// What each path's weights hold that makes its results a finding
    /// (exit 1) rather than parity, in path order: MISSING state-dict
    /// entries (from the inventory) and the checkpoint tensors it reads that
    /// hold NaN or ±Inf. NaN/Inf are counted as tensors are read (paths
    /// sharing a tensor read it once, so what any path saw is merged): call
    /// it after the run. Every verb that runs the model reports these the
    /// same way (`compare`, `dump`, `drafter`, `triage`).
    pub fn weight_findings(&self) -> Vec<WeightFindings> {
        let seen: BTreeMap<String, NonFinite> = self
            .paths
            .iter()
            .flat_map(|p| p.view.non_finite())
            .collect();
        self.paths
            .iter()
            .map(|p| {
                let reads: HashSet<&str> = p
                    .view
                    .names()
                    .iter()
                    .flat_map(|n| match p.view.origin(n) {
                        Some(WeightOrigin::Checkpoint { key } | WeightOrigin::Tied { key }) => {
                            vec![key.as_str()]
                        }
                        Some(WeightOrigin::Converted { param }) => {
                            param.sources.iter().map(String::as_str).collect()
                        }
                        _ => Vec::new(),
                    })
                    .collect();
                WeightFindings {
                    path: p.path.name().to_string(),
                    missing: p.inventory.missing_names.clone(),
                    non_finite: seen
                        .iter()
                        .filter(|(k, _)| reads.contains(k.as_str()))
                        .map(|(k, v)| (k.clone(), *v))
                        .collect(),
                }
            })
            .collect()
    }

    /// [`Self::weight_findings`] as one phrase per path that has any.
    pub fn findings(&self) -> Vec<String> {
        self.weight_findings()
            .iter()
            .filter_map(WeightFindings::describe)
            .collect()
    }

    /// MISSING findings of the loading paths this session did not open
    /// (header-only inventories), one phrase each with the inventory's
    /// cause and fix: `triage` runs the `causal-lm` baseline only, and a
    /// harness that loads the target through another path reads random
    /// weights. Paths that do not apply to the config are skipped.
    pub fn other_path_findings(&self) -> Vec<String> {
        LoadingPath::ALL
            .iter()
            .filter(|p| !self.paths.iter().any(|q| q.path == **p))
            .filter_map(|&p| loading::resolve(&self.ckpt, p).ok())
            .filter(|r| !r.inventory.missing_names.is_empty())
            .map(|r| {
                let n = r.inventory.missing_names.len();
                let why = r.inventory.notes.first().map(|n| format!(" — {n}")).unwrap_or_default();
                format!(
                    "{}: {n} MISSING tensor{}: a harness loading the target with {} reads random weights{why}",
                    r.path.name(),
                    if n == 1 { "" } else { "s" },
                    r.path.auto_class()
                )
            })
            .collect()
    }

    /// Resolves one more loading path on this session's checkpoint, seeded
    /// and placed like the others (triage's variants).
    ///
    /// Errors: as [`fn@loading::resolve`].
    pub fn resolve_extra(&self, path: LoadingPath, seed: u64) -> Result<ResolvedPath> {
        Ok(loading::resolve(&self.ckpt, path)?.seeded(seed, &self.spec.device))
    }
}

/// One path's weight findings ([`Session::weight_findings`]).
#[derive(Debug, Clone, Default)]
pub struct WeightFindings {
    /// The loading path.
    pub path: String,
    /// MISSING (randomly initialised) state-dict entries.
    pub missing: Vec<String>,
    /// Checkpoint tensors the path reads that hold NaN or ±Inf, by key.
    pub non_finite: BTreeMap<String, NonFinite>,
}

impl WeightFindings {
    /// One phrase (`causal-lm: 1 MISSING tensor (lm_head.weight), weight K
    /// holds 1 NaN and 1 Inf values`), `None` when there is nothing.
    pub fn describe(&self) -> Option<String> {
        let mut parts = Vec::new();
        if !self.missing.is_empty() {
            let shown: Vec<&str> = self.missing.iter().take(3).map(String::as_str).collect();
            parts.push(format!(
                "{} MISSING tensor{} (randomly initialised: {}{})",
                self.missing.len(),
                if self.missing.len() == 1 { "" } else { "s" },
                shown.join(", "),
                if self.missing.len() > 3 { ", …" } else { "" }
            ));
        }
        for (k, nf) in &self.non_finite {
            parts.push(format!(
                "weight {k} holds {} NaN and {} Inf values",
                nf.nan, nf.inf
            ));
        }
        (!parts.is_empty()).then(|| format!("{}: {}", self.path, parts.join(", ")))
    }
}

/// MISSING tensors of a path may take, in f32, this many times the
/// checkpoint's bytes on disk (plus [`MISSING_SLACK`]) before the run is
/// refused: a path missing its LM head or most of its layers is run (a
/// finding), one whose config sizes the missing part far beyond anything the
/// checkpoint holds is not this checkpoint's model.
pub const MISSING_FACTOR: u64 = 4;
/// See [`MISSING_FACTOR`].
pub const MISSING_SLACK: u64 = 256 << 20;

/// Refuses, before anything is initialised, a path whose MISSING tensors
/// would be generated larger than [`MISSING_FACTOR`] × the checkpoint's
/// bytes on disk + [`MISSING_SLACK`].
///
/// Errors ([`Error::Config`]): naming the path, the bytes and the largest tensor.
pub fn check_missing_backed(ckpt: &Checkpoint, p: &ResolvedPath) -> Result<()> {
    let disk: u64 = ckpt.headers.shards.iter().map(|s| s.file_len).sum();
    let limit = disk
        .saturating_mul(MISSING_FACTOR)
        .saturating_add(MISSING_SLACK);
    let mut total = 0u64;
    let mut largest: Option<(u64, &str, &[usize])> = None;
    for name in p.view.names() {
        if let Some(loading::WeightOrigin::Missing { shape, .. }) = p.view.origin(name) {
            let bytes = crate::checkpoint::headers::checked_numel(shape)
                .unwrap_or(u64::MAX)
                .saturating_mul(4);
            total = total.saturating_add(bytes);
            if largest.is_none_or(|(b, _, _)| bytes > b) {
                largest = Some((bytes, name, shape));
            }
        }
    }
    match largest {
        Some((_, name, shape)) if total > limit => Err(Error::Config(format!(
            "{}: on {}, the MISSING tensors would be initialised with {total} bytes (f32; largest {name} \
             {shape:?}), more than {MISSING_FACTOR} x the checkpoint's {disk} bytes on disk: the config's \
             sizes do not describe this checkpoint",
            ckpt.config_path.display(),
            p.path
        ))),
        _ => Ok(()),
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
