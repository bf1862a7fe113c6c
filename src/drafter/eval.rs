//! Replay evaluation of a DFlash drafter (z-lab/dflash `dflash/model.py`
//! `dflash_generate`, GitHub main @44947fb; `docs/architecture.md`, "drafter").
//!
//! At temperature 0 the DFlash loop commits exactly the target's greedy
//! trajectory, so it can be replayed with one target forward per prompt: the
//! target's greedy continuation is generated once (with its cache), its tap
//! hidden states are captured over the whole sequence, and the blocks are
//! walked: at anchor `start` the drafter sees the block `[tok[start], M, …, M]`
//! and the context rows `< start`, the longest prefix of its greedy drafts that
//! equals `tok[start+1..]` is accepted (`a`), `a + 1` is recorded and
//! `start += a + 1` — z-lab GitHub main's rule (full blocks every round, stop
//! once `start ≥ prompt_len + max_new_tokens`). DDTree-N replays the same way
//! with a best-first tree of N draft nodes per round (`liranringel/ddtree`
//! `build_ddtree_tree` / `follow_verified_tree`).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use candle_core::{Tensor, D};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::loading::WeightSource;
use crate::models::dflash::{DraftContext, Drafter};
use crate::precision::Precision;

/// The end-of-generation rule replayed (named in every report).
pub const END_RULE: &str =
    "z-lab dflash GitHub main: full blocks every round, record a+1, stop when start>=prompt_len+max_new_tokens";

/// The end-of-generation rule of the `dflash` 0.1.0 wheel on PyPI.
pub const END_RULE_WHEEL: &str = "dflash 0.1.0 wheel (PyPI): verify min(B,max_length-start) tokens, record min(a+1,max_length-start-1), loop while start+1<max_length";

/// Which reference loop's end-of-generation rule to replay (`--end-rule`):
/// z-lab's GitHub main and the PyPI wheel, both "0.1.0", differ only there.
/// Serialised as its sentence ([`EndRule::describe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EndRule {
    /// z-lab GitHub main @44947fb ([`END_RULE`]).
    #[default]
    GithubMain,
    /// The PyPI wheel's `dflash_generate` ([`END_RULE_WHEEL`]): the last
    /// blocks shrink to the tokens left, and recorded lengths sum to
    /// `max_new_tokens - 1`.
    Wheel,
}

impl Serialize for EndRule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.describe())
    }
}

impl EndRule {
    /// Its `--end-rule` value.
    pub fn flag(self) -> &'static str {
        match self {
            EndRule::GithubMain => "main",
            EndRule::Wheel => "wheel",
        }
    }

    /// The rule as a sentence (what reports record).
    pub fn describe(self) -> &'static str {
        match self {
            EndRule::GithubMain => END_RULE,
            EndRule::Wheel => END_RULE_WHEEL,
        }
    }
}

/// What the drafter needs from a target: its embedding and LM head, read
/// from the target's weights (rows gathered, the head in vocabulary chunks).
pub struct DraftTarget<'a> {
    /// The drafter.
    pub drafter: &'a Drafter,
    /// The target's text-model weights (`embed_tokens.weight`).
    pub weights: &'a dyn WeightSource,
    /// Where the target's `lm_head.weight` comes from.
    pub head: &'a dyn WeightSource,
    /// The target's compute dtype (its embedding rows and head are rounded to it).
    pub prec: Precision,
}

/// Per-prompt result of one replay.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PromptTau {
    /// Mean acceptance length over the rounds of this prompt.
    pub tau: f64,
    /// `a + 1` per round.
    pub acceptance_lengths: Vec<usize>,
}

impl PromptTau {
    fn new(acceptance_lengths: Vec<usize>) -> Self {
        let tau = if acceptance_lengths.is_empty() {
            0.0
        } else {
            acceptance_lengths.iter().sum::<usize>() as f64 / acceptance_lengths.len() as f64
        };
        Self {
            tau,
            acceptance_lengths,
        }
    }
}

