//! `triage`: every usual suspect of a drafter regression tested in one run
//! and ranked by what it costs in τ.
//!
//! Baseline: the training-side path (`causal-lm`, its own dtype, chunked Gated
//! DeltaNet, taps `hidden_states[L+1]`). Each [`Suspect`] changes one thing an
//! eval harness gets wrong; its per-tap divergence from the baseline is
//! measured on the baseline's trajectory and its τ on its own greedy
//! trajectory. Suspects that only change which hidden states feed the drafter
//! (tap offsets, the normed last tap) reuse the baseline's forward, so they
//! cost no target compute. With `--trajectories` every variant is measured
//! on the supplied greedy outputs instead (one teacher-forced sweep per
//! group; the suspects that need their own decode loop or prompts do not
//! apply).

pub mod assess;
mod batches;
pub mod evidence;
mod floor;
mod forced;
mod groups;
pub mod harness;
pub mod lanes;
mod observed;
mod on_base;
mod outcomes;
mod ranking;
pub mod suspects;

use std::time::Instant;

use serde::Serialize;

use crate::drafter::bootstrap::{Bootstrap, DeltaInterval};
use crate::drafter::eval::{self, EndRule, PromptTau};
use crate::drafter::plan::plan_for;
use crate::drafter::plan::Residency;
use crate::drafter::target::TargetModel;
use crate::drafter::trajectories::{Given, GivenFile, PathDepartures, TrajectoryReport};
use crate::drafter::{load_checked, Replay};
use crate::error::Result;
use crate::loading::resident::Resident;
use crate::loading::{LoadingPath, WeightSource};
use crate::models::dflash::Drafter;
use crate::models::GdnForm;
use crate::precision::Precision;
use crate::session::Session;
use assess::PromptRun;
pub use evidence::{Evidence, Presence};
pub use harness::{HarnessOptions, NotApplicable};
use lanes::LaneEdit;
pub use suspects::{Head, Recipe, Suspect, SuspectGroup, Taps, Weights};

/// What to triage (besides the session's target).
#[derive(Debug, Clone)]
pub struct TriageSettings {
    /// Drafter directory or Hub id.
    pub drafter: String,
    /// Greedy tokens per prompt, the DDTree budget and the end-of-generation
    /// rule every lane's loop and replay follow (`--end-rule`).
    pub replay: Replay,
    /// τ seen in the eval that regressed, to point at consistent suspects.
    pub observed_tau: Option<f64>,
    /// `--engine-metrics`: the engine's counters, whose τ is the observed one.
    pub engine_metrics: Option<std::path::PathBuf>,
    /// k of the "decode positions shifted by +k" suspect.
    pub position_shift: usize,
    /// Seed for MISSING tensors.
    pub seed: u64,
    /// Hide progress.
    pub quiet: bool,
    /// `--memory-budget` (see [`crate::drafter::plan::MemoryPlan`]).
    pub memory_budget: Option<u64>,
    /// `--reset-at`, `--left-pad` and the prompt options (the harness and
    /// engine suspects).
    pub harness: HarnessOptions,
    /// `--trajectories`: every variant measured on supplied greedy outputs.
    pub trajectories: Option<GivenFile>,
    /// Measure the noise floor of a bf16/f16 baseline's taps (`--no-noise-floor` skips it).
    pub noise_floor: crate::parity::noise::FloorPlan,
}

