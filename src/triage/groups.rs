//! How triage runs its suspects: suspects that read the same weights in the
//! same dtype with the same lm_head form a group whose lanes advance
//! together in one DFlash loop (one sweep per round for all of them) and one
//! teacher-forced sweep over the baseline's tokens; tap suspects read the
//! baseline's forward.

use std::time::Instant;

use candle_core::Tensor;

use super::lanes::{self, Forcing, LaneEdit};
use super::suspects::{self, Head, Recipe, Taps, Weights};
use crate::drafter::eval::PromptTau;
use crate::drafter::generate::{dflash_loop, Lane};
use crate::drafter::target::{Capture, TargetModel};
use crate::drafter::{concat_taps, replay_all, teacher_forced, Forced, Replay};
use crate::error::Result;
use crate::loading::resident::Resident;
use crate::loading::WeightSource;
use crate::models::dflash::Drafter;
use crate::models::GdnForm;
use crate::progress;
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
        }
    }
}

/// One lane of a group run: a suspect (or the baseline) and how it runs.
pub struct LaneSpec {
    /// Index into the plan; `None` for the baseline.
    pub suspect: Option<usize>,
    /// Delta-rule form.
    pub form: GdnForm,
    /// Positions after the prompt shifted by this.
    pub decode_shift: usize,
    /// Faults and prompt changes ([`LaneEdit`]).
    pub edit: LaneEdit,
}

/// Runs that read the same weights in the same dtype with the same lm_head:
/// their lanes advance together in one DFlash loop (one sweep per round for
/// all of them) and one teacher-forced sweep over the baseline's tokens.
pub struct Group<'a> {
    /// The target every lane runs on.
    pub target: TargetModel<'a>,
    /// The lanes (the baseline's first in its group).
    pub lanes: Vec<LaneSpec>,
}