/// `[start+1 .. start+b)` draft logits `[b-1, V]` at anchor `start` of
/// `tokens` for a block of `b` slots (the drafter's `block_size`, or fewer
/// where the wheel's rule shrinks the last blocks), with context rows
/// `feats[0..start)` (`feats`: `[T, K·H]`) whose keys and values `ctx` holds
/// as far as earlier anchors of the same walk reached ([`DraftContext`]).
pub fn draft_logits(
    t: &DraftTarget,
    tokens: &[u32],
    feats: &Tensor,
    start: usize,
    b: usize,
    ctx: &mut DraftContext,
) -> Result<Tensor> {
    let rows = |a: usize, e: usize| Ok(feats.narrow(0, a, e - a)?);
    let draft = DraftRequest {
        t,
        tokens,
        start,
        b,
        ctx,
        rows: &rows,
    };
    let y = draft_outputs(vec![draft])?.remove(0);
    t.drafter.logits_from(&y, t.head, t.prec)
}

/// The greedy drafts (the argmax of each row) of several drafts through
/// `t`'s `lm_head`, from their outputs (`draft_outputs`): the head read once
/// per 16 drafts instead of once per draft ([`Drafter::logits_from_each`]),
/// each pass's logits dropped once its argmax is taken; each draft's logits
/// bitwise [`draft_logits`]'s.
///
/// Errors: as [`draft_logits`].
pub fn greedy_drafts(t: &DraftTarget, outs: &[Tensor]) -> Result<Vec<Vec<u32>>> {
    let mut drafts = Vec::with_capacity(outs.len());
    for pass in outs.chunks(rounds::MAX_DRAFTS_PER_PASS) {
        let each: Vec<(&Drafter, &Tensor)> = pass.iter().map(|y| (t.drafter, y)).collect();
        for l in Drafter::logits_from_each(&each, t.head, t.prec)? {
            drafts.push(super::target::argmax_rows(&l)?);
        }
    }
    Ok(drafts)
}

/// Tokens after `prompt_len + max_new` a replay under `rule` reads: the
/// targets of the last block's drafts (GitHub main: full blocks, B − 1
/// beyond the last anchor; the wheel shrinks its last blocks to end at
/// `max_new`).
pub fn lookahead(rule: EndRule, b: usize) -> usize {
    match rule {
        EndRule::GithubMain => b - 1,
        EndRule::Wheel => 0,
    }
}

fn check_len(
    tokens: &[u32],
    prompt_len: usize,
    max_new: usize,
    b: usize,
    rule: EndRule,
) -> Result<()> {
    if prompt_len == 0 {
        return Err(Error::Input("a prompt needs at least one token".into()));
    }
    let need = prompt_len + max_new + lookahead(rule, b);
    if tokens.len() < need {
        return Err(Error::Input(format!(
            "trajectory has {} tokens; the replay needs {need}: prompt ({prompt_len}) + max_new_tokens ({max_new}) + the last block's targets ({})",
            tokens.len(),
            lookahead(rule, b)
        )));
    }
    Ok(())
}

/// Walks the anchors of one trajectory under `rule`: `round(start, block)`
/// returns the round's accepted drafts plus one (`a + 1`) for a block of
/// `block` slots at anchor `start`; the walk records what each round commits
/// and advances by it ([`rounds::Walk`], one round at a time).
fn walk(
    prompt_len: usize,
    max_new: usize,
    b: usize,
    rule: EndRule,
    mut round: impl FnMut(usize, usize) -> Result<usize>,
) -> Result<PromptTau> {
    let mut w = rounds::Walk::new(prompt_len, max_new, b, rule);
    while let Some((start, block)) = w.pending() {
        w.advance(round(start, block)?);
    }
    Ok(PromptTau::new(w.lens))
}

/// DFlash replay over one trajectory under the end-of-generation `rule`.
/// `tokens`: prompt + greedy continuation (at least `prompt_len + max_new +
/// B` tokens); `feats`: `[≥ that, K·H]` tap features of those tokens.
pub fn replay_dflash(
    t: &DraftTarget,
    tokens: &[u32],
    prompt_len: usize,
    feats: &Tensor,
    max_new: usize,
    rule: EndRule,
) -> Result<PromptTau> {
    let b = t.drafter.cfg.block_size;
    check_len(tokens, prompt_len, max_new, b, rule)?;
    let mut ctx = DraftContext::new();
    walk(prompt_len, max_new, b, rule, |start, block| {
        let drafts = draft_logits(t, tokens, feats, start, block, &mut ctx)?
            .argmax(D::Minus1)?
            .to_vec1::<u32>()?;
        Ok(rounds::dflash_accepted(&drafts, tokens, start))
    })
}