/// One suspect's outcome (a `variants[]` row of `triage --json`).
#[derive(Debug, Clone, Serialize)]
pub struct VariantResult {
    /// Short name ([`Suspect::name`]).
    pub name: String,
    /// The kind of fault: loading, numerics, harness or engine.
    pub group: SuspectGroup,
    /// What it emulates ([`Suspect::description`]).
    pub description: String,
    /// Whether the checkpoint, drafter and prompts show this fault, and
    /// what shows it ([`evidence::Inputs::of`]).
    pub evidence: Evidence,
    /// First tap (as a `hidden_states` index) whose features diverge from the
    /// baseline's beyond tolerance, on the baseline trajectory.
    pub first_divergent: Option<usize>,
    /// Smallest per-token cosine between the variant's and the baseline's tap
    /// features (on the baseline trajectory).
    pub cos_min_at_taps: f64,
    /// The taps' largest difference over the baseline's tap noise floor
    /// (`≤ 1`: numerics noise); absent without a floor or when the variant
    /// computes in another dtype; `null` over an empty band.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tap_noise_ratio: Option<Option<f64>>,
    /// Where along the compared rows the first divergent tap departs, per
    /// prompt (`tap 1 (hidden_states[2]): positions 0–15 agree in all 5
    /// prompts; departure starts at position 16 …`); rows count from the
    /// first position the variant and the baseline share.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub taps_depart: Option<String>,
    /// τ (macro) on the variant's own trajectory.
    pub tau_macro: f64,
    /// τ(variant) − τ(baseline).
    pub delta_tau: f64,
    /// 95 % interval on Δτ, paired bootstrap over prompts (`None` with one
    /// prompt); `contains_zero`: not distinguishable with this many prompts.
    pub delta_tau_interval: Option<DeltaInterval>,
    /// DDTree τ (macro).
    pub ddtree_tau_macro: f64,
    /// With `--observed-tau`: observed − τ(baseline) lies in the Δτ interval
    /// (one prompt: |τ − observed| ≤ 0.25 or 10 %).
    pub consistent_with_observed: Option<bool>,
    /// Where the divergence columns are measured.
    pub divergence_on: DivergenceOn,
    /// Per prompt: the first new token where its output leaves the
    /// baseline's greedy continuation (`null`: never), for suspects that
    /// generate their own continuation of the same text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub departs_from_greedy_at: Option<Vec<Option<usize>>>,
    /// Per prompt: τ, acceptance lengths, its new tokens.
    pub per_prompt: Vec<PromptRun>,
    /// Seconds this variant took (0 reading the baseline's forward; else its
    /// shared run's; on given trajectories the sweep's + its group's replays').
    pub wall_s: f64,
    /// Sweeps over the target's layers of the run this variant was part of
    /// (0 for variants reading the baseline's forward).
    pub sweeps: usize,
    /// The other runs in those sweeps (on given trajectories: every one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shared_sweeps_with: Vec<String>,
    /// With `--trajectories`: where this variant's argmax leaves the given
    /// tokens (absent for variants reading the baseline's forward, whose
    /// logits are the baseline's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub departures: Option<PathDepartures>,
}

/// Where a variant's divergence columns are measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DivergenceOn {
    /// Teacher-forced on the baseline's tokens.
    BaselineTrajectory,
    /// The suspect's loop's features against a correct forward over its own
    /// tokens: faults of the decode loop.
    OwnTrajectory,
}

/// The baseline the variants are measured against.
#[derive(Debug, Clone, Serialize)]
pub struct Baseline {
    /// Loading path (`causal-lm`).
    pub path: LoadingPath,
    /// dtype it computes in (its own).
    pub dtype: Precision,
    /// Delta-rule form.
    pub gdn_form: GdnForm,
    /// Whether the target has Gated DeltaNet layers (the form applies).
    #[serde(skip)]
    pub linear_attention: bool,
    /// The drafter's taps.
    pub taps: Vec<usize>,
    /// τ (macro).
    pub tau_macro: f64,
    /// DDTree τ (macro).
    pub ddtree_tau_macro: f64,
    /// Seconds (the baseline's run, with the variants sharing its sweeps).
    pub wall_s: f64,
    /// Sweeps over the target's layers of that run.
    pub sweeps: usize,
    /// Per prompt: τ, acceptance lengths, its greedy continuation.
    pub per_prompt: Vec<PromptRun>,
    /// The noise floor of its taps in bf16/f16 (rows by the tap's
    /// `hidden_states` index; `docs/noise-floor.md`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tap_noise_floor: Option<crate::parity::noise::NoiseFloor>,
}

