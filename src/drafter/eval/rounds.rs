//! DFlash and DDTree replays of many trajectories in lock-step rounds
//! ([`replay_jobs`]). Each trajectory's two walks stop at anchors; a round
//! drafts every anchor some walk waits at (once, however many walks wait
//! there: DFlash and DDTree start at the same anchor and meet again
//! wherever their acceptances sum alike). The drafts of a pass (at most
//! [`MAX_DRAFTS_PER_PASS`]) go through the drafter together, one per
//! trajectory's context at a time ([`super::draft_outputs`]), and through
//! the same `lm_head` in one read of it ([`Drafter::logits_from_each`]),
//! instead of each alone. Each draft
//! and each logit is the same computation as a replay of its own gives
//! ([`super::replay_dflash`], [`super::replay_ddtree`]), so the results are
//! theirs bit for bit.

use std::collections::HashMap;

use candle_core::{Tensor, D};

use super::{build_tree, check_len, DraftTarget, EndRule, PromptTau};
use crate::error::Result;
use crate::models::dflash::{DraftContext, Drafter};

/// One trajectory to replay DFlash and DDTree on.
pub struct ReplayJob<'a> {
    /// Drafter and target (embedding, `lm_head`, dtype).
    pub target: &'a DraftTarget<'a>,
    /// Prompt + continuation.
    pub tokens: &'a [u32],
    /// Tokens of the prompt.
    pub prompt_len: usize,
    /// `[≥ T, K·H]` tap features of `tokens`.
    pub feats: &'a Tensor,
    /// New tokens replayed.
    pub max_new: usize,
}

/// Drafts made per `lm_head` pass at most: their logits are held until the
/// pass ends, twice while the chunks are joined (15 × 248 320 f32 values,
/// 15 MB, each at the 27B target's: 16 drafts take 0.5 GB at the peak).
pub(super) const MAX_DRAFTS_PER_PASS: usize = 16;

/// The anchors of one walk under an end rule, one round at a time: GitHub
/// main drafts full blocks while `start < prompt_len + max_new` and records
/// `a + 1`; the wheel drafts `min(B, max_length − start)` slots while
/// `start + 1 < max_length` and records `min(a + 1, max_length − start − 1)`.
pub(super) struct Walk {
    max_length: usize,
    b: usize,
    rule: EndRule,
    start: usize,
    /// What each round committed.
    pub(super) lens: Vec<usize>,
}

impl Walk {
    pub(super) fn new(prompt_len: usize, max_new: usize, b: usize, rule: EndRule) -> Self {
        Self {
            max_length: prompt_len + max_new,
            b,
            rule,
            start: prompt_len,
            lens: Vec::new(),
        }
    }

    /// The next round's anchor and block slots; `None` once the walk ends.
    pub(super) fn pending(&self) -> Option<(usize, usize)> {
        let (s, m) = (self.start, self.max_length);
        match self.rule {
            EndRule::GithubMain if s < m => Some((s, self.b)),
            EndRule::Wheel if s + 1 < m => Some((s, self.b.min(m - s))),
            _ => None,
        }
    }

    /// Records a round that accepted `a1` (accepted drafts + 1).
    pub(super) fn advance(&mut self, a1: usize) {
        let committed = match self.rule {
            EndRule::GithubMain => a1,
            EndRule::Wheel => a1.min(self.max_length - self.start - 1),
        };
        self.lens.push(committed);
        self.start += committed;
    }
}

/// What both walks read from one draft: DFlash's greedy drafts and DDTree's
/// tree.
struct Drafted {
    drafts: Vec<u32>,
    tree: Vec<HashMap<u32, usize>>,
}

impl Drafted {
    fn dflash(&self, tokens: &[u32], start: usize) -> usize {
        dflash_accepted(&self.drafts, tokens, start)
    }

    fn ddtree(&self, tokens: &[u32], start: usize) -> usize {
        ddtree_accepted(&self.tree, tokens, start)
    }
}

/// DFlash's `a + 1` for greedy `drafts` at anchor `start` of `tokens`: the
/// drafts that equal the tokens after the anchor, counted until the first
/// that does not, plus one.
pub(super) fn dflash_accepted(drafts: &[u32], tokens: &[u32], start: usize) -> usize {
    let a = drafts
        .iter()
        .zip(&tokens[start + 1..])
        .take_while(|(d, x)| d == x)
        .count();
    a + 1
}

/// DDTree's accepted path length (root included, DFlash's scale) for
/// `tree` at anchor `start` of `tokens`: the longest root path equal to the
/// tokens after the anchor. The tree is at most block − 1 deep, so the walk
/// never reads past the block's targets.
pub(super) fn ddtree_accepted(tree: &[HashMap<u32, usize>], tokens: &[u32], start: usize) -> usize {
    let (mut cur, mut depth) = (0usize, 0usize);
    while let Some(&child) = tokens.get(start + depth + 1).and_then(|t| tree[cur].get(t)) {
        cur = child;
        depth += 1;
    }
    depth + 1
}