#[derive(PartialEq)]
struct Cand {
    logw: f32,
    parent: usize,
    depth: usize,
    rank: usize,
}
impl Eq for Cand {}
impl PartialOrd for Cand {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Cand {
    fn cmp(&self, o: &Self) -> Ordering {
        // Max-heap on logw; ties: earlier-created parents, shallower, lower rank first.
        self.logw
            .total_cmp(&o.logw)
            .then(o.parent.cmp(&self.parent))
            .then(o.depth.cmp(&self.depth))
            .then(o.rank.cmp(&self.rank))
    }
}

/// DDTree's draft tree from `[D, V]` draft logits: best-first over path
/// log-probabilities (product of per-depth log-softmax), at most `budget`
/// non-root nodes. Returns `children[node] = token → child` (node 0 = root).
pub fn build_tree(logits: &Tensor, budget: usize) -> Result<Vec<HashMap<u32, usize>>> {
    let lp = candle_nn::ops::log_softmax(logits, D::Minus1)?.to_vec2::<f32>()?;
    let depths = lp.len();
    let v = lp.first().map(Vec::len).unwrap_or(0);
    let k = budget.min(v);
    // Per depth: (token, logprob) sorted by logprob descending, first k.
    let top: Vec<Vec<(u32, f32)>> = lp
        .iter()
        .map(|row| {
            let mut idx: Vec<(u32, f32)> = row
                .iter()
                .enumerate()
                .map(|(i, &x)| (i as u32, x))
                .collect();
            // The first k in (logprob descending, id ascending) order: a
            // total order, so selecting them and sorting those gives the
            // full sort's first k.
            let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
            if k > 0 && k < idx.len() {
                idx.select_nth_unstable_by(k - 1, order);
            }
            idx.truncate(k);
            idx.sort_by(order);
            idx
        })
        .collect();
    let mut children: Vec<HashMap<u32, usize>> = vec![HashMap::new()];
    if depths == 0 || k == 0 {
        return Ok(children);
    }
    let mut heap = BinaryHeap::new();
    heap.push(Cand {
        logw: top[0][0].1,
        parent: 0,
        depth: 1,
        rank: 0,
    });
    while let Some(c) = heap.pop() {
        if children.len() > budget {
            break;
        }
        let idx = children.len();
        let tok = top[c.depth - 1][c.rank].0;
        children[c.parent].insert(tok, idx);
        children.push(HashMap::new());
        if c.rank + 1 < k {
            let row = &top[c.depth - 1];
            heap.push(Cand {
                logw: c.logw - row[c.rank].1 + row[c.rank + 1].1,
                parent: c.parent,
                depth: c.depth,
                rank: c.rank + 1,
            });
        }
        if c.depth < depths {
            heap.push(Cand {
                logw: c.logw + top[c.depth][0].1,
                parent: idx,
                depth: c.depth + 1,
                rank: 0,
            });
        }
        if children.len() > budget {
            break;
        }
    }
    Ok(children)
}

/// DDTree-`budget` replay: per round, the tree from the draft logits; accept
/// the longest root path equal to the trajectory; record its length (root
/// included, so the same scale as DFlash's `a + 1`). The anchors are walked
/// under the same end rule as DFlash (`rule`): under the wheel's rule the
/// last blocks shrink, so the tree is at most `block - 1` deep there.
pub fn replay_ddtree(
    t: &DraftTarget,
    tokens: &[u32],
    prompt_len: usize,
    feats: &Tensor,
    max_new: usize,
    budget: usize,
    rule: EndRule,
) -> Result<PromptTau> {
    let b = t.drafter.cfg.block_size;
    check_len(tokens, prompt_len, max_new, b, rule)?;
    let mut ctx = DraftContext::new();
    walk(prompt_len, max_new, b, rule, |start, block| {
        let logits = draft_logits(t, tokens, feats, start, block, &mut ctx)?;
        let tree = build_tree(&logits, budget)?;
        Ok(rounds::ddtree_accepted(&tree, tokens, start))
    })
}

/// The drafter as loaded.
#[derive(Debug, Clone, Serialize)]
pub struct DrafterInfo {
    /// Argument given.
    pub source: String,
    /// Target decoder layers tapped (`hidden_states[L+1]`).
    pub target_layer_ids: Vec<usize>,
    /// Draft block length B.
    pub block_size: usize,
    /// Token filling the masked block slots.
    pub mask_token_id: u32,
    /// Draft layers.
    pub num_hidden_layers: usize,
    /// dtype the drafter computed in.
    pub dtype: Precision,
    /// What the drafter's config records about its target, checked against
    /// this target ([`crate::drafter::audit`]); a disagreement fails the run.
    pub audit: Vec<crate::drafter::audit::AuditCheck>,
    /// Tensors the drafter's file holds that the DFlash forward never reads
    /// (dflash's `from_pretrained` lists them as UNEXPECTED), sorted: τ is
    /// measured without them.
    pub unexpected_tensors: Vec<String>,
    /// The window the drafter's config names for its `sliding_attention`
    /// layers without `use_sliding_window: true`: transformers'
    /// `Qwen3Config` drops it, so dflash (and this run) attend those layers
    /// causally without a window.
    pub sliding_window_unused: Option<usize>,
    /// Config flags asking for a forward the DFlash one does not have
    /// (`norm_before_fc: true`), as `name: value`: τ is measured without
    /// them, a finding like [`Self::unexpected_tensors`].
    pub ignored_flags: Vec<String>,
}

/// DDTree results for one path.
#[derive(Debug, Clone, Serialize)]
pub struct DdtreeTau {
    /// Node budget N (DDTree-N).
    pub budget: usize,
    /// τ macro: mean over prompts of each prompt's mean acceptance length.
    pub tau_macro: f64,
    /// τ pooled: mean over all rounds.
    pub tau_pooled: f64,
    /// Per prompt.
    pub per_prompt: Vec<PromptTau>,
}

/// One prompt replayed on one path.
#[derive(Debug, Clone, Serialize)]
pub struct PromptReplay {
    /// Mean acceptance length of this prompt.
    pub tau: f64,
    /// `a + 1` per round.
    pub acceptance_lengths: Vec<usize>,
    /// The target's greedy continuation (the trajectory the drafter is judged on).
    pub tokens: Vec<u32>,
}

/// The loading path whose `lm_head` (and embeddings) a replay drafted
/// through, and how: written `causal-lm (its own)`, `causal-lm (borrowed)`
/// (a path without one, `AutoModel`, borrows it), or `causal-lm (embeddings
/// and lm_head only)` (`drafter --features`: the file's taps, path 0's
/// embeddings and a path's `lm_head`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LmHeadFrom {
    /// The path it comes from.
    pub path: crate::loading::LoadingPath,
    /// How the replay uses it.
    pub how: HeadUse,
}

