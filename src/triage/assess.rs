//! What triage says about each suspect beyond its τ: the per-prompt runs,
//! the 95 % interval on Δτ (a paired bootstrap over prompts,
//! [`crate::drafter::bootstrap`]), whether it is consistent with an
//! observed τ, where its output leaves the baseline's greedy continuation,
//! and the cheapest next check for the top suspect.

use serde::Serialize;

use candle_core::Tensor;

use super::batches::Ran;
use super::groups::Outcome;
use super::lanes::LaneEdit;
use super::suspects::{Recipe, Suspect};
use super::{Baseline, DivergenceOn, TriageSettings, VariantResult};
use crate::drafter::bootstrap::{Bootstrap, DeltaInterval};
use crate::drafter::eval::PromptTau;
use crate::drafter::trajectories::{Given, PathDepartures};
use crate::error::Result;
use crate::models::dflash::Drafter;
use crate::parity::noise::{BandRole, NoiseCell, NoiseFloor};
use crate::parity::{Accumulator, Tolerance, Verdict};
use crate::session::Session;

/// One prompt's run of a suspect (or the baseline): `per_prompt[]`.
#[derive(Debug, Clone, Serialize)]
pub struct PromptRun {
    /// τ on this prompt.
    pub tau: f64,
    /// `a + 1` per round.
    pub acceptance_lengths: Vec<usize>,
    /// The `max_new_tokens` tokens it generated after its prompt (the
    /// baseline's, for suspects that read the baseline's forward).
    pub tokens: Vec<u32>,
}

/// Per-prompt runs of an outcome (`max_new[k]` new tokens of prompt k).
pub fn per_prompt(o: &Outcome, max_new: &[usize]) -> Vec<PromptRun> {
    o.dflash
        .iter()
        .zip(&o.tokens)
        .zip(&o.prompt_lens)
        .zip(max_new)
        .map(|(((p, t), &n), &m)| PromptRun {
            tau: p.tau,
            acceptance_lengths: p.acceptance_lengths.clone(),
            tokens: t[n..(n + m).min(t.len())].to_vec(),
        })
        .collect()
}

/// τ per prompt.
pub fn taus(p: &[PromptTau]) -> Vec<f64> {
    p.iter().map(|x| x.tau).collect()
}

/// The interval on τ(suspect) − τ(baseline), paired over prompts.
pub fn interval(b: &Bootstrap, suspect: &[PromptTau], base: &[PromptTau]) -> Option<DeltaInterval> {
    b.delta(&taus(suspect), &taus(base))
}

/// `--observed-tau` consistency: the observed τ minus the baseline's lies in
/// the suspect's Δτ interval; without an interval (one prompt), |τ −
/// observed| ≤ max(0.25, 10 % of observed).
pub fn consistent(observed: f64, base_tau: f64, tau: f64, iv: Option<&DeltaInterval>) -> bool {
    match iv {
        Some(i) => i.contains(observed - base_tau),
        None => (tau - observed).abs() <= 0.25f64.max(0.1 * observed),
    }
}

/// Per prompt, the first of the `max_new` new tokens where the suspect's
/// output differs from the baseline's greedy continuation (`None`: it
/// never does), for suspects that generate their own continuation of the
/// same text.
pub fn departures(
    o: &Outcome,
    base_tokens: &[Vec<u32>],
    base_lens: &[usize],
    max_new: usize,
) -> Vec<Option<usize>> {
    o.tokens
        .iter()
        .zip(&o.prompt_lens)
        .zip(base_tokens.iter().zip(base_lens))
        .map(|((t, &n), (b, &bn))| {
            let ours = &t[n..(n + max_new).min(t.len())];
            let greedy = &b[bn..(bn + max_new).min(b.len())];
            ours.iter().zip(greedy).position(|(x, y)| x != y)
        })
        .collect()
}

