//! Lock-step capture: every loading path runs layer `l` on every prompt before
//! any path runs layer `l+1` (DESIGN §1.4). Observers see each
//! `hidden_states` index once for all paths, compute their statistics and drop
//! the tensors, so no path's full activation history is kept. Weights are read
//! one layer at a time from the shared mmap; paths whose layer resolves to the
//! same checkpoint bytes share one loaded copy, and one forward pass when
//! their inputs are bitwise equal as well.

use std::sync::Arc;

use candle_core::Tensor;

use crate::checkpoint::config::LayerType;
use crate::error::Result;
use crate::models::precision::Precision;
use crate::models::qwen3_5::{DecoderLayer, Embedding, FinalNorm, GdnForm, LmHead, TextModelSpec};
use crate::models::WeightSource;
use crate::progress::RunProgress;

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

/// Loads one piece per path, sharing it between paths of the same group of
/// [`share_groups`] (same bytes, same dtype).
fn load_shared<T>(
    paths: &[PathModel],
    groups: &[usize],
    load: impl Fn(&dyn WeightSource, Precision) -> Result<T>,
) -> Result<Vec<Arc<T>>> {
    let mut out: Vec<Arc<T>> = Vec::with_capacity(paths.len());
    for (p, path) in paths.iter().enumerate() {
        let piece = match groups[p] {
            g if g < p => out[g].clone(),
            _ => Arc::new(load(path.source, path.precision)?),
        };
        out.push(piece);
    }
    Ok(out)
}

/// Groups paths whose `names` resolve to the same bytes and compute in the
/// same dtype: `group[p]` is the first path with p's identity.
fn share_groups(paths: &[PathModel], names: &[String]) -> Vec<usize> {
    let ids: Vec<(Precision, Vec<String>)> = paths
        .iter()
        .map(|p| {
            (
                p.precision,
                names.iter().map(|n| p.source.identity(n)).collect(),
            )
        })
        .collect();
    (0..paths.len())
        .map(|p| ids.iter().position(|x| *x == ids[p]).unwrap_or(p))
        .collect()
}

/// f32 bytes of `names` on one path.
fn tensor_bytes(path: &PathModel, names: &[String]) -> u64 {
    names
        .iter()
        .filter_map(|n| path.source.shape(n))
        .map(|s| s.iter().product::<usize>() as u64 * 4)
        .sum()
}

/// f32 bytes of `names` as loaded once per group (`groups`: [`share_groups`]).
fn group_bytes(paths: &[PathModel], names: &[String], groups: &[usize]) -> u64 {
    paths
        .iter()
        .enumerate()
        .filter(|&(p, _)| groups[p] == p)
        .map(|(_, path)| tensor_bytes(path, names))
        .sum()
}

/// True when two tensors hold the same f32 values, bit for bit (at once when
/// they are the same tensor, as a shared path's state is).
fn bitwise_equal(a: &Tensor, b: &Tensor) -> Result<bool> {
    if a.id() == b.id() {
        return Ok(true);
    }
    if a.dims() != b.dims() {
        return Ok(false);
    }
    let (a, b) = (a.flatten_all()?, b.flatten_all()?);
    let (va, vb) = (a.to_vec1::<f32>()?, b.to_vec1::<f32>()?);
    Ok(va.iter().zip(&vb).all(|(x, y)| x.to_bits() == y.to_bits()))
}

