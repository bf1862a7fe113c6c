//! `hsparity drafter` (and `compare --drafter`): the DFlash drafter's
//! acceptance length τ on each loading path, DDTree-N from the same drafts,
//! and cross runs (path B's features against path A's trajectory).

use crate::checkpoint::resolve;
use crate::commands::Session;
use crate::drafter_eval::{
    self, CrossTau, DdtreeTau, DraftTarget, DrafterInfo, DrafterReport, EndRule, PathTau,
    PromptReplay, PromptTau,
};
use crate::error::{Error, Result};
use crate::loading::LoadingPath;
use crate::models::dflash::{DflashConfig, Drafter, DrafterWeights};
use crate::models::precision::Precision;
use crate::models::qwen3_5::{GdnForm, TextModel};
use crate::models::WeightSource;
use crate::progress;
use crate::prompts::PromptOptions;

/// Options of a drafter evaluation.
#[derive(Debug, Clone)]
pub struct DrafterOptions {
    /// Target checkpoint (directory or Hub id).
    pub checkpoint: String,
    /// Drafter (directory or Hub id).
    pub drafter: String,
    /// Loading paths; the first is the reference of the cross runs and τ gap.
    pub paths: Vec<LoadingPath>,
    /// Prompt set.
    pub prompts: PromptOptions,
    /// Greedy tokens generated per prompt (the replayed span).
    pub max_new_tokens: usize,
    /// DDTree node budget.
    pub ddtree_budget: usize,
    /// Fail (exit 1) when τ on two paths differs by more than this.
    pub max_tau_gap: f64,
    /// `auto` or a dtype for every target path.
    pub dtype: String,
    /// Seed for tensors a path would initialise randomly.
    pub seed: u64,
    /// Hide progress.
    pub quiet: bool,
    /// Compute device (`--device`).
    pub device: crate::device::DeviceSpec,
    /// End-of-generation rule of the reference loop to replay.
    pub end_rule: drafter_eval::EndRule,
}

/// Reads the drafter's dtype from its config (`dtype`/`torch_dtype`), f32 when absent.
fn drafter_precision(cfg_path: &std::path::Path) -> Result<Precision> {
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(cfg_path).map_err(|e| Error::io(cfg_path, e))?,
    )
    .map_err(|e| Error::Config(format!("{}: {e}", cfg_path.display())))?;
    match v.get("dtype").or_else(|| v.get("torch_dtype")) {
        None | Some(serde_json::Value::Null) => Ok(Precision::F32),
        Some(d) => d
            .as_str()
            .and_then(|s| Precision::parse(s).ok())
            .ok_or_else(|| {
                Error::Config(format!(
                    "{}: dtype {d}: expected \"float32\", \"bfloat16\" or \"float16\"",
                    cfg_path.display()
                ))
            }),
    }
}

/// Resolves and loads a drafter for `target` (checks mask id and taps against
/// the target). Returns the drafter and the dtype it computes in.
///
/// Errors: unresolvable source, invalid config, taps outside the target,
/// mask id outside the vocabulary, weights that do not fit.
pub fn load_drafter(
    source: &str,
    target: &crate::checkpoint::config::TextConfig,
    n_layers: usize,
    device: &candle_core::Device,
) -> Result<(Drafter, Precision)> {
    let dsrc = resolve::resolve(source)?;
    let cfg_path = dsrc.dir.join("config.json");
    let cfg = DflashConfig::from_file(&cfg_path)?;
    let dprec = drafter_precision(&cfg_path)?;
    if cfg.mask_token_id as usize >= target.vocab_size {
        return Err(Error::Config(format!(
            "{}: mask_token_id {} is outside the target's vocabulary ({} rows)",
            cfg_path.display(),
            cfg.mask_token_id,
            target.vocab_size
        )));
    }
    if let Some(bad) = cfg.target_layer_ids.iter().find(|&&l| l >= n_layers) {
        return Err(Error::Config(format!(
            "{}: target_layer_ids contains {bad}, but the target has decoder layers 0..{}",
            cfg_path.display(),
            n_layers - 1
        )));
    }
    let weights = DrafterWeights::load_dir(&dsrc.dir)?.to_device(device)?;
    Ok((
        Drafter::load(cfg, &weights, target.hidden_size, dprec)?,
        dprec,
    ))
}

