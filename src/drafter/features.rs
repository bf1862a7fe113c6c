//! τ on captured features (`drafter --features FILE`): the drafter replayed
//! on the taps a file holds (an hsparity dump, or anything `import` reads:
//! a SpecForge training record, a vLLM capture, …) over the file's own token
//! sequence, drafting through the target's embeddings and LM head only; next
//! to it, τ on each loading path's own taps over the same tokens (one
//! teacher-forced forward per path). The direct test of the hidden-state
//! contract: does the drafter accept as well on what an eval path gives it
//! as on what it was trained on?
//!
//! The replay is [`super::eval`]'s (z-lab's DFlash loop at temperature 0 and
//! DDTree-N), anchored at the end of each sequence's prompt: the rows before
//! its first `loss_mask` 1 (a training record's prompt), or the first token
//! alone when the file has no loss mask. At most `max_new_tokens` tokens of
//! each response are walked; a response needs that many plus one block.

use candle_core::Tensor;
use serde::Serialize;

use super::eval::{self, CrossTau, DdtreeTau, DraftTarget, DrafterInfo, EndRule, PathTau};
use super::eval::{HeadUse, LmHeadFrom, PromptReplay, PromptTau};
use super::plan::{MemoryPlan, Residency};
use super::target::TargetModel;
use super::trajectories::TrajectoryReport;
use super::{DrafterSettings, Replay};
use crate::dump::Dump;
use crate::error::{Error, Result};
use crate::loading::resident::Resident;
use crate::loading::{ResolvedPath, WeightSource};
use crate::models::dflash::Drafter;
use crate::models::GdnForm;
use crate::precision::Precision;
use crate::progress::Bars;
use crate::session::{weights_key, Session};

/// One sequence of the file, ready to replay.
#[derive(Debug, Clone)]
pub struct FeaturePrompt {
    /// `p{k}` of the file.
    pub index: usize,
    /// Prompt + response token ids.
    pub tokens: Vec<u32>,
    /// Where the replay anchors: the prompt's length.
    pub prompt_len: usize,
    /// `[T, K·H]`: the drafter's taps as the file holds them.
    pub feats: Tensor,
    /// Response tokens walked (at most `max_new_tokens`; the response holds one block more).
    pub max_new: usize,
}

/// One sequence of the file as reported.
#[derive(Debug, Clone, Serialize)]
pub struct FeaturePromptFacts {
    /// `p{k}` of the file.
    pub prompt: usize,
    /// Tokens in the file.
    pub tokens: usize,
    /// Prompt tokens (the replay's first anchor).
    pub prompt_tokens: usize,
    /// Response tokens the replay walked.
    pub replayed_new_tokens: usize,
}

/// The file's side of the evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct FeatureFile {
    /// The file given.
    pub file: String,
    /// What it is: `dump` or an engine format (`specforge`, `vllm`, …).
    pub format: String,
    /// Where each tap was read from (`hidden_states[L+1]` or `last_layer_output`).
    pub taps: Vec<String>,
    /// The sequences replayed.
    pub prompts: Vec<FeaturePromptFacts>,
    /// τ on the file's taps (its `name` is the file).
    pub tau: PathTau,
}

/// The members `drafter --features` adds to the envelope: those of a
/// drafter report (`paths` over the file's tokens, no cross runs) plus `features`.
#[derive(Debug, Clone, Serialize)]
pub struct FeaturesEval {
    /// The drafter as loaded.
    pub drafter: DrafterInfo,
    /// The replayed end-of-generation rule.
    pub end_rule: EndRule,
    /// Response tokens walked per sequence, at most.
    pub max_new_tokens: usize,
    /// Largest |τ(path) − τ(file)|.
    pub tau_gap: f64,
    /// `--max-tau-gap`.
    pub max_tau_gap: f64,
    /// The largest gap with its 95 % interval (the file is the reference;
    /// set by the verb, which knows `--seed`: [`super::gap::gap_from`]).
    pub tau_gap_interval: Option<super::gap::TauGap>,
    /// τ on the file's taps.
    pub features: FeatureFile,
    /// τ on each loading path's own taps over the file's tokens.
    pub paths: Vec<PathTau>,
    /// Always empty (no trajectory is generated).
    pub cross: Vec<CrossTau>,
    /// How the target's weights were held for the paths' teacher-forced sweeps.
    pub plan: MemoryPlan,
    /// Always null (`--trajectories` and `--features` exclude each other).
    pub trajectories: Option<TrajectoryReport>,
    /// What τ was measured on, in words (the file's sequences).
    pub measured_on: String,
    /// `features`.
    pub prompt_basis: crate::prompts::PromptBasis,
}

