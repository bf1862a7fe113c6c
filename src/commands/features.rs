//! `hsparity drafter <CKPT> --drafter D --features FILE`: τ on the taps a
//! file holds (an hsparity dump, or anything `import` reads) over the file's
//! own tokens, drafting through the target's embeddings and LM head only,
//! next to τ on each loading path's own taps over the same tokens.

use std::path::{Path, PathBuf};

use crate::commands::drafter::DrafterOptions;
use crate::drafter::{self, features};
use crate::dump::Dump;
use crate::error::{Error, Result};
use crate::import::{Format, ImportOptions};
use crate::models::GdnForm;
use crate::prompts::{Prompt, PromptSource};
use crate::report::features::FeaturesReport;
use crate::report::Environment;
use crate::session::Session;

/// Options of `drafter --features`.
#[derive(Debug, Clone)]
pub struct FeaturesOptions {
    /// The drafter run (checkpoint, paths, dtype, drafter, replay); its prompt
    /// options must be empty: the file gives the tokens.
    pub drafter: DrafterOptions,
    /// The file: a dump, or an engine capture `import` reads.
    pub features: PathBuf,
    /// The engine format (`None`: a dump, or detected).
    pub format: Option<Format>,
    /// How to read an engine capture; taps, N and H default to the drafter's and the checkpoint's.
    pub read: ImportOptions,
}

/// True when `path` is a safetensors file with `p0.` tensors (an hsparity dump).
fn is_dump(path: &Path) -> bool {
    crate::input::read(path).is_ok_and(|b| {
        safetensors::SafeTensors::read_metadata(&b)
            .is_ok_and(|(_, m)| m.tensors().keys().any(|k| k.starts_with("p0.")))
    })
}

/// The file as a dump, and what it was (`dump` or the engine format).
///
/// Errors: as [`Dump::read`] and the import readers.
pub fn read_features(
    path: &Path,
    format: Option<Format>,
    opts: &ImportOptions,
) -> Result<(Dump, String)> {
    if format.is_none() && is_dump(path) {
        return Ok((Dump::read(path)?, "dump".into()));
    }
    let imp = crate::commands::import::read(path, format, opts)?;
    Ok((imp.to_dump(), imp.format.name().into()))
}

/// Runs the evaluation.
///
/// Errors: prompt options given; as [`Session::open`], [`drafter::load_drafter`],
/// [`read_features`] and [`features::from_dump`]; a sequence longer than the
/// target's `max_position_embeddings`.
pub fn run(o: &FeaturesOptions) -> Result<FeaturesReport> {
    let d = &o.drafter;
    let settings = &d.drafter;
    drafter::check_tau_gap(settings.max_tau_gap)?;
    drafter::check_end_rule(settings.replay.max_new, settings.replay.rule)?;
    if settings.engine_metrics.is_some() {
        return Err(Error::Input(
            "--engine-metrics compares an engine's acceptance with τ on prompts (or --trajectories), not on --features: the engine's rounds anchor at the prompt end, the file's at its loss mask".into(),
        ));
    }
    let p = &d.target.prompts;
    if !p.texts.is_empty() || !p.ids.is_empty() || p.file.is_some() {
        return Err(Error::Input(
            "--features replays the file's own tokens: --prompt, --prompt-ids and --prompts do not apply".into(),
        ));
    }
    // a one-token placeholder prompt; the file's sequences replace it below
    let mut target = d.target.clone();
    target.prompts.ids = vec![vec![0]];
    let mut session = Session::open(&target, &d.paths)?;
    let tc = session.paths[0].text_config.clone();
    let n = session.spec.num_layers();
    let (dr, dprec) = drafter::load_drafter(&settings.source, &tc, n, &session.spec.device)?;
    let read = ImportOptions {
        target_layer_ids: o
            .read
            .target_layer_ids
            .clone()
            .or(Some(dr.cfg.target_layer_ids.clone())),
        num_layers: o.read.num_layers.or(Some(n)),
        hidden_size: o.read.hidden_size.or(Some(tc.hidden_size)),
        ..o.read.clone()
    };
    let (dump, format) = read_features(&o.features, o.format, &read)?;
    let name = o.features.display().to_string();
    let (prompts, mut notes) = features::from_dump(
        &dump,
        &name,
        &dr.cfg.target_layer_ids,
        (n, tc.vocab_size),
        (&settings.replay, dr.cfg.block_size),
    )?;
    if let Some(p) = prompts
        .iter()
        .find(|p| p.tokens.len() > tc.max_position_embeddings)
    {
        return Err(Error::Input(format!(
            "{name}: p{} has {} tokens, over the target's max_position_embeddings = {}",
            p.index,
            p.tokens.len(),
            tc.max_position_embeddings
        )));
    }
    session.prompts = prompts
        .iter()
        .map(|p| Prompt {
            source: PromptSource::Ids,
            origin: format!("{name} p{}", p.index),
            ids: p.tokens.clone(),
            chat: None,
        })
        .collect();
    session.rendering = crate::prompts::Rendering {
        basis: crate::prompts::PromptBasis::Features,
        ..Default::default()
    };
    let file = features::FileFacts {
        dtype: dump.dtype(&name)?,
        file: name,
        format,
    };
    let (mut eval, more) =
        features::evaluate(&session, (&dr, dprec), settings, (&file, &prompts), d.quiet)?;
    notes.extend(more);
    eval.tau_gap_interval =
        crate::drafter::gap::gap_from(&eval.features.tau, &eval.paths, d.target.seed);
    let mut findings = crate::drafter::audit::mismatches(&eval.drafter.audit);
    findings.extend(session.findings());
    Ok(crate::report::features::build(
        eval,
        Environment::of_session(&session, GdnForm::Chunked)?,
        d.command_line.clone(),
        notes,
    )
    .with_findings(&findings))
}