/// What to run next for `top` (the costliest suspect): the check that
/// confirms or clears it, with the command when hsparity runs it.
/// `baseline_tau`: τ of the correct run; `checkpoint`, `drafter`: as given.
///
/// `run` holds the flags of the run that every printed command repeats
/// ([`RunFlags`]), so that each reproduces what the sentence says it gives.
pub fn next_check(top: &Suspect, baseline_tau: f64, run: &RunFlags) -> String {
    let checkpoint = &run.checkpoint;
    // ` --prompts FILE …`: nothing when the run used the built-in prompts.
    let prompts: String = run.prompts.iter().map(|f| format!(" {f}")).collect();
    let correct = format!(
        "`hsparity drafter {checkpoint} --drafter {} --paths causal-lm{prompts}{}` gives τ {baseline_tau:.2} with the correct loop",
        run.drafter, run.replay
    );
    match top {
        Suspect::HarnessGdnCrop => format!("run your harness with the Gated DeltaNet state rolled back to the accepted prefix (or the target re-run over it) instead of LinearAttentionLayer.crop: {correct}"),
        Suspect::GdnStateReset(_) => format!("rerun with prefix caching and chunked prefill off (vLLM: --no-enable-prefix-caching, a --max-num-batched-tokens above the longest prompt); {correct}"),
        Suspect::LeftPadUnmasked(_) => format!("pass the attention mask with left-padded batches (or run batch size 1): {correct}"),
        Suspect::KvFp8 => format!("serve with --kv-cache-dtype auto (or a checkpoint with calibrated KV scales) and compare τ: {correct}"),
        Suspect::ThinkingFlipped(v) => {
            let flipped: Vec<&str> = run
                .prompts
                .chunks(2)
                .filter(|f| f[0] != "--enable-thinking" && f[0] != "--chat")
                .flatten()
                .map(String::as_str)
                .collect();
            let flipped: String = flipped.iter().map(|f| format!(" {f}")).collect();
            // The drafter default is a prompt set, templated already.
            let render = match &run.default_set {
                Some(set) if run.prompts.is_empty() => format!(" --prompt-set {set}"),
                _ => format!("{flipped} --chat"),
            };
            format!("render the prompts as your harness does and compare: `hsparity prompts {checkpoint}{render} --enable-thinking {v}` shows them; {correct}")
        }
        Suspect::DrafterSwaAsFull => "check that your engine gives the drafter's sliding-window layers their window (vLLM PR #40898)".to_string(),
        Suspect::TapOffset(_) | Suspect::NormedLastTap => format!("print which hidden_states your harness concatenates for the drafter (tap L is hidden_states[L+1], pre-norm): {correct}"),
        Suspect::Positions(_) => format!("log the position ids your harness feeds after the prefill (they continue from the prompt length): {correct}"),
        Suspect::Vlm => format!("`hsparity compare {checkpoint} --paths causal-lm,vlm{prompts}` shows where the two loading paths part"),
        Suspect::Dtype(p) => format!("check the dtype your harness loads the target in (`hsparity inventory {checkpoint}` lists each path's); {p} costs what this row says"),
        Suspect::Recurrent => format!("check which delta-rule kernel your engine runs for multi-token forwards: {correct}"),
        Suspect::RouterDtype => format!("check that your engine computes the MoE router's softmax in f32 (transformers: softmax(router_logits, dtype=torch.float)): {correct}"),
        Suspect::MissingOn(_) | Suspect::RandomLmHead => format!("`hsparity inventory {checkpoint}` lists what each loading path leaves MISSING"),
    }
}

/// The flags of a triage run that a printed next check repeats.
#[derive(Debug, Clone)]
pub struct RunFlags {
    /// The checkpoint argument, shell-quoted.
    pub checkpoint: String,
    /// The drafter argument, shell-quoted.
    pub drafter: String,
    /// The prompt options as flags ([`crate::prompts::PromptOptions::to_flags`]).
    pub prompts: Vec<String>,
    /// ` --max-new-tokens N --ddtree-budget B` (and `--trajectories FILE`).
    pub replay: String,
    /// The drafter default's set (`mix:2`) when the run used it: a drafter
    /// command without prompt flags runs it again; `prompts` is told it.
    pub default_set: Option<String>,
}