/// Where the drafter's tap `l` lives in a dump of an `n_layers`-layer target.
fn tap_source(d: &Dump, k: usize, l: usize, n_layers: usize, name: &str) -> Result<Tensor> {
    let held = || {
        let mut s = format!("it holds hidden_states {:?}", d.indices());
        if d.prompts[0].last_layer_output.is_some() {
            s.push_str(" and last_layer_output");
        }
        s
    };
    let p = &d.prompts[k];
    let t = if l + 1 < n_layers {
        p.hidden_states.get(&(l + 1))
    } else if l + 1 == n_layers {
        p.last_layer_output.as_ref()
    } else {
        None
    };
    t.cloned().ok_or_else(|| {
        Error::Input(if l + 1 == n_layers {
            format!(
                "{name}: no p{k}.last_layer_output: the drafter's tap {l} is the last layer's pre-norm output; {}",
                held()
            )
        } else {
            format!(
                "{name}: no p{k}.hidden_states.{}: the drafter's tap {l} is hidden_states[{}]; {}",
                l + 1,
                l + 1,
                held()
            )
        })
    })
}

/// The anchor of sequence `k`: the rows before the first `loss_mask` 1, else 1.
fn prompt_len(mask: Option<&Vec<i64>>) -> Option<usize> {
    match mask {
        Some(m) => m.iter().position(|&x| x != 0),
        None => Some(1),
    }
}

/// The drafter's taps (`taps`, of an `n_layers`-layer target with `vocab`
/// tokens) out of `dump` (named `name`), per sequence, with what cannot be
/// replayed noted. At most `replay.max_new` response tokens are walked; a
/// response needs one block (`block`) more.
///
/// Errors ([`Error::Input`], naming the file and key): no `input_ids`; a
/// dump of a target of another depth; a tap the file does not hold; an id
/// outside the vocabulary; no sequence long enough to replay.
pub fn from_dump(
    dump: &Dump,
    name: &str,
    taps: &[usize],
    (n_layers, vocab): (usize, usize),
    (replay, block): (&Replay, usize),
) -> Result<(Vec<FeaturePrompt>, Vec<String>)> {
    if !dump.has_input_ids() {
        return Err(Error::Input(format!(
            "{name}: no p0.input_ids: `drafter --features` replays the drafter over the file's own tokens"
        )));
    }
    if let Some(n) = dump.num_layers().filter(|&n| n != n_layers) {
        return Err(Error::Input(format!(
            "{name}: holds the states of a {n}-layer target, the checkpoint has {n_layers} layers"
        )));
    }
    let mut out = Vec::new();
    let mut notes = Vec::new();
    for (k, p) in dump.prompts.iter().enumerate() {
        let ids = p.input_ids.as_ref().expect("checked");
        let tokens = ids
            .iter()
            .map(|&i| u32::try_from(i).ok().filter(|&u| (u as usize) < vocab))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| {
                Error::Input(format!(
                    "{name}: p{k}.input_ids holds an id outside the target's vocabulary (0..{vocab})"
                ))
            })?;
        let parts = taps
            .iter()
            .map(|&l| tap_source(dump, k, l, n_layers, name))
            .collect::<Result<Vec<_>>>()?;
        let Some(start) = prompt_len(p.loss_mask.as_ref()) else {
            notes.push(format!(
                "{name}: p{k} skipped: its loss_mask has no 1 (no response)"
            ));
            continue;
        };
        let room = tokens.len().saturating_sub(start + block);
        if start == 0 || room == 0 {
            notes.push(format!(
                "{name}: p{k} skipped: {} tokens after a {start}-token prompt, fewer than one block ({block}) plus one",
                tokens.len().saturating_sub(start)
            ));
            continue;
        }
        out.push(FeaturePrompt {
            index: k,
            feats: Tensor::cat(&parts, 1)?,
            prompt_len: start,
            max_new: room.min(replay.max_new),
            tokens,
        });
    }
    if dump.prompts.iter().any(|p| p.loss_mask.is_none()) {
        notes.push(format!(
            "{name} has no loss_mask: the replay anchors after the first token and walks the sequence from there"
        ));
    }
    if out.is_empty() {
        return Err(Error::Input(format!(
            "{name}: no sequence is long enough to replay (a response needs max_new_tokens + one block of {block})"
        )));
    }
    Ok((out, notes))
}

/// DFlash and DDTree-N on every sequence with `feats[j]` as context rows.
fn replay(
    t: &DraftTarget,
    prompts: &[FeaturePrompt],
    feats: &[&Tensor],
    r: Replay,
) -> Result<(Vec<PromptTau>, Vec<PromptTau>)> {
    let mut dfl = Vec::new();
    let mut tree = Vec::new();
    for (p, f) in prompts.iter().zip(feats) {
        let (toks, n) = (&p.tokens, p.prompt_len);
        dfl.push(eval::replay_dflash(t, toks, n, f, p.max_new, r.rule)?);
        tree.push(eval::replay_ddtree(
            t, toks, n, f, p.max_new, r.budget, r.rule,
        )?);
    }
    Ok((dfl, tree))
}

