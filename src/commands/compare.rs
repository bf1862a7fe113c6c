//! `hsparity compare`: the same prompts through two or more loading paths in
//! lock-step, per-layer parity, the prefill-vs-incremental check, and
//! optionally the drafter's τ on every path — as named steps over the
//! session ([`Session::open`]), the live parity ([`crate::parity::live`])
//! and the report's parts ([`crate::report::compare::build`]).

use crate::drafter::{self, DrafterSettings};
use crate::error::{Error, Result};
use crate::loading::LoadingPath;
use crate::models::GdnForm;
use crate::parity::noise::FloorPlan;
use crate::parity::{live, IncrementalPlan};
use crate::report::compare::{build, summarize, Compare};
use crate::report::{CompareReport, Environment, Kind, Report, TAP_CONVENTION};
use crate::session::{Session, Target};

pub use crate::parity::incremental::INCREMENTAL_AUTO_BYTES;

/// Options of `compare`.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Checkpoint, prompts, seed, device, `--dtype`.
    pub target: Target,
    /// Loading paths (≥ 2); the first is the reference `a` of every pair.
    pub paths: Vec<LoadingPath>,
    /// Drafter taps (decoder-layer indices) to mark.
    pub taps: Vec<usize>,
    /// Delta-rule form.
    pub gdn_form: GdnForm,
    /// Prefill-vs-incremental check: `None` = automatic
    /// ([`IncrementalPlan::resolve`]), `Some(b)` = forced on/off.
    pub incremental: Option<bool>,
    /// Measure the noise floor of a half-precision reference path (`--no-noise-floor` skips it).
    pub noise_floor: FloorPlan,
    /// Also evaluate a DFlash drafter on every path (`--drafter`).
    pub drafter: Option<DrafterSettings>,
    /// Hide progress.
    pub quiet: bool,
    /// The command line, for the report's "reproduce" section.
    pub command_line: String,
}

/// Runs the comparison and returns the report.
///
/// Errors ([`Error::Input`] unless noted): fewer than two paths, a tap
/// outside `0..num_hidden_layers`, a drafter that does not fit the target,
/// and anything [`Session::open`] or the capture returns.
pub fn run(opts: &CompareOptions) -> Result<CompareReport> {
    if opts.paths.len() < 2 {
        return Err(Error::Input(format!(
            "compare needs at least two loading paths, got {}",
            opts.paths.len()
        )));
    }
    let mut session = Session::open(&opts.target, &opts.paths)?;
    // Loaded and checked before the capture, evaluated after it.
    let drafter = match &opts.drafter {
        Some(d) => {
            drafter::check_tau_gap(d.max_tau_gap)?;
            Some(super::drafter::prepare(&mut session, d, &opts.target)?)
        }
        None => None,
    };
    let taps = match (&drafter, opts.taps.is_empty()) {
        (Some(p), true) => p.drafter().cfg.target_layer_ids.clone(),
        _ => opts.taps.clone(),
    };
    check_taps(&taps, session.spec.num_layers())?;
    let mut notes = Vec::new();
    let mut paths = build::paths_as_run(&session, opts.target.seed, &mut notes);
    let plan = IncrementalPlan::for_session(opts.incremental, &session, opts.gdn_form);
    let parity = live::run(&session, opts.gdn_form, &plan, opts.noise_floor, opts.quiet)?;
    build::attach_non_finite(&session, &mut paths, &mut notes);
    let (mut verdict, mut summary) = summarize(&parity.pairs, &paths);
    if let IncrementalPlan::Skip(why) = plan {
        notes.push(why);
    }
    notes.extend(parity.pairs.iter().filter_map(|p| p.wide_band_note()));
    build::append_incremental(&parity.incremental, &mut verdict, &mut summary);
    let drafter = match drafter {
        Some(p) => {
            let run = (opts.target.seed, opts.command_line.as_str(), opts.quiet);
            Some(super::drafter::evaluate(&session, p, run)?)
        }
        None => None,
    };
    if let Some(rep) = &drafter {
        build::append_drafter(rep, &mut verdict, &mut summary);
    }
    let body = Compare {
        tap_convention: TAP_CONVENTION.into(),
        taps,
        inventory: build::inventory(&session),
        paths,
        prompts: build::prompt_infos(&session),
        pairs: parity.pairs,
        drafter,
        incremental: parity.incremental,
    };
    let env = Environment::of_session(&session, opts.gdn_form)?;
    Ok(Report::new(
        Kind::Compare,
        verdict,
        &summary,
        env,
        opts.command_line.clone(),
        notes,
        body,
    ))
}

/// Refuses a tap outside the model's decoder layers.
fn check_taps(taps: &[usize], n: usize) -> Result<()> {
    match taps.iter().find(|&&t| t >= n) {
        Some(bad) => Err(Error::Input(format!(
            "--taps {bad}: the model has decoder layers 0..{} ({TAP_CONVENTION})",
            n - 1
        ))),
        None => Ok(()),
    }
}
