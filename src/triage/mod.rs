//! `triage`: every usual suspect of a drafter regression tested in one run
//! and ranked by what it costs in τ.
//!
//! Baseline: the training-side path (`causal-lm`, its own dtype, chunked Gated
//! DeltaNet, taps `hidden_states[L+1]`). Each [`Suspect`] changes one thing an
//! eval harness gets wrong; its per-tap divergence from the baseline is
//! measured on the baseline's trajectory and its τ on its own greedy
//! trajectory. Suspects that only change which hidden states feed the drafter
//! (tap offsets, the normed last tap) reuse the baseline's forward, so they
//! cost no target compute.

pub mod suspects;

use std::time::Instant;

use candle_core::Tensor;
use serde::Serialize;

use crate::drafter::eval::{self, EndRule, PromptTau};
use crate::drafter::{load_checked, replay_all, Replay, Replayed};
use crate::error::Result;
use crate::loading::{LoadingPath, ResolvedPath, WeightSource};
use crate::models::dflash::Drafter;
use crate::models::{GdnForm, StepOutput, TextModel};
use crate::parity::{Accumulator, Tolerance, Verdict};
use crate::precision::Precision;
use crate::progress;
use crate::session::{weights_key, Session};
pub use suspects::{Outcome, Suspect, Taps};

/// What to triage (besides the session's target).
#[derive(Debug, Clone)]
pub struct TriageSettings {
    /// Drafter directory or Hub id.
    pub drafter: String,
    /// Greedy tokens per prompt and the DDTree budget (the end rule is
    /// z-lab GitHub main's).
    pub replay: Replay,
    /// τ seen in the eval that regressed, to point at consistent suspects.
    pub observed_tau: Option<f64>,
    /// k of the "decode positions shifted by +k" suspect.
    pub position_shift: usize,
    /// Seed for MISSING tensors.
    pub seed: u64,
    /// Hide progress.
    pub quiet: bool,
}

/// One suspect's outcome (a `variants[]` row of `triage --json`).
#[derive(Debug, Clone, Serialize)]
pub struct VariantResult {
    /// Short name ([`Suspect::name`]).
    pub name: String,
    /// What it emulates ([`Suspect::description`]).
    pub description: String,
    /// First tap (as a `hidden_states` index) whose features diverge from the
    /// baseline's beyond tolerance, on the baseline trajectory.
    pub first_divergent: Option<usize>,
    /// Smallest per-token cosine between the variant's and the baseline's tap
    /// features (on the baseline trajectory).
    pub cos_min_at_taps: f64,
    /// τ (macro) on the variant's own trajectory.
    pub tau_macro: f64,
    /// τ(variant) − τ(baseline).
    pub delta_tau: f64,
    /// DDTree τ (macro).
    pub ddtree_tau_macro: f64,
    /// With `--observed-tau`: |τ − observed| ≤ 0.25 or 10 %.
    pub consistent_with_observed: Option<bool>,
    /// Seconds this variant took (0 for variants sharing the baseline forward).
    pub wall_s: f64,
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
    /// The drafter's taps.
    pub taps: Vec<usize>,
    /// τ (macro).
    pub tau_macro: f64,
    /// DDTree τ (macro).
    pub ddtree_tau_macro: f64,
    /// Seconds.
    pub wall_s: f64,
}

/// The members `triage`'s report adds to the envelope.
#[derive(Debug, Clone, Serialize)]
pub struct Triage {
    /// The baseline.
    pub baseline: Baseline,
    /// Ranked by |delta_tau|, largest first.
    pub variants: Vec<VariantResult>,
    /// `--observed-tau`.
    pub observed_tau: Option<f64>,
    /// Whole run, seconds.
    pub wall_time_s: f64,
}