/// The τ row of one replay.
fn tau_row(
    name: String,
    (dtype, lm_head_from): (Precision, LmHeadFrom),
    prompts: &[FeaturePrompt],
    (dfl, tree): (Vec<PromptTau>, Vec<PromptTau>),
    (block, budget): (usize, usize),
    sweeps: usize,
) -> PathTau {
    let tree_summary = eval::summarize(&tree, block);
    PathTau {
        name,
        dtype,
        lm_head_from,
        summary: eval::summarize(&dfl, block),
        per_prompt: dfl
            .into_iter()
            .zip(prompts)
            .map(|(r, p)| PromptReplay {
                tau: r.tau,
                acceptance_lengths: r.acceptance_lengths,
                tokens: p.tokens[p.prompt_len..p.prompt_len + p.max_new].to_vec(),
            })
            .collect(),
        ddtree: DdtreeTau {
            budget,
            tau_macro: tree_summary.tau_macro,
            tau_pooled: tree_summary.tau_pooled,
            per_prompt: tree,
        },
        sweeps,
        rounds: 0,
    }
}

/// The path whose `lm_head` drafts: the first with one.
fn head_path(session: &Session) -> Result<&ResolvedPath> {
    session
        .paths
        .iter()
        .find(|p| p.view.has_lm_head())
        .ok_or_else(|| {
            Error::Input("no loading path has an lm_head; add causal-lm to --paths".into())
        })
}

/// What the file's side of the run is, for the report.
#[derive(Debug, Clone)]
pub struct FileFacts {
    /// The file given.
    pub file: String,
    /// `dump` or the engine format read.
    pub format: String,
    /// The dtype the file's states are in.
    pub dtype: Precision,
}

/// What every replay of one evaluation shares.
struct Run<'a> {
    session: &'a Session,
    drafter: &'a Drafter,
    settings: &'a DrafterSettings,
    prompts: &'a [FeaturePrompt],
    plan: &'a MemoryPlan,
    bar: indicatif::ProgressBar,
}

impl Run<'_> {
    fn sizes(&self) -> (usize, usize) {
        (self.drafter.cfg.block_size, self.settings.replay.budget)
    }

    /// τ on the file's taps, drafting through the embeddings of path 0 and the lm_head of `hp`.
    fn file_tau(&self, file: &FileFacts, hp: &ResolvedPath) -> Result<PathTau> {
        let p0 = &self.session.paths[0];
        let d0 = p0.compute;
        self.bar
            .set_message(format!("{}: the file's taps", file.file));
        let t = DraftTarget {
            drafter: self.drafter,
            weights: &p0.view,
            head: &hp.view,
            prec: d0,
        };
        let feats: Vec<&Tensor> = self.prompts.iter().map(|p| &p.feats).collect();
        let from = LmHeadFrom {
            path: hp.path,
            how: HeadUse::EmbeddingsAndHeadOnly,
        };
        let own = replay(&t, self.prompts, &feats, self.settings.replay)?;
        self.bar.inc(1);
        Ok(tau_row(
            file.file.clone(),
            (file.dtype, from),
            self.prompts,
            own,
            self.sizes(),
            0,
        ))
    }

    /// τ on `p`'s own taps over the file's tokens (one teacher-forced forward per sequence).
    fn path_tau(
        &self,
        p: &ResolvedPath,
        head_src: &dyn WeightSource,
        d: Precision,
        from: LmHeadFrom,
    ) -> Result<PathTau> {
        self.bar.set_message(format!(
            "{}: its own taps over the file's tokens",
            p.path.name()
        ));
        let tokens: Vec<Vec<u32>> = self.prompts.iter().map(|p| p.tokens.clone()).collect();
        let lens: Vec<usize> = self.prompts.iter().map(|p| p.prompt_len).collect();
        let taps = &self.drafter.cfg.target_layer_ids;
        let resident = match self.plan.mode {
            Residency::Resident => Some(Resident::load(&p.view, p.view.names())?),
            Residency::Streamed => None,
        };
        let weights: &dyn WeightSource = match &resident {
            Some(r) => r,
            None => &p.view,
        };
        let target = TargetModel {
            spec: &self.session.spec,
            weights,
            head: head_src,
            prec: d,
        };
        let own = super::features(&target, &tokens, &lens, taps, (GdnForm::Chunked, 0), &[])?;
        let t = DraftTarget {
            drafter: self.drafter,
            weights,
            head: head_src,
            prec: d,
        };
        let r = replay(
            &t,
            self.prompts,
            &own.iter().collect::<Vec<_>>(),
            self.settings.replay,
        )?;
        Ok(tau_row(
            p.path.name().into(),
            (d, from),
            self.prompts,
            r,
            self.sizes(),
            1,
        ))
    }

    /// Every path's row; a path reading the same bytes in the same dtype with the same
    /// lm_head as an earlier one reuses its replay (every kernel is deterministic).
    fn path_taus(&self, hp: &ResolvedPath, notes: &mut Vec<String>) -> Result<Vec<PathTau>> {
        let mut done: Vec<((Precision, Vec<String>), PathTau)> = Vec::new();
        for p in &self.session.paths {
            let own_head = p.view.has_lm_head();
            let head_src: &dyn WeightSource = if own_head { &p.view } else { &hp.view };
            let d = p.compute;
            let key = weights_key(&self.session.spec, &p.view, Some(head_src), d);
            let from = LmHeadFrom {
                path: if own_head { p.path } else { hp.path },
                how: if own_head {
                    HeadUse::Own
                } else {
                    HeadUse::Borrowed
                },
            };
            let row = match done.iter().find(|(k, _)| *k == key) {
                Some((_, r)) => {
                    notes.push(format!(
                        "{} reads the same weights as {} in the same dtype with the same lm_head: its replay is {}'s",
                        p.path.name(),
                        r.name,
                        r.name
                    ));
                    PathTau {
                        name: p.path.name().into(),
                        lm_head_from: from,
                        ..r.clone()
                    }
                }
                None => self.path_tau(p, head_src, d, from)?,
            };
            self.bar.inc(1);
            done.push((key, row));
        }
        Ok(done.into_iter().map(|(_, r)| r).collect())
    }
}