/// How a replay uses a path's `lm_head` ([`LmHeadFrom`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadUse {
    /// The path's own.
    Own,
    /// Borrowed by a path without one.
    Borrowed,
    /// Only the embeddings and `lm_head` (the taps come from a file).
    EmbeddingsAndHeadOnly,
}

impl std::fmt::Display for LmHeadFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match self.how {
            HeadUse::Own => "its own",
            HeadUse::Borrowed => "borrowed",
            HeadUse::EmbeddingsAndHeadOnly => "embeddings and lm_head only",
        };
        write!(f, "{} ({how})", self.path.name())
    }
}

impl Serialize for LmHeadFrom {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// τ on one loading path.
#[derive(Debug, Clone, Serialize)]
pub struct PathTau {
    /// Loading path.
    pub name: String,
    /// dtype the target computed in on this path.
    pub dtype: Precision,
    /// Where `lm_head` came from (`AutoModel` has none of its own).
    pub lm_head_from: LmHeadFrom,
    #[serde(flatten)]
    /// τ aggregates (flattened into the JSON object).
    pub summary: TauSummary,
    /// Per prompt: τ, acceptance lengths, the trajectory.
    pub per_prompt: Vec<PromptReplay>,
    /// DDTree-N from the same drafts.
    pub ddtree: DdtreeTau,
    /// Sweeps over the target's layers this path ran (prefill, one per
    /// verification round, the cross run's teacher-forced one); 0 when its
    /// results are another path's.
    pub sweeps: usize,
    /// Verification rounds of the generation (0 with given trajectories).
    pub rounds: usize,
}

/// Drafter fed `features`' hidden states, judged on `trajectory`'s tokens.
#[derive(Debug, Clone, Serialize)]
pub struct CrossTau {
    /// Path whose tap features fed the drafter.
    pub features: String,
    /// Path whose trajectory the drafts were judged on.
    pub trajectory: String,
    /// τ macro: mean over prompts of each prompt's mean acceptance length.
    pub tau_macro: f64,
    /// τ pooled: mean over all rounds.
    pub tau_pooled: f64,
    /// DDTree τ (macro).
    pub ddtree_tau_macro: f64,
}

/// τ aggregates over prompts (z-lab's τ is the macro mean).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TauSummary {
    /// Mean over prompts of each prompt's mean acceptance length (z-lab's τ).
    pub tau_macro: f64,
    /// Mean over all rounds pooled.
    pub tau_pooled: f64,
    /// Fraction of rounds with acceptance length `i`, i = 0..=B (index 0 unused).
    pub histogram: Vec<f64>,
    /// For draft slot k = 1..B-1: fraction of rounds that accepted it.
    pub per_position_acceptance: Vec<f64>,
}

