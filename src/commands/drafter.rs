//! `hsparity drafter`: the DFlash drafter's acceptance length τ on each
//! loading path, DDTree-N from the same drafts, and cross runs (path B's
//! features against path A's trajectory).

use crate::drafter::{self, DrafterSettings};
use crate::error::Result;
use crate::loading::LoadingPath;
use crate::models::GdnForm;
use crate::precision::Precision;
use crate::report::{DrafterReport, Environment};
use crate::session::{Session, Target};

/// Options of `drafter`.
#[derive(Debug, Clone)]
pub struct DrafterOptions {
    /// Checkpoint, prompts, seed, device.
    pub target: Target,
    /// Loading paths; the first is the reference of the cross runs and τ gap.
    pub paths: Vec<LoadingPath>,
    /// `None` = each path's own dtype; else this dtype for every target path.
    pub dtype: Option<Precision>,
    /// The drafter and what is replayed.
    pub drafter: DrafterSettings,
    /// Hide progress.
    pub quiet: bool,
    /// The command line, for the report.
    pub command_line: String,
}

/// Runs the drafter evaluation.
///
/// Errors: as [`Session::open`], [`drafter::attach_trajectories`] and
/// [`drafter::load_checked`]; a bad
/// `--max-tau-gap`; no loading path with an `lm_head` to draft through.
pub fn run(opts: &DrafterOptions) -> Result<DrafterReport> {
    drafter::check_tau_gap(opts.drafter.max_tau_gap)?;
    let mut session = Session::open(&opts.target, &opts.paths)?;
    let settings = &opts.drafter;
    let given = drafter::attach_trajectories(
        &mut session,
        settings.trajectories.as_ref(),
        opts.target.prompts.names_prompts(),
    )?;
    let (dr, dprec, given) =
        drafter::load_checked(&session, &settings.source, settings.replay, 0, given)?;
    let (mut eval, notes) = drafter::paths::evaluate(
        &session,
        &dr,
        dprec,
        settings,
        given.as_ref(),
        opts.dtype,
        opts.quiet,
    )?;
    eval.tau_gap_interval = drafter::gap::gap(&eval, opts.target.seed);
    Ok(crate::report::drafter::build(
        eval,
        Environment::of_session(&session, GdnForm::Chunked)?,
        opts.command_line.clone(),
        notes,
    )
    .with_findings(&session.findings()))
}