/// What the baseline's run leaves for the suspects.
pub struct Base {
    /// Prompt + greedy continuation per prompt.
    pub tokens: Vec<Vec<u32>>,
    /// Per prompt: `hidden_states[0..=N]`, then the raw last-layer output.
    pub hidden: Vec<Vec<Tensor>>,
    /// Its tap features (teacher-forced over its tokens).
    pub feats: Vec<Tensor>,
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
/// `tokens` (prompts of `lens`) as its edit changes them, or its own
/// generated tokens (`own`, lane-major).
fn forcings_of(g: &Group, tokens: &[Vec<u32>], lens: &[usize], own: &[Vec<u32>]) -> Vec<Forcing> {
    let np = tokens.len();
    g.lanes
        .iter()
        .enumerate()
        .flat_map(|(j, l)| {
            (0..np)
                .map(move |k| lanes::forcing_for(&l.edit, k, &tokens[k], lens[k], &own[j * np + k]))
        })
        .collect()
}

/// The group's lanes × prompts through the DFlash loop, then one
/// teacher-forced sweep over the baseline's tokens (`base`; `None` for the
/// baseline's own group, whose tokens it generates) — for a lane measured on
/// its own trajectory, a correct forward over its own tokens. Returns per
/// lane its outcome, and the baseline when this is its group.
pub fn run_group(
    g: &Group,
    drafter: &Drafter,
    prompts: &[Vec<u32>],
    replay: Replay,
    base: Option<&Base>,
) -> Result<(Vec<Outcome>, Option<Base>)> {
    let t0 = Instant::now();
    let np = prompts.len();
    let lanes = lanes_of(g, prompts);
    let gen = dflash_loop(&g.target, drafter, &lanes, replay.max_new, &|_| {})?;
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let base_tokens: Vec<Vec<u32>> = match base {
        Some(b) => b.tokens.clone(),
        None => gen.tokens[..np].to_vec(),
    };
    // Divergence on the baseline's tokens: each lane's taps; the baseline's
    // own lane keeps every hidden state (the tap suspects read them).
    let n = g.target.spec.num_layers();
    let taps = &drafter.cfg.target_layer_ids;
    let all: Vec<Capture> = (0..=n)
        .map(Capture::Hidden)
        .chain([Capture::Tap(n - 1)])
        .collect();
    let tap_caps: Vec<Capture> = taps.iter().map(|&l| Capture::Tap(l)).collect();
    let forcings = forcings_of(g, &base_tokens, &lens, &gen.tokens);
    let seqs: Vec<Forced> = forcings
        .iter()
        .zip(g.lanes.iter().flat_map(|l| std::iter::repeat_n(l, np)))
        .map(|(f, l)| Forced {
            tokens: &f.tokens,
            prompt_len: f.prompt_len,
            form: l.form,
            decode_shift: l.decode_shift,
            faults: f.faults,
        })
        .collect();
    let own_base = base.is_none();
    let caps = if own_base { &all } else { &tap_caps };
    let outs = teacher_forced(&g.target, &seqs, caps, false)?;
    let mut outcomes = Vec::new();
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
        let own_lens: Vec<usize> = lanes[range.clone()]
            .iter()
            .map(|l| l.prompt.len())
            .collect();
        let (dflash, ddtree) = replay_all(
            drafter,
            &g.target,
            &gen.tokens[range.clone()],
            &own_lens,
            &gen.features[range.clone()],
            replay,
        )?;
        if l.suspect.is_none() {
            new_base = Some(Base {
                tokens: base_tokens.clone(),
                hidden: outs[range.clone()]
                    .iter()
                    .map(|o| o.captures.clone())
                    .collect(),
                feats: forced.clone(),
            });
        }
        let (feats_on_base, reference) = lanes::compared(
            &l.edit,
            forced,
            &gen.features[range.clone()],
            &forcings[range.clone()],
        )?;
        outcomes.push(Outcome {
            feats_on_base,
            reference,
            base_skip: forcings[range.clone()]
                .iter()
                .map(|f| f.base_skip)
                .collect(),
            tokens: gen.tokens[range.clone()].to_vec(),
            prompt_lens: own_lens,
            dflash,
            ddtree,
            wall_s: 0.0,
            sweeps: gen.sweeps + 1,
        });
    }
    let wall = t0.elapsed().as_secs_f64();
    outcomes.iter_mut().for_each(|o| o.wall_s = wall);
    Ok((outcomes, new_base))
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
        spec: &session.spec,
        weights: w,
        head: h,
        prec: *prec,
    })
}

/// The groups of a triage run: the baseline's first (its lane first), then
/// one per distinct target; every model suspect is a lane of one group.
pub fn build<'a>(
    session: &'a Session,
    base_target: TargetModel<'a>,
    recipes: &'a [Recipe],
    residents: &'a [Option<Resident>],
) -> Vec<Group<'a>> {
    let key_of = |t: &TargetModel| weights_key(t.spec, t.weights, Some(t.head), t.prec);
    let mut groups = vec![Group {
        target: base_target,
        lanes: vec![LaneSpec {
            suspect: None,
            form: GdnForm::Chunked,
            decode_shift: 0,
            edit: LaneEdit::default(),
        }],
    }];
    let mut keys = vec![key_of(&base_target)];
    for (i, r) in recipes.iter().enumerate() {
        let Recipe::Model {
            form,
            decode_shift,
            lane: edit,
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
        };
        let k = key_of(&t);
        match keys.iter().position(|x| *x == k) {
            Some(g) => groups[g].lanes.push(lane),
            None => {
                keys.push(k);
                groups.push(Group {
                    target: t,
                    lanes: vec![lane],
                });
            }
        }
    }
    groups
}

/// What running every group gave.
pub struct Ran {
    /// Per suspect (plan order) its outcome; `None` for tap suspects.
    pub outcomes: Vec<Option<Outcome>>,
    /// Per suspect: the other runs of its group.
    pub shared: Vec<Vec<String>>,
    /// The baseline's forward, for the tap suspects.
    pub base: Base,
    /// The baseline's own outcome.
    pub baseline: Outcome,
}

