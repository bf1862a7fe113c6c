//! DFlash drafter evaluation: loading a drafter against a target and the
//! checks that must pass before a long run ([`load_checked`]), the target's
//! tap features ([`fn@features`]), the replay of DFlash and DDTree on a
//! trajectory ([`replay_all`], over [`eval`]), and τ on every loading path of
//! a session ([`paths::evaluate`]), and τ on captured features next to the
//! paths' own ([`features::evaluate`], `drafter --features`).

pub mod audit;
pub mod bootstrap;
pub mod engine_gap;
pub mod engine_metrics;
pub mod eval;
pub mod faults;
pub mod features;
pub mod gap;
pub mod generate;
pub mod paths;
pub mod plan;
pub mod target;
pub mod trajectories;

use crate::checkpoint::resolve;
use crate::error::{Error, Result};
use crate::models::dflash::{DflashConfig, Drafter, DrafterWeights};
use crate::models::GdnForm;
use crate::precision::Precision;
use crate::session::Session;
use candle_core::Tensor;
use eval::{DraftTarget, EndRule, PromptTau};
use std::sync::Arc;
use target::{Capture, Resume, Sequence, Step, StepOut, TargetModel};
use trajectories::{Given, GivenFile};

/// What a replay walks: new tokens per prompt, the DDTree node budget, and
/// the end-of-generation rule (DFlash and DDTree walk the anchors under it).
#[derive(Debug, Clone, Copy)]
pub struct Replay {
    /// Greedy tokens generated (and replayed) per prompt.
    pub max_new: usize,
    /// DDTree node budget (DDTree-N).
    pub budget: usize,
    /// End-of-generation rule of the reference loop.
    pub rule: EndRule,
}

/// A drafter evaluation as asked for (`drafter`, `compare --drafter`).
#[derive(Debug, Clone)]
pub struct DrafterSettings {
    /// Drafter directory or Hub id.
    pub source: String,
    /// What is replayed.
    pub replay: Replay,
    /// Fail (exit 1) when τ on two paths differs by more than this.
    pub max_tau_gap: f64,
    /// Bytes the stored weights may take to stay resident (`--memory-budget`;
    /// `None`: a share of the available memory, see [`plan::MemoryPlan`]).
    pub memory_budget: Option<u64>,
    /// `--trajectories`: τ on supplied greedy outputs instead of generating.
    pub trajectories: Option<trajectories::GivenFile>,
    /// `--engine-metrics`: an engine's speculative-decoding counters on the
    /// same prompts, compared with τ ([`engine_gap`]).
    pub engine_metrics: Option<std::path::PathBuf>,
}

/// DFlash and DDTree-N results per prompt of one replay.
pub type Replayed = (Vec<PromptTau>, Vec<PromptTau>);

