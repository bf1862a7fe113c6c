//! The target's greedy continuation, produced by the DFlash loop itself at
//! temperature 0 (z-lab/dflash `dflash/model.py::dflash_generate`): per round
//! the drafter drafts a block from the target's tap features, one layer-major
//! sweep verifies the whole block for every prompt at once, the longest
//! prefix matching the target's argmax is kept and the target's own token
//! follows it. So the number of sweeps is the number of rounds (plus the
//! prefill), not the number of tokens. At temperature 0 every committed
//! token is the target's greedy token, so the output is its greedy
//! continuation.
//!
//! The caches are cropped to the kept tokens after each verification: the
//! attention KV cache truncated, the Gated DeltaNet conv and recurrent state
//! advanced by exactly the kept tokens from what the verification computed
//! ([`crate::models::qwen3_5::gated_delta_net::GdnState::commit`]) — the
//! correct form of the crop `dflash_generate` gets wrong on transformers 5.23
//! (`LinearAttentionLayer.crop` rolls back the conv state only).

use std::sync::Arc;

use candle_core::Tensor;

use super::eval::{draft_outputs, greedy_drafts, DraftRequest, DraftTarget, EndRule};
use super::faults::Faults;
use super::target::{argmax_rows, Capture, Resume, Sequence, Step, StepOut, TargetModel};
use crate::error::Result;
use crate::models::dflash::{narrow_pieces, DraftContext, Drafter};
use crate::models::GdnForm;

/// What the loop produced per prompt.
pub struct Generation {
    /// Prompt + greedy continuation, at least `max_new + block` new tokens
    /// (what a replay needs to judge the last blocks, DDTree's included).
    pub tokens: Vec<Vec<u32>>,
    /// Tap features `[fed, K·H]` of every token fed to the target (the
    /// prefill's rows, then each verification's kept rows).
    pub features: Vec<Tensor>,
    /// The loop's `a + 1` per round while `start < prompt_len + max_new`.
    pub acceptance_lengths: Vec<Vec<usize>>,
    /// Verification rounds run (every prompt advances in each).
    pub rounds: usize,
    /// Sweeps over the target's layers: the prefill plus one per round.
    pub sweeps: usize,
    /// Lanes whose prefill was swept; the others took a twin's, bit for bit
    /// the same (a lane that differs only after its prompt).
    pub prefills: usize,
    /// Per lane, its prefill's resume point when one was asked for and the
    /// lane has one (`Sequence::resume_at`); a lane that took a twin's
    /// prefill shares its point.
    pub resumes: Vec<Option<Arc<Resume>>>,
}

/// One prompt's progress through the loop.
struct Run {
    seq: Sequence,
    tokens: Vec<u32>,
    feats: Vec<Tensor>,
    lens: Vec<usize>,
    max_length: usize,
    need: usize,
    rule: EndRule,
    prompt_len: usize,
    /// The drafter's keys and values of the rows in `feats` so far.
    ctx: DraftContext,
    /// The prefill's resume point.
    resume: Option<Arc<Resume>>,
}

/// New tokens the loop commits per lane before it stops (what its progress
/// counts: [`dflash_loop`]'s `on_progress`): `max_new + block` under z-lab
/// GitHub main's rule (whole blocks until `start >= prompt_len + max_new`,
/// then one more), `max_new` under the wheel's.
pub fn lane_tokens(max_new: usize, block: usize, rule: EndRule) -> u64 {
    match rule {
        EndRule::GithubMain => (max_new + block) as u64,
        EndRule::Wheel => max_new as u64,
    }
}

impl Run {
    /// New tokens committed so far, at most [`lane_tokens`].
    fn progress(&self) -> u64 {
        let end = match self.rule {
            EndRule::GithubMain => self.tokens.len().min(self.need),
            EndRule::Wheel => (self.seq.len() + 1).min(self.max_length),
        };
        end.saturating_sub(self.prompt_len) as u64
    }

    fn done(&self) -> bool {
        match self.rule {
            EndRule::GithubMain => self.tokens.len() >= self.need,
            EndRule::Wheel => self.seq.len() + 1 >= self.max_length,
        }
    }

    /// Slots of the block verified at anchor `start` (the wheel shrinks the
    /// last blocks to the tokens left).
    fn block(&self, start: usize, b: usize) -> usize {
        match self.rule {
            EndRule::GithubMain => b,
            EndRule::Wheel => b.min(self.max_length - start),
        }
    }

    /// Tokens a round with `a` accepted drafts commits at anchor `start`
    /// (the wheel's `produced`).
    fn produced(&self, start: usize, a: usize) -> usize {
        match self.rule {
            EndRule::GithubMain => a + 1,
            EndRule::Wheel => (a + 1).min(self.max_length - start - 1),
        }
    }