/// Aggregates per-prompt results for block size `b`.
pub fn summarize(per_prompt: &[PromptTau], b: usize) -> TauSummary {
    let all: Vec<usize> = per_prompt
        .iter()
        .flat_map(|p| p.acceptance_lengths.iter().copied())
        .collect();
    let n = all.len().max(1) as f64;
    let mut histogram = vec![0f64; b + 1];
    for &l in &all {
        if l <= b {
            histogram[l] += 1.0 / n;
        }
    }
    let per_position_acceptance = (1..b)
        .map(|k| all.iter().filter(|&&l| l > k).count() as f64 / n)
        .collect();
    let tau_macro = if per_prompt.is_empty() {
        0.0
    } else {
        per_prompt.iter().map(|p| p.tau).sum::<f64>() / per_prompt.len() as f64
    };
    TauSummary {
        tau_macro,
        tau_pooled: all.iter().sum::<usize>() as f64 / n,
        histogram,
        per_position_acceptance,
    }
}

/// Concatenates the tap features along the feature dim: tap L = output of
/// decoder layer L = `hidden_states[L+1]`, pre-norm — for the last layer that
/// is the raw `last_layer_output`, not transformers' final-normed entry
/// (sglang#32204). `hidden_states`: N+1 entries; result `[T, K·H]`.
/// Errors: a tap ≥ N.
pub fn tap_features(
    hidden_states: &[Tensor],
    last_layer_output: &Tensor,
    taps: &[usize],
) -> Result<Tensor> {
    let n_layers = hidden_states.len().saturating_sub(1);
    let parts = taps
        .iter()
        .map(|&l| match l {
            l if l + 1 < n_layers => Ok(&hidden_states[l + 1]),
            l if l + 1 == n_layers => Ok(last_layer_output),
            l => Err(Error::Input(format!(
                "drafter tap {l} is outside the target's decoder layers 0..{} (tap L = output of layer L = hidden_states[L+1])",
                n_layers.saturating_sub(1)
            ))),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&parts, D::Minus1)?)
}

mod drafts;
mod notes;
mod rounds;
pub(crate) use drafts::{draft_outputs, DraftRequest};
pub use notes::unread_finding;
pub use rounds::{replay_jobs, ReplayJob};

#[cfg(test)]
mod tests;
