//! The teacher-forced sweep of a triage group: every lane × prompt over the
//! tokens it feeds (each lane's taps; the baseline's own lane every hidden
//! state, which the tap suspects read), the baseline lane's noise shadow
//! beside it when its floor is wanted, and the logits of the lanes with a
//! head of their own.

use candle_core::Tensor;

use super::groups::Group;
use super::lanes::Forcing;
use crate::drafter::target::{Capture, StepOut};
use crate::drafter::{teacher_forced_each, Forced};
use crate::error::Result;

/// Per prompt, the baseline's noise shadow's taps (one `[T, H]` per tap).
pub type ShadowTaps = Vec<Vec<Tensor>>;

/// Runs `forcings` (lane-major, as the group's lanes × prompts) through
/// `g`'s target in one sweep, keeping each lane's tap features `taps` (the
/// baseline's own group, `own_base`: every hidden state) and, with
/// `logits`, the logits of its continuation rows. Returns the lanes' step
/// outputs and, where [`Group::shadow_taps`] asks (the baseline's own
/// group), the taps of the baseline lane's noise shadow per prompt.
///
/// Errors: as [`teacher_forced_each`]; a head that cannot be read.
pub fn sweep(
    g: &Group,
    forcings: &[Forcing],
    taps: &[usize],
    own_base: bool,
    logits: bool,
) -> Result<(Vec<StepOut>, Option<ShadowTaps>)> {
    let n = g.target.spec.num_layers();
    let np = forcings.len() / g.lanes.len().max(1);
    let all: Vec<Capture> = (0..=n)
        .map(Capture::Hidden)
        .chain([Capture::Tap(n - 1)])
        .collect();
    let tap_caps: Vec<Capture> = taps.iter().map(|&l| Capture::Tap(l)).collect();
    // A lane with a head of its own (the baseline's group only) feeds the
    // baseline lane's tokens through the baseline's layers: it takes that
    // lane's outputs (lane 0) instead of running again.
    let runs = |j: usize| g.lanes[j / np.max(1)].head.is_none();
    let mut seqs: Vec<Forced> = forcings
        .iter()
        .zip(g.lanes.iter().flat_map(|l| std::iter::repeat_n(l, np)))
        .enumerate()
        .filter(|(j, _)| runs(*j))
        .map(|(_, (f, l))| Forced {
            tokens: &f.tokens,
            prompt_len: f.prompt_len,
            form: l.form,
            decode_shift: l.decode_shift,
            faults: f.faults,
        })
        .collect();
    let ran = seqs.len();
    let caps = if own_base { &all } else { &tap_caps };
    let mut each = vec![caps.as_slice(); ran];
    // The baseline lane's noise shadow (its lanes come first), taps only,
    // no logits.
    let shadow = own_base && g.shadow_taps;
    if shadow {
        seqs.extend_from_within(..np);
        each.extend(std::iter::repeat_n(tap_caps.as_slice(), np));
    }
    let shadowed: Vec<bool> = (0..seqs.len()).map(|j| j >= ran).collect();
    let wants: Vec<bool> = shadowed.iter().map(|s| logits && !s).collect();
    let mut done = teacher_forced_each(&g.target, &seqs, &each, &shadowed, &wants)?;
    let shadow_taps = shadow.then(|| {
        done.split_off(ran)
            .into_iter()
            .map(|o| o.captures)
            .collect::<Vec<_>>()
    });
    let mut done = done.into_iter();
    let mut outs: Vec<StepOut> = Vec::with_capacity(forcings.len());
    for j in 0..forcings.len() {
        outs.push(match runs(j) {
            true => done.next().expect("one output per sequence run"),
            false => outs[j % np].clone(),
        });
    }
    if own_base && logits {
        own_head_logits(g, forcings, n, &mut outs)?;
    }
    Ok((outs, shadow_taps))
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