    fn context(&self) -> Result<Tensor> {
        Ok(Tensor::cat(&self.feats, 0)?)
    }

    /// The features of positions `a..e`, from the pieces `feats` holds.
    fn context_rows(feats: &[Tensor], a: usize, e: usize) -> Result<Tensor> {
        let parts = narrow_pieces(feats, 0, a, e)?;
        match (parts.is_empty(), feats.first()) {
            (true, Some(f)) => Ok(f.narrow(0, 0, 0)?),
            _ => Ok(Tensor::cat(&parts, 0)?),
        }
    }
}

/// One sequence the loop advances: a prompt, and how the target runs it.
#[derive(Debug, Clone)]
pub struct Lane {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Delta-rule form of multi-token forwards.
    pub form: GdnForm,
    /// Positions after the prompt shifted by this (0 normally).
    pub decode_shift: usize,
    /// Harness or engine faults emulated (none normally).
    pub faults: Faults,
}

impl Lane {
    /// A plain lane: chunked delta rule, no position shift.
    pub fn plain(prompt: &[u32]) -> Self {
        Self {
            prompt: prompt.to_vec(),
            form: GdnForm::Chunked,
            decode_shift: 0,
            faults: Faults::default(),
        }
    }
}

/// Runs the DFlash loop on every lane (all of them advance in each sweep),
/// to z-lab GitHub main's end rule; after the prefill and after each round
/// `on_progress` gets the new tokens committed so far over all lanes (it
/// ends at `lanes × lane_tokens`, [`lane_tokens`]).
///
/// Errors: a tap outside the target; a tensor failure.
pub fn dflash_loop(
    target: &TargetModel,
    drafter: &Drafter,
    lanes: &[Lane],
    max_new: usize,
    on_progress: &dyn Fn(u64),
) -> Result<Generation> {
    dflash_loop_with(
        target,
        drafter,
        lanes,
        max_new,
        EndRule::GithubMain,
        &[],
        on_progress,
    )
}

/// [`dflash_loop`] under the end-of-generation `rule`. Under
/// [`EndRule::Wheel`] it is `dflash_generate` of the `dflash` 0.1.0 wheel
/// round for round: the last blocks shrink to `min(B, max_length − start)`,
/// each round commits `produced = min(a + 1, max_length − start − 1)`, the
/// loop runs while `start + 1 < max_length`, and the tokens stop at
/// `prompt_len + max_new` (too few for a GitHub-main replay).
///
/// With captures to `keep`, a lane whose prompt has a resume point
/// (`Sequence::resume_at`) is prefilled in two sweeps split there, bit
/// for bit the one sweep, and [`Generation::resumes`] holds the state
/// between them with the rows of `keep` before it: a teacher-forced sweep
/// of the same tokens can start there ([`super::Forced::resume`]).
///
/// Errors: a tap outside the target; a tensor failure.
pub fn dflash_loop_with(
    target: &TargetModel,
    drafter: &Drafter,
    lanes: &[Lane],
    max_new: usize,
    rule: EndRule,
    keep: &[Capture],
    on_progress: &dyn Fn(u64),
) -> Result<Generation> {
    let b = drafter.cfg.block_size;
    let capture = Capture::taps(&drafter.cfg.target_layer_ids);
    let mut runs: Vec<Run> = lanes
        .iter()
        .map(|l| (l, &l.prompt))
        .map(|(l, p)| Run {
            seq: Sequence::new(target.spec, p.len(), l.form, l.decode_shift).with_faults(l.faults),
            tokens: p.clone(),
            feats: Vec::new(),
            lens: Vec::new(),
            max_length: p.len() + max_new,
            need: p.len() + max_new + b,
            rule,
            prompt_len: p.len(),
            ctx: DraftContext::new(),
            resume: None,
        })
        .collect();
    let prefills = prefill(target, &mut runs, lanes, (&capture, keep))?;
    let sweeps_done = |runs: &[Run]| on_progress(runs.iter().map(Run::progress).sum());
    // A split prefill is two sweeps.
    let mut sweeps = 1 + usize::from(runs.iter().any(|r| r.resume.is_some()));
    sweeps_done(&runs);
    let dt = DraftTarget {
        drafter,
        weights: target.weights,
        head: target.head,
        prec: target.prec,
    };
    let mut rounds = 0;
    while runs.iter().any(|r| !r.done()) {
        let blocks = draft(&dt, &mut runs, b)?;
        let outs = verify(target, &mut runs, &blocks, &capture)?;
        rounds += 1;
        sweeps += 1;
        commit(&mut runs, &blocks, outs)?;
        sweeps_done(&runs);
    }
    if rule == EndRule::Wheel {
        runs.iter_mut()
            .for_each(|r| r.tokens.truncate(r.max_length));
    }
    let mut g = Generation {
        tokens: Vec::new(),
        features: Vec::new(),
        acceptance_lengths: Vec::new(),
        rounds,
        sweeps,
        prefills,
        resumes: Vec::new(),
    };
    for r in runs {
        g.features.push(r.context()?);
        g.tokens.push(r.tokens);
        g.acceptance_lengths.push(r.lens);
        g.resumes.push(r.resume);
    }
    Ok(g)
}

