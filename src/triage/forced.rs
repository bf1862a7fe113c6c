//! The teacher-forced sweep of a triage group: every lane × prompt over the
//! tokens it feeds (each lane's taps; the baseline's own lane every hidden
//! state, which the tap suspects read), the baseline lane's noise shadow
//! beside it when its floor is wanted, and the logits of the lanes with a
//! head of their own. On supplied trajectories every group's sweep runs in
//! one pass over the layers ([`sweep_groups`]).

use std::sync::Arc;

use candle_core::Tensor;

use super::groups::Group;
use super::lanes::Forcing;
use crate::drafter::target::{Capture, Resume, StepOut};
use crate::drafter::{teacher_forced_together, Forced, ForcedJob};
use crate::error::Result;

/// Per prompt, the baseline's noise shadow's taps (one `[T, H]` per tap).
pub type ShadowTaps = Vec<Vec<Tensor>>;

/// What a group's sweep gives: per lane × prompt its step output, and the
/// baseline lane's noise shadow's taps where its group ran it.
pub type Swept = (Vec<StepOut>, Option<ShadowTaps>);

/// One group's part of [`sweep_groups`].
pub struct Share<'g, 'a> {
    /// The group.
    pub group: &'g Group<'a>,
    /// What its lanes × prompts feed (lane-major).
    pub forcings: &'g [Forcing],
    /// The baseline's own group: its baseline lane keeps every hidden state.
    pub own_base: bool,
    /// Per lane × prompt, its loop's prefill resume point (empty: none):
    /// the sweep starts there where it serves ([`Resume::serves`]).
    pub resumes: &'g [Option<Arc<Resume>>],
}

/// Runs `forcings` (lane-major, as the group's lanes × prompts) through
/// `g`'s target in one sweep, keeping each lane's tap features `taps` (the
/// baseline's own group, `own_base`: every hidden state) and, with
/// `logits`, the logits of its continuation rows. Returns the lanes' step
/// outputs and, where [`Group::shadow_taps`] asks (the baseline's own
/// group), the taps of the baseline lane's noise shadow per prompt. A lane
/// × prompt with a resume point in `resumes` (its loop's prefill) starts
/// there where that serves, with the same outputs.
///
/// Errors: as [`teacher_forced_together`]; a head that cannot be read.
pub fn sweep(
    g: &Group,
    (forcings, resumes): (&[Forcing], &[Option<Arc<Resume>>]),
    taps: &[usize],
    own_base: bool,
    logits: bool,
) -> Result<Swept> {
    let share = Share {
        group: g,
        forcings,
        own_base,
        resumes,
    };
    let mut done = sweep_groups(&[share], taps, logits)?;
    Ok(done.pop().expect("one result per group"))
}

/// [`sweep`] of every group in `shares` in one pass over the layers: layer
/// l of every group's target before layer l+1 of any
/// ([`crate::drafter::target::sweep_together`]), so groups reading the same
/// checkpoint in other dtypes read its bytes once. Each group gets what
/// its own [`sweep`] gives.
///
/// Errors: as [`sweep`], for any group.
pub fn sweep_groups(shares: &[Share], taps: &[usize], logits: bool) -> Result<Vec<Swept>> {
    let preps: Vec<Prepared> = shares.iter().map(|s| Prepared::of(s, taps)).collect();
    let each: Vec<Vec<&[Capture]>> = preps.iter().map(Prepared::captures).collect();
    let shadowed: Vec<Vec<bool>> = preps
        .iter()
        .map(|p| (0..p.seqs.len()).map(|j| j >= p.ran).collect())
        .collect();
    let wants: Vec<Vec<bool>> = shadowed
        .iter()
        .map(|s| s.iter().map(|s| logits && !s).collect())
        .collect();
    let jobs: Vec<ForcedJob> = shares
        .iter()
        .enumerate()
        .map(|(i, s)| ForcedJob {
            target: s.group.target,
            seqs: &preps[i].seqs,
            capture: &each[i],
            shadowed: &shadowed[i],
            logits: &wants[i],
        })
        .collect();
    let done = teacher_forced_together(&jobs)?;
    shares
        .iter()
        .zip(&preps)
        .zip(done)
        .map(|((s, p), d)| p.assemble(s, d, logits))
        .collect()
}

/// What a group's sweep keeps of each lane it runs (not the shadow): every
/// hidden state (`hidden_states[0..=N]`, then the raw last-layer output) in
/// the baseline's own group (`own_base`), else the drafter's `taps` of an
/// `n`-layer target.
pub fn kept(own_base: bool, n: usize, taps: &[usize]) -> Vec<Capture> {
    match own_base {
        true => (0..=n)
            .map(Capture::Hidden)
            .chain([Capture::Tap(n - 1)])
            .collect(),
        false => Capture::taps(taps),
    }
}