/// Reads the drafter's dtype from its config (`dtype`/`torch_dtype`), f32 when absent.
fn drafter_precision(cfg_path: &std::path::Path) -> Result<Precision> {
    let v: serde_json::Value = serde_json::from_str(&crate::input::read_to_string(cfg_path)?)
        .map_err(|e| Error::Config(format!("{}: {e}", cfg_path.display())))?;
    match v.get("dtype").or_else(|| v.get("torch_dtype")) {
        None | Some(serde_json::Value::Null) => Ok(Precision::F32),
        Some(d) => d.as_str().and_then(Precision::from_name).ok_or_else(|| {
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
    let dsrc = resolve::resolve_as("drafter", source)?;
    let cfg_path = dsrc.dir.join("config.json");
    if std::fs::symlink_metadata(&cfg_path).is_err() {
        let inside = resolve::subfolders_with_config(&dsrc.dir)
            .map(|s| format!("; its subfolders {s} hold one: pass the drafter's"))
            .unwrap_or_default();
        return Err(Error::Input(format!(
            "drafter {source}: no config.json (expected a DFlash drafter folder){inside}"
        )));
    }
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
        Drafter::load(cfg, weights, target.hidden_size, dprec)?,
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
/// (plus `extra` positions: triage's largest position shift or left pad) stays within
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
                if extra > 0 { format!(" + {extra} extra positions (triage's largest position shift or --left-pad)") } else { String::new() }
            )));
        }
    }
    Ok(())
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
/// `replay.max_new` tokens plus `extra` ([`check_positions`]) and the end rule
/// ([`check_end_rule`]) — or, with supplied trajectories (`given`), that
/// every output is long enough for one round ([`Given::with_replay`]). What
/// `drafter`, `compare --drafter` and `triage` share, done before any long
/// computation. Returns the drafter, its dtype and the trajectories with
/// their replayed lengths.
///
/// Errors: as those.
pub fn load_checked(
    session: &Session,
    source: &str,
    replay: Replay,
    extra: usize,
    given: Option<Given>,
) -> Result<(Drafter, Precision, Option<Given>)> {
    let tc = &session.paths[0].text_config;
    let (drafter, dprec) =
        load_drafter(source, tc, session.spec.num_layers(), &session.spec.device)?;
    let b = drafter.cfg.block_size;
    let given = match given {
        Some(g) => {
            if let Some(n) = g.cap {
                check_end_rule(n, replay.rule)?;
            }
            Some(g.with_replay(b, replay.rule)?)
        }
        None => {
            check_positions(
                &session.prompts,
                replay.max_new,
                b,
                extra,
                tc.max_position_embeddings,
            )?;
            check_end_rule(replay.max_new, replay.rule)?;
            None
        }
    };
    Ok((drafter, dprec, given))
}

/// Reads `--trajectories` (when given) into `session`: its prompts become
/// the run's unless prompt options named them (`prompts_named`), in which
/// case they must match ([`trajectories::attach`]).
///
/// Errors: as [`trajectories::attach`].
pub fn attach_trajectories(
    session: &mut Session,
    file: Option<&GivenFile>,
    prompts_named: bool,
) -> Result<Option<Given>> {
    file.map(|f| trajectories::attach(session, f, prompts_named))
        .transpose()
}

/// Replays DFlash and DDTree-`budget` on every prompt's trajectory with the
/// features `feats[k]`, drafting through `target`'s embedding and LM head,
/// over `r.max_new` new tokens each. Returns the DFlash and the DDTree
/// results per prompt.
///
/// Errors: as [`replay_upto`].
pub fn replay_all(
    drafter: &Drafter,
    target: &TargetModel,
    tokens: &[Vec<u32>],
    prompt_lens: &[usize],
    feats: &[Tensor],
    r: Replay,
) -> Result<Replayed> {
    let max_new = vec![r.max_new; tokens.len()];
    replay_upto(drafter, target, tokens, prompt_lens, &max_new, feats, r)
}

/// [`replay_all`] over `max_new[k]` new tokens of prompt k (supplied
/// trajectories of different lengths).
///
/// Errors: as [`replay_sets`].
pub fn replay_upto(
    drafter: &Drafter,
    target: &TargetModel,
    tokens: &[Vec<u32>],
    prompt_lens: &[usize],
    max_new: &[usize],
    feats: &[Tensor],
    r: Replay,
) -> Result<Replayed> {
    let set = ReplaySet {
        drafter,
        target,
        tokens,
        prompt_lens,
        max_new,
        feats,
    };
    Ok(replay_sets(&[set], r)?.remove(0))
}

/// Trajectories to replay with one drafter through one target: what
/// [`replay_upto`] takes.
pub struct ReplaySet<'a> {
    /// The drafter.
    pub drafter: &'a Drafter,
    /// The target whose embedding and `lm_head` it drafts through.
    pub target: &'a TargetModel<'a>,
    /// Prompt + continuation per trajectory.
    pub tokens: &'a [Vec<u32>],
    /// Prompt length per trajectory.
    pub prompt_lens: &'a [usize],
    /// New tokens replayed per trajectory.
    pub max_new: &'a [usize],
    /// Tap features `[T, K·H]` per trajectory.
    pub feats: &'a [Tensor],
}