/// The baseline's model, trajectory and forward outputs that every suspect
/// runs against.
pub struct Context<'a> {
    /// The session (baseline path first).
    pub session: &'a Session,
    /// The drafter.
    pub drafter: &'a Drafter,
    /// The baseline model (resident; variants clone it to share its tensors).
    pub base: TextModel,
    /// Its dtype.
    pub base_prec: Precision,
    /// Prompt + greedy continuation per prompt.
    pub base_tokens: Vec<Vec<u32>>,
    /// Its forward over those tokens (hidden states requested).
    base_outs: Vec<StepOutput>,
    /// Its tap features.
    pub base_feats: Vec<Tensor>,
    /// The baseline's weights key (a variant with the same key shares them).
    base_key: (Precision, Vec<String>),
    prompt_lens: Vec<usize>,
    replay: Replay,
    /// Seed for MISSING tensors.
    pub seed: u64,
}

impl Context<'_> {
    /// The baseline loading path.
    pub fn base_path(&self) -> &ResolvedPath {
        &self.session.paths[0]
    }

    fn taps(&self) -> &[usize] {
        &self.drafter.cfg.target_layer_ids
    }

    /// Features for the taps under `mode` from the baseline's forward.
    pub fn feats_of(&self, mode: Taps) -> Result<Vec<Tensor>> {
        self.base_outs
            .iter()
            .map(|o| {
                suspects::select(
                    o.hidden_states.as_deref().expect("requested"),
                    o.last_layer_output.as_ref().expect("requested"),
                    self.taps(),
                    mode,
                )
            })
            .collect()
    }

    /// DFlash and DDTree replays of `feats` over `tokens` with `model`'s head.
    pub fn replay(
        &self,
        model: &TextModel,
        tokens: &[Vec<u32>],
        feats: &[Tensor],
    ) -> Result<Replayed> {
        replay_all(
            self.drafter,
            model,
            tokens,
            &self.prompt_lens,
            feats,
            self.replay,
        )
    }

    /// Greedy trajectories of `m` over the prompts (`form` for the prefill).
    fn trajectories(&self, m: &TextModel, form: GdnForm) -> Result<Vec<Vec<u32>>> {
        let n_gen = self.replay.max_new + self.drafter.cfg.block_size;
        self.session
            .prompts
            .iter()
            .map(|p| Ok([p.ids.clone(), m.greedy(&p.ids, n_gen, form)?].concat()))
            .collect()
    }

    /// A variant that runs its own target model: divergence on the baseline
    /// trajectory, τ on its own trajectory.
    pub fn own_model(&self, m: &TextModel, form: GdnForm) -> Result<Outcome> {
        let taps = self.taps();
        let feats_on_base =
            crate::drafter::features(m, &self.base_tokens, &self.prompt_lens, taps, form)?;
        let tokens = self.trajectories(m, form)?;
        let own = crate::drafter::features(m, &tokens, &self.prompt_lens, taps, form)?;
        let (dflash, ddtree) = self.replay(m, &tokens, &own)?;
        Ok(Outcome {
            feats_on_base,
            dflash,
            ddtree,
        })
    }

    /// A variant model: the baseline's tensors when it reads the same bytes
    /// in the same dtype with the same lm_head (no second copy), else loaded.
    pub fn variant_model(
        &self,
        view: &dyn WeightSource,
        head: &dyn WeightSource,
        prec: Precision,
    ) -> Result<TextModel> {
        if weights_key(&self.session.spec, view, Some(head), prec) == self.base_key {
            Ok(self.base.clone())
        } else {
            TextModel::load(&self.session.spec, view, Some(head), prec)
        }
    }
}

/// τ (macro) of per-prompt results for block size `b`.
fn tau(p: &[PromptTau], b: usize) -> f64 {
    eval::summarize(p, b).tau_macro
}