/// Runs `prompts` through every path in lock-step, reporting to `obs`.
///
/// Streaming: the embeddings are gathered by row from the mapped checkpoint,
/// one decoder layer's weights are materialised at a time (once for all paths
/// reading the same bytes in the same dtype) and dropped before the next, and
/// the LM head is applied in vocabulary chunks. A layer shared by two paths is
/// run once when its inputs are bitwise equal too (the outputs would be
/// bitwise equal: every kernel is deterministic), so identical paths cost one
/// forward pass.
///
/// Errors: a tensor cannot be loaded (missing, unreadable), a token id is out
/// of range, or an observer fails.
pub fn run(
    spec: &TextModelSpec,
    paths: &[PathModel],
    prompts: &[Vec<u32>],
    opts: CaptureOptions,
    obs: &mut dyn Observer,
    progress: Option<&RunProgress>,
) -> Result<()> {
    let n = spec.num_layers();
    let pos: Vec<_> = prompts
        .iter()
        .map(|p| spec.positions(0, p.len()))
        .collect::<Result<_>>()?;
    let none: Vec<Option<Vec<Tensor>>> = vec![None; paths.len()];
    let np = prompts.len();
    // Prompt k of path p (`local`: p's layer on path 0's input) is about to run.
    let at_prompt = |p: usize, k: usize, local: bool| {
        if let Some(pr) = progress {
            pr.prompts.set_position(k as u64);
            pr.prompts.set_message(format!(
                "{}{}",
                paths[p].name,
                if local { " (local)" } else { "" }
            ));
        }
    };
    let norm_names = ["norm.weight".to_string()];
    let head_names = ["lm_head.weight".to_string()];
    let head_groups = share_groups(paths, &head_names);
    // Paths whose lm_head is read (each shared copy once).
    let head_leaders: Vec<usize> = (0..paths.len())
        .filter(|&p| paths[p].has_lm_head && head_groups[p] == p)
        .collect();
    if let Some(pr) = progress {
        let layers: u64 = (0..n)
            .map(|l| spec.layer_tensor_names(l))
            .map(|names| group_bytes(paths, &names, &share_groups(paths, &names)))
            .sum();
        let total = layers
            + group_bytes(paths, &norm_names, &share_groups(paths, &norm_names))
            + head_leaders
                .iter()
                .map(|&p| tensor_bytes(&paths[p], &head_names))
                .sum::<u64>();
        pr.loading.set_length(total);
        pr.layers.set_message("embeddings");
    }
    let groups = share_groups(paths, &["embed_tokens.weight".to_string()]);
    let mut states: Vec<Vec<Tensor>> = Vec::with_capacity(paths.len());
    for (p, path) in paths.iter().enumerate() {
        let g = groups[p];
        let hs = if g < p {
            states[g].clone()
        } else {
            prompts
                .iter()
                .map(|ids| Embedding::gather(path.source, path.precision, ids))
                .collect::<Result<Vec<_>>>()?
        };
        states.push(hs);
    }
    obs.hidden_states(0, HiddenKind::Embedding, &states, &none)?;

    for l in 0..n {
        let names = spec.layer_tensor_names(l);
        if let Some(pr) = progress {
            pr.layers
                .set_message(format!("layer {l} ({})", spec.layer_types[l].as_str()));
            pr.loading.set_message(format!("layer {l}"));
            pr.prompts.set_position(0);
        }
        let groups = share_groups(paths, &names);
        let layers = load_shared(paths, &groups, |s, p| DecoderLayer::load(spec, s, l, p))?;
        if let Some(pr) = progress {
            pr.loading.inc(group_bytes(paths, &names, &groups));
        }
        // Propagated: path p's layer on its own history; reuses the output of
        // an earlier path with the same layer and the same input.
        let mut next: Vec<Vec<Tensor>> = Vec::with_capacity(paths.len());
        for p in 0..paths.len() {
            let mut out = Vec::with_capacity(np);
            for (k, (h, ps)) in states[p].iter().zip(&pos).enumerate() {
                let mut reuse = None;
                for q in 0..p {
                    if groups[q] == groups[p] && bitwise_equal(&states[q][k], h)? {
                        reuse = Some(next[q][k].clone());
                        break;
                    }
                }
                out.push(match reuse {
                    Some(t) => t,
                    None => {
                        at_prompt(p, k, false);
                        layers[p].forward(h, spec, ps, opts.form, None)?
                    }
                });
            }
            next.push(out);
        }
        // Local: path p's layer on path 0's input (= path 0's output when
        // the layer is shared with path 0).
        let mut local = none.clone();
        if opts.local {
            for p in 1..paths.len() {
                local[p] = Some(if groups[p] == groups[0] {
                    next[0].clone()
                } else {
                    let mut out = Vec::with_capacity(np);
                    for (k, (h, ps)) in states[0].iter().zip(&pos).enumerate() {
                        let mut reuse = None;
                        for q in 0..paths.len() {
                            if q != p && groups[q] == groups[p] && bitwise_equal(&states[q][k], h)?
                            {
                                // Path q (same layer) was already run on this input.
                                reuse = Some(next[q][k].clone());
                                break;
                            }
                        }
                        out.push(match reuse {
                            Some(t) => t,
                            None => {
                                at_prompt(p, k, true);
                                layers[p].forward(h, spec, ps, opts.form, None)?
                            }
                        });
                    }
                    out
                });
            }
        }
        states = next;
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
            let norm_groups = share_groups(paths, &norm_names);
            let norms = load_shared(paths, &norm_groups, |s, p| FinalNorm::load(spec, s, p))?;
            if let Some(pr) = progress {
                pr.loading
                    .inc(group_bytes(paths, &norm_names, &norm_groups));
            }
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
        if let Some(pr) = progress {
            pr.prompts.set_position(np as u64);
            pr.layers.inc(1);
        }
    }

    // LM head in vocabulary chunks, each chunk read once for all paths that
    // share `lm_head.weight` (same bytes, same dtype).
    if let Some(pr) = progress {
        pr.layers.set_message("lm_head");
        pr.loading.set_message("lm_head (vocabulary chunks)");
    }
    let mut logits: Vec<Option<Vec<Tensor>>> = vec![None; paths.len()];
    for &p in &head_leaders {
        let path = &paths[p];
        // Members of this group with a head; inputs deduplicated bitwise.
        let members: Vec<usize> = (p..paths.len())
            .filter(|&q| paths[q].has_lm_head && head_groups[q] == p)
            .collect();
        let mut distinct: Vec<usize> = Vec::new();
        let mut same_as: Vec<usize> = Vec::with_capacity(members.len());
        for &q in &members {
            let mut found = None;
            for (j, &r) in distinct.iter().enumerate() {
                let mut eq = true;
                for (a, b) in states[q].iter().zip(&states[r]) {
                    if !bitwise_equal(a, b)? {
                        eq = false;
                        break;
                    }
                }
                if eq {
                    found = Some(j);
                    break;
                }
            }
            same_as.push(match found {
                Some(j) => j,
                None => {
                    distinct.push(q);
                    distinct.len() - 1
                }
            });
        }
        let inputs: Vec<&[Tensor]> = distinct.iter().map(|&r| states[r].as_slice()).collect();
        let out = LmHead::forward_streamed(path.source, path.precision, &inputs)?;
        if let Some(pr) = progress {
            pr.loading.inc(tensor_bytes(path, &head_names));
        }
        for (&q, &j) in members.iter().zip(&same_as) {
            logits[q] = Some(out[j].clone());
        }
    }
    obs.logits(&logits)
}
