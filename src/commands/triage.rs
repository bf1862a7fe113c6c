//! `hsparity triage`: the usual suspects of a drafter regression ranked by
//! what they cost in τ (the matrix itself is [`crate::triage`]).

use crate::error::Result;
use crate::loading::LoadingPath;
use crate::models::GdnForm;
use crate::report::{Environment, TriageReport};
use crate::session::{Session, Target};
use crate::triage::{self, TriageSettings};

/// Options of `triage`.
#[derive(Debug, Clone)]
pub struct TriageOptions {
    /// Checkpoint, prompts, seed, device.
    pub target: Target,
    /// Drafter, replay, observed τ, position shift.
    pub settings: TriageSettings,
    /// The command line, for the report.
    pub command_line: String,
}

/// Runs the triage matrix on the `causal-lm` baseline.
///
/// Errors: as [`Session::open`], [`crate::drafter::attach_trajectories`]
/// and [`triage::run`].
pub fn run(opts: &TriageOptions) -> Result<TriageReport> {
    let mut session = Session::open(&opts.target, &[LoadingPath::CausalLm])?;
    let given = crate::drafter::attach_trajectories(
        &mut session,
        opts.settings.trajectories.as_ref(),
        opts.target.prompts.names_prompts(),
    )?;
    // thinking-flipped renders the prompts again with the flag flipped.
    let mut settings = opts.settings.clone();
    settings.harness.prompts = opts.target.prompts.clone();
    let (t, summary, notes) = triage::run(&session, &settings, given)?;
    let mut findings = crate::drafter::audit::mismatches(&t.drafter_audit);
    findings.extend(session.findings());
    findings.extend(session.other_path_findings());
    Ok(crate::report::triage::build(
        t,
        summary,
        Environment::of_session(&session, GdnForm::Chunked)?,
        opts.command_line.clone(),
        notes,
    )
    .with_findings(&findings))
}