/// Evaluates `drafter` (computing in `dprec`) on the file's taps (`prompts`,
/// from [`from_dump`]) and on every loading path's own taps over the same
/// tokens, each path in its compute dtype (`ResolvedPath::compute`). Returns the
/// evaluation and notes for the report.
///
/// Errors: no loading path with an `lm_head`; a tensor failure.
pub fn evaluate(
    session: &Session,
    (drafter, dprec): (&Drafter, Precision),
    settings: &DrafterSettings,
    (file, prompts): (&FileFacts, &[FeaturePrompt]),
    quiet: bool,
) -> Result<(FeaturesEval, Vec<String>)> {
    let bars = Bars::new(quiet);
    let plan = super::plan::plan_for(session, drafter, settings.memory_budget);
    let run = Run {
        session,
        drafter,
        settings,
        prompts,
        plan: &plan,
        bar: bars.count(1 + session.paths.len() as u64, "replays"),
    };
    let hp = head_path(session)?;
    let file_tau = run.file_tau(file, hp)?;
    let mut notes = Vec::new();
    let paths = run.path_taus(hp, &mut notes)?;
    run.bar.finish();
    bars.clear();
    let tau0 = file_tau.summary.tau_macro;
    let tau_gap = paths
        .iter()
        .map(|p| (p.summary.tau_macro - tau0).abs())
        .fold(0.0, f64::max);
    let taps = &drafter.cfg.target_layer_ids;
    let n = session.spec.num_layers();
    let eval = FeaturesEval {
        drafter: DrafterInfo {
            source: settings.source.clone(),
            target_layer_ids: taps.clone(),
            block_size: drafter.cfg.block_size,
            mask_token_id: drafter.cfg.mask_token_id,
            num_hidden_layers: drafter.cfg.num_hidden_layers,
            dtype: dprec,
            audit: super::audit::audit(&drafter.cfg, &session.paths[0].text_config),
            unexpected_tensors: drafter.unexpected.clone(),
            sliding_window_unused: drafter.cfg.sliding_window_unused,
            ignored_flags: drafter.cfg.ignored_flags.clone(),
        },
        end_rule: settings.replay.rule,
        max_new_tokens: settings.replay.max_new,
        tau_gap,
        max_tau_gap: settings.max_tau_gap,
        tau_gap_interval: None,
        measured_on: crate::prompts::describe(&session.prompts, &session.rendering),
        prompt_basis: session.rendering.basis,
        features: FeatureFile {
            file: file.file.clone(),
            format: file.format.clone(),
            taps: taps
                .iter()
                .map(|&l| match l + 1 == n {
                    true => "last_layer_output".to_string(),
                    false => format!("hidden_states[{}]", l + 1),
                })
                .collect(),
            prompts: prompts
                .iter()
                .map(|p| FeaturePromptFacts {
                    prompt: p.index,
                    tokens: p.tokens.len(),
                    prompt_tokens: p.prompt_len,
                    replayed_new_tokens: p.max_new,
                })
                .collect(),
            tau: file_tau,
        },
        paths,
        cross: Vec::new(),
        plan,
        trajectories: None,
    };
    Ok((eval, notes))
}
