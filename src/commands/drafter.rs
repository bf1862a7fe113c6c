//! `hsparity drafter`: the DFlash drafter's acceptance length τ on each
//! loading path, DDTree-N from the same drafts, and cross runs (path B's
//! features against path A's trajectory).

use crate::drafter::engine_gap;
use crate::drafter::engine_metrics::{self, EngineMetrics};
use crate::drafter::eval::PromptTau;
use crate::drafter::trajectories::Given;
use crate::drafter::{self, DrafterSettings};
use crate::error::Result;
use crate::loading::LoadingPath;
use crate::models::dflash::Drafter;
use crate::models::GdnForm;
use crate::precision::Precision;
use crate::report::{DrafterReport, Environment};
use crate::session::{Session, Target};

/// Options of `drafter`.
#[derive(Debug, Clone)]
pub struct DrafterOptions {
    /// Checkpoint, prompts, seed, device, `--dtype`.
    pub target: Target,
    /// Loading paths; the first is the reference of the cross runs and τ gap.
    pub paths: Vec<LoadingPath>,
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
    let prepared = prepare(&mut session, &opts.drafter, &opts.target)?;
    let report = evaluate(
        &session,
        prepared,
        (opts.target.seed, &opts.command_line, opts.quiet),
    )?;
    Ok(report.with_findings(&session.findings()))
}

/// A drafter loaded and checked against a session before any long run.
pub(crate) struct Prepared<'a> {
    settings: &'a DrafterSettings,
    drafter: Drafter,
    dprec: Precision,
    given: Option<Given>,
    engine: Option<EngineMetrics>,
}

impl Prepared<'_> {
    /// The drafter.
    pub(crate) fn drafter(&self) -> &Drafter {
        &self.drafter
    }
}

/// Reads the supplied trajectories into `session` and loads and checks the
/// drafter against it (config, taps, mask id, weights, positions):
/// what `drafter` and `compare --drafter` do before their long runs.
///
/// Errors: as [`drafter::attach_trajectories`] and [`drafter::load_checked`].
pub(crate) fn prepare<'a>(
    session: &mut Session,
    settings: &'a DrafterSettings,
    target: &Target,
) -> Result<Prepared<'a>> {
    let given = drafter::attach_trajectories(
        session,
        settings.trajectories.as_ref(),
        target.prompts.names_prompts(),
    )?;
    let (drafter, dprec, given) =
        drafter::load_checked(session, &settings.source, settings.replay, 0, given)?;
    let engine = settings
        .engine_metrics
        .as_deref()
        .map(|f| {
            let (n, b) = (session.prompts.len(), drafter.cfg.block_size);
            engine_metrics::read_for(f, n, b, settings.replay.rule, given.is_some())
        })
        .transpose()?;
    Ok(Prepared {
        settings,
        drafter,
        dprec,
        given,
        engine,
    })
}

/// The prepared drafter evaluated on every path of `session`
/// ([`drafter::paths::evaluate`]), with the τ gap's interval, as a report.
///
/// Errors: as [`drafter::paths::evaluate`].
pub(crate) fn evaluate(
    session: &Session,
    p: Prepared<'_>,
    (seed, command_line, quiet): (u64, &str, bool),
) -> Result<DrafterReport> {
    let (mut eval, notes) = drafter::paths::evaluate(
        session,
        &p.drafter,
        p.dprec,
        p.settings,
        p.given.as_ref(),
        quiet,
    )?;
    eval.tau_gap_interval = drafter::gap::gap(&eval, seed);
    if let Some(m) = p.engine {
        let path = &eval.paths[0];
        let rounds: Vec<PromptTau> = path
            .per_prompt
            .iter()
            .map(|q| engine_metrics::prompt_tau(q.acceptance_lengths.clone()))
            .collect();
        let replayed =
            engine_gap::replayed(p.given.as_ref(), p.settings.replay.max_new, rounds.len());
        let ours = engine_gap::Ours {
            name: &path.name,
            rounds: &rounds,
            replayed: &replayed,
            block: eval.drafter.block_size,
        };
        let departures = eval.trajectories.as_ref().map(|t| &t.paths[0]);
        eval.engine = Some(engine_gap::compare(m, &ours, departures));
    }
    let env = Environment::of_session(session, GdnForm::Chunked)?;
    let made_for = drafter::audit::mismatches(&eval.drafter.audit);
    let report = crate::report::drafter::build(eval, env, command_line.into(), notes);
    Ok(report.with_findings(&made_for))
}
