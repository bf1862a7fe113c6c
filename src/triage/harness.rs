//! The harness and engine suspects (`harness-gdn-crop`,
//! `gdn-state-reset@K`, `left-pad-unmasked:P`, `kv-fp8`, `thinking-flipped`,
//! `drafter-swa-as-full`): when each applies to this target, drafter and
//! prompts, how its lanes differ from the baseline's ([`LaneEdit`]), and the
//! reason it does not run when it does not.

use serde::Serialize;

use super::lanes::{LaneEdit, PromptEdit, ResetAt};
use super::suspects::{Recipe, Suspect};
use crate::checkpoint::config::LayerType;
use crate::drafter::faults::Faults;
use crate::drafter::Replay;
use crate::error::{Error, Result};
use crate::models::dflash::{DraftLayerType, Drafter};
use crate::models::CacheCrop;
use crate::prompts::{self, PromptLimits, PromptOptions};
use crate::session::Session;

/// Pads before each prompt of `left-pad-unmasked:P` unless `--left-pad` says.
pub const DEFAULT_LEFT_PAD: usize = 8;

/// What the harness and engine suspects need besides the session.
#[derive(Debug, Clone)]
pub struct HarnessOptions {
    /// `--reset-at K`: where `gdn-state-reset` drops the state (`None`: the
    /// middle of each prompt).
    pub reset_at: Option<usize>,
    /// `--left-pad P`: pads of `left-pad-unmasked` (0: not run).
    pub left_pad: usize,
    /// The prompt options as given (to render them with `enable_thinking`
    /// flipped).
    pub prompts: PromptOptions,
}

impl HarnessOptions {
    /// `--reset-at` and `--left-pad`; the prompt options are filled by the
    /// verb (`commands::triage`).
    pub fn new(reset_at: Option<usize>, left_pad: usize) -> Self {
        Self {
            reset_at,
            left_pad,
            prompts: PromptOptions::default(),
        }
    }
}

impl Default for HarnessOptions {
    fn default() -> Self {
        Self {
            reset_at: None,
            left_pad: DEFAULT_LEFT_PAD,
            prompts: PromptOptions::default(),
        }
    }
}

/// A suspect that does not run here, and why (`not_applicable[]` of
/// `triage --json`).
#[derive(Debug, Clone, Serialize)]
pub struct NotApplicable {
    /// The suspect's name.
    pub name: String,
    /// Why it does not apply to this target, drafter or prompts.
    pub reason: String,
}

/// The harness and engine suspects that apply, each with its lane edit
/// (`None`: a drafter suspect), and those that do not.
pub struct Planned {
    /// In report order.
    pub suspects: Vec<(Suspect, Option<LaneEdit>)>,
    /// With the reason.
    pub not_applicable: Vec<NotApplicable>,
}

/// Plans the harness and engine suspects for `session` and `drafter`
/// (`given`: every variant is measured on supplied trajectories, so the
/// suspects that need their own decode loop or another prompt do not run).
///
/// Errors ([`Error::Input`]): `--reset-at` outside some prompt.
pub fn plan(
    session: &Session,
    drafter: &Drafter,
    replay: Replay,
    opts: &HarnessOptions,
    given: bool,
) -> Result<Planned> {
    let mut p = Planned {
        suspects: Vec::new(),
        not_applicable: Vec::new(),
    };
    let mut skip = |s: Suspect, reason: String| {
        p.not_applicable.push(NotApplicable {
            name: s.name(),
            reason,
        })
    };
    let types = &session.spec.layer_types;
    let linear = types.contains(&LayerType::LinearAttention);
    let edit = |faults: Faults| LaneEdit {
        faults,
        ..LaneEdit::default()
    };
    let mut run = Vec::new();
    if given {
        skip(
            Suspect::HarnessGdnCrop,
            "with --trajectories the tokens are given and teacher-forced: there is no decode loop whose cache crop to emulate (a trajectory written by such a loop shows as the baseline's departures from it)".into(),
        );
    } else if linear {
        let crop = LaneEdit {
            own_trajectory: true,
            ..edit(Faults {
                crop: CacheCrop::ConvOnly,
                ..Faults::default()
            })
        };
        run.push((Suspect::HarnessGdnCrop, Some(crop)));
    } else {
        skip(
            Suspect::HarnessGdnCrop,
            "the target has no linear-attention layers: cropping an attention-only cache is exact"
                .into(),
        );
    }
    let reset = Suspect::GdnStateReset(opts.reset_at);
    match (linear, reset_position(session, opts.reset_at)?) {
        (false, _) => skip(reset, "the target has no linear-attention layers: there is no state to drop (the variant would equal the baseline)".into()),
        (true, Err(why)) => skip(reset, why),
        (true, Ok(at)) => run.push((
            reset,
            Some(LaneEdit {
                reset: Some(at),
                ..LaneEdit::default()
            }),
        )),
    }
    let pad = Suspect::LeftPadUnmasked(opts.left_pad);
    match (opts.left_pad, pad_id(session)) {
        (0, _) => skip(pad, "--left-pad 0".into()),
        (_, None) => skip(
            pad,
            "no pad or eos token in tokenizer.json to pad with".into(),
        ),
        (count, Some(id)) => run.push((
            pad,
            Some(LaneEdit {
                prompt: PromptEdit::LeftPad { pad: id, count },
                ..LaneEdit::default()
            }),
        )),
    }
    if types.contains(&LayerType::FullAttention) {
        run.push((
            Suspect::KvFp8,
            Some(edit(Faults {
                kv_fp8: true,
                ..Faults::default()
            })),
        ));
    } else {
        skip(Suspect::KvFp8, "the target has no attention layers".into());
    }
    let flipped = match given {
        true => Err("with --trajectories the prompts are the supplied ones, and a prompt rendered otherwise has no supplied continuation to measure on".into()),
        false => flipped_prompts(session, drafter, replay, &opts.prompts),
    };
    match flipped {
        Ok((value, prompts)) => run.push((
            Suspect::ThinkingFlipped(value),
            Some(LaneEdit {
                prompt: PromptEdit::Replaced(prompts),
                ..LaneEdit::default()
            }),
        )),
        Err(why) => skip(Suspect::ThinkingFlipped(false), why),
    }
    if drafter
        .cfg
        .layer_types
        .contains(&DraftLayerType::SlidingAttention)
    {
        run.push((Suspect::DrafterSwaAsFull, None));
    } else {
        skip(
            Suspect::DrafterSwaAsFull,
            "the drafter has no sliding-window layers".into(),
        );
    }
    p.suspects = run;
    Ok(p)
}

