//! τ on every loading path of a session: each path's greedy trajectory, the
//! drafter replayed on its own tap features, and cross runs (path B's
//! features against path 0's trajectory), with DDTree-N from the same drafts.

use serde::Serialize;

use super::eval::{self, CrossTau, DdtreeTau, DrafterInfo, EndRule, PathTau, PromptReplay};
use super::{features, replay_all, DrafterSettings, Replayed};
use crate::error::{Error, Result};
use crate::loading::{ResolvedPath, WeightSource};
use crate::models::dflash::Drafter;
use crate::models::{GdnForm, TextModel};
use crate::precision::Precision;
use crate::progress::Bars;
use crate::session::{weights_key, Session};

/// The members a drafter report adds to the envelope (`drafter --json`, and
/// the `drafter` member of `compare --json`).
#[derive(Debug, Clone, Serialize)]
pub struct DrafterEval {
    /// The drafter as loaded.
    pub drafter: DrafterInfo,
    /// The replayed end-of-generation rule.
    pub end_rule: EndRule,
    /// Greedy tokens per prompt.
    pub max_new_tokens: usize,
    /// Largest |τ(path) − τ(reference path)|.
    pub tau_gap: f64,
    /// `--max-tau-gap`.
    pub max_tau_gap: f64,
    /// τ per loading path.
    pub paths: Vec<PathTau>,
    /// Path j's features on path 0's trajectory (j ≥ 1).
    pub cross: Vec<CrossTau>,
}

/// One loading path's evaluation (its model already dropped).
struct PathResult {
    name: String,
    dtype: Precision,
    lm_head_from: String,
    /// Per prompt: full token sequence (prompt + continuation).
    tokens: Vec<Vec<u32>>,
    /// Its features on its own trajectory.
    own: Replayed,
    /// Its features on path 0's trajectory (`None` for path 0).
    cross: Option<Replayed>,
}

/// What every path's run shares.
struct Run<'a> {
    session: &'a Session,
    drafter: &'a Drafter,
    settings: &'a DrafterSettings,
    prompt_lens: Vec<usize>,
    generated: indicatif::ProgressBar,
    replays: indicatif::ProgressBar,
}

impl Run<'_> {
    /// `model`'s features on `tokens`, replayed through `model`'s embedding and lm_head.
    fn replay(&self, model: &TextModel, tokens: &[Vec<u32>], what: String) -> Result<Replayed> {
        self.replays.set_message(what);
        let taps = &self.drafter.cfg.target_layer_ids;
        let feats = features(model, tokens, &self.prompt_lens, taps, GdnForm::Chunked)?;
        let r = replay_all(
            self.drafter,
            model,
            tokens,
            &self.prompt_lens,
            &feats,
            self.settings.replay,
        )?;
        self.replays.inc(1);
        Ok(r)
    }

    /// Loads `p` (with `head`'s lm_head), generates its trajectories,
    /// replays its own and path 0's (`first`), drops the model.
    fn evaluate_path(
        &self,
        p: &ResolvedPath,
        head: &dyn WeightSource,
        dtype: Precision,
        first: Option<&PathResult>,
    ) -> Result<(Vec<Vec<u32>>, Replayed, Option<Replayed>)> {
        let name = p.path.name();
        self.generated
            .set_message(format!("{name}: loading weights"));
        let model = TextModel::load(&self.session.spec, &p.view, Some(head), dtype)?;
        let block = self.drafter.cfg.block_size;
        let mut tokens = Vec::new();
        for pr in &self.session.prompts {
            self.generated.set_message(format!("{name}: generating"));
            let gen = model.greedy(
                &pr.ids,
                self.settings.replay.max_new + block,
                GdnForm::Chunked,
            )?;
            tokens.push([pr.ids.clone(), gen].concat());
            self.generated.inc(1);
        }
        let own = self.replay(&model, &tokens, name.to_string())?;
        let cross = first
            .map(|r0| {
                self.replay(
                    &model,
                    &r0.tokens,
                    format!("{name} features on {}'s tokens", r0.name),
                )
            })
            .transpose()?;
        Ok((tokens, own, cross))
    }
}

/// The lm_head a path drafts and decodes with: its own, else the first
/// path's that has one (as an eval harness built on `AutoModel` must).
fn head_of<'a>(
    session: &'a Session,
    p: &'a ResolvedPath,
    notes: &mut Vec<String>,
) -> Result<(&'a dyn WeightSource, String)> {
    if p.view.has_lm_head() {
        return Ok((&p.view, format!("{} (its own)", p.path.name())));
    }
    let hp = session
        .paths
        .iter()
        .find(|p| p.view.has_lm_head())
        .ok_or_else(|| {
            Error::Input("no loading path has an lm_head; add causal-lm to --paths".into())
        })?;
    notes.push(format!(
        "{} ({}) has no lm_head: greedy decoding and draft logits use {}'s lm_head.weight, as an eval harness built on it must",
        p.path.name(),
        p.inventory.class,
        hp.path.name()
    ));
    Ok((&hp.view, format!("{} (borrowed)", hp.path.name())))
}

