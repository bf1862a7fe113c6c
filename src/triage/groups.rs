//! How triage runs its suspects: suspects that read the same weights in the
//! same dtype with the same lm_head form a group whose lanes advance
//! together in one DFlash loop (one sweep per round for all of them) and one
//! teacher-forced sweep over the baseline's tokens; tap suspects read the
//! baseline's forward. With supplied trajectories there is no generation:
//! one teacher-forced sweep per group over the given tokens (as each lane's
//! edit changes them) gives every lane's taps (for its replay and its
//! divergence) and logits (checked against the given tokens).

use std::time::Instant;

use candle_core::Tensor;

use super::forced;
use super::lanes::{self, Forcing, LaneEdit};
use super::suspects::{self, Head, Recipe, Taps, Weights};
use crate::drafter::eval::PromptTau;
use crate::drafter::generate::{dflash_loop_with, Lane};
use crate::drafter::target::TargetModel;
use crate::drafter::trajectories::{departures_of, Departure, Given};
use crate::drafter::{concat_taps, replay_sets, Replay, ReplaySet};
use crate::error::Result;
use crate::loading::resident::Resident;
use crate::loading::WeightSource;
use crate::models::dflash::Drafter;
use crate::models::GdnForm;
use crate::session::{weights_key, Session};

/// What a suspect's run gives: its tap features on the baseline trajectory,
/// and its DFlash and DDTree replays on its own trajectory.
pub struct Outcome {
    /// Per prompt `[T, K·H]`, on the baseline's tokens (the rows compared
    /// with the baseline's from `base_skip` on); on its own tokens when
    /// `reference` is set.
    pub feats_on_base: Vec<Tensor>,
    /// What `feats_on_base` is compared with when not the baseline's
    /// features: a correct forward over the suspect's own tokens.
    pub reference: Option<Vec<Tensor>>,
    /// Per prompt: the baseline's first compared row.
    pub base_skip: Vec<usize>,
    /// Per prompt: its prompt (as fed) + continuation.
    pub tokens: Vec<Vec<u32>>,
    /// Per prompt: its prompt's length as fed.
    pub prompt_lens: Vec<usize>,
    /// DFlash per prompt.
    pub dflash: Vec<PromptTau>,
    /// DDTree per prompt.
    pub ddtree: Vec<PromptTau>,
    /// Seconds of the run.
    pub wall_s: f64,
    /// Sweeps of the run.
    pub sweeps: usize,
    /// Departures from the supplied trajectories (empty without them).
    pub departures: Vec<Departure>,
}

impl Outcome {
    /// The outcome of a suspect that reads the baseline's forward (tap and
    /// drafter suspects): `feats` on its tokens, the replays `replayed`.
    pub fn on_base(
        feats: Vec<Tensor>,
        base: &Base,
        session: &Session,
        replayed: crate::drafter::Replayed,
    ) -> Self {
        Outcome {
            base_skip: vec![0; feats.len()],
            feats_on_base: feats,
            reference: None,
            tokens: base.tokens.clone(),
            prompt_lens: session.prompt_lens(),
            dflash: replayed.0,
            ddtree: replayed.1,
            wall_s: 0.0,
            sweeps: 0,
            departures: Vec::new(),
        }
    }
}

/// One lane of a group run: a suspect (or the baseline) and how it runs.
pub struct LaneSpec<'a> {
    /// Index into the plan; `None` for the baseline.
    pub suspect: Option<usize>,
    /// Delta-rule form.
    pub form: GdnForm,
    /// Positions after the prompt shifted by this.
    pub decode_shift: usize,
    /// Faults and prompt changes ([`LaneEdit`]).
    pub edit: LaneEdit,
    /// Its own `lm_head` where the group's is not its: a suspect whose
    /// target differs from the baseline's in the head alone, measured on
    /// supplied trajectories, where its hidden states are the baseline's
    /// and only its logits and drafts go through its head.
    pub head: Option<&'a dyn WeightSource>,
}

/// Runs that read the same weights in the same dtype with the same lm_head:
/// their lanes advance together in one DFlash loop (one sweep per round for
/// all of them) and one teacher-forced sweep over the baseline's tokens.
pub struct Group<'a> {
    /// The target every lane runs on.
    pub target: TargetModel<'a>,
    /// The lanes (the baseline's first in its group).
    pub lanes: Vec<LaneSpec<'a>>,
    /// Run the baseline's lane again through the noise shadow in the
    /// teacher-forced sweep, for the floor of its taps (the baseline's group
    /// in half precision; [`Base::shadow_taps`]).
    pub shadow_taps: bool,
}

