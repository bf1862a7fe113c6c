//! Lock-step capture: every loading path runs layer `l` on every prompt before
//! any path runs layer `l+1` (DESIGN §1.4). Observers see each
//! `hidden_states` index once for all paths, compute their statistics and drop
//! the tensors, so no path's full activation history is kept. Weights are read
//! one layer at a time from the shared mmap; paths whose layer resolves to the
//! same checkpoint bytes share one loaded copy.

use std::sync::Arc;

use candle_core::Tensor;
use indicatif::ProgressBar;

use crate::checkpoint::config::LayerType;
use crate::error::Result;
use crate::models::precision::Precision;
use crate::models::qwen3_5::{DecoderLayer, Embedding, FinalNorm, GdnForm, LmHead, TextModelSpec};
use crate::models::WeightSource;

/// What a `hidden_states` entry is (the `layer_type` of the report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HiddenKind {
    /// `hidden_states[0]`: token embeddings.
    Embedding,
    /// `hidden_states[l+1]`, output of decoder layer `l` (l < N−1).
    Layer(LayerType),
    /// `hidden_states[N]`: final-normed output of the last layer.
    FinalNorm,
}

impl HiddenKind {
    /// `"embedding"`, `"linear_attention"`, `"full_attention"`, `"final_norm"`.
    pub fn as_str(self) -> &'static str {
        match self {
            HiddenKind::Embedding => "embedding",
            HiddenKind::Layer(t) => t.as_str(),
            HiddenKind::FinalNorm => "final_norm",
        }
    }
}

/// One loading path as the capture sees it: a name and its weights.
pub struct PathModel<'a> {
    /// Loading path name (`causal-lm`, …).
    pub name: String,
    /// The path's tensor view.
    pub source: &'a dyn WeightSource,
    /// Whether the path's class has an `lm_head` (logits are captured).
    pub has_lm_head: bool,
    /// The dtype the path computes in.
    pub precision: Precision,
}

/// Capture settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct CaptureOptions {
    /// Delta-rule form for the linear-attention layers.
    pub form: GdnForm,
    /// Also run every path's layer on path 0's input ("local" comparison).
    pub local: bool,
}

/// Receives captured tensors. `states[p][k]` is path `p`'s tensor for prompt
/// `k`, `[T_k, H]` (or `[T_k, V]` for logits).
pub trait Observer {
    /// `hidden_states[index]` for every path. `local[p]` (p ≥ 1, with
    /// [`CaptureOptions::local`]) is path p's layer applied to path 0's input;
    /// `None` for path 0 and for the embeddings.
    fn hidden_states(
        &mut self,
        index: usize,
        kind: HiddenKind,
        states: &[Vec<Tensor>],
        local: &[Option<Vec<Tensor>>],
    ) -> Result<()>;

    /// Raw output of the last decoder layer (before the final norm).
    fn last_layer_output(&mut self, states: &[Vec<Tensor>]) -> Result<()>;

    /// Logits for paths with an LM head (`None` for the others).
    fn logits(&mut self, logits: &[Option<Vec<Tensor>>]) -> Result<()>;
}

/// Loads one piece per path, sharing it between paths whose tensors have the
/// same identity and that compute in the same dtype.
fn load_shared<T>(
    paths: &[PathModel],
    names: &[String],
    load: impl Fn(&dyn WeightSource, Precision) -> Result<T>,
) -> Result<Vec<Arc<T>>> {
    let mut out: Vec<Arc<T>> = Vec::with_capacity(paths.len());
    let mut ids: Vec<(Precision, Vec<String>)> = Vec::with_capacity(paths.len());
    for p in paths {
        let id = (
            p.precision,
            names.iter().map(|n| p.source.identity(n)).collect(),
        );
        match ids.iter().position(|x| *x == id) {
            Some(j) => out.push(out[j].clone()),
            None => out.push(Arc::new(load(p.source, p.precision)?)),
        }
        ids.push(id);
    }
    Ok(out)
}

