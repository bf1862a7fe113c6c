//! What the user's inputs say about each suspect: whether the checkpoint,
//! the drafter and the prompts show the fault (`present`), whether it
//! depends on a harness or engine that hsparity does not see (`possible`),
//! or whether it cannot occur with these inputs (`hypothetical`: emulated to
//! show what it would cost). The ranking leads with the present findings;
//! the next check follows the top one.

use serde::Serialize;

use super::suspects::Suspect;
use crate::loading::{self, LoadingPath, ResolvedPath};
use crate::models::dflash::{DraftLayerType, Drafter};
use crate::precision::Precision;
use crate::session::{weights_key, Session};

/// How far the inputs show a suspect, in ranking order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Presence {
    /// The checkpoint, drafter or prompts show it: a loading path with
    /// MISSING tensors, a path that loads another dtype or other tensors,
    /// sliding-window drafter layers, `enable_thinking` left to the
    /// template's default.
    Present,
    /// It depends on the eval harness or the serving engine (how it reads
    /// the taps, its decode loop, padding, kernels, KV cache), which the
    /// inputs do not show.
    Possible,
    /// It cannot occur with these inputs (every path has its `lm_head`; the
    /// `vlm` path loads bitwise what `causal-lm` loads): emulated to show
    /// what it would cost elsewhere.
    Hypothetical,
}

impl Presence {
    /// `present`, `possible`, `hypothetical`.
    pub fn name(self) -> &'static str {
        match self {
            Presence::Present => "present",
            Presence::Possible => "possible",
            Presence::Hypothetical => "hypothetical",
        }
    }
}

/// A suspect's presence and what in the inputs shows it (`evidence` of a
/// `variants[]` row).
#[derive(Debug, Clone, Serialize)]
pub struct Evidence {
    /// Present, possible or hypothetical.
    pub presence: Presence,
    /// What shows it, or why it is only possible or hypothetical.
    pub reason: String,
}

impl Evidence {
    fn new(presence: Presence, reason: impl Into<String>) -> Self {
        Self {
            presence,
            reason: reason.into(),
        }
    }
}

/// What a triage run's inputs are, gathered once: the session, the
/// drafter, the longest context the drafter attends to (prompt, new tokens
/// and a block), and every other loading path of the checkpoint, resolved
/// from the headers.
pub struct Inputs<'a> {
    session: &'a Session,
    drafter: &'a Drafter,
    contexts: usize,
    others: Vec<ResolvedPath>,
}

impl<'a> Inputs<'a> {
    /// The inputs of a run generating `max_new` tokens per prompt.
    pub fn gather(session: &'a Session, drafter: &'a Drafter, max_new: usize) -> Self {
        let base = session.paths[0].path;
        let others = LoadingPath::applicable(&session.ckpt.config)
            .into_iter()
            .filter(|&p| p != base)
            .filter_map(|p| loading::resolve(&session.ckpt, p).ok())
            .collect();
        let contexts = session
            .prompt_lens()
            .iter()
            .map(|n| n + max_new + drafter.cfg.block_size)
            .max()
            .unwrap_or(0);
        Self {
            session,
            drafter,
            contexts,
            others,
        }
    }

    /// `p` resolved, when it applies to the checkpoint and is not the
    /// baseline's path.
    fn resolved(&self, p: LoadingPath) -> Option<&ResolvedPath> {
        self.others.iter().find(|r| r.path == p)
    }

    /// The first loading path (the baseline's, then the others in
    /// transformers' order) that leaves tensors MISSING.
    pub fn missing_on(&self) -> Option<LoadingPath> {
        std::iter::once(&self.session.paths[0])
            .chain(&self.others)
            .find(|r| r.inventory.missing > 0)
            .map(|r| r.path)
    }