/// [`replay_upto`] on every set at once: all their trajectories in the
/// same lock-step rounds ([`eval::replay_jobs`]), so that the drafts of a
/// round through the same `lm_head` read it once. Bitwise each set's own
/// replay. Returns per set its DFlash and DDTree results per trajectory.
///
/// Errors: a trajectory shorter than the replay needs; mismatched counts; a
/// tensor failure.
pub fn replay_sets(sets: &[ReplaySet], r: Replay) -> Result<Vec<Replayed>> {
    let mut targets = Vec::with_capacity(sets.len());
    for s in sets {
        let n = s.tokens.len();
        if s.prompt_lens.len() != n || s.feats.len() != n || s.max_new.len() != n {
            return Err(Error::Input(format!(
                "replay needs one prompt length, one length and one feature tensor per trajectory: {n} trajectories, {} prompt lengths, {} lengths, {} feature tensors",
                s.prompt_lens.len(),
                s.max_new.len(),
                s.feats.len()
            )));
        }
        targets.push(DraftTarget {
            drafter: s.drafter,
            weights: s.target.weights,
            head: s.target.head,
            prec: s.target.prec,
        });
    }
    let jobs: Vec<eval::ReplayJob> = sets
        .iter()
        .zip(&targets)
        .flat_map(|(s, t)| {
            (0..s.tokens.len()).map(move |k| eval::ReplayJob {
                target: t,
                tokens: &s.tokens[k],
                prompt_len: s.prompt_lens[k],
                feats: &s.feats[k],
                max_new: s.max_new[k],
            })
        })
        .collect();
    let mut done = eval::replay_jobs(&jobs, r.budget, r.rule)?.into_iter();
    Ok(sets
        .iter()
        .map(|s| done.by_ref().take(s.tokens.len()).unzip())
        .collect())
}

/// A token sequence fed teacher-forced: its tokens, how many are the
/// prompt, and how the target runs it.
#[derive(Debug, Clone, Copy)]
pub struct Forced<'a> {
    /// Prompt + continuation.
    pub tokens: &'a [u32],
    /// Tokens of the prompt (later ones carry `decode_shift`).
    pub prompt_len: usize,
    /// Delta-rule form.
    pub form: GdnForm,
    /// Positions after the prompt shifted by this.
    pub decode_shift: usize,
    /// Harness or engine faults emulated (none normally).
    pub faults: faults::Faults,
    /// Where the sweep starts instead of token 0: a prefill of the same
    /// tokens that serves it ([`Resume::serves`]; one that does not is an
    /// error); the outputs are the same.
    pub resume: Option<&'a Resume>,
}

/// Feeds every sequence whole in one layer-major sweep, keeping `capture`
/// and, with `logits`, the logits of every row from the last prompt token
/// on (the predictions of the continuation).
///
/// Errors: a capture outside the target; a tensor failure.
pub fn teacher_forced(
    target: &TargetModel,
    seqs: &[Forced],
    capture: &[Capture],
    logits: bool,
) -> Result<Vec<StepOut>> {
    let n = seqs.len();
    let job = ForcedJob {
        target: *target,
        seqs,
        capture: &vec![capture; n],
        shadowed: &[],
        logits: &vec![logits; n],
    };
    Ok(teacher_forced_together(&[job])?.pop().unwrap_or_default())
}

/// One target's sequences in [`teacher_forced_together`]: [`teacher_forced`]
/// keeping `capture[j]` of sequence j and, where `logits[j]`, its logits;
/// the sequences `shadowed` marks run through the layers' noise shadow in
/// the same sweep ([`TargetModel::sweep_each`]).
pub struct ForcedJob<'a, 'j> {
    /// The target they run on.
    pub target: TargetModel<'a>,
    /// The sequences.
    pub seqs: &'j [Forced<'j>],
    /// One capture list per sequence.
    pub capture: &'j [&'j [Capture]],
    /// Sequences run through the noise shadow (missing: none).
    pub shadowed: &'j [bool],
    /// Sequences whose continuation's logits are wanted (missing: none).
    pub logits: &'j [bool],
}