/// Where `gdn-state-reset` drops the state in every prompt: `Err(reason)`
/// when some prompt is too short to have a middle.
///
/// Errors ([`Error::Input`]): `--reset-at K` with K = 0 or K not inside
/// every prompt.
fn reset_position(
    session: &Session,
    at: Option<usize>,
) -> Result<std::result::Result<ResetAt, String>> {
    let lens = session.prompt_lens();
    let shortest = lens.iter().copied().min().unwrap_or(0);
    Ok(match at {
        None if shortest < 2 => {
            Err("a prompt of one token has no middle to drop the state at".into())
        }
        None => Ok(ResetAt::Middle),
        Some(k) if k == 0 || k >= shortest => {
            let (i, n) = lens
                .iter()
                .enumerate()
                .min_by_key(|(_, n)| **n)
                .map(|(i, n)| (i, *n))
                .unwrap_or((0, 0));
            return Err(Error::Input(format!(
                "--reset-at {k}: the reset must fall inside every prompt (1..={}; prompt {i} has {n} tokens)",
                shortest.saturating_sub(1)
            )));
        }
        Some(k) => Ok(ResetAt::At(k)),
    })
}

/// The pad id a batched harness pads with: the tokenizer's `pad_token`,
/// else its `eos_token` (the usual `tokenizer.pad_token =
/// tokenizer.eos_token`), looked up in `tokenizer.json`.
fn pad_id(session: &Session) -> Option<u32> {
    let path = session.ckpt.tokenizer.as_deref()?;
    let tok = tokenizers::Tokenizer::from_file(path).ok()?;
    let cfg = crate::chat::TokenizerConfig::read(&session.ckpt.source.dir).ok()?;
    let named = |attr: &str| {
        cfg.special_tokens
            .iter()
            .find(|(a, _)| a == attr)
            .and_then(|(_, t)| tok.token_to_id(t))
    };
    named("pad_token").or_else(|| named("eos_token"))
}

/// The prompts rendered with `enable_thinking` flipped: the value used and
/// the ids per prompt, or why the suspect does not apply.
fn flipped_prompts(
    session: &Session,
    drafter: &Drafter,
    replay: Replay,
    opts: &PromptOptions,
) -> std::result::Result<(bool, Vec<Vec<u32>>), String> {
    if session.rendering.template.is_none() {
        return Err("the prompts are not rendered with a chat template (pass --chat, --messages or --prompt-set)".into());
    }
    let tc = &session.paths[0].text_config;
    let render = |v: bool| -> std::result::Result<Vec<prompts::Prompt>, String> {
        let o = PromptOptions {
            enable_thinking: Some(v),
            ..opts.clone()
        };
        prompts::resolve_in(
            &o,
            Some(&session.ckpt.source.dir),
            session.ckpt.tokenizer.as_deref(),
            PromptLimits::of(tc),
        )
        .map(|r| r.prompts)
        .map_err(|e| format!("rendering with enable_thinking={v} fails: {e}"))
    };
    let ids = |ps: &[prompts::Prompt]| ps.iter().map(|p| p.ids.clone()).collect::<Vec<_>>();
    let now = session.prompt_ids();
    // Flip what the run used: the flag as given, else the value the
    // template's default does not render like.
    let value = match session.rendering.enable_thinking {
        Some(v) => !v,
        None => ids(&render(true)?) != now,
    };
    let flipped = render(value)?;
    if ids(&flipped) == now {
        return Err(
            "the chat template renders the same prompts with enable_thinking true and false".into(),
        );
    }
    crate::drafter::check_positions(
        &flipped,
        replay.max_new,
        drafter.cfg.block_size,
        0,
        tc.max_position_embeddings,
    )
    .map_err(|e| format!("with enable_thinking={value}: {e}"))?;
    Ok((value, ids(&flipped)))
}

/// The recipe of a harness or engine suspect run with lanes `edit`,
/// computing in `prec` on the baseline's weights and lm_head.
pub fn lane_recipe(edit: &LaneEdit, prec: crate::precision::Precision) -> Recipe {
    Recipe::Model {
        weights: super::Weights::Base,
        prec,
        head: super::Head::Base,
        form: crate::models::GdnForm::Chunked,
        decode_shift: 0,
        lane: edit.clone(),
        spec: None,
    }
}