/// The members `triage`'s report adds to the envelope.
#[derive(Debug, Clone, Serialize)]
pub struct Triage {
    /// The baseline.
    pub baseline: Baseline,
    /// Ranked: the suspects present in the inputs first, then the
    /// possible ones, then the hypothetical ones; each by |delta_tau|,
    /// largest first.
    pub variants: Vec<VariantResult>,
    /// Suspects that do not apply to this target, drafter or prompts, with
    /// the reason.
    pub not_applicable: Vec<NotApplicable>,
    /// How the Δτ intervals were drawn.
    pub uncertainty: Bootstrap,
    /// The cheapest next check for the top suspect (`ranking::top_suspect`: the
    /// top present finding that lowers τ, else the costliest suspect).
    pub next_check: Option<String>,
    /// `--observed-tau`.
    pub observed_tau: Option<f64>,
    /// The supplied trajectories and the baseline's departures from them
    /// (`None` when every variant generated its own).
    pub trajectories: Option<TrajectoryReport>,
    /// Whole run, seconds.
    pub wall_time_s: f64,
    /// What the drafter's config records about its target, checked against
    /// this one ([`crate::drafter::audit`]); a disagreement fails the run.
    pub drafter_audit: Vec<crate::drafter::audit::AuditCheck>,
    /// What every τ was measured on, in words ([`crate::prompts::describe`]).
    pub measured_on: String,
    /// Which prompts those are (`given`, `drafter-default`, …).
    pub prompt_basis: crate::prompts::PromptBasis,
    /// The end-of-generation rule every loop and replay followed
    /// (`--end-rule`; serialised as its sentence).
    pub end_rule: EndRule,
    /// `--engine-metrics`: the engine's acceptance beside the baseline's.
    pub engine: Option<crate::drafter::engine_gap::EngineComparison>,
}

/// τ (macro) of per-prompt results for block size `b`.
fn tau(p: &[PromptTau], b: usize) -> f64 {
    eval::summarize(p, b).tau_macro
}

/// The suspects that apply to this target and drafter, in report order,
/// each with its lane edit when it is a harness or engine suspect run on the
/// target (the others: their own recipe), and those that do not apply.
///
/// Errors ([`crate::error::Error::Input`]): `--reset-at` outside a prompt.
fn plan(
    session: &Session,
    shown: &evidence::Inputs,
    drafter: &Drafter,
    base_prec: Precision,
    settings: &TriageSettings,
    replay: Replay,
    notes: &mut Vec<String>,
) -> Result<harness::Planned> {
    let mut not_applicable = Vec::new();
    let mut skip = |s: Suspect, reason: String| {
        not_applicable.push(NotApplicable {
            name: s.name(),
            reason,
        })
    };
    let mut plan = vec![Suspect::Vlm];
    plan.extend(
        Precision::ALL
            .into_iter()
            .filter(|&p| p != base_prec)
            .map(Suspect::Dtype),
    );
    if session
        .spec
        .layer_types
        .contains(&crate::checkpoint::config::LayerType::LinearAttention)
    {
        plan.push(Suspect::Recurrent);
    } else {
        skip(
            Suspect::Recurrent,
            "the target has no linear-attention layers: there is no delta rule to run in another form"
                .into(),
        );
    }
    match (&session.spec.moe, base_prec) {
        (None, _) => skip(
            Suspect::RouterDtype,
            "the target is dense: it has no MoE routers".into(),
        ),
        (Some(_), Precision::F32) => skip(
            Suspect::RouterDtype,
            "the baseline computes in f32, where the router's softmax is f32 either way".into(),
        ),
        (Some(_), _) => plan.push(Suspect::RouterDtype),
    }
    plan.extend([Suspect::TapOffset(-1), Suspect::TapOffset(1)]);
    let n_layers = session.spec.num_layers();
    if drafter.cfg.target_layer_ids.iter().max() == Some(&(n_layers - 1)) {
        plan.push(Suspect::NormedLastTap);
    } else {
        skip(
            Suspect::NormedLastTap,
            format!(
                "no tap is on the last layer ({}), and only hidden_states[N] is final-normed",
                n_layers - 1
            ),
        );
    }
    plan.extend([
        Suspect::Positions(1),
        Suspect::Positions(settings.position_shift),
    ]);
    match shown.missing_on() {
        Some(p) => plan.push(Suspect::MissingOn(p)),
        None => {
            let when = if session.ckpt.config.raw.get("text_config").is_some() {
                "what causal-lm gets when tie_word_embeddings is set only at the top level and lm_head.weight is absent"
            } else {
                "what a loader that does not tie the head gets when lm_head.weight is absent"
            };
            notes.push(format!(
                "no path reports MISSING tensors on this checkpoint; the missing variant emulates a random lm_head (normal(0, initializer_range)), {when}"
            ));
            plan.push(Suspect::RandomLmHead);
        }
    }
    let mut out: Vec<(Suspect, Option<LaneEdit>)> = plan.into_iter().map(|s| (s, None)).collect();
    let h = harness::plan(
        session,
        drafter,
        replay,
        &settings.harness,
        settings.trajectories.is_some(),
    )?;
    out.extend(h.suspects);
    not_applicable.extend(h.not_applicable);
    Ok(harness::Planned {
        suspects: out,
        not_applicable,
    })
}