/// What the baseline's run leaves for the suspects.
pub struct Base {
    /// Prompt + greedy continuation per prompt.
    pub tokens: Vec<Vec<u32>>,
    /// Per prompt: `hidden_states[0..=N]`, then the raw last-layer output.
    pub hidden: Vec<Vec<Tensor>>,
    /// Its tap features (teacher-forced over its tokens).
    pub feats: Vec<Tensor>,
    /// New tokens replayed per prompt.
    pub max_new: Vec<usize>,
    /// Per prompt, the taps of the baseline's noise shadow over its tokens
    /// (one `[T, H]` per tap), when its group ran it ([`Group::shadow_taps`]).
    pub shadow_taps: Option<forced::ShadowTaps>,
}

/// Where a group's own trajectories come from.
enum Source<'a> {
    /// Generated by the DFlash loop (one lane per suspect × prompt).
    Generated(crate::drafter::generate::Generation),
    /// Supplied: every lane is measured on them.
    Given(&'a Given),
}

/// Every lane of `g` × every prompt, as the DFlash loop runs them.
fn lanes_of(g: &Group, prompts: &[Vec<u32>]) -> Vec<Lane> {
    g.lanes
        .iter()
        .flat_map(|l| {
            prompts.iter().enumerate().map(move |(k, p)| Lane {
                prompt: l.edit.prompt(k, p),
                form: l.form,
                decode_shift: l.decode_shift,
                faults: l.edit.faults(p.len()),
            })
        })
        .collect()
}

/// What every lane × prompt of `g` feeds teacher-forced: the baseline's
/// (or the supplied) `tokens` (prompts of `lens`) as its edit changes them,
/// or its own generated tokens (`own`, lane-major; none with supplied
/// trajectories, where no lane is measured on its own trajectory).
fn forcings_of(
    g: &Group,
    tokens: &[Vec<u32>],
    lens: &[usize],
    own: Option<&[Vec<u32>]>,
) -> Vec<Forcing> {
    let np = tokens.len();
    g.lanes
        .iter()
        .enumerate()
        .flat_map(|(j, l)| {
            (0..np).map(move |k| match own {
                Some(own) => lanes::forcing_for(&l.edit, k, &tokens[k], lens[k], &own[j * np + k]),
                None => l.edit.forcing(k, &tokens[k], lens[k]),
            })
        })
        .collect()
}

/// The group's lanes × prompts through the DFlash loop, then one
/// teacher-forced sweep over the baseline's tokens (`base`; `None` for the
/// baseline's own group, whose tokens it generates) — for a lane measured on
/// its own trajectory, a correct forward over its own tokens. With `given`
/// trajectories only the teacher-forced sweep runs, over them. Returns per
/// lane its outcome, and the baseline when this is its group.
/// `on_progress` gets the new tokens the loop has committed over the
/// group's lanes ([`dflash_loop_with`], under `replay.rule`).
pub fn run_group(
    g: &Group,
    drafter: &Drafter,
    prompts: &[Vec<u32>],
    (replay, on_progress): (Replay, &dyn Fn(u64)),
    base: Option<&Base>,
    given: Option<&Given>,
) -> Result<(Vec<Outcome>, Option<Base>)> {
    let t0 = Instant::now();
    let np = prompts.len();
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let (run, base_tokens, max_new) = match given {
        Some(t) => (Source::Given(t), t.tokens.clone(), t.replayed.clone()),
        None => {
            let lanes = lanes_of(g, prompts);
            let gen = dflash_loop_with(
                &g.target,
                drafter,
                &lanes,
                replay.max_new,
                replay.rule,
                on_progress,
            )?;
            let tokens = match base {
                Some(b) => b.tokens.clone(),
                None => gen.tokens[..np].to_vec(),
            };
            (Source::Generated(gen), tokens, vec![replay.max_new; np])
        }
    };
    let n = g.target.spec.num_layers();
    let taps = &drafter.cfg.target_layer_ids;
    let own = match &run {
        Source::Generated(gen) => Some(gen.tokens.as_slice()),
        Source::Given(_) => None,
    };
    let forcings = forcings_of(g, &base_tokens, &lens, own);
    let own_base = base.is_none();
    let (outs, shadow_taps) = forced::sweep(g, &forcings, taps, own_base, given.is_some())?;
    let mut lanes = Vec::with_capacity(g.lanes.len());
    let mut new_base: Option<Base> = None;
    for (j, l) in g.lanes.iter().enumerate() {
        let range = j * np..(j + 1) * np;
        let forced = outs[range.clone()]
            .iter()
            .map(|o| match own_base {
                true => {
                    suspects::select(&o.captures[..=n], &o.captures[n + 1], taps, Taps::Offset(0))
                }
                false => concat_taps(&o.captures),
            })
            .collect::<Result<Vec<_>>>()?;
        if l.suspect.is_none() {
            new_base = Some(Base {
                tokens: base_tokens.clone(),
                hidden: outs[range.clone()]
                    .iter()
                    .map(|o| o.captures.clone())
                    .collect(),
                feats: forced.clone(),
                max_new: max_new.clone(),
                shadow_taps: shadow_taps.clone(),
            });
        }
        let lane = LaneRun {
            forcings: &forcings[range.clone()],
            range,
        };
        let replayed = match &run {
            Source::Generated(gen) => lane.generated(replay, gen),
            Source::Given(t) => lane.given(t, &forced),
        };
        lanes.push((lane, forced, replayed));
    }
    let inputs: Vec<&ReplayInputs> = lanes.iter().map(|(_, _, r)| r).collect();
    let replayed = replay_lanes(g, drafter, &inputs, replay)?;
    let mut outcomes = Vec::with_capacity(lanes.len());
    for (((lane, forced, inputs), r), l) in lanes.into_iter().zip(replayed).zip(&g.lanes) {
        outcomes.push(match &run {
            Source::Generated(gen) => lane.generated_outcome(&l.edit, forced, gen, inputs, r)?,
            Source::Given(t) => {
                let outs = &outs[lane.range.clone()];
                lane.given_outcome(&l.edit, forced, t, outs, inputs, r)?
            }
        });
    }
    let wall = t0.elapsed().as_secs_f64();
    outcomes.iter_mut().for_each(|o| o.wall_s = wall);
    Ok((outcomes, new_base))
}