/// The rows the target returned logits for (asked for in every step here).
fn logits_of(o: &StepOut) -> Result<&Tensor> {
    o.logits.as_ref().ok_or_else(|| {
        crate::error::Error::Tensor(candle_core::Error::Msg(
            "the target's sweep returned no logits where the loop asked for them".into(),
        ))
    })
}

/// Per lane, the earlier lane whose prefill is its own bit for bit, if any:
/// the same prompt, and fresh sequences a prefill leaves in the same state
/// ([`Sequence::same_prefill`]). Each lane's layers run as if it ran alone
/// ([`crate::models::decoder::DecoderLayer::forward_batch`]), so a twin's
/// state and taps are the lane's own.
fn prefill_twins(runs: &[Run], lanes: &[Lane]) -> Vec<Option<usize>> {
    let same = |i: usize, j: usize| {
        lanes[i].prompt == lanes[j].prompt && runs[i].seq.same_prefill(&runs[j].seq)
    };
    (0..lanes.len())
        .map(|i| (0..i).find(|&j| same(i, j)))
        .collect()
}

/// The prefill: every prompt's taps, and the first new token from its last
/// row, in one sweep of the lanes whose prefill no earlier lane shares
/// ([`prefill_twins`]); the others take their twin's state, taps, token and
/// resume point. With captures to `keep`, the lanes with a resume point
/// (`Sequence::resume_at`) first feed the tokens before it in a sweep of
/// their own. Returns the prefills swept.
fn prefill(
    target: &TargetModel,
    runs: &mut [Run],
    lanes: &[Lane],
    (capture, keep): (&[Capture], &[Capture]),
) -> Result<usize> {
    let twins = prefill_twins(runs, lanes);
    let at: Vec<Option<usize>> = runs
        .iter()
        .zip(&twins)
        .map(|(r, t)| t.is_none().then(|| r.seq.resume_at(target.spec)).flatten())
        .map(|a| a.filter(|_| !keep.is_empty()))
        .collect();
    resume_points(target, runs, lanes, &at, (capture, keep))?;
    let mut steps: Vec<Step> = runs
        .iter_mut()
        .zip(lanes)
        .zip(&twins)
        .zip(&at)
        .filter(|((_, twin), _)| twin.is_none())
        .map(|(((r, l), _), at)| Step {
            seq: &mut r.seq,
            ids: &l.prompt[at.unwrap_or(0)..],
            tentative: false,
            logits: l.prompt.len() - 1 - at.unwrap_or(0)..l.prompt.len() - at.unwrap_or(0),
        })
        .collect();
    let swept = steps.len();
    let outs = target.sweep(&mut steps, capture)?;
    drop(steps);
    let own = twins.iter().enumerate().filter(|(_, t)| t.is_none());
    for ((i, _), o) in own.zip(outs) {
        let r = &mut runs[i];
        r.feats
            .push(Tensor::cat(&o.captures, candle_core::D::Minus1)?);
        r.tokens.push(argmax_rows(logits_of(&o)?)?[0]);
    }
    for (i, twin) in twins.iter().enumerate() {
        if let Some(j) = *twin {
            // A twin comes before its lane.
            let (before, rest) = runs.split_at_mut(i);
            let (r, t) = (&mut rest[0], &before[j]);
            r.seq.adopt_state(&t.seq)?;
            r.feats = t.feats.clone();
            r.resume = t.resume.clone();
            r.tokens.push(t.tokens[t.prompt_len]);
        }
    }
    Ok(swept)
}