/// Evaluates `drafter` (computing in `dprec`) on every loading path of
/// `session`, in `dtype` when given (else each path's own dtype). One path
/// at a time, one resident model: load, generate the greedy trajectory,
/// replay on it, replay its features on path 0's trajectory (cross), drop.
/// A path reading the same bytes in the same dtype with the same lm_head as
/// an earlier one reuses that one's results (every kernel is deterministic).
/// Returns the evaluation and notes for the report.
///
/// Errors: no loading path with an `lm_head`; a tensor failure.
pub fn evaluate(
    session: &Session,
    drafter: &Drafter,
    dprec: Precision,
    settings: &DrafterSettings,
    dtype: Option<Precision>,
    quiet: bool,
) -> Result<(DrafterEval, Vec<String>)> {
    let bars = Bars::new(quiet);
    let n = session.paths.len();
    let run = Run {
        session,
        drafter,
        settings,
        prompt_lens: session.prompt_lens(),
        generated: bars.count((n * session.prompts.len()) as u64, "prompts generated"),
        replays: bars.count((2 * n).saturating_sub(1) as u64, "replays"),
    };
    let mut notes = Vec::new();
    let mut runs: Vec<PathResult> = Vec::new();
    let mut keys = Vec::new();
    for (i, p) in session.paths.iter().enumerate() {
        let (head, lm_head_from) = head_of(session, p, &mut notes)?;
        let dtype = dtype.unwrap_or(p.dtype);
        let key = weights_key(&session.spec, &p.view, Some(head), dtype);
        let same_as = keys.iter().position(|k| *k == key);
        keys.push(key);
        let (tokens, own, cross) = match same_as {
            Some(j) => {
                let r: &PathResult = &runs[j];
                notes.push(format!(
                    "{} reads the same weights as {} in the same dtype with the same lm_head: its trajectory and replays are {}'s (computed once; every kernel is deterministic)",
                    p.path.name(),
                    r.name,
                    r.name
                ));
                run.generated.inc(session.prompts.len() as u64);
                // Path j's features on path 0's tokens: j's own replay when j = 0.
                let cross = match (i, j) {
                    (0, _) => None,
                    (_, 0) => Some(r.own.clone()),
                    _ => r.cross.clone(),
                };
                run.replays.inc(1 + u64::from(cross.is_some()));
                (r.tokens.clone(), r.own.clone(), cross)
            }
            None => run.evaluate_path(p, head, dtype, runs.first())?,
        };
        runs.push(PathResult {
            name: p.path.name().to_string(),
            dtype,
            lm_head_from,
            tokens,
            own,
            cross,
        });
    }
    run.generated.finish();
    run.replays.finish();
    bars.clear();
    Ok((assemble(session, drafter, dprec, settings, &runs), notes))
}

/// τ per path, the cross runs and the τ gap from the paths' results.
fn assemble(
    session: &Session,
    drafter: &Drafter,
    dprec: Precision,
    settings: &DrafterSettings,
    runs: &[PathResult],
) -> DrafterEval {
    let b = drafter.cfg.block_size;
    let max_new = settings.replay.max_new;
    let mut paths = Vec::new();
    let mut cross = Vec::new();
    for r in runs {
        let (dfl, tree) = r.own.clone();
        let summary = eval::summarize(&dfl, b);
        let tree_summary = eval::summarize(&tree, b);
        paths.push(PathTau {
            name: r.name.clone(),
            dtype: r.dtype,
            lm_head_from: r.lm_head_from.clone(),
            summary,
            per_prompt: dfl
                .into_iter()
                .zip(&r.tokens)
                .zip(&session.prompts)
                .map(|((p, toks), pr)| PromptReplay {
                    tau: p.tau,
                    acceptance_lengths: p.acceptance_lengths,
                    tokens: toks[pr.ids.len()..pr.ids.len() + max_new].to_vec(),
                })
                .collect(),
            ddtree: DdtreeTau {
                budget: settings.replay.budget,
                tau_macro: tree_summary.tau_macro,
                tau_pooled: tree_summary.tau_pooled,
                per_prompt: tree,
            },
        });
        if let Some((dfl, tree)) = &r.cross {
            let s = eval::summarize(dfl, b);
            cross.push(CrossTau {
                features: r.name.clone(),
                trajectory: runs[0].name.clone(),
                tau_macro: s.tau_macro,
                tau_pooled: s.tau_pooled,
                ddtree_tau_macro: eval::summarize(tree, b).tau_macro,
            });
        }
    }
    let tau0 = paths[0].summary.tau_macro;
    let tau_gap = paths
        .iter()
        .map(|p| (p.summary.tau_macro - tau0).abs())
        .fold(0.0, f64::max);
    DrafterEval {
        drafter: DrafterInfo {
            source: settings.source.clone(),
            target_layer_ids: drafter.cfg.target_layer_ids.clone(),
            block_size: b,
            mask_token_id: drafter.cfg.mask_token_id,
            num_hidden_layers: drafter.cfg.num_hidden_layers,
            dtype: dprec,
        },
        end_rule: settings.replay.rule,
        max_new_tokens: max_new,
        tau_gap,
        max_tau_gap: settings.max_tau_gap,
        paths,
        cross,
    }
}