/// Every lane's replays (`inputs`, lane order) in the same rounds: one
/// `lm_head` pass per round and head.
///
/// Errors: as [`replay_sets`].
fn replay_lanes(
    g: &Group,
    drafter: &Drafter,
    inputs: &[&ReplayInputs],
    replay: Replay,
) -> Result<Vec<crate::drafter::Replayed>> {
    let targets: Vec<TargetModel> = g
        .lanes
        .iter()
        .map(|l| TargetModel {
            head: l.head.unwrap_or(g.target.head),
            ..g.target
        })
        .collect();
    let sets: Vec<ReplaySet> = inputs
        .iter()
        .zip(&targets)
        .map(|(r, t)| r.set(drafter, t))
        .collect();
    replay_sets(&sets, replay)
}

/// One lane's outcome from its group's runs.
struct LaneRun<'a> {
    /// What the lane fed teacher-forced, per prompt.
    forcings: &'a [Forcing],
    /// Its rows of the group's lanes × prompts.
    range: std::ops::Range<usize>,
}

/// What a lane replays: its trajectories, their prompts and new tokens,
/// and the features the drafter reads.
struct ReplayInputs {
    tokens: Vec<Vec<u32>>,
    lens: Vec<usize>,
    max_new: Vec<usize>,
    feats: Vec<Tensor>,
}

impl ReplayInputs {
    /// Its replay with `drafter` through `target`.
    fn set<'a>(&'a self, drafter: &'a Drafter, target: &'a TargetModel<'a>) -> ReplaySet<'a> {
        ReplaySet {
            drafter,
            target,
            tokens: &self.tokens,
            prompt_lens: &self.lens,
            max_new: &self.max_new,
            feats: &self.feats,
        }
    }
}

impl LaneRun<'_> {
    /// From the DFlash loop: the lane's own trajectory (`gen`'s rows) and
    /// the features the loop made over it.
    fn generated(
        &self,
        replay: Replay,
        gen: &crate::drafter::generate::Generation,
    ) -> ReplayInputs {
        let lens: Vec<usize> = self.forcings.iter().map(|f| f.prompt_len).collect();
        ReplayInputs {
            tokens: gen.tokens[self.range.clone()].to_vec(),
            max_new: vec![replay.max_new; lens.len()],
            lens,
            feats: gen.features[self.range.clone()].to_vec(),
        }
    }

    /// τ on its own trajectory (`replayed`), divergence from its
    /// teacher-forced `forced` features.
    fn generated_outcome(
        &self,
        edit: &LaneEdit,
        forced: Vec<Tensor>,
        gen: &crate::drafter::generate::Generation,
        inputs: ReplayInputs,
        (dflash, ddtree): crate::drafter::Replayed,
    ) -> Result<Outcome> {
        let (feats_on_base, reference) = lanes::compared(
            edit,
            forced,
            &gen.features[self.range.clone()],
            self.forcings,
        )?;
        Ok(Outcome {
            feats_on_base,
            reference,
            base_skip: self.forcings.iter().map(|f| f.base_skip).collect(),
            tokens: inputs.tokens,
            prompt_lens: inputs.lens,
            dflash,
            ddtree,
            wall_s: 0.0,
            sweeps: gen.sweeps + 1,
            departures: Vec::new(),
        })
    }

    /// On supplied trajectories `t`: the tokens the lane fed (the given
    /// ones as its edit changes them) and its teacher-forced `forced`
    /// features.
    fn given(&self, t: &Given, forced: &[Tensor]) -> ReplayInputs {
        ReplayInputs {
            tokens: self.forcings.iter().map(|f| f.tokens.clone()).collect(),
            lens: self.forcings.iter().map(|f| f.prompt_len).collect(),
            max_new: t.replayed.clone(),
            feats: forced.to_vec(),
        }
    }

    /// τ from `replayed`, its departures from the given tokens from the
    /// sweep's logits (`outs`).
    fn given_outcome(
        &self,
        edit: &LaneEdit,
        forced: Vec<Tensor>,
        t: &Given,
        outs: &[crate::drafter::target::StepOut],
        inputs: ReplayInputs,
        (dflash, ddtree): crate::drafter::Replayed,
    ) -> Result<Outcome> {
        let departures = departures_of(t, outs)?;
        let (feats_on_base, reference) = lanes::compared(edit, forced, &[], self.forcings)?;
        Ok(Outcome {
            feats_on_base,
            reference,
            base_skip: self.forcings.iter().map(|f| f.base_skip).collect(),
            tokens: inputs.tokens,
            prompt_lens: inputs.lens,
            dflash,
            ddtree,
            wall_s: 0.0,
            sweeps: 1,
            departures,
        })
    }
}

