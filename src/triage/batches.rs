//! Every group of the triage run in turn, the baseline's first, with the
//! progress of the run: variants run, and the new tokens of the batch
//! running now ([`crate::progress`]).

use super::groups::{run_group, Base, Group, LaneSpec, Outcome};
use crate::drafter::generate::lane_tokens;
use crate::drafter::trajectories::Given;
use crate::drafter::Replay;
use crate::error::Result;
use crate::models::dflash::Drafter;
use crate::progress;

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

/// The variants a batch runs, short enough for a progress line: the first
/// three names and how many more.
fn batch_label(names: &[String]) -> String {
    match names.len() {
        0..=3 => names.join(", "),
        n => format!("{}, … {} more", names[..3].join(", "), n - 3),
    }
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
    given: Option<&Given>,
    quiet: bool,
) -> Result<Ran> {
    let bars = progress::Bars::new(quiet);
    let total: usize = groups.iter().map(|g| g.lanes.len()).sum();
    let pb = bars.count(
        total as u64,
        "forward variants run (the tap variants reuse the baseline's)",
    );
    let tokens = bars.count(0, "new tokens generated (this batch)");
    let per_lane =
        prompts.len() as u64 * lane_tokens(replay.max_new, drafter.cfg.block_size, replay.rule);
    let mut outcomes: Vec<Option<Outcome>> = (0..names.len()).map(|_| None).collect();
    let mut shared: Vec<Vec<String>> = vec![Vec::new(); names.len()];
    let (mut base, mut baseline) = (None, None);
    for g in groups {
        let label = |l: &LaneSpec| {
            l.suspect
                .map_or("baseline".to_string(), |i| names[i].clone())
        };
        let lane_names: Vec<String> = g.lanes.iter().map(label).collect();
        pb.set_message(batch_label(&lane_names));
        tokens.set_length(if given.is_some() {
            0
        } else {
            per_lane * g.lanes.len() as u64
        });
        tokens.set_position(0);
        let on_progress = |n: u64| tokens.set_position(n);
        let (outs, b) = run_group(
            g,
            drafter,
            prompts,
            (replay, &on_progress),
            base.as_ref(),
            given,
        )?;
        // A head made for this group's suspect (the random lm_head) is not
        // needed by the next group.
        g.target.head.release();
        g.lanes
            .iter()
            .filter_map(|l| l.head)
            .for_each(|h| h.release());
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
        pb.inc(g.lanes.len() as u64);
    }
    tokens.finish_and_clear();
    pb.finish_and_clear();
    bars.clear();
    Ok(Ran {
        outcomes,
        shared,
        base: base.expect("the baseline's group runs first"),
        baseline: baseline.expect("the baseline lane runs"),
    })
}