    /// What the inputs show about `s`: the checkpoint's loading paths, the
    /// drafter's config, the run's prompts and rendering.
    pub fn of(&self, s: &Suspect) -> Evidence {
        use Presence::*;
        let (session, drafter, contexts) = (self.session, self.drafter, self.contexts);
        let base = &session.paths[0];
        match s {
            Suspect::Vlm => vlm(session, self.resolved(LoadingPath::Vlm)),
            Suspect::MissingOn(p) => {
                let inv = match self.resolved(*p) {
                    Some(r) => r.inventory.clone(),
                    None => base.inventory.clone(),
                };
                let baseline = if *p == base.path {
                    " — the baseline's own path, so this row cannot differ from it: every τ here is measured on random weights"
                } else {
                    ""
                };
                Evidence::new(
                    Present,
                    format!(
                        "{p} ({}) leaves {} MISSING{}: randomly initialised{baseline}",
                        p.auto_class(),
                        crate::text::counted(inv.missing, "tensor", None),
                        first_names(&inv.missing_names)
                    ),
                )
            }
            Suspect::RandomLmHead => Evidence::new(
                Hypothetical,
                "no loading path leaves lm_head.weight (or any tensor) MISSING on this checkpoint",
            ),
            Suspect::Dtype(p) => dtype(&session.paths[0], &self.others, *p),
            Suspect::DrafterSwaAsFull => swa(drafter, contexts),
            Suspect::ThinkingFlipped(v) => match session.rendering.enable_thinking {
                None => Evidence::new(
                    Present,
                    format!(
                        "enable_thinking is not set: the prompts take the chat template's default, and a harness that passes enable_thinking={v} renders other prompts"
                    ),
                ),
                Some(now) => Evidence::new(
                    Possible,
                    format!("this run sets enable_thinking={now}; a harness that sets {v} renders other prompts"),
                ),
            },
            Suspect::Recurrent => Evidence::new(
                Possible,
                format!(
                    "every transformers loading path prefills with the chunked form; an engine's multi-token kernel may run the recurrent one ({} computes in {})",
                    base.path, base.compute
                ),
            ),
            Suspect::RouterDtype => Evidence::new(
                Possible,
                "transformers computes the router's softmax in f32; an engine may compute it in the model dtype",
            ),
            Suspect::TapOffset(_) | Suspect::NormedLastTap => Evidence::new(
                Possible,
                format!(
                    "the drafter's config names taps {:?} (tap L = hidden_states[L+1], pre-norm); which index a harness reads is not in the inputs",
                    drafter.cfg.target_layer_ids
                ),
            ),
            Suspect::Positions(_) => Evidence::new(
                Possible,
                "the position ids a harness feeds after the prefill are not in the inputs",
            ),
            Suspect::HarnessGdnCrop => Evidence::new(
                Possible,
                "z-lab dflash_generate (0.1.0) on transformers 5.23.0 crops the cache this way; whether your harness does is not in the inputs",
            ),
            Suspect::GdnStateReset(_) => Evidence::new(
                Possible,
                "an engine's prefix cache or chunked prefill that restores only the attention KV; not in the inputs",
            ),
            Suspect::LeftPadUnmasked(_) => Evidence::new(
                Possible,
                "a batched harness's padding and mask are not in the inputs (a dump's p{k}.attention_mask shows them: hsparity diff)",
            ),
            Suspect::KvFp8 => Evidence::new(
                Possible,
                "the engine's KV-cache dtype is a serving flag (vLLM --kv-cache-dtype), not in the inputs",
            ),
        }
    }
}

/// ` (a, b, c, …)`: the first three names.
fn first_names(names: &[String]) -> String {
    if names.is_empty() {
        return String::new();
    }
    let shown: Vec<&str> = names.iter().take(3).map(String::as_str).collect();
    let more = if names.len() > 3 { ", …" } else { "" };
    format!(" ({}{more})", shown.join(", "))
}

