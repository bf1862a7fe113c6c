//! The suspects of a drafter regression, as a type: each [`Suspect`] is one
//! thing an eval harness or a loading path gets wrong, with its name, what it
//! emulates, and its [`Recipe`] — how the target runs for it. Adding a
//! suspect is one variant here and one arm of [`Suspect::recipe`].

use candle_core::{DType, Tensor};

use crate::drafter::eval;
use crate::error::{Error, Result};
use crate::loading::{InitRule, LoadingPath, ResolvedPath, WeightSource};
use crate::models::moe::RouterSoftmax;
use crate::models::{GdnForm, TextModelSpec};
use crate::precision::Precision;
use crate::session::Session;

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

/// Where a suspect's target weights come from.
pub enum Weights {
    /// The baseline's.
    Base,
    /// Another loading path's.
    Path(Box<ResolvedPath>),
}

/// Where a suspect's lm_head comes from.
pub enum Head {
    /// The baseline's.
    Base,
    /// Its own loading path's.
    Own,
    /// A tensor made for it (the random lm_head).
    Made(MadeHead),
}

/// How the target runs for a suspect.
pub enum Recipe {
    /// Its own target run (greedy trajectory, τ on it; divergence on the
    /// baseline's trajectory).
    Model {
        /// Layer weights.
        weights: Weights,
        /// Compute dtype.
        prec: Precision,
        /// lm_head.
        head: Head,
        /// Delta-rule form.
        form: GdnForm,
        /// Positions after the prompt shifted by this.
        decode_shift: usize,
        /// The model's geometry and numerics when they are not the
        /// session's (the router's softmax dtype); such a run shares no
        /// sweeps.
        spec: Option<Box<TextModelSpec>>,
    },
    /// Other hidden states of the baseline's forward fed to the drafter.
    Taps(Taps),
}

/// How a variant turns hidden states into drafter features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taps {
    /// `hidden_states[L+1+offset]` (pre-norm; offset 0 = the convention).
    Offset(i64),
    /// The last tap goes through the final norm.
    NormedLast,
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

    /// How the target runs for this suspect on `session` (baseline path
    /// first, computing in `base_prec`).
    ///
    /// Errors: a loading path that cannot be resolved; the random head cannot be made.
    pub fn recipe(&self, session: &Session, base_prec: Precision, seed: u64) -> Result<Recipe> {
        let model = |weights, prec, head, form, decode_shift| Recipe::Model {
            weights,
            prec,
            head,
            form,
            decode_shift,
            spec: None,
        };
        Ok(match *self {
            Suspect::Vlm => {
                let p = session.resolve_extra(LoadingPath::Vlm, seed)?;
                let prec = p.dtype;
                model(
                    Weights::Path(Box::new(p)),
                    prec,
                    Head::Base,
                    GdnForm::Chunked,
                    0,
                )
            }
            Suspect::Dtype(p) => model(Weights::Base, p, Head::Base, GdnForm::Chunked, 0),
            Suspect::Recurrent => {
                model(Weights::Base, base_prec, Head::Base, GdnForm::Recurrent, 0)
            }
            Suspect::TapOffset(k) => Recipe::Taps(Taps::Offset(k)),
            Suspect::NormedLastTap => Recipe::Taps(Taps::NormedLast),
            Suspect::Positions(k) => {
                model(Weights::Base, base_prec, Head::Base, GdnForm::Chunked, k)
            }
            Suspect::MissingOn(path) => {
                let p = session.resolve_extra(path, seed)?;
                let (prec, head) = (
                    p.dtype,
                    if p.view.has_lm_head() {
                        Head::Own
                    } else {
                        Head::Base
                    },
                );
                model(Weights::Path(Box::new(p)), prec, head, GdnForm::Chunked, 0)
            }
            Suspect::RandomLmHead => {
                let tc = &session.paths[0].text_config;
                let head = MadeHead::random(
                    tc.vocab_size,
                    tc.hidden_size,
                    tc.initializer_range,
                    seed,
                    base_prec,
                    &session.spec.device,
                );
                model(
                    Weights::Base,
                    base_prec,
                    Head::Made(head),
                    GdnForm::Chunked,
                    0,
                )
            }
            Suspect::RouterDtype => Recipe::Model {
                weights: Weights::Base,
                prec: base_prec,
                head: Head::Base,
                form: GdnForm::Chunked,
                decode_shift: 0,
                spec: Some(Box::new(
                    session
                        .spec
                        .clone()
                        .with_router_softmax(RouterSoftmax::ModelDtype),
                )),
            },
        })
    }
}

/// Features for `taps` under `mode` from one forward's hidden states
/// (`hs`: transformers' N+1 entries, the last final-normed; `last`: the raw
/// last-layer output).
///
/// Errors ([`Error::Input`]): a tap that falls outside the model.
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

/// An lm_head made for a suspect (the random one), held in the compute
/// dtype's storage (bf16/f16 when the target computes in half precision)
/// and read in vocabulary chunks like a checkpoint's. It is generated when
/// its group first reads it and dropped when the group is done
/// ([`WeightSource::release`]), so a 27B target's 2.5 GB random head is
/// resident only while the suspect runs.
pub struct MadeHead {
    /// `[V, H]`.
    shape: [usize; 2],
    /// The init's standard deviation.
    std: f64,
    seed: u64,
    prec: Precision,
    device: candle_core::Device,
    made: std::sync::Mutex<Option<Tensor>>,
}

impl MadeHead {
    /// `lm_head.weight [V, H]` drawn from normal(0, `std`) with `seed` (the
    /// init transformers gives a MISSING lm_head), rounded to `prec`, on
    /// `device`; nothing is generated yet.
    pub fn random(
        v: usize,
        h: usize,
        std: f64,
        seed: u64,
        prec: Precision,
        device: &candle_core::Device,
    ) -> Self {
        Self {
            shape: [v, h],
            std,
            seed,
            prec,
            device: device.clone(),
            made: std::sync::Mutex::new(None),
        }
    }

    /// The head in its storage dtype, generated on first use.
    ///
    /// Errors: a tensor failure; the device cannot hold it.
    fn get(&self) -> Result<Tensor> {
        let mut m = self
            .made
            .lock()
            .map_err(|_| Error::Input("the random lm_head's lock is poisoned".into()))?;
        if let Some(t) = m.as_ref() {
            return Ok(t.clone());
        }
        let t = crate::loading::init::init_tensor_in(
            "lm_head.weight",
            InitRule::Normal { std: self.std },
            &self.shape,
            Some(self.seed),
            self.prec,
        )?
        .to_device(&self.device)?;
        *m = Some(t.clone());
        Ok(t)
    }
}

impl WeightSource for MadeHead {
    fn tensor(&self, _name: &str) -> Result<Tensor> {
        Ok(self.get()?.to_dtype(DType::F32)?)
    }
    fn tensor_in(&self, name: &str, prec: Precision) -> Result<Tensor> {
        prec.round(&self.tensor(name)?)
    }
    fn row_range(&self, _name: &str, start: usize, len: usize, prec: Precision) -> Result<Tensor> {
        prec.round(&self.get()?.narrow(0, start, len)?.to_dtype(DType::F32)?)
    }
    fn shape(&self, _name: &str) -> Option<Vec<usize>> {
        Some(self.shape.to_vec())
    }
    fn release(&self) {
        if let Ok(mut m) = self.made.lock() {
            *m = None;
        }
    }
    fn identity(&self, name: &str) -> String {
        format!("synthetic:{name}")
    }
}