/// Runs `prompts` through every path in lock-step, reporting to `obs`.
///
/// Errors: a tensor cannot be loaded (missing, unreadable), a token id is out
/// of range, or an observer fails.
pub fn run(
    spec: &TextModelSpec,
    paths: &[PathModel],
    prompts: &[Vec<u32>],
    opts: CaptureOptions,
    obs: &mut dyn Observer,
    progress: Option<&ProgressBar>,
) -> Result<()> {
    let n = spec.num_layers();
    let pos: Vec<_> = prompts
        .iter()
        .map(|p| spec.positions(0, p.len()))
        .collect::<Result<_>>()?;
    let none: Vec<Option<Vec<Tensor>>> = vec![None; paths.len()];

    let emb = load_shared(paths, &["embed_tokens.weight".to_string()], Embedding::load)?;
    let mut states: Vec<Vec<Tensor>> = emb
        .iter()
        .map(|e| prompts.iter().map(|ids| e.forward(ids)).collect())
        .collect::<Result<_>>()?;
    drop(emb);
    obs.hidden_states(0, HiddenKind::Embedding, &states, &none)?;

    for l in 0..n {
        if let Some(pb) = progress {
            pb.set_message(format!("layer {l}"));
        }
        let layers = load_shared(paths, &spec.layer_tensor_names(l), |s, p| {
            DecoderLayer::load(spec, s, l, p)
        })?;
        let mut local = none.clone();
        if opts.local {
            for (p, layer) in layers.iter().enumerate().skip(1) {
                local[p] = Some(
                    states[0]
                        .iter()
                        .zip(&pos)
                        .map(|(h, ps)| layer.forward(h, spec, ps, opts.form, None))
                        .collect::<Result<_>>()?,
                );
            }
        }
        states = layers
            .iter()
            .zip(&states)
            .map(|(layer, hs)| {
                hs.iter()
                    .zip(&pos)
                    .map(|(h, ps)| layer.forward(h, spec, ps, opts.form, None))
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<_>>()?;
        drop(layers);
        if l + 1 < n {
            obs.hidden_states(
                l + 1,
                HiddenKind::Layer(spec.layer_types[l]),
                &states,
                &local,
            )?;
        } else {
            obs.last_layer_output(&states)?;
            let norms = load_shared(paths, &["norm.weight".to_string()], |s, p| {
                FinalNorm::load(spec, s, p)
            })?;
            let local_normed: Vec<Option<Vec<Tensor>>> = local
                .iter()
                .zip(&norms)
                .map(|(lo, norm)| {
                    lo.as_ref()
                        .map(|v| {
                            v.iter()
                                .map(|h| norm.forward(h))
                                .collect::<Result<Vec<_>>>()
                        })
                        .transpose()
                })
                .collect::<Result<_>>()?;
            states = norms
                .iter()
                .zip(&states)
                .map(|(norm, hs)| {
                    hs.iter()
                        .map(|h| norm.forward(h))
                        .collect::<Result<Vec<_>>>()
                })
                .collect::<Result<_>>()?;
            obs.hidden_states(n, HiddenKind::FinalNorm, &states, &local_normed)?;
        }
        if let Some(pb) = progress {
            pb.inc(1);
        }
    }

    let heads = paths
        .iter()
        .map(|p| {
            p.has_lm_head
                .then(|| LmHead::load(p.source, p.precision))
                .transpose()
        })
        .collect::<Result<Vec<_>>>()?;
    let logits: Vec<Option<Vec<Tensor>>> = heads
        .iter()
        .zip(&states)
        .map(|(head, hs)| {
            head.as_ref()
                .map(|h| hs.iter().map(|x| h.forward(x)).collect::<Result<Vec<_>>>())
                .transpose()
        })
        .collect::<Result<_>>()?;
    obs.logits(&logits)
}