/// A suspect's weights and head as a [`TargetModel`] (`base`: the
/// baseline's weights source). Returns the target and, for another path,
/// the resident copy it reads from (kept alive by the caller).
fn target_of<'a>(
    session: &'a Session,
    base: &'a dyn WeightSource,
    recipe: &'a Recipe,
    resident: &'a Option<Resident>,
) -> Option<TargetModel<'a>> {
    let Recipe::Model {
        weights,
        prec,
        head,
        spec,
        ..
    } = recipe
    else {
        return None;
    };
    let w: &dyn WeightSource = match (weights, resident) {
        (Weights::Base, _) => base,
        (Weights::Path(_), Some(r)) => r,
        (Weights::Path(p), None) => &p.view,
    };
    let h: &dyn WeightSource = match head {
        Head::Base => base,
        Head::Own => w,
        Head::Made(m) => m,
    };
    Some(TargetModel {
        spec: spec.as_deref().unwrap_or(&session.spec),
        weights: w,
        head: h,
        prec: *prec,
    })
}

/// The groups of a triage run: the baseline's first (its lane first), then
/// one per distinct target; every model suspect is a lane of one group. On
/// supplied trajectories (`given`) a suspect that differs from the baseline
/// in its `lm_head` alone is a lane of the baseline's group with its own
/// head ([`LaneSpec::head`]).
pub fn build<'a>(
    session: &'a Session,
    base_target: TargetModel<'a>,
    recipes: &'a [Recipe],
    residents: &'a [Option<Resident>],
    given: bool,
) -> Vec<Group<'a>> {
    let key_of = |t: &TargetModel| weights_key(t.spec, t.weights, Some(t.head), t.prec);
    let body_of = |t: &TargetModel| weights_key(t.spec, t.weights, None, t.prec);
    let mut groups = vec![Group {
        target: base_target,
        lanes: vec![LaneSpec {
            suspect: None,
            form: GdnForm::Chunked,
            decode_shift: 0,
            edit: LaneEdit::default(),
            head: None,
        }],
        shadow_taps: false,
    }];
    let mut keys = vec![key_of(&base_target)];
    for (i, r) in recipes.iter().enumerate() {
        let Recipe::Model {
            form,
            decode_shift,
            lane: edit,
            spec,
            ..
        } = r
        else {
            continue;
        };
        let Some(t) = target_of(session, base_target.weights, r, &residents[i]) else {
            continue;
        };
        let lane = LaneSpec {
            suspect: Some(i),
            form: *form,
            decode_shift: *decode_shift,
            edit: edit.clone(),
            head: None,
        };
        let k = key_of(&t);
        let head_only = given
            && spec.is_none()
            && (lane.form, lane.decode_shift) == (GdnForm::Chunked, 0)
            && lane.edit == LaneEdit::default()
            && body_of(&t) == body_of(&base_target);
        if head_only && k != keys[0] {
            groups[0].lanes.push(LaneSpec {
                head: Some(t.head),
                ..lane
            });
            continue;
        }
        // A run with its own numerics (spec) never shares sweeps.
        let shared = spec.is_none().then(|| keys.iter().position(|x| *x == k));
        match shared.flatten() {
            Some(g) => groups[g].lanes.push(lane),
            None => {
                keys.push(k);
                groups.push(Group {
                    target: t,
                    lanes: vec![lane],
                    shadow_taps: false,
                });
            }
        }
    }
    groups
}