/// Runs the triage matrix on `session` (opened on `causal-lm`). Returns the
/// result, its summary sentence and notes. Suspects that read the same
/// weights in the same dtype with the same lm_head as another run share its
/// sweeps (extra sequences in the same DFlash loop); tap suspects read the
/// baseline's forward. With `given` trajectories (read into the session by
/// [`crate::drafter::attach_trajectories`]) every variant is measured on
/// them: one teacher-forced sweep per group, no generation.
///
/// Errors: as the drafter loading ([`load_checked`]) and the model runs.
pub fn run(
    session: &Session,
    settings: &TriageSettings,
    given: Option<Given>,
) -> Result<(Triage, String, Vec<String>)> {
    let t0 = Instant::now();
    let replay = settings.replay;
    // The left pads, like a position shift, move the last positions out.
    let extra = settings.position_shift.max(settings.harness.left_pad);
    let (drafter, _, given) = load_checked(session, &settings.drafter, replay, extra, given)?;
    let mut notes = Vec::new();
    let (settings, engine) =
        observed::with_observed(settings, session, &drafter, given.as_ref(), &mut notes)?;
    let settings = &settings;
    let (base_path, base_prec) = (&session.paths[0], session.paths[0].dtype);
    let inputs_shown = evidence::Inputs::gather(session, &drafter, settings.replay.max_new);
    let (planned, not_applicable) = plan(
        session,
        &inputs_shown,
        &drafter,
        base_prec,
        settings,
        replay,
        &mut notes,
    )
    .map(|p| (p.suspects, p.not_applicable))?;
    let suspects: Vec<Suspect> = planned.iter().map(|(s, _)| *s).collect();
    let recipes = recipes_of(&planned, session, base_prec, settings.seed)?;
    let mem = plan_for(session, &drafter, settings.memory_budget);
    let (resident_base, residents) = hold(mem.mode, &base_path.view, &recipes)?;
    let base_w: &dyn WeightSource = match &resident_base {
        Some(r) => r,
        None => &base_path.view,
    };
    let base_target = TargetModel {
        spec: &session.spec,
        weights: base_w,
        head: base_w,
        prec: base_prec,
    };
    let mut groups = groups::build(session, base_target, &recipes, &residents, given.is_some());
    groups[0].shadow_taps = floor::wanted(base_prec, settings.noise_floor);
    let names: Vec<String> = suspects.iter().map(Suspect::name).collect();
    let mut ran = batches::run_all(
        &groups,
        &drafter,
        &session.prompt_ids(),
        replay,
        &names,
        given.as_ref(),
        settings.quiet,
    )?;
    let baseline = baseline_of(&ran, &drafter, (session, &base_target))?;
    let mut outcomes = std::mem::take(&mut ran.outcomes);
    on_base::tap_outcomes(
        session,
        &drafter,
        &base_target,
        &ran.base,
        &recipes,
        replay,
        &mut outcomes,
        &mut notes,
    )?;
    let boot = Bootstrap::seeded(settings.seed);
    let ctx = assess::Scoring {
        inputs_shown: &inputs_shown,
        session,
        drafter: &drafter,
        baseline: &baseline,
        ran: &ran,
        boot,
        settings,
        given: given.as_ref(),
    };
    let mut variants = Vec::new();
    for (i, s) in suspects.iter().enumerate() {
        if let Some(o) = &outcomes[i] {
            variants.push(ctx.score(i, s, o, planned[i].1.as_ref(), &recipes[i])?);
        }
    }
    ranking::rank(&mut variants);
    let measured_on = crate::prompts::describe(&session.prompts, &session.rendering);
    let mut summary = ranking::summarize(&baseline, &variants, settings.observed_tau);
    summary.push_str(&format!("; τ on {measured_on}"));
    // The drafter itself: every τ here is measured without what it does not read.
    if let Some(f) = eval::unread_finding(&drafter.unexpected, &drafter.cfg.ignored_flags) {
        summary = format!("{f}; {summary}");
    }
    let trajectories = given
        .as_ref()
        .map(|g| trajectory_report(g, &ran.baseline, &mut summary, &mut notes));
    let engine = observed::beside(
        engine,
        &baseline,
        (settings, &drafter, given.as_ref()),
        trajectories.as_ref(),
        &mut summary,
    );
    let next_check = next_check(&variants, &suspects, &baseline, session, settings);
    let triage = Triage {
        baseline,
        variants,
        not_applicable,
        uncertainty: boot,
        next_check,
        observed_tau: settings.observed_tau,
        trajectories,
        wall_time_s: t0.elapsed().as_secs_f64(),
        drafter_audit: crate::drafter::audit::audit(&drafter.cfg, &session.paths[0].text_config),
        measured_on,
        prompt_basis: session.rendering.basis,
        end_rule: replay.rule,
        engine,
    };
    Ok((triage, summary, notes))
}