/// Per-tap divergence: the first tap whose features fail `tol`, and the
/// smallest cosine over all taps. `a`, `b`: per prompt `[T, K·H]`.
fn tap_divergence(
    a: &[Tensor],
    b: &[Tensor],
    taps: &[usize],
    h: usize,
    tol: &Tolerance,
) -> Result<(Option<usize>, f64)> {
    if a.len() != b.len() {
        return Err(crate::error::Error::Input(format!(
            "tap divergence needs features of the same prompts: {} vs {}",
            a.len(),
            b.len()
        )));
    }
    let mut first = None;
    let mut cos_min = f64::INFINITY;
    for (j, &l) in taps.iter().enumerate() {
        let mut acc = Accumulator::default();
        for (k, (x, y)) in a.iter().zip(b).enumerate() {
            acc.add(k, &x.narrow(1, j * h, h)?, &y.narrow(1, j * h, h)?)?;
        }
        let m = acc.finish();
        cos_min = cos_min.min(m.cos_min);
        if first.is_none() && tol.judge(&m) != Verdict::Pass {
            first = Some(l + 1);
        }
    }
    Ok((first, cos_min))
}

/// The suspects that apply to this target and drafter, in report order
/// (notes say why the others do not run).
fn plan(cx: &Context, settings: &TriageSettings, notes: &mut Vec<String>) -> Vec<Suspect> {
    let mut plan = vec![Suspect::Vlm];
    plan.extend(
        Precision::ALL
            .into_iter()
            .filter(|&p| p != cx.base_prec)
            .map(Suspect::Dtype),
    );
    plan.push(Suspect::Recurrent);
    if cx.session.spec.moe.is_some() {
        if cx.base_prec == Precision::F32 {
            notes.push(
                "router-dtype not run: the baseline computes in f32, where the router's softmax is f32 either way"
                    .into(),
            );
        } else {
            plan.push(Suspect::RouterDtype);
        }
    }
    plan.extend([Suspect::TapOffset(-1), Suspect::TapOffset(1)]);
    let n_layers = cx.session.spec.num_layers();
    if cx.taps().iter().max() == Some(&(n_layers - 1)) {
        plan.push(Suspect::NormedLastTap);
    } else {
        notes.push(format!(
            "normed-last-tap not run: no tap is on the last layer ({}), and only hidden_states[N] is final-normed",
            n_layers - 1
        ));
    }
    plan.extend([
        Suspect::Positions(1),
        Suspect::Positions(settings.position_shift),
    ]);
    let missing = [LoadingPath::CausalLm, LoadingPath::Vlm]
        .into_iter()
        .find(|&p| {
            crate::loading::resolve(&cx.session.ckpt, p).is_ok_and(|r| r.inventory.missing > 0)
        });
    plan.push(missing.map_or(Suspect::RandomLmHead, Suspect::MissingOn));
    plan
}

/// The baseline: its model, greedy trajectories, forward and τ.
fn baseline<'a>(
    session: &'a Session,
    drafter: &'a Drafter,
    settings: &TriageSettings,
) -> Result<(Context<'a>, Baseline)> {
    let tb = Instant::now();
    let base_path = &session.paths[0];
    let base_prec = base_path.dtype;
    let base = TextModel::load(
        &session.spec,
        &base_path.view,
        Some(&base_path.view),
        base_prec,
    )?;
    let base_key = weights_key(
        &session.spec,
        &base_path.view,
        Some(&base_path.view),
        base_prec,
    );
    let mut cx = Context {
        session,
        drafter,
        base,
        base_prec,
        base_tokens: Vec::new(),
        base_outs: Vec::new(),
        base_feats: Vec::new(),
        base_key,
        prompt_lens: session.prompt_lens(),
        replay: settings.replay,
        seed: settings.seed,
    };
    cx.base_tokens = cx.trajectories(&cx.base, GdnForm::Chunked)?;
    cx.base_outs = cx
        .base_tokens
        .iter()
        .map(|t| cx.base.forward(t, None, GdnForm::Chunked, true))
        .collect::<Result<_>>()?;
    cx.base_feats = cx.feats_of(Taps::Offset(0))?;
    let (bd, bt) = cx.replay(&cx.base, &cx.base_tokens, &cx.base_feats)?;
    let b = drafter.cfg.block_size;
    let baseline = Baseline {
        path: LoadingPath::CausalLm,
        dtype: base_prec,
        gdn_form: GdnForm::Chunked,
        taps: drafter.cfg.target_layer_ids.clone(),
        tau_macro: tau(&bd, b),
        ddtree_tau_macro: tau(&bt, b),
        wall_s: tb.elapsed().as_secs_f64(),
    };
    Ok((cx, baseline))
}

