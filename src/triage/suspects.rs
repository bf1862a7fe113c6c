//! The suspects of a drafter regression, as a type: each [`Suspect`] is one
//! thing an eval harness or a loading path gets wrong, with its name, what it
//! emulates, and how it runs ([`Suspect::run`]). Adding a suspect is one
//! variant here and one function.

use candle_core::Tensor;

use super::Context;
use crate::drafter::eval::{self, PromptTau};
use crate::error::{Error, Result};
use crate::loading::{InitRule, LoadingPath, WeightSource};
use crate::models::moe::RouterSoftmax;
use crate::models::{GdnForm, LmHead, TextModel};
use crate::precision::Precision;

/// One suspect (a triage variant).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Suspect {
    /// The `vlm` loading path (`AutoModel`).
    Vlm,
    /// The target computing in another dtype.
    Dtype(Precision),
    /// The Gated DeltaNet recurrent form instead of the chunked one.
    Recurrent,
    /// Taps read at `hidden_states[L+1+k]`.
    TapOffset(i64),
    /// The last-layer tap read after the final norm.
    NormedLastTap,
    /// Decode positions shifted by `k` after the prefill.
    Positions(usize),
    /// A loading path with MISSING tensors, initialised as transformers would.
    MissingOn(LoadingPath),
    /// A random `lm_head` (no path misses anything: the commonest case emulated).
    RandomLmHead,
    /// MoE targets: the router's softmax in the model dtype instead of f32.
    RouterDtype,
}

/// What a suspect's run gives: its tap features on the baseline trajectory,
/// and its DFlash and DDTree replays on its own trajectory.
pub struct Outcome {
    /// Per prompt `[T, K·H]`, on the baseline's tokens.
    pub feats_on_base: Vec<Tensor>,
    /// DFlash per prompt.
    pub dflash: Vec<PromptTau>,
    /// DDTree per prompt.
    pub ddtree: Vec<PromptTau>,
}

impl Suspect {
    /// Short name (`tap-offset-1`, `dtype-bf16`, …).
    pub fn name(&self) -> String {
        match self {
            Suspect::Vlm => "vlm".into(),
            Suspect::Dtype(p) => format!("dtype-{p}"),
            Suspect::Recurrent => "gdn-recurrent".into(),
            Suspect::TapOffset(k) => format!("tap-offset{k:+}"),
            Suspect::NormedLastTap => "normed-last-tap".into(),
            Suspect::Positions(k) => format!("positions+{k}"),
            Suspect::MissingOn(p) => format!("missing-{p}"),
            Suspect::RandomLmHead => "missing-lm_head".into(),
            Suspect::RouterDtype => "router-dtype".into(),
        }
    }

    /// What it emulates, in one line.
    pub fn description(&self) -> String {
        match self {
            Suspect::Vlm => "loading path vlm (AutoModel: its own dtype and tie resolution; lm_head borrowed from causal-lm)".into(),
            Suspect::Dtype(p) => format!("dtype {p}"),
            Suspect::Recurrent => "Gated DeltaNet recurrent form instead of chunked".into(),
            Suspect::TapOffset(-1) => "tap offset −1 (hidden_states[L] instead of [L+1])".into(),
            Suspect::TapOffset(1) => {
                "tap offset +1 (hidden_states[L+2]; final-normed when L+2 = N)".into()
            }
            Suspect::TapOffset(k) => format!("tap offset {k:+} (hidden_states[L+1{k:+}])"),
            Suspect::NormedLastTap => {
                "tap on the last layer read from hidden_states[N], i.e. after the final norm".into()
            }
            Suspect::Positions(1) => {
                "decode positions shifted by +1 (off-by-one position ids after the prefill)".into()
            }
            Suspect::Positions(k) => format!(
                "decode positions shifted by +{k} (stale rope offset, e.g. cached rope_deltas)"
            ),
            Suspect::MissingOn(_) | Suspect::RandomLmHead => {
                "MISSING tensors initialised as transformers would".into()
            }
            Suspect::RouterDtype => {
                "MoE router softmax in the model dtype instead of f32 (softmax(logits) without dtype=torch.float)"
                    .into()
            }
        }
    }

    /// True for the suspects that only change which hidden states feed the
    /// drafter: they reuse the baseline's forward (no target compute).
    pub fn shares_forward(&self) -> bool {
        matches!(self, Suspect::TapOffset(_) | Suspect::NormedLastTap)
    }

    /// Runs the suspect on the baseline context. `Ok(None)` when it cannot
    /// run here (the reason is added to `notes`).
    ///
    /// Errors: a tensor failure or a loading error.
    pub fn run(&self, cx: &Context, notes: &mut Vec<String>) -> Result<Option<Outcome>> {
        match *self {
            Suspect::Vlm => vlm(cx).map(Some),
            Suspect::Dtype(p) => {
                let view = &cx.base_path().view;
                let m = cx.variant_model(view, view, p)?;
                cx.own_model(&m, GdnForm::Chunked).map(Some)
            }
            Suspect::Recurrent => cx.own_model(&cx.base, GdnForm::Recurrent).map(Some),
            Suspect::TapOffset(k) => tap_variant(cx, Taps::Offset(k), self, notes),
            Suspect::NormedLastTap => tap_variant(cx, Taps::NormedLast, self, notes),
            Suspect::Positions(k) => {
                let m = cx.base.clone().with_decode_shift(k);
                cx.own_model(&m, GdnForm::Chunked).map(Some)
            }
            Suspect::MissingOn(p) => missing_on(cx, p).map(Some),
            Suspect::RandomLmHead => random_lm_head(cx, notes).map(Some),
            Suspect::RouterDtype => router_dtype(cx).map(Some),
        }
    }
}