/// What scoring a suspect's outcome against the baseline needs.
pub struct Scoring<'a> {
    /// The run's session.
    pub session: &'a Session,
    /// The drafter.
    pub drafter: &'a Drafter,
    /// The baseline's results.
    pub baseline: &'a Baseline,
    /// Every group's run.
    pub ran: &'a Ran,
    /// How intervals are drawn.
    pub boot: Bootstrap,
    /// The triage settings (`--observed-tau`).
    pub settings: &'a TriageSettings,
    /// `--trajectories`: every lane measured on them.
    pub given: Option<&'a Given>,
    /// What the inputs show of each suspect ([`super::evidence::Inputs`]).
    pub inputs_shown: &'a super::evidence::Inputs<'a>,
}

impl Scoring<'_> {
    /// What localisation knows of each prompt's rows: where its prompt ends
    /// (rows start at the first position the variant and the baseline share).
    fn inputs(&self, o: &Outcome) -> Vec<crate::parity::PromptInputs> {
        self.session
            .prompt_lens()
            .iter()
            .zip(&o.base_skip)
            .map(|(&n, &skip)| crate::parity::PromptInputs {
                prompt_end: n.checked_sub(skip),
                ..Default::default()
            })
            .collect()
    }

    /// Suspect `i`'s row: divergence at the taps (against the baseline's
    /// rows it compares with, or its own reference), τ, the Δτ interval,
    /// consistency, departures, per-prompt runs.
    ///
    /// Errors: a tensor failure.
    pub fn score(
        &self,
        i: usize,
        s: &Suspect,
        o: &Outcome,
        edit: Option<&LaneEdit>,
        recipe: &Recipe,
    ) -> Result<VariantResult> {
        let (ran, baseline, b) = (self.ran, self.baseline, self.drafter.cfg.block_size);
        let reference: Vec<Tensor> = match &o.reference {
            Some(r) => r.clone(),
            None => ran
                .base
                .feats
                .iter()
                .zip(&o.base_skip)
                .map(|(f, &k)| Ok(f.narrow(0, k, f.dim(0)? - k)?))
                .collect::<Result<_>>()?,
        };
        let same_dtype = match recipe {
            Recipe::Model { prec, .. } => *prec == baseline.dtype,
            _ => true,
        };
        // The band is measured on the baseline's teacher-forced tokens: it
        // bounds the comparisons made there, not a loop's own trajectory
        // against a forward over it (decode against prefill arithmetic).
        let on_base = o.reference.is_none();
        let floor = baseline
            .tap_noise_floor
            .as_ref()
            .filter(|_| same_dtype && on_base);
        let (first_divergent, cos_min_at_taps, taps_depart, tap_noise_ratio) = tap_divergence(
            &o.feats_on_base,
            &reference,
            &self.drafter.cfg.target_layer_ids,
            self.session.paths[0].text_config.hidden_size,
            (&Tolerance::for_precision(baseline.dtype), floor),
            &self.inputs(o),
        )?;
        let tau_v = super::tau(&o.dflash, b);
        let iv = interval(&self.boot, &o.dflash, &ran.baseline.dflash);
        let same_text = edit.is_none_or(LaneEdit::same_conversation_text);
        // With supplied trajectories no suspect generates its own
        // continuation: its departures from the given tokens say it instead.
        let own_run = matches!(recipe, Recipe::Model { .. }) && same_text && self.given.is_none();
        let max_new = &ran.base.max_new;
        Ok(VariantResult {
            name: s.name(),
            group: s.group(),
            description: s.description(),
            evidence: self.inputs_shown.of(s),
            first_divergent,
            cos_min_at_taps,
            taps_depart,
            tap_noise_ratio,
            tau_macro: tau_v,
            delta_tau: tau_v - baseline.tau_macro,
            delta_tau_interval: iv,
            ddtree_tau_macro: super::tau(&o.ddtree, b),
            consistent_with_observed: self
                .settings
                .observed_tau
                .map(|x| consistent(x, baseline.tau_macro, tau_v, iv.as_ref())),
            divergence_on: if o.reference.is_some() {
                DivergenceOn::OwnTrajectory
            } else {
                DivergenceOn::BaselineTrajectory
            },
            departs_from_greedy_at: own_run.then(|| {
                departures(
                    o,
                    &ran.base.tokens,
                    &self.session.prompt_lens(),
                    self.settings.replay.max_new,
                )
            }),
            per_prompt: per_prompt(o, max_new),
            wall_s: o.wall_s,
            sweeps: o.sweeps,
            shared_sweeps_with: ran.shared[i].clone(),
            departures: self
                .given
                .filter(|_| !matches!(recipe, Recipe::Taps(_) | Recipe::Drafter(_)))
                .map(|g| PathDepartures::new(&s.name(), super::checked(g), &o.departures)),
        })
    }
}