/// Runs the triage matrix on `session` (opened on `causal-lm`). Returns the
/// result, its summary sentence and notes.
///
/// Errors: as the drafter loading ([`load_checked`]) and the model runs.
pub fn run(session: &Session, settings: &TriageSettings) -> Result<(Triage, String, Vec<String>)> {
    let t0 = Instant::now();
    let replay = Replay {
        rule: EndRule::GithubMain,
        ..settings.replay
    };
    let settings = &TriageSettings {
        replay,
        ..settings.clone()
    };
    let (drafter, _) = load_checked(session, &settings.drafter, replay, settings.position_shift)?;
    let mut notes = Vec::new();
    let (cx, baseline) = baseline(session, &drafter, settings)?;
    let plan = plan(&cx, settings, &mut notes);
    let pb = progress::single(plan.len() as u64 + 1, "runs", settings.quiet);
    pb.inc(1);
    let b = drafter.cfg.block_size;
    let h = session.paths[0].text_config.hidden_size;
    let tol = Tolerance::for_precision(cx.base_prec);
    let mut variants = Vec::new();
    for s in plan {
        pb.set_message(s.description());
        let tv = Instant::now();
        if let Some(o) = s.run(&cx, &mut notes)? {
            let (first_divergent, cos_min_at_taps) =
                tap_divergence(&o.feats_on_base, &cx.base_feats, cx.taps(), h, &tol)?;
            let tau_v = tau(&o.dflash, b);
            variants.push(VariantResult {
                name: s.name(),
                description: s.description(),
                first_divergent,
                cos_min_at_taps,
                tau_macro: tau_v,
                delta_tau: tau_v - baseline.tau_macro,
                ddtree_tau_macro: tau(&o.ddtree, b),
                consistent_with_observed: settings
                    .observed_tau
                    .map(|o| (tau_v - o).abs() <= 0.25f64.max(0.1 * o)),
                wall_s: if s.shares_forward() {
                    0.0
                } else {
                    tv.elapsed().as_secs_f64()
                },
            });
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    variants.sort_by(|a, b| b.delta_tau.abs().total_cmp(&a.delta_tau.abs()));
    let summary = summarize(&baseline, &variants, settings.observed_tau);
    let triage = Triage {
        baseline,
        variants,
        observed_tau: settings.observed_tau,
        wall_time_s: t0.elapsed().as_secs_f64(),
    };
    Ok((triage, summary, notes))
}

/// The summary sentence: the baseline τ, the costliest suspects, and those
/// consistent with the observed τ.
fn summarize(baseline: &Baseline, variants: &[VariantResult], observed: Option<f64>) -> String {
    let top: Vec<String> = variants
        .iter()
        .filter(|v| v.delta_tau < 0.0)
        .take(3)
        .map(|v| format!("{} (Δτ {:+.2})", v.name, v.delta_tau))
        .collect();
    let mut summary = format!(
        "baseline causal-lm τ {:.2}; {}",
        baseline.tau_macro,
        if top.is_empty() {
            "no suspect lowers τ".to_string()
        } else {
            format!("costliest suspects: {}", top.join(", "))
        }
    );
    if let Some(o) = observed {
        let ok: Vec<&str> = variants
            .iter()
            .filter(|v| v.consistent_with_observed == Some(true))
            .map(|v| v.name.as_str())
            .collect();
        summary.push_str(&format!(
            "; consistent with observed τ {o}: {}",
            if ok.is_empty() {
                "none".to_string()
            } else {
                ok.join(", ")
            }
        ));
    }
    summary
}