/// Every job's sequences fed whole in one sweep across all their targets
/// ([`target::sweep_together`]: each layer's bytes read once however many
/// dtypes and heads read them); per job, its sequences' outputs, each what
/// the job's own sweep gives.
///
/// Errors: as [`teacher_forced`], for any job.
pub fn teacher_forced_together(jobs: &[ForcedJob]) -> Result<Vec<Vec<StepOut>>> {
    let mut states: Vec<Vec<Sequence>> = jobs
        .iter()
        .map(|j| {
            j.seqs
                .iter()
                .zip(j.capture)
                .map(|(f, capture)| {
                    let mut s = Sequence::new(j.target.spec, f.prompt_len, f.form, f.decode_shift)
                        .with_faults(f.faults);
                    if let Some(r) = f.resume {
                        r.start(&mut s, (&j.target, f, capture))?;
                    }
                    Ok(s)
                })
                .collect::<Result<_>>()
        })
        .collect::<Result<_>>()?;
    let mut steps: Vec<Vec<Step>> = states
        .iter_mut()
        .zip(jobs)
        .map(|(states, job)| {
            states
                .iter_mut()
                .zip(job.seqs)
                .enumerate()
                .map(|(k, (seq, f))| {
                    let at = f.resume.map_or(0, Resume::at);
                    Step {
                        seq,
                        ids: &f.tokens[at..],
                        tentative: false,
                        logits: match job.logits.get(k).copied().unwrap_or(false) {
                            true => f.prompt_len.saturating_sub(1) - at..f.tokens.len() - at,
                            false => 0..0,
                        },
                    }
                })
                .collect()
        })
        .collect();
    let mut parts: Vec<target::Part> = steps
        .iter_mut()
        .zip(jobs)
        .map(|(steps, job)| target::Part {
            target: job.target,
            steps,
            capture: job.capture,
            shadowed: job.shadowed,
        })
        .collect();
    let done = target::sweep_together(&mut parts)?;
    // A sequence that started at a resume point gets the rows before it.
    done.into_iter()
        .zip(jobs)
        .map(|(outs, job)| {
            outs.into_iter()
                .zip(job.seqs.iter().zip(job.capture))
                .map(|(o, (f, capture))| match f.resume {
                    Some(r) => r.prepend(capture, o),
                    None => Ok(o),
                })
                .collect()
        })
        .collect()
}

/// The drafter's features `[T, K·H]` from a step's tap captures.
///
/// Errors: a tensor failure.
pub fn concat_taps(captures: &[Tensor]) -> Result<Tensor> {
    Ok(Tensor::cat(captures, candle_core::D::Minus1)?)
}

/// Tap features of `target` over each token sequence (`[T, K·H]` each),
/// teacher-forced in one layer-major sweep; the first `prompt_lens[k]`
/// tokens of sequence k are its prompt (later tokens carry `decode_shift`).
/// Sequence k starts at `resumes[k]` where that point serves it
/// ([`Resume::serves`]; `resumes` may be shorter, or empty), with the same
/// features.
///
/// Errors: a tap outside the target; a tensor failure.
pub fn features(
    target: &TargetModel,
    tokens: &[Vec<u32>],
    prompt_lens: &[usize],
    taps: &[usize],
    (form, decode_shift): (GdnForm, usize),
    resumes: &[Option<Arc<Resume>>],
) -> Result<Vec<Tensor>> {
    let capture = Capture::taps(taps);
    let seqs: Vec<Forced> = tokens
        .iter()
        .zip(prompt_lens)
        .enumerate()
        .map(|(k, (t, &n))| {
            let forced = Forced {
                tokens: t,
                prompt_len: n,
                form,
                decode_shift,
                faults: faults::Faults::default(),
                resume: None,
            };
            let resume = resumes.get(k).and_then(Option::as_deref);
            Forced {
                resume: resume.filter(|r| r.serves(target, &forced, &capture)),
                ..forced
            }
        })
        .collect();
    teacher_forced(target, &seqs, &capture, false)?
        .into_iter()
        .map(|o| concat_taps(&o.captures))
        .collect()
}