/// DFlash and DDTree-`budget` on every job under `rule`, in lock-step
/// rounds. Returns per job its DFlash and its DDTree results.
///
/// Errors: a trajectory shorter than its replay needs; a tensor failure.
pub fn replay_jobs(
    jobs: &[ReplayJob],
    budget: usize,
    rule: EndRule,
) -> Result<Vec<(PromptTau, PromptTau)>> {
    let mut walks = Vec::with_capacity(jobs.len());
    for j in jobs {
        let b = j.target.drafter.cfg.block_size;
        check_len(j.tokens, j.prompt_len, j.max_new, b, rule)?;
        let w = || Walk::new(j.prompt_len, j.max_new, b, rule);
        walks.push([w(), w()]);
    }
    let mut drafted: Vec<HashMap<(usize, usize), Drafted>> =
        jobs.iter().map(|_| HashMap::new()).collect();
    // Each trajectory's context keys and values, grown as its walks advance.
    let mut ctxs: Vec<DraftContext> = jobs.iter().map(|_| DraftContext::new()).collect();
    loop {
        let mut wanted: Vec<(usize, (usize, usize))> = Vec::new();
        for (j, pair) in walks.iter_mut().enumerate() {
            for (kind, w) in pair.iter_mut().enumerate() {
                while let Some(at) = w.pending() {
                    let Some(d) = drafted[j].get(&at) else {
                        if !wanted.contains(&(j, at)) {
                            wanted.push((j, at));
                        }
                        break;
                    };
                    let tokens = jobs[j].tokens;
                    w.advance(match kind {
                        0 => d.dflash(tokens, at.0),
                        _ => d.ddtree(tokens, at.0),
                    });
                }
            }
        }
        if wanted.is_empty() {
            break;
        }
        // Both walks are past the anchors behind them: their drafts go, and
        // a trajectory whose walks are done drops its context.
        for ((pair, d), ctx) in walks.iter().zip(drafted.iter_mut()).zip(ctxs.iter_mut()) {
            let behind = pair[0].start.min(pair[1].start);
            d.retain(|&(at, _), _| at >= behind);
            if pair.iter().all(|w| w.pending().is_none()) {
                *ctx = DraftContext::new();
            }
        }
        for pass in wanted.chunks(MAX_DRAFTS_PER_PASS) {
            for ((j, at), d) in pass.iter().zip(draft_each(jobs, &mut ctxs, pass, budget)?) {
                drafted[*j].insert(*at, d);
            }
        }
    }
    Ok(walks
        .into_iter()
        .map(|[dfl, tree]| (PromptTau::new(dfl.lens), PromptTau::new(tree.lens)))
        .collect())
}

/// The drafts at `wanted` (job, (anchor, block slots)): the drafters'
/// forwards of a batch's drafts together ([`super::draft_outputs`]; job j's
/// context keys and values held in `ctxs[j]`, one draft per context in a
/// batch), then the logits of all drafts through the same `lm_head` from one pass
/// over it.
fn draft_each(
    jobs: &[ReplayJob],
    ctxs: &mut [DraftContext],
    wanted: &[(usize, (usize, usize))],
    budget: usize,
) -> Result<Vec<Drafted>> {
    let rows: Vec<_> = jobs
        .iter()
        .map(|job| move |a: usize, e: usize| Ok(job.feats.narrow(0, a, e - a)?))
        .collect();
    // A trajectory's second anchor in the pass waits for its first: each
    // batch holds one draft per context, the k-th of each trajectory's.
    let mut outs: Vec<Option<Tensor>> = vec![None; wanted.len()];
    let mut seen = vec![0usize; jobs.len()];
    let nth: Vec<usize> = wanted
        .iter()
        .map(|&(j, _)| {
            seen[j] += 1;
            seen[j] - 1
        })
        .collect();
    for k in 0..nth.iter().max().map_or(0, |m| m + 1) {
        let mut free_ctxs: Vec<Option<&mut DraftContext>> = ctxs.iter_mut().map(Some).collect();
        let mut index = Vec::new();
        let mut drafts = Vec::new();
        for (i, &(j, (start, b))) in wanted.iter().enumerate().filter(|(i, _)| nth[*i] == k) {
            let ctx = free_ctxs[j]
                .take()
                .expect("one draft per context in a batch");
            drafts.push(super::DraftRequest {
                t: jobs[j].target,
                tokens: jobs[j].tokens,
                start,
                b,
                ctx,
                rows: &rows[j],
            });
            index.push(i);
        }
        for (i, y) in index.into_iter().zip(super::draft_outputs(drafts)?) {
            outs[i] = Some(y);
        }
    }
    let outs: Vec<Tensor> = outs
        .into_iter()
        .map(|y| y.expect("every draft is made"))
        .collect();
    let mut logits: Vec<Option<Tensor>> = vec![None; wanted.len()];
    // Drafts through one head (the same source, rounded alike) share a pass.
    let mut left: Vec<usize> = (0..wanted.len()).collect();
    while let Some(&first) = left.first() {
        let t = jobs[wanted[first].0].target;
        let same = |i: &usize| {
            let u = jobs[wanted[*i].0].target;
            std::ptr::addr_eq(u.head, t.head) && u.prec == t.prec
        };
        let (these, rest): (Vec<usize>, Vec<usize>) = left.iter().partition(|i| same(i));
        let each: Vec<(&Drafter, &Tensor)> = these
            .iter()
            .map(|&i| (jobs[wanted[i].0].target.drafter, &outs[i]))
            .collect();
        for (i, l) in these
            .iter()
            .zip(Drafter::logits_from_each(&each, t.head, t.prec)?)
        {
            logits[*i] = Some(l);
        }
        left = rest;
    }
    logits
        .into_iter()
        .map(|l| {
            let l = l.expect("every draft's logits are made");
            Ok(Drafted {
                drafts: l.argmax(D::Minus1)?.to_vec1::<u32>()?,
                tree: build_tree(&l, budget)?,
            })
        })
        .collect()
}