/// Refuses a `max_new` for which `rule` records no round: the wheel's loop
/// (`while start + 1 < prompt_len + max_new_tokens`) never runs for
/// `max_new_tokens = 1`, so τ would be undefined.
///
/// Errors ([`Error::Input`]): `max_new < 2` under [`EndRule::Wheel`].
pub fn check_end_rule(max_new: usize, rule: EndRule) -> Result<()> {
    if rule == EndRule::Wheel && max_new < 2 {
        return Err(Error::Input(format!(
            "--max-new-tokens {max_new} with --end-rule wheel: the wheel's loop runs no round \
             (it stops once start + 1 >= prompt_len + max_new_tokens), so τ is undefined; \
             use at least 2"
        )));
    }
    Ok(())
}

/// Checks that every prompt plus `max_new` generated tokens plus one block
/// (plus `extra` positions, e.g. a triage position shift) stays within
/// `max_position_embeddings`, and that `max_new ≥ 1`.
///
/// Errors ([`Error::Input`]): naming the prompt, the sum and the limit.
pub fn check_positions(
    prompts: &[crate::prompts::Prompt],
    max_new: usize,
    block: usize,
    extra: usize,
    max_pos: usize,
) -> Result<()> {
    if max_new == 0 {
        return Err(Error::Input("--max-new-tokens must be at least 1".into()));
    }
    for (k, p) in prompts.iter().enumerate() {
        let need = p
            .ids
            .len()
            .checked_add(max_new)
            .and_then(|x| x.checked_add(block))
            .and_then(|x| x.checked_add(extra));
        if need.is_none_or(|n| n > max_pos) {
            return Err(Error::Input(format!(
                "prompt {k} ({}): {} prompt tokens + --max-new-tokens {max_new} + block {block}{} exceed the target's max_position_embeddings = {max_pos}",
                p.origin,
                p.ids.len(),
                if extra > 0 { format!(" + position shift {extra}") } else { String::new() }
            )));
        }
    }
    Ok(())
}

/// Replays DFlash and DDTree-`budget` on every prompt's trajectory with the
/// features `feats[k]`, drafting through `model`'s embedding and LM head.
/// What a replay walks: new tokens per prompt, DDTree budget, and the
/// end-of-generation rule (DFlash and DDTree walk the anchors under it).
#[derive(Debug, Clone, Copy)]
pub struct Replay {
    pub max_new: usize,
    pub budget: usize,
    pub rule: drafter_eval::EndRule,
}

pub fn replay_all(
    drafter: &Drafter,
    model: &TextModel,
    tokens: &[Vec<u32>],
    prompt_lens: &[usize],
    feats: &[candle_core::Tensor],
    r: Replay,
) -> Result<(Vec<PromptTau>, Vec<PromptTau>)> {
    let (max_new, budget) = (r.max_new, r.budget);
    let head = model
        .lm_head()
        .ok_or_else(|| Error::Input("drafting needs the target's lm_head".into()))?
        .weight();
    let t = DraftTarget {
        drafter,
        embed: model.embedding(),
        lm_head: head,
    };
    let mut dfl = Vec::new();
    let mut tree = Vec::new();
    for ((toks, &n), f) in tokens.iter().zip(prompt_lens).zip(feats) {
        dfl.push(drafter_eval::replay_dflash(
            &t, toks, n, f, max_new, r.rule,
        )?);
        tree.push(drafter_eval::replay_ddtree(
            &t, toks, n, f, max_new, budget, r.rule,
        )?);
    }
    Ok((dfl, tree))
}