/// The baseline's row: the training-side path in its own dtype with the
/// chunked delta rule, its τ and DDTree τ over the prompts, its cost, and
/// in half precision its taps' noise floor (unless `--no-noise-floor`; its
/// shadow ran in the baseline's sweep).
///
/// Errors: the floor's tensor failures.
fn baseline_of(
    ran: &batches::Ran,
    drafter: &crate::models::dflash::Drafter,
    (session, target): (&Session, &TargetModel),
) -> Result<Baseline> {
    let b = drafter.cfg.block_size;
    let taps = drafter.cfg.target_layer_ids.as_slice();
    Ok(Baseline {
        path: LoadingPath::CausalLm,
        dtype: target.prec,
        gdn_form: GdnForm::Chunked,
        linear_attention: session
            .spec
            .layer_types
            .contains(&crate::checkpoint::config::LayerType::LinearAttention),
        taps: drafter.cfg.target_layer_ids.clone(),
        tau_macro: tau(&ran.baseline.dflash, b),
        ddtree_tau_macro: tau(&ran.baseline.ddtree, b),
        wall_s: ran.baseline.wall_s,
        sweeps: ran.baseline.sweeps,
        per_prompt: assess::per_prompt(&ran.baseline, &ran.base.max_new),
        tap_noise_floor: floor::of_taps(target.prec, &ran.base, taps)?,
    })
}