/// The baseline with every MoE router taking its softmax in the model dtype
/// (probabilities, their top-k sum and the renormalisation rounded to it).
fn router_dtype(cx: &Context) -> Result<Outcome> {
    let spec = cx
        .session
        .spec
        .clone()
        .with_router_softmax(RouterSoftmax::ModelDtype);
    let view = &cx.base_path().view;
    let m = TextModel::load(&spec, view, Some(view), cx.base_prec)?;
    cx.own_model(&m, GdnForm::Chunked)
}

/// The `vlm` path's own model (its dtype; lm_head borrowed from the baseline).
fn vlm(cx: &Context) -> Result<Outcome> {
    let vp = cx.session.resolve_extra(LoadingPath::Vlm, cx.seed)?;
    let m = cx.variant_model(&vp.view, &cx.base_path().view, vp.dtype)?;
    cx.own_model(&m, GdnForm::Chunked)
}

/// A path with MISSING tensors (its own lm_head when it has one).
fn missing_on(cx: &Context, path: LoadingPath) -> Result<Outcome> {
    let r = cx.session.resolve_extra(path, cx.seed)?;
    let head: &dyn WeightSource = if r.view.has_lm_head() {
        &r.view
    } else {
        &cx.base_path().view
    };
    let m = cx.variant_model(&r.view, head, r.dtype)?;
    cx.own_model(&m, GdnForm::Chunked)
}

/// The baseline with a random `lm_head` (normal(0, initializer_range)).
fn random_lm_head(cx: &Context, notes: &mut Vec<String>) -> Result<Outcome> {
    let tc = &cx.base_path().text_config;
    let shape = vec![tc.vocab_size, tc.hidden_size];
    let w = crate::loading::view::init_tensor(
        "lm_head.weight",
        InitRule::Normal {
            std: tc.initializer_range,
        },
        &shape,
        Some(cx.seed),
    )?
    .to_device(&cx.session.spec.device)?;
    let head = LmHead::load(&SingleTensor(w), cx.base_prec)?;
    let m = cx.base.clone().with_lm_head(Some(head));
    notes.push(
        "no path reports MISSING tensors on this checkpoint; the missing variant emulates a random lm_head (normal(0, initializer_range)), what causal-lm gets when tie_word_embeddings is set only at the top level and lm_head.weight is absent".into(),
    );
    cx.own_model(&m, GdnForm::Chunked)
}

/// How a variant turns hidden states into drafter features.
#[derive(Clone, Copy)]
pub enum Taps {
    /// `hidden_states[L+1+offset]` (pre-norm; offset 0 = the convention).
    Offset(i64),
    /// The last tap goes through the final norm.
    NormedLast,
}

/// A suspect that reads other hidden states of the baseline's forward.
fn tap_variant(
    cx: &Context,
    mode: Taps,
    s: &Suspect,
    notes: &mut Vec<String>,
) -> Result<Option<Outcome>> {
    match cx.feats_of(mode) {
        Ok(f) => {
            let (dflash, ddtree) = cx.replay(&cx.base, &cx.base_tokens, &f)?;
            Ok(Some(Outcome {
                feats_on_base: f,
                dflash,
                ddtree,
            }))
        }
        Err(e) => {
            notes.push(format!("{}: skipped ({e})", s.description()));
            Ok(None)
        }
    }
}

/// Features for `taps` under `mode` from one forward's outputs.
pub fn select(hs: &[Tensor], last: &Tensor, taps: &[usize], mode: Taps) -> Result<Tensor> {
    match mode {
        Taps::Offset(0) => eval::tap_features(hs, last, taps),
        Taps::Offset(k) => {
            // What a harness reading `hidden_states[L+1+k]` literally gets:
            // index N is transformers' final-normed entry.
            let parts = taps
                .iter()
                .map(|&l| {
                    let i = l as i64 + 1 + k;
                    if i < 0 || i >= hs.len() as i64 {
                        Err(Error::Input(format!(
                            "tap {l}{k:+} falls outside the model"
                        )))
                    } else {
                        Ok(&hs[i as usize])
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Tensor::cat(&parts, candle_core::D::Minus1)?)
        }
        Taps::NormedLast => {
            // Only a tap on the last layer can be read after the final norm
            // (transformers' hidden_states[N]); the plan checks that.
            let parts: Vec<&Tensor> = taps.iter().map(|&l| &hs[l + 1]).collect();
            Ok(Tensor::cat(&parts, candle_core::D::Minus1)?)
        }
    }
}

/// A one-tensor weight source (`lm_head.weight`).
struct SingleTensor(Tensor);

impl WeightSource for SingleTensor {
    fn tensor(&self, _name: &str) -> Result<Tensor> {
        Ok(self.0.clone())
    }
    fn identity(&self, name: &str) -> String {
        format!("synthetic:{name}")
    }
}
