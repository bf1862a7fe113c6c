//! From a group's teacher-forced sweep to its lanes' outcomes: each lane's
//! tap features, the replays of all its lanes in the same rounds, and on
//! supplied trajectories where each lane's argmax departs from them.

use candle_core::Tensor;

use super::forced;
use super::groups::{Base, Group, Outcome, Source};
use super::lanes::{self, Forcing, LaneEdit};
use super::suspects::{self, Taps};
use crate::drafter::target::TargetModel;
use crate::drafter::trajectories::{departures_of, Departure, Given};
use crate::drafter::{concat_taps, replay_sets, Replay, ReplaySet};
use crate::error::Result;
use crate::models::dflash::Drafter;

/// A group's teacher-forced sweep done: what the rest of its run reads.
pub(super) struct AfterSweep<'r> {
    /// Where its trajectories come from.
    pub(super) run: Source<'r>,
    /// The baseline's (or the supplied) tokens per prompt.
    pub(super) base_tokens: Vec<Vec<u32>>,
    /// New tokens replayed per prompt.
    pub(super) max_new: Vec<usize>,
    /// What its lanes × prompts fed (lane-major).
    pub(super) forcings: Vec<Forcing>,
    /// The baseline's own group.
    pub(super) own_base: bool,
    /// The sweep's outputs.
    pub(super) outs: forced::Swept,
}

impl AfterSweep<'_> {
    /// Each lane's features, its replays (all lanes in the same rounds) and
    /// outcome; the baseline's forward when this is its group.
    ///
    /// Errors: as [`replay_sets`]; a tensor failure.
    pub(super) fn finish(
        self,
        g: &Group,
        drafter: &Drafter,
        replay: Replay,
    ) -> Result<(Vec<Outcome>, Option<Base>)> {
        let n = g.target.spec.num_layers();
        let np = self.base_tokens.len();
        let taps = &drafter.cfg.target_layer_ids;
        let (outs, shadow_taps) = &self.outs;
        let mut lanes = Vec::with_capacity(g.lanes.len());
        let mut new_base: Option<Base> = None;
        for (j, l) in g.lanes.iter().enumerate() {
            let range = j * np..(j + 1) * np;
            let forced = outs[range.clone()]
                .iter()
                .map(|o| match self.own_base {
                    true => suspects::select(
                        &o.captures[..=n],
                        &o.captures[n + 1],
                        taps,
                        Taps::Offset(0),
                    ),
                    false => concat_taps(&o.captures),
                })
                .collect::<Result<Vec<_>>>()?;
            if l.suspect.is_none() {
                new_base = Some(Base {
                    tokens: self.base_tokens.clone(),
                    hidden: outs[range.clone()]
                        .iter()
                        .map(|o| o.captures.clone())
                        .collect(),
                    feats: forced.clone(),
                    max_new: self.max_new.clone(),
                    shadow_taps: shadow_taps.clone(),
                });
            }
            let lane = LaneRun {
                forcings: &self.forcings[range.clone()],
                range,
            };
            let replayed = match &self.run {
                Source::Generated(gen) => lane.generated(replay, gen),
                Source::Given(t) => lane.given(t, &forced),
            };
            lanes.push((lane, forced, replayed));
        }
        let inputs: Vec<&ReplayInputs> = lanes.iter().map(|(_, _, r)| r).collect();
        let replayed = replay_lanes(g, drafter, &inputs, replay)?;
        let mut outcomes = Vec::with_capacity(lanes.len());
        for (((lane, forced, inputs), r), l) in lanes.into_iter().zip(replayed).zip(&g.lanes) {
            outcomes.push(match &self.run {
                Source::Generated(gen) => {
                    lane.generated_outcome(&l.edit, forced, gen, inputs, r)?
                }
                Source::Given(t) => {
                    let outs = &outs[lane.range.clone()];
                    lane.given_outcome(&l.edit, forced, t, outs, inputs, r)?
                }
            });
        }
        Ok((outcomes, new_base))
    }
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
        let compared = lanes::compared(
            edit,
            forced,
            &gen.features[self.range.clone()],
            self.forcings,
        )?;
        Ok(self.outcome(
            compared,
            inputs,
            (dflash, ddtree),
            gen.sweeps + 1,
            Vec::new(),
        ))
    }

    /// The lane's outcome: its features as compared, the tokens it
    /// replayed, its τ, its sweeps and departures (`wall_s` set by the
    /// caller, which times the group).
    fn outcome(
        &self,
        (feats_on_base, reference): (Vec<Tensor>, Option<Vec<Tensor>>),
        inputs: ReplayInputs,
        (dflash, ddtree): crate::drafter::Replayed,
        sweeps: usize,
        departures: Vec<Departure>,
    ) -> Outcome {
        Outcome {
            feats_on_base,
            reference,
            base_skip: self.forcings.iter().map(|f| f.base_skip).collect(),
            tokens: inputs.tokens,
            prompt_lens: inputs.lens,
            dflash,
            ddtree,
            wall_s: 0.0,
            sweeps,
            departures,
        }
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
        let compared = lanes::compared(edit, forced, &[], self.forcings)?;
        Ok(self.outcome(compared, inputs, (dflash, ddtree), 1, departures))
    }
}