/// The supplied trajectories with the baseline's departures from them; a
/// note that τ is measured on them, and a summary clause when the baseline
/// itself departs.
fn trajectory_report(
    g: &Given,
    baseline: &groups::Outcome,
    summary: &mut String,
    notes: &mut Vec<String>,
) -> TrajectoryReport {
    let base = PathDepartures::new("baseline", checked(g), &baseline.departures);
    notes.push(format!(
        "τ of every variant is measured on the supplied trajectories, not on its own greedy continuation; {}",
        base.describe()
    ));
    if base.first_failure.is_some() {
        summary.push_str("; the given trajectory is not the baseline's greedy output");
    }
    TrajectoryReport::new(g, vec![base])
}

/// Output positions of the supplied trajectories (each is checked).
pub(crate) fn checked(g: &Given) -> usize {
    g.lines.iter().map(|t| t.output.len()).sum()
}

/// Holds the baseline's weights and each other loading path's resident in
/// their stored dtype under a resident plan (another path shares every
/// tensor it reads from the same checkpoint key), or none under a streamed
/// one.
///
/// Errors: shard I/O.
fn hold(
    mode: Residency,
    base: &crate::loading::TensorView,
    recipes: &[Recipe],
) -> Result<(Option<Resident>, Vec<Option<Resident>>)> {
    if mode == Residency::Streamed {
        return Ok((None, recipes.iter().map(|_| None).collect()));
    }
    let b = Resident::load(base, base.names())?;
    let others = recipes
        .iter()
        .map(|r| match r {
            Recipe::Model {
                weights: Weights::Path(p),
                ..
            } => Resident::load_sharing(&p.view, p.view.names(), Some(&b)).map(Some),
            _ => Ok(None),
        })
        .collect::<Result<_>>()?;
    Ok((Some(b), others))
}

/// Each planned suspect's recipe: a harness or engine suspect's lanes on the
/// baseline's weights, else its own.
///
/// Errors: as [`Suspect::recipe`].
fn recipes_of(
    planned: &[(Suspect, Option<LaneEdit>)],
    session: &Session,
    prec: Precision,
    seed: u64,
) -> Result<Vec<Recipe>> {
    planned
        .iter()
        .map(|(s, edit)| match edit {
            Some(e) => Ok(harness::lane_recipe(e, prec)),
            None => s.recipe(session, prec, seed),
        })
        .collect()
}

/// The next check for the top suspect ([`ranking::top_suspect`]), if any.
fn next_check(
    variants: &[VariantResult],
    suspects: &[Suspect],
    baseline: &Baseline,
    session: &Session,
    settings: &TriageSettings,
) -> Option<String> {
    let top = ranking::top_suspect(variants)?;
    let s = suspects.iter().find(|s| s.name() == top.name)?;
    use crate::prompts::shell_quote;
    let mut replay = format!(
        " --max-new-tokens {} --ddtree-budget {}",
        settings.replay.max_new, settings.replay.budget
    );
    let rule = match settings.replay.rule {
        EndRule::GithubMain => String::new(),
        r => format!(" --end-rule {}", r.flag()),
    };
    if let Some(t) = &settings.trajectories {
        replay = format!(
            " --trajectories {}",
            shell_quote(&t.file.display().to_string())
        );
        if let Some(n) = t.max_new {
            replay.push_str(&format!(" --max-new-tokens {n}"));
        }
        replay.push_str(&format!(" --ddtree-budget {}", settings.replay.budget));
    }
    replay.push_str(&rule);
    let run = assess::RunFlags {
        checkpoint: shell_quote(&session.ckpt.source.display),
        drafter: shell_quote(&settings.drafter),
        prompts: settings.harness.prompts.to_flags(),
        replay,
        default_set: (session.rendering.basis == crate::prompts::PromptBasis::DrafterDefault)
            .then(|| crate::prompts::DRAFTER_DEFAULT_SET.to_string()),
    };
    Some(assess::next_check(s, baseline.tau_macro, &run))
}