/// Runs every group (the baseline's first: the others need its tokens).
/// `names`: the suspects' names.
///
/// Errors: as [`run_group`].
pub fn run_all(
    groups: &[Group],
    drafter: &Drafter,
    prompts: &[Vec<u32>],
    replay: Replay,
    names: &[String],
    quiet: bool,
) -> Result<Ran> {
    let pb = progress::single(groups.len() as u64, "runs", quiet);
    let mut outcomes: Vec<Option<Outcome>> = (0..names.len()).map(|_| None).collect();
    let mut shared: Vec<Vec<String>> = vec![Vec::new(); names.len()];
    let (mut base, mut baseline) = (None, None);
    for g in groups {
        let label = |l: &LaneSpec| {
            l.suspect
                .map_or("baseline".to_string(), |i| names[i].clone())
        };
        let lane_names: Vec<String> = g.lanes.iter().map(label).collect();
        pb.set_message(lane_names.join(", "));
        let (outs, b) = run_group(g, drafter, prompts, replay, base.as_ref())?;
        if b.is_some() {
            base = b;
        }
        for (l, o) in g.lanes.iter().zip(outs) {
            let me = label(l);
            let others = lane_names.iter().filter(|n| **n != me).cloned().collect();
            match l.suspect {
                Some(i) => {
                    shared[i] = others;
                    outcomes[i] = Some(o);
                }
                None => baseline = Some(o),
            }
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(Ran {
        outcomes,
        shared,
        base: base.expect("the baseline's group runs first"),
        baseline: baseline.expect("the baseline lane runs"),
    })
}

/// The outcomes of the suspects that read the baseline's forward: the tap
/// suspects (other hidden states fed to the drafter over the baseline's
/// tokens; one whose taps fall outside the model is skipped with a note)
/// and the drafter suspects (the baseline's features replayed with the
/// drafter run differently).
///
/// Errors: a replay failure.
#[allow(clippy::too_many_arguments)]
pub fn tap_outcomes(
    session: &Session,
    drafter: &Drafter,
    base_target: &TargetModel,
    base: &Base,
    recipes: &[Recipe],
    replay: Replay,
    outcomes: &mut [Option<Outcome>],
    notes: &mut Vec<String>,
) -> Result<()> {
    let n = session.spec.num_layers();
    let taps = &drafter.cfg.target_layer_ids;
    for (i, r) in recipes.iter().enumerate() {
        let mode = match r {
            Recipe::Taps(mode) => mode,
            Recipe::Drafter(edit) => {
                let d = edit.apply(drafter);
                let lens = session.prompt_lens();
                let replayed =
                    replay_all(&d, base_target, &base.tokens, &lens, &base.feats, replay)?;
                outcomes[i] = Some(Outcome::on_base(
                    base.feats.clone(),
                    base,
                    session,
                    replayed,
                ));
                continue;
            }
            Recipe::Model { .. } => continue,
        };
        let feats: Result<Vec<Tensor>> = base
            .hidden
            .iter()
            .map(|h| suspects::select(&h[..=n], &h[n + 1], taps, *mode))
            .collect();
        match feats {
            Ok(f) => {
                let (dflash, ddtree) = replay_all(
                    drafter,
                    base_target,
                    &base.tokens,
                    &session.prompt_lens(),
                    &f,
                    replay,
                )?;
                outcomes[i] = Some(Outcome::on_base(f, base, session, (dflash, ddtree)));
            }
            Err(e) => notes.push(format!("{}: skipped ({e})", describe(*mode))),
        }
    }
    Ok(())
}

/// The description of a tap suspect from its mode.
fn describe(mode: Taps) -> String {
    match mode {
        Taps::Offset(k) => super::Suspect::TapOffset(k).description(),
        Taps::NormedLast => super::Suspect::NormedLastTap.description(),
    }
}