/// The first part of a split prefill: the lanes with a resume point `at`
/// feed their prompt's tokens before it, keeping the taps (`capture`, their
/// first features) and `keep`, and hold the state there as their resume
/// point.
///
/// Errors: a tensor failure.
fn resume_points(
    target: &TargetModel,
    runs: &mut [Run],
    lanes: &[Lane],
    at: &[Option<usize>],
    (capture, keep): (&[Capture], &[Capture]),
) -> Result<()> {
    let both: Vec<Capture> = capture.iter().chain(keep).copied().collect();
    let mut steps: Vec<Step> = runs
        .iter_mut()
        .zip(lanes)
        .zip(at)
        .filter_map(|((r, l), at)| at.map(|a| (r, l, a)))
        .map(|(r, l, a)| Step {
            seq: &mut r.seq,
            ids: &l.prompt[..a],
            tentative: false,
            logits: 0..0,
        })
        .collect();
    if steps.is_empty() {
        return Ok(());
    }
    let outs = target.sweep(&mut steps, &both)?;
    drop(steps);
    let split = runs.iter_mut().zip(lanes).zip(at);
    for (((r, l), a), mut o) in split.filter(|(_, a)| a.is_some()).zip(outs) {
        let kept = o.captures.split_off(capture.len());
        r.feats
            .push(Tensor::cat(&o.captures, candle_core::D::Minus1)?);
        let kept = keep.iter().copied().zip(kept).collect();
        let ids = &l.prompt[..a.unwrap_or(0)];
        r.resume = Some(Arc::new(r.seq.resume_point(target, ids, kept)?));
    }
    Ok(())
}

/// One drafted block per unfinished prompt, from its features: `(run,
/// [last committed token, drafts…])`; the drafter's forward of every
/// prompt's block together (each prompt's context keys and values held
/// across rounds, [`DraftContext`]; [`draft_outputs`]), then
/// the drafts from one pass over the `lm_head` per 16 drafts
/// ([`greedy_drafts`]).
fn draft(dt: &DraftTarget, runs: &mut [Run], b: usize) -> Result<Vec<(usize, Vec<u32>)>> {
    let mut live: Vec<(usize, usize, usize)> = Vec::new();
    for (i, r) in runs.iter_mut().enumerate() {
        if r.done() {
            // A finished lane drafts no more: its context's keys and values go.
            r.ctx = DraftContext::new();
            continue;
        }
        let start = r.seq.len();
        live.push((i, start, r.block(start, b)));
    }
    // The features as the drafts read them (the pieces shared, not copied).
    let feats: Vec<Vec<Tensor>> = live.iter().map(|&(i, ..)| runs[i].feats.clone()).collect();
    let rows: Vec<_> = feats
        .iter()
        .map(|f| move |a: usize, e: usize| Run::context_rows(f, a, e))
        .collect();
    let mut lanes: Vec<Option<&mut Run>> = runs.iter_mut().map(Some).collect();
    let drafts = live
        .iter()
        .zip(&rows)
        .map(|(&(i, start, block), rows)| {
            let r = lanes[i].take().expect("one draft per lane");
            DraftRequest {
                t: dt,
                tokens: &r.tokens,
                start,
                b: block,
                ctx: &mut r.ctx,
                rows,
            }
        })
        .collect();
    let outs = draft_outputs(drafts)?;
    let live: Vec<(usize, usize)> = live.iter().map(|&(i, start, _)| (i, start)).collect();
    Ok(live
        .iter()
        .zip(greedy_drafts(dt, &outs)?)
        .map(|(&(i, start), drafts)| (i, [&[runs[i].tokens[start]][..], &drafts].concat()))
        .collect())
}

/// Every block verified by the target in one sweep (tentatively: the
/// states advance over the whole block until [`commit`] keeps a prefix).
fn verify(
    target: &TargetModel,
    runs: &mut [Run],
    blocks: &[(usize, Vec<u32>)],
    capture: &[Capture],
) -> Result<Vec<StepOut>> {
    let active: Vec<usize> = blocks.iter().map(|(i, _)| *i).collect();
    let mut steps: Vec<Step> = runs
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| active.contains(i))
        .zip(blocks)
        .map(|((_, r), (_, blk))| Step {
            seq: &mut r.seq,
            ids: blk,
            tentative: true,
            logits: 0..blk.len(),
        })
        .collect();
    target.sweep(&mut steps, capture)
}

/// Per verified block: the drafts the target's greedy tokens accept, the
/// state committed to them, their taps kept, the accepted tokens and the
/// target's own next one appended, the round's acceptance length recorded.
fn commit(runs: &mut [Run], blocks: &[(usize, Vec<u32>)], outs: Vec<StepOut>) -> Result<()> {
    for ((i, blk), o) in blocks.iter().zip(outs) {
        let r = &mut runs[*i];
        let start = r.seq.len() - blk.len();
        let post = argmax_rows(logits_of(&o)?)?;
        let a = blk[1..]
            .iter()
            .zip(&post)
            .take_while(|(d, t)| d == t)
            .count();
        let kept = r.produced(start, a);
        r.seq.commit(kept)?;
        let taps = Tensor::cat(&o.captures, candle_core::D::Minus1)?;
        r.feats.push(taps.narrow(0, 0, kept)?);
        r.tokens.extend_from_slice(&blk[1..=a]);
        r.tokens.push(post[a]);
        if start < r.max_length {
            r.lens.push(kept);
        }
    }
    Ok(())
}