/// `vlm`: present when `AutoModel` loads other tensors, another dtype or
/// leaves tensors MISSING; hypothetical when it loads bitwise what the
/// baseline loads.
fn vlm(session: &Session, vlm: Option<&ResolvedPath>) -> Evidence {
    let base = &session.paths[0];
    let Some(v) = vlm else {
        return Evidence::new(
            Presence::Hypothetical,
            "AutoModel does not load this checkpoint's config",
        );
    };
    let mut diffs = Vec::new();
    if v.dtype != base.dtype {
        diffs.push(format!(
            "it loads {} ({}) where {} loads {} ({})",
            v.dtype, v.inventory.dtype_reason, base.path, base.dtype, base.inventory.dtype_reason
        ));
    }
    if v.inventory.missing > 0 {
        diffs.push(format!(
            "it leaves {} MISSING",
            crate::text::counted(v.inventory.missing, "tensor", None)
        ));
    }
    let key = |r: &ResolvedPath| weights_key(&session.spec, &r.view, None, r.dtype).1;
    if v.inventory.missing == 0 && key(v) != key(base) {
        diffs.push("it reads other tensors for the text model".into());
    }
    if diffs.is_empty() {
        Evidence::new(
            Presence::Hypothetical,
            format!(
                "AutoModel (vlm) loads the same tensors in the same dtype as {} on this checkpoint: the hidden states are bitwise the same",
                base.path
            ),
        )
    } else {
        Evidence::new(
            Presence::Present,
            format!(
                "AutoModel (vlm) loads this checkpoint differently: {}",
                diffs.join("; ")
            ),
        )
    }
}

/// `dtype-P`: present when a loading path of this checkpoint (the
/// baseline's, or one of `others`) loads in P.
fn dtype(base: &ResolvedPath, others: &[ResolvedPath], p: Precision) -> Evidence {
    let loads: Vec<String> = std::iter::once(base)
        .chain(others)
        .filter(|r| r.dtype == p)
        .map(|r| {
            format!(
                "{} ({}) loads {p} ({})",
                r.path,
                r.path.auto_class(),
                r.inventory.dtype_reason
            )
        })
        .collect();
    if loads.is_empty() {
        Evidence::new(
            Presence::Possible,
            format!(
                "no loading path loads this checkpoint in {p}; a harness that passes dtype=torch.{} computes in it",
                p.torch_name()
            ),
        )
    } else {
        Evidence::new(Presence::Present, loads.join("; "))
    }
}

/// `drafter-swa-as-full`: present (the drafter has sliding-window layers),
/// saying when no context of this run reaches the window.
fn swa(drafter: &Drafter, contexts: usize) -> Evidence {
    let types = &drafter.cfg.layer_types;
    let sliding = types
        .iter()
        .filter(|t| **t == DraftLayerType::SlidingAttention)
        .count();
    let window = drafter.cfg.sliding_window;
    let mut reason = format!(
        "the drafter's config makes {sliding} of its {} layers sliding-window{}: an engine that ignores the window runs them as full attention",
        types.len(),
        window.map(|w| format!(" (window {w})")).unwrap_or_default()
    );
    if window.is_none() && drafter.cfg.sliding_window_unused.is_none() {
        reason.push_str(
            "; it names no window, so those layers attend causally within the block over the whole context (dflash's own reading), and the full-attention run differs only in that",
        );
    }
    if let Some(w) = drafter.cfg.sliding_window_unused {
        reason.push_str(&format!(
            "; its window {w} is not in use (no use_sliding_window: true, so transformers' Qwen3Config drops it): dflash and this run attend those layers causally with no window"
        ));
    }
    if let Some(w) = window.filter(|&w| contexts <= w) {
        reason.push_str(&format!(
            "; no context of this run reaches the window (longest {contexts} tokens ≤ {w}), so it costs nothing here: measure on prompts longer than {w} tokens"
        ));
    }
    Evidence::new(Presence::Present, reason)
}
