//! The suspects that read the baseline's forward instead of running the
//! target: tap suspects (other hidden states fed to the drafter) and drafter
//! suspects (the drafter run differently), replayed together.

use candle_core::Tensor;

use super::groups::{Base, Outcome};
use super::suspects::{self, Recipe, Taps};
use crate::drafter::target::TargetModel;
use crate::drafter::{replay_sets, Replay, ReplaySet};
use crate::error::Result;
use crate::models::dflash::Drafter;
use crate::session::Session;

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
    let lens = session.prompt_lens();
    // Per suspect that reads the baseline's forward: its drafter (`None`:
    // the drafter as loaded) and the features it replays.
    let mut runs: Vec<(usize, Option<Drafter>, Vec<Tensor>)> = Vec::new();
    for (i, r) in recipes.iter().enumerate() {
        match r {
            Recipe::Drafter(edit) => runs.push((i, Some(edit.apply(drafter)), base.feats.clone())),
            Recipe::Taps(mode) => {
                let feats: Result<Vec<Tensor>> = base
                    .hidden
                    .iter()
                    .map(|h| suspects::select(&h[..=n], &h[n + 1], taps, *mode))
                    .collect();
                match feats {
                    Ok(f) => runs.push((i, None, f)),
                    Err(e) => notes.push(format!("{}: skipped ({e})", describe(*mode))),
                }
            }
            Recipe::Model { .. } => {}
        }
    }
    // All of their replays in the same rounds (one lm_head pass per round).
    let sets: Vec<ReplaySet> = runs
        .iter()
        .map(|(_, d, f)| ReplaySet {
            drafter: d.as_ref().unwrap_or(drafter),
            target: base_target,
            tokens: &base.tokens,
            prompt_lens: &lens,
            max_new: &base.max_new,
            feats: f,
        })
        .collect();
    let replayed = replay_sets(&sets, replay)?;
    for ((i, _, f), r) in runs.into_iter().zip(replayed) {
        outcomes[i] = Some(Outcome::on_base(f, base, session, r));
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
