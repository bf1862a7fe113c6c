//! Every group of the triage run in turn, the baseline's first, with the
//! progress of the run: variants run, and the new tokens of the batch
//! running now ([`crate::progress`]).

use super::groups::{run_given, run_group, Base, Group, Outcome};
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
    let total: usize = groups.iter().map(|g| g.lanes.len() + g.aliases.len()).sum();
    let pb = bars.count(
        total as u64,
        "forward variants run (the tap variants reuse the baseline's)",
    );
    let tokens = bars.count(0, "new tokens generated (this batch)");
    let per_lane =
        prompts.len() as u64 * lane_tokens(replay.max_new, drafter.cfg.block_size, replay.rule);
    let label = |s: Option<usize>| s.map_or("baseline".to_string(), |i| names[i].clone());
    let mut done = Done {
        outcomes: (0..names.len()).map(|_| None).collect(),
        shared: vec![Vec::new(); names.len()],
        base: None,
        baseline: None,
    };
    match given {
        Some(given) => {
            // One sweep for every group: each shares it with every other lane.
            let all = names_of(groups, &label);
            pb.set_message(batch_label(&all));
            let mut after = |g: &Group, outs: Vec<Outcome>, b: Option<Base>| {
                done.take(g, outs, b, &all, &label);
                pb.inc((g.lanes.len() + g.aliases.len()) as u64);
            };
            run_given(groups, drafter, prompts, replay, given, &mut after)?;
        }
        None => {
            for g in groups {
                let lane_names = names_of(std::slice::from_ref(g), &label);
                pb.set_message(batch_label(&lane_names));
                tokens.set_length(per_lane * g.lanes.len() as u64);
                tokens.set_position(0);
                let on_progress = |n: u64| tokens.set_position(n);
                let progress = (replay, &on_progress as &dyn Fn(u64));
                let (outs, b) = run_group(g, drafter, prompts, progress, done.base.as_ref())?;
                done.take(g, outs, b, &lane_names, &label);
                pb.inc((g.lanes.len() + g.aliases.len()) as u64);
            }
        }
    }
    tokens.finish_and_clear();
    pb.finish_and_clear();
    bars.clear();
    Ok(Ran {
        outcomes: done.outcomes,
        shared: done.shared,
        base: done.base.expect("the baseline's group runs first"),
        baseline: done.baseline.expect("the baseline lane runs"),
    })
}

/// The runs of `groups` by name (their lanes and their aliases), the
/// baseline first, then in plan order.
fn names_of(groups: &[Group], label: &dyn Fn(Option<usize>) -> String) -> Vec<String> {
    let mut runs: Vec<Option<usize>> = groups
        .iter()
        .flat_map(|g| {
            let aliases = g.aliases.iter().map(|&(i, _)| Some(i));
            g.lanes.iter().map(|l| l.suspect).chain(aliases)
        })
        .collect();
    runs.sort();
    runs.into_iter().map(label).collect()
}

/// The groups' results so far.
struct Done {
    outcomes: Vec<Option<Outcome>>,
    shared: Vec<Vec<String>>,
    base: Option<Base>,
    baseline: Option<Outcome>,
}

impl Done {
    /// Group `g`'s outcomes `outs` (and the baseline's forward `b`, from
    /// its group); each lane shared its sweeps with the other runs of
    /// `sharing`. The heads made for the group's suspects (the random
    /// lm_head) are released: no later group reads them.
    fn take(
        &mut self,
        g: &Group,
        outs: Vec<Outcome>,
        b: Option<Base>,
        sharing: &[String],
        label: &dyn Fn(Option<usize>) -> String,
    ) {
        g.target.head.release();
        g.lanes
            .iter()
            .filter_map(|l| l.head)
            .for_each(|h| h.release());
        if b.is_some() {
            self.base = b;
        }
        for &(i, j) in &g.aliases {
            self.shared[i] = sharing
                .iter()
                .filter(|n| **n != label(Some(i)))
                .cloned()
                .collect();
            self.outcomes[i] = Some(outs[j].clone());
        }
        for (l, o) in g.lanes.iter().zip(outs) {
            let me = label(l.suspect);
            let others = sharing.iter().filter(|n| **n != me).cloned().collect();
            match l.suspect {
                Some(i) => {
                    self.shared[i] = others;
                    self.outcomes[i] = Some(o);
                }
                None => self.baseline = Some(o),
            }
        }
    }
}
