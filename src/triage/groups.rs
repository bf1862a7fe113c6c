//! How triage runs its suspects: suspects that read the same weights in the
//! same dtype with the same lm_head form a group whose lanes advance
//! together in one DFlash loop (one sweep per round for all of them) and one
//! teacher-forced sweep over the baseline's tokens; tap suspects read the
//! baseline's forward. With supplied trajectories there is no generation:
//! one teacher-forced sweep over the given tokens (as each lane's edit
//! changes them), every group's target layer by layer together, gives every
//! lane's taps (for its replay and its divergence) and logits (checked
//! against the given tokens). A suspect whose run would be a lane's bit for
//! bit is that lane's alias ([`Group::aliases`]).

use std::time::Instant;

use candle_core::Tensor;

use super::forced;
use super::lanes::{self, Forcing, LaneEdit};
use super::outcomes::AfterSweep;
use super::suspects::{Head, Recipe, Weights};
use crate::drafter::eval::PromptTau;
use crate::drafter::generate::{dflash_loop_with, Lane};
use crate::drafter::target::TargetModel;
use crate::drafter::trajectories::{Departure, Given};
use crate::drafter::Replay;
use crate::error::Result;
use crate::loading::resident::Resident;
use crate::loading::WeightSource;
use crate::models::dflash::Drafter;
use crate::models::GdnForm;
use crate::session::{weights_key, Session};

/// What a suspect's run gives: its tap features on the baseline trajectory,
/// and its DFlash and DDTree replays on its own trajectory.
#[derive(Clone)]
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
    /// Suspects whose run would be a lane's exactly (same target, tokens,
    /// form, positions and faults: another loading path that loads the same
    /// tensors): `(suspect, lane)`, the suspect taking the lane's outcome
    /// instead of running it again.
    pub aliases: Vec<(usize, usize)>,
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
pub(super) enum Source<'a> {
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
/// its own trajectory, a correct forward over its own tokens (supplied
/// trajectories run every group together instead: [`run_given`]). Returns
/// per lane its outcome, and the baseline when this is its group.
/// `on_progress` gets the new tokens the loop has committed over the
/// group's lanes ([`dflash_loop_with`], under `replay.rule`).
pub fn run_group(
    g: &Group,
    drafter: &Drafter,
    prompts: &[Vec<u32>],
    (replay, on_progress): (Replay, &dyn Fn(u64)),
    base: Option<&Base>,
) -> Result<(Vec<Outcome>, Option<Base>)> {
    let t0 = Instant::now();
    let np = prompts.len();
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let lanes = lanes_of(g, prompts);
    let own_base = base.is_none();
    let taps = &drafter.cfg.target_layer_ids;
    // The loop's prefills leave resume points for the sweep below.
    let keep = forced::kept(own_base, g.target.spec.num_layers(), taps);
    let mut gen = dflash_loop_with(
        &g.target,
        drafter,
        &lanes,
        replay.max_new,
        replay.rule,
        &keep,
        on_progress,
    )?;
    let base_tokens = match base {
        Some(b) => b.tokens.clone(),
        None => gen.tokens[..np].to_vec(),
    };
    let forcings = forcings_of(g, &base_tokens, &lens, Some(&gen.tokens));
    // The resume points (their rows kept) go once the sweep has read them.
    let resumes = std::mem::take(&mut gen.resumes);
    let swept = forced::sweep(g, (&forcings, &resumes), taps, own_base, false)?;
    drop(resumes);
    let swept = AfterSweep {
        run: Source::Generated(gen),
        base_tokens,
        max_new: vec![replay.max_new; np],
        forcings,
        own_base,
        outs: swept,
    };
    let (mut outcomes, new_base) = swept.finish(g, drafter, replay)?;
    let wall = t0.elapsed().as_secs_f64();
    outcomes.iter_mut().for_each(|o| o.wall_s = wall);
    Ok((outcomes, new_base))
}

/// What [`run_given`] hands each group's result to: the group, its lanes'
/// outcomes, the baseline's forward when it is the baseline's group.
pub type AfterGroup<'f> = dyn FnMut(&Group, Vec<Outcome>, Option<Base>) + 'f;

/// Every group on supplied trajectories `given`: their teacher-forced
/// sweeps in one pass over the layers ([`forced::sweep_groups`]: a layer's
/// bytes read once for every dtype and head), then each group's replays;
/// `after` gets each group's result as it is done (its made heads can go).
/// An outcome's `wall_s` is the shared sweep's seconds plus its group's
/// replays'.
///
/// Errors: as [`run_group`].
pub fn run_given(
    groups: &[Group],
    drafter: &Drafter,
    prompts: &[Vec<u32>],
    replay: Replay,
    given: &Given,
    after: &mut AfterGroup,
) -> Result<()> {
    let t0 = Instant::now();
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let forcings: Vec<Vec<Forcing>> = groups
        .iter()
        .map(|g| forcings_of(g, &given.tokens, &lens, None))
        .collect();
    let shares: Vec<forced::Share> = groups
        .iter()
        .zip(&forcings)
        .enumerate()
        .map(|(i, (group, forcings))| forced::Share {
            group,
            forcings,
            own_base: i == 0,
            resumes: &[],
        })
        .collect();
    let taps = &drafter.cfg.target_layer_ids;
    let swept = forced::sweep_groups(&shares, taps, true)?;
    let sweep_s = t0.elapsed().as_secs_f64();
    for ((i, g), (outs, forcings)) in groups
        .iter()
        .enumerate()
        .zip(swept.into_iter().zip(forcings))
    {
        let t = Instant::now();
        let swept = AfterSweep {
            run: Source::Given(given),
            base_tokens: given.tokens.clone(),
            max_new: given.replayed.clone(),
            forcings,
            own_base: i == 0,
            outs,
        };
        let (mut outcomes, base) = swept.finish(g, drafter, replay)?;
        let wall = sweep_s + t.elapsed().as_secs_f64();
        outcomes.iter_mut().for_each(|o| o.wall_s = wall);
        after(g, outcomes, base);
    }
    Ok(())
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
        aliases: Vec::new(),
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
            Some(g) => {
                // The same target, tokens and numerics as a lane already
                // there (another loading path that loads the same tensors):
                // its run is that lane's, bit for bit.
                let same = groups[g].lanes.iter().position(|x| {
                    x.head.is_none()
                        && (x.form, x.decode_shift) == (lane.form, lane.decode_shift)
                        && x.edit == lane.edit
                });
                match same {
                    Some(j) => groups[g].aliases.push((i, j)),
                    None => groups[g].lanes.push(lane),
                }
            }
            None => {
                // A run with its own numerics never takes another's lanes
                // (nor its aliases): its key is its own.
                let mut k = k;
                if spec.is_some() {
                    k.1.push(format!("own numerics: suspect {i}"));
                }
                keys.push(k);
                groups.push(Group {
                    target: t,
                    lanes: vec![lane],
                    shadow_taps: false,
                    aliases: Vec::new(),
                });
            }
        }
    }
    groups
}

#[cfg(test)]
mod tests;