/// A group's sequences as its sweep feeds them.
struct Prepared<'f> {
    /// The lanes × prompts that run (lanes with a head of their own take
    /// the baseline lane's outputs), then the noise shadow's copies of the
    /// baseline lane's prompts.
    seqs: Vec<Forced<'f>>,
    /// How many of `seqs` are not the shadow's.
    ran: usize,
    /// What each lane that runs keeps ([`kept`]).
    lane_caps: Vec<Capture>,
    /// The drafter's taps (what the noise shadow keeps).
    tap_caps: Vec<Capture>,
    /// The baseline's own group.
    own_base: bool,
    /// Per lane × prompt: it runs (a lane with a head of its own takes the
    /// baseline lane's outputs instead).
    runs: Vec<bool>,
}

impl<'f> Prepared<'f> {
    /// What `s`'s group feeds, keeping `taps`.
    fn of(s: &Share<'f, '_>, taps: &[usize]) -> Self {
        let g = s.group;
        let n = g.target.spec.num_layers();
        let np = s.forcings.len() / g.lanes.len().max(1);
        // A lane with a head of its own (the baseline's group only) feeds the
        // baseline lane's tokens through the baseline's layers: it takes that
        // lane's outputs (lane 0) instead of running again.
        let runs: Vec<bool> = (0..s.forcings.len())
            .map(|j| g.lanes[j / np.max(1)].head.is_none())
            .collect();
        let lane_caps = kept(s.own_base, n, taps);
        let mut seqs: Vec<Forced> = s
            .forcings
            .iter()
            .zip(g.lanes.iter().flat_map(|l| std::iter::repeat_n(l, np)))
            .enumerate()
            .filter(|(j, _)| runs[*j])
            .map(|(j, (f, l))| {
                let mut forced = Forced {
                    tokens: &f.tokens,
                    prompt_len: f.prompt_len,
                    form: l.form,
                    decode_shift: l.decode_shift,
                    faults: f.faults,
                    resume: None,
                };
                let resume = s.resumes.get(j).and_then(Option::as_deref);
                forced.resume = resume.filter(|r| r.serves(&g.target, &forced, &lane_caps));
                forced
            })
            .collect();
        let ran = seqs.len();
        // The baseline lane's noise shadow (its lanes come first), taps only,
        // no logits.
        if s.own_base && g.shadow_taps {
            // From token 0: no prefill ran through the shadow.
            let shadow: Vec<Forced> = seqs[..np]
                .iter()
                .map(|f| Forced { resume: None, ..*f })
                .collect();
            seqs.extend(shadow);
        }
        Prepared {
            seqs,
            ran,
            lane_caps,
            tap_caps: kept(false, n, taps),
            own_base: s.own_base,
            runs,
        }
    }

    /// One capture list per sequence.
    fn captures(&self) -> Vec<&[Capture]> {
        (0..self.seqs.len())
            .map(|j| match j < self.ran {
                true => self.lane_caps.as_slice(),
                false => self.tap_caps.as_slice(),
            })
            .collect()
    }

    /// The group's result from its sequences' outputs `done`: the shadow's
    /// taps split off, the lanes with a head of their own given the
    /// baseline lane's outputs and (with `logits`) their own logits.
    ///
    /// Errors: a head that cannot be read; a tensor failure.
    fn assemble(&self, s: &Share, mut done: Vec<StepOut>, logits: bool) -> Result<Swept> {
        let (g, forcings) = (s.group, s.forcings);
        let n = g.target.spec.num_layers();
        let np = forcings.len() / g.lanes.len().max(1);
        let shadow_taps = (self.seqs.len() > self.ran).then(|| {
            done.split_off(self.ran)
                .into_iter()
                .map(|o| o.captures)
                .collect::<Vec<_>>()
        });
        let mut done = done.into_iter();
        let mut outs: Vec<StepOut> = Vec::with_capacity(forcings.len());
        for j in 0..forcings.len() {
            outs.push(match self.runs[j] {
                true => done.next().expect("one output per sequence run"),
                false => outs[j % np].clone(),
            });
        }
        if self.own_base && logits {
            own_head_logits(g, forcings, n, &mut outs)?;
        }
        Ok((outs, shadow_taps))
    }
}

/// The logits of the lanes of the baseline's group that have their own
/// head ([`LaneSpec::head`]): its head over the final-normed rows the sweep
/// kept (`hidden_states[n]`, capture `n`), the rows the sweep's logits cover.
///
/// Errors: the head cannot be read; a tensor failure.
fn own_head_logits(g: &Group, forcings: &[Forcing], n: usize, outs: &mut [StepOut]) -> Result<()> {
    let np = forcings.len() / g.lanes.len().max(1);
    for (j, l) in g.lanes.iter().enumerate() {
        let Some(head) = l.head else {
            continue;
        };
        let range = j * np..(j + 1) * np;
        let rows: Vec<Tensor> = outs[range.clone()]
            .iter()
            .zip(&forcings[range.clone()])
            .map(|(o, f)| {
                let from = f.prompt_len.saturating_sub(1);
                Ok(o.captures[n].narrow(0, from, f.tokens.len() - from)?)
            })
            .collect::<Result<_>>()?;
        let logits = crate::models::LmHead::forward_streamed(head, g.target.prec, &[&rows])?;
        for (o, l) in outs[range].iter_mut().zip(logits.into_iter().flatten()) {
            o.logits = Some(l);
        }
    }
    Ok(())
}