/// Per-tap divergence: the first tap whose features fail `tol` (with the
/// tap's band of `floor` bounding its pass thresholds, where the baseline's
/// taps have one: [`BandRole::Bounds`]), the smallest cosine over all taps,
/// where along the rows that tap departs
/// ([`crate::parity::localise::where_known`]: per prompt, the first
/// departing row, and the end of the prompt when it departs there, from
/// `inputs`), and with a floor the taps' largest difference over their
/// bands (`Some(None)`: over an empty band). `a`, `b`: per prompt `[T, K·H]`.
fn tap_divergence(
    a: &[Tensor],
    b: &[Tensor],
    taps: &[usize],
    h: usize,
    (tol, floor): (&Tolerance, Option<&NoiseFloor>),
    inputs: &[crate::parity::PromptInputs],
) -> Result<TapDivergence> {
    if a.len() != b.len() {
        return Err(crate::error::Error::Input(format!(
            "tap divergence needs features of the same prompts: {} vs {}",
            a.len(),
            b.len()
        )));
    }
    let mut first = None;
    let mut cos_min = f64::INFINITY;
    let mut where_ = None;
    // The largest ratio over the taps with a band (`None`: one over an empty band).
    let (mut banded, mut worst) = (false, Some(0.0f64));
    for (j, &l) in taps.iter().enumerate() {
        let mut acc = Accumulator::default();
        for (k, (x, y)) in a.iter().zip(b).enumerate() {
            acc.add(k, &x.narrow(1, j * h, h)?, &y.narrow(1, j * h, h)?)?;
        }
        let m = acc.finish();
        cos_min = cos_min.min(m.cos_min);
        let band = floor.and_then(|f| f.band(l + 1));
        let tol = match band {
            Some(b) => BandRole::Bounds.tolerance(*tol, b),
            None => *tol,
        };
        if let Some(b) = band {
            banded = true;
            let finite = m.nan_count + m.inf_count == 0;
            worst = match (worst, NoiseCell::of(b, &m).ratio.filter(|_| finite)) {
                (Some(x), Some(y)) => Some(x.max(y)),
                _ => None,
            };
        }
        if first.is_none() && tol.judge(&m) != Verdict::Pass {
            first = Some(l + 1);
            let agreement: Vec<crate::parity::PromptAgreement> = m
                .profile
                .iter()
                .map(|rows| crate::parity::PromptAgreement::of(rows, &tol))
                .collect();
            let found = crate::parity::localise::where_known(l + 1, &agreement, inputs);
            where_ = Some(found.replace(
                &format!("hidden_states[{}]: ", l + 1),
                &format!("tap {l} (hidden_states[{}]): ", l + 1),
            ));
        }
    }
    Ok((first, cos_min, where_, banded.then_some(worst)))
}

/// What [`tap_divergence`] finds: the first divergent tap (as a
/// `hidden_states` index), the smallest cosine, where it departs, and the
/// largest difference over the taps' noise bands.
type TapDivergence = (Option<usize>, f64, Option<String>, Option<Option<f64>>);