/// Tap features of `model` over each token sequence (`[T, K·H]` each), the
/// first `prompt_lens[k]` tokens of sequence k being its prompt (decoded
/// tokens keep their decode positions, shifted when the model has a decode shift).
pub fn features(
    model: &TextModel,
    tokens: &[Vec<u32>],
    prompt_lens: &[usize],
    taps: &[usize],
    form: GdnForm,
) -> Result<Vec<candle_core::Tensor>> {
    tokens
        .iter()
        .zip(prompt_lens)
        .map(|(toks, &n)| {
            let pos = model.positions_with_prompt(n, toks.len());
            let out = model.forward_at(toks, &pos, None, form, true)?;
            drafter_eval::tap_features(
                out.hidden_states.as_deref().expect("requested"),
                out.last_layer_output.as_ref().expect("requested"),
                taps,
            )
        })
        .collect()
}

/// DFlash and DDTree-N results per prompt of one replay.
type Replayed = (Vec<PromptTau>, Vec<PromptTau>);

/// One loading path's drafter evaluation (its model already dropped).
struct PathRun {
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

/// Refuses a τ gap that is negative or not a number.
///
/// Errors ([`Error::Input`]): naming `--max-tau-gap`.
pub fn check_tau_gap(gap: f64) -> Result<()> {
    if gap.is_finite() && gap >= 0.0 {
        Ok(())
    } else {
        Err(Error::Input(format!(
            "--max-tau-gap {gap}: expected a non-negative number"
        )))
    }
}

/// Loads `source` for the session's target on its device and checks it
/// against the run: taps and mask id ([`load_drafter`]), positions for
/// `max_new` tokens plus `extra` ([`check_positions`]) and the end rule
/// ([`check_end_rule`]). What `drafter`, `compare --drafter` and `triage`
/// share, done before any long computation.
///
/// Errors: as those three.
pub fn load_checked(
    session: &Session,
    source: &str,
    max_new: usize,
    extra: usize,
    rule: EndRule,
) -> Result<(Drafter, Precision)> {
    let tc = &session.paths[0].text_config;
    let (drafter, dprec) =
        load_drafter(source, tc, session.spec.num_layers(), &session.spec.device)?;
    check_positions(
        &session.prompts,
        max_new,
        drafter.cfg.block_size,
        extra,
        tc.max_position_embeddings,
    )?;
    check_end_rule(max_new, rule)?;
    Ok((drafter, dprec))
}

/// Runs the drafter evaluation.
///
/// Errors: as [`Session::open`] and [`load_checked`]; a bad `--max-tau-gap`;
/// no loading path with an `lm_head` to draft through.
pub fn run(opts: &DrafterOptions) -> Result<DrafterReport> {
    check_tau_gap(opts.max_tau_gap)?;
    let session = Session::open(
        &opts.checkpoint,
        &opts.paths,
        &opts.prompts,
        opts.seed,
        opts.device,
    )?;
    let (drafter, dprec) = load_checked(
        &session,
        &opts.drafter,
        opts.max_new_tokens,
        0,
        opts.end_rule,
    )?;
    run_in(&session, &drafter, dprec, opts)
}

/// The evaluation on an open session with a loaded, checked drafter (the
/// session's paths, prompts and device are used; `opts.checkpoint`,
/// `opts.paths`, `opts.prompts`, `opts.seed` and `opts.device` are not read
/// again).
///
/// Errors: no loading path with an `lm_head`; a tensor failure.
pub fn run_in(
    session: &Session,
    drafter: &Drafter,
    dprec: Precision,
    opts: &DrafterOptions,
) -> Result<DrafterReport> {
    let b = drafter.cfg.block_size;
    let forced = Precision::parse_or_auto(&opts.dtype)?;
    let head_path = session.paths.iter().find(|p| p.view.has_lm_head());
    let mut notes = Vec::new();
    let total = (session.paths.len() * session.prompts.len()) as u64;
    let bars = progress::Bars::new(opts.quiet);
    let pb = bars.count(total, "prompts generated");
    let replays = (2 * session.paths.len()).saturating_sub(1) as u64;
    let rb = bars.count(replays, "replays");
    let prompt_lens: Vec<usize> = session.prompts.iter().map(|p| p.ids.len()).collect();
    let taps = drafter.cfg.target_layer_ids.clone();
    // Features of `model` on `tokens`, replayed through `model`'s embedding and lm_head.
    let replay = |model: &TextModel, tokens: &[Vec<u32>], what: String| -> Result<Replayed> {
        rb.set_message(what);
        let feats = features(model, tokens, &prompt_lens, &taps, GdnForm::Chunked)?;
        replay_all(
            drafter,
            model,
            tokens,
            &prompt_lens,
            &feats,
            Replay {
                max_new: opts.max_new_tokens,
                budget: opts.ddtree_budget,
                rule: opts.end_rule,
            },
        )
        .inspect(|_| rb.inc(1))
    };

    // One path at a time, one resident model: load, generate the greedy
    // trajectory, replay on it, replay its features on path 0's trajectory
    // (cross), drop. A path reading the same bytes in the same dtype with the
    // same lm_head as an earlier one reuses that one's results (every kernel
    // is deterministic).
    let mut runs: Vec<PathRun> = Vec::new();
    let mut keys: Vec<(Precision, Vec<String>)> = Vec::new();
    for (i, p) in session.paths.iter().enumerate() {
        let (head, lm_head_from): (&dyn WeightSource, String) = if p.view.has_lm_head() {
            (&p.view, format!("{} (its own)", p.path.name()))
        } else {
            let hp = head_path.ok_or_else(|| {
                Error::Input("no loading path has an lm_head; add causal-lm to --paths".into())
            })?;
            notes.push(format!(
                "{} ({}) has no lm_head: greedy decoding and draft logits use {}'s lm_head.weight, as an eval harness built on it must",
                p.path.name(),
                p.inventory.class,
                hp.path.name()
            ));
            (&hp.view, format!("{} (borrowed)", hp.path.name()))
        };
        let dtype = forced.unwrap_or(p.dtype.precision());
        let key = crate::commands::weights_key(&session.spec, &p.view, Some(head), dtype);
        let same_as = keys.iter().position(|k| *k == key);
        keys.push(key);
        let run = match same_as {
            Some(j) => {
                notes.push(format!(
                    "{} reads the same weights as {} in the same dtype with the same lm_head: its trajectory and replays are {}'s (computed once; every kernel is deterministic)",
                    p.path.name(),
                    runs[j].name,
                    runs[j].name
                ));
                pb.inc(session.prompts.len() as u64);
                let r = &runs[j];
                // Path j's features on path 0's tokens: j's own replay when j = 0.
                let cross = match (i, j) {
                    (0, _) => None,
                    (_, 0) => Some(r.own.clone()),
                    _ => r.cross.clone(),
                };
                rb.inc(1 + u64::from(cross.is_some()));
                PathRun {
                    name: p.path.name().to_string(),
                    dtype,
                    lm_head_from,
                    tokens: r.tokens.clone(),
                    own: r.own.clone(),
                    cross,
                }
            }
            None => {
                pb.set_message(format!("{}: loading weights", p.path.name()));
                let model = TextModel::load(&session.spec, &p.view, Some(head), dtype)?;
                let mut tokens = Vec::new();
                for pr in &session.prompts {
                    pb.set_message(format!("{}: generating", p.path.name()));
                    let gen = model.greedy(&pr.ids, opts.max_new_tokens + b, GdnForm::Chunked)?;
                    tokens.push([pr.ids.clone(), gen].concat());
                    pb.inc(1);
                }
                let own = replay(&model, &tokens, p.path.name().to_string())?;
                let cross = match runs.first() {
                    Some(r0) => Some(replay(
                        &model,
                        &r0.tokens,
                        format!("{} features on {}'s tokens", p.path.name(), r0.name),
                    )?),
                    None => None,
                };
                PathRun {
                    name: p.path.name().to_string(),
                    dtype,
                    lm_head_from,
                    tokens,
                    own,
                    cross,
                }
            }
        };
        runs.push(run);
    }
    pb.finish();
    rb.finish();
    bars.clear();

    let mut paths = Vec::new();
    let mut cross = Vec::new();
    for r in &runs {
        let (dfl, tree) = r.own.clone();
        let summary = drafter_eval::summarize(&dfl, b);
        let tree_summary = drafter_eval::summarize(&tree, b);
        paths.push(PathTau {
            name: r.name.clone(),
            dtype: r.dtype.name().into(),
            lm_head_from: r.lm_head_from.clone(),
            summary,
            per_prompt: dfl
                .into_iter()
                .zip(&r.tokens)
                .zip(&session.prompts)
                .map(|((p, toks), pr)| PromptReplay {
                    tau: p.tau,
                    acceptance_lengths: p.acceptance_lengths,
                    tokens: toks[pr.ids.len()..pr.ids.len() + opts.max_new_tokens].to_vec(),
                })
                .collect(),
            ddtree: DdtreeTau {
                budget: opts.ddtree_budget,
                tau_macro: tree_summary.tau_macro,
                tau_pooled: tree_summary.tau_pooled,
                per_prompt: tree,
            },
        });
        if let Some((dfl, tree)) = &r.cross {
            let s = drafter_eval::summarize(dfl, b);
            cross.push(CrossTau {
                features: r.name.clone(),
                trajectory: runs[0].name.clone(),
                tau_macro: s.tau_macro,
                tau_pooled: s.tau_pooled,
                ddtree_tau_macro: drafter_eval::summarize(tree, b).tau_macro,
            });
        }
    }
    let tau0 = paths[0].summary.tau_macro;
    let tau_gap = paths
        .iter()
        .map(|p| (p.summary.tau_macro - tau0).abs())
        .fold(0.0, f64::max);
    let verdict = if tau_gap > opts.max_tau_gap {
        crate::parity::Verdict::Fail
    } else {
        crate::parity::Verdict::Pass
    };
    let taus: Vec<String> = paths
        .iter()
        .map(|p| format!("{} {:.2}", p.name, p.summary.tau_macro))
        .collect();
    let summary = format!(
        "{}: drafter τ {} (DDTree-{} {}; gap {:.3}, limit {})",
        if verdict == crate::parity::Verdict::Pass {
            "PASS"
        } else {
            "FAIL"
        },
        taus.join(" vs "),
        opts.ddtree_budget,
        paths
            .iter()
            .map(|p| format!("{:.2}", p.ddtree.tau_macro))
            .collect::<Vec<_>>()
            .join(" vs "),
        tau_gap,
        opts.max_tau_gap
    );
    Ok(DrafterReport {
        schema_version: crate::report::SCHEMA_VERSION,
        verdict,
        summary,
        exit_code: if verdict == crate::parity::Verdict::Pass {
            0
        } else {
            1
        },
        drafter: DrafterInfo {
            source: opts.drafter.clone(),
            target_layer_ids: drafter.cfg.target_layer_ids.clone(),
            block_size: b,
            mask_token_id: drafter.cfg.mask_token_id,
            num_hidden_layers: drafter.cfg.num_hidden_layers,
            dtype: dprec.name().into(),
        },
        end_rule: opts.end_rule.describe().into(),
        max_new_tokens: opts.max_new_tokens,
        tau_gap,
        max_tau_gap: opts.max_tau_gap,
        paths,
        cross,
        notes,
    })
}
