//! Lock-step capture: every loading path runs layer `l` on every prompt before
//! any path runs layer `l+1` (`docs/architecture.md`, "lock-step capture"). Observers see each
//! `hidden_states` index once for all paths, compute their statistics and drop
//! the tensors, so no path's full activation history is kept. Weights are read
//! one layer at a time from the shared mmap; paths whose layer resolves to the
//! same checkpoint bytes share one loaded copy, and one forward pass when
//! their inputs are bitwise equal as well.

pub mod decode;
mod head;
mod share;

use candle_core::Tensor;

use crate::checkpoint::config::LayerType;
use crate::error::Result;
use crate::loading::WeightSource;
use crate::models::moe::Routing;
use crate::models::{
    DecoderLayer, Embedding, FinalNorm, GdnForm, LayerState, Positions, Sequence, TextModelSpec,
};
use crate::precision::Precision;
use crate::progress::RunProgress;
pub use decode::CachedDecode;
use decode::{DecodePlan, DecodeRows, Own};
use share::{group_bytes, load_shared, same_input, share_groups};

/// What a `hidden_states` entry is (the `layer_type` of the report;
/// serialised as [`HiddenKind::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HiddenKind {
    /// `hidden_states[0]`: token embeddings.
    Embedding,
    /// `hidden_states[l+1]`, output of decoder layer `l` (l < N−1).
    Layer(LayerType),
    /// The output of a decoder layer whose mixer is not known (a dump
    /// records no layer types).
    DecoderLayer,
    /// `hidden_states[N]`: final-normed output of the last layer.
    FinalNorm,
}

impl HiddenKind {
    /// `"embedding"`, `"linear_attention"`, `"full_attention"`,
    /// `"decoder_layer"`, `"final_norm"`.
    pub fn as_str(self) -> &'static str {
        match self {
            HiddenKind::Embedding => "embedding",
            HiddenKind::Layer(t) => t.as_str(),
            HiddenKind::DecoderLayer => "decoder_layer",
            HiddenKind::FinalNorm => "final_norm",
        }
    }

    /// The kind of index `i` of an N-layer model whose layer types are not
    /// known (a dump).
    pub fn of_index(i: usize, n: usize) -> Self {
        match i {
            0 => HiddenKind::Embedding,
            i if i == n => HiddenKind::FinalNorm,
            _ => HiddenKind::DecoderLayer,
        }
    }
}

impl serde::Serialize for HiddenKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
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
    /// A path measuring another's noise floor (its products rounded the
    /// other way near rounding midpoints, [`crate::loading::NoiseShadow`]): it runs on its own history
    /// only, with no local forward and no cached decode. It comes after
    /// every other path.
    pub noise_shadow: bool,
}

/// Capture settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct CaptureOptions {
    /// Delta-rule form for the linear-attention layers.
    pub form: GdnForm,
    /// Also run every path's layer on path 0's input ("local" comparison).
    pub local: bool,
    /// Also run the prefill-vs-incremental check's cached decode on every
    /// path, in the same sweep (reported by [`Observer::cached_decode`]).
    pub cached_decode: Option<CachedDecode>,
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

    /// The cached decode of [`CaptureOptions::cached_decode`]: `steps[p]`
    /// are path p's final-normed states of the stepped tokens (`[steps, H]`,
    /// one row per step: the prompt's last `check.steps` tokens, after a
    /// prefill of the `prefill_tokens` before them). Called once, after the
    /// final norm's `hidden_states`; the default ignores it.
    fn cached_decode(
        &mut self,
        check: CachedDecode,
        prefill_tokens: usize,
        steps: &[Tensor],
    ) -> Result<()> {
        let _ = (check, prefill_tokens, steps);
        Ok(())
    }

    /// The MoE routers' choices of decoder layer `layer` (reported after its
    /// `hidden_states[layer + 1]`; only for layers with a sparse MoE block):
    /// `routing[p][k]` is path p's choice on prompt k, `local[p]` (p ≥ 1,
    /// with [`CaptureOptions::local`]) path p's layer on path 0's input. The
    /// default ignores them.
    fn routing(
        &mut self,
        layer: usize,
        routing: &[Vec<Routing>],
        local: &[Option<Vec<Routing>>],
    ) -> Result<()> {
        let _ = (layer, routing, local);
        Ok(())
    }
}

/// Per path, per prompt: `states[p][k]`.
type PerPath = Vec<Vec<Tensor>>;

/// Per path (`None` for path 0), per prompt: a layer fed path 0's input.
type LocalPerPath = Vec<Option<Vec<Tensor>>>;

/// Per prompt: a layer's outputs and its MoE router's choices (`None` for a
/// dense layer).
type Outputs = (Vec<Tensor>, Vec<Option<Routing>>);

/// An earlier run of a layer: `(its inputs, its outputs, its routings)`.
type Done<'a> = (&'a [Tensor], &'a [Tensor], &'a [Option<Routing>]);

/// One decoder layer on every path: propagated outputs, local outputs, and
/// the routers' choices of both (empty for a dense layer).
struct LayerRun {
    next: PerPath,
    /// The cached decode's rows per path (empty without one).
    decode: Vec<DecodeRows>,
    local: LocalPerPath,
    routing: Vec<Vec<Routing>>,
    local_routing: Vec<Option<Vec<Routing>>>,
}

/// What a path's layer run is for ([`Run::forward`]).
enum Mode<'s> {
    /// Its own history.
    Own,
    /// Path 0's input (the local comparison).
    Local,
    /// Its own history, prompt `prompt` also leaving in `into` the state
    /// after its first `at` tokens (the cached decode's prefill).
    Snapshot {
        prompt: usize,
        at: usize,
        into: &'s mut LayerState,
    },
}

/// The outputs (and routings) of a batch's extra sequences, in order.
type Ran = Vec<(Tensor, Option<Routing>)>;

/// Everything one capture shares across its steps.
struct Run<'a> {
    spec: &'a TextModelSpec,
    paths: &'a [PathModel<'a>],
    pos: Vec<Positions>,
    form: GdnForm,
    progress: &'a RunProgress,
    decode: Option<DecodePlan>,
}

impl Run<'_> {
    /// Prompt k of path p (`local`: p's layer on path 0's input) is about to run.
    fn at_prompt(&self, p: usize, k: usize, local: bool) {
        self.progress.prompts.set_position(k as u64);
        self.progress.prompts.set_message(format!(
            "{}{}",
            self.paths[p].name,
            if local { " (local)" } else { "" }
        ));
    }

    /// `hidden_states[0]` of every path; paths sharing the embedding share the rows.
    fn embed(&self, prompts: &[Vec<u32>]) -> Result<Vec<Vec<Tensor>>> {
        let groups = share_groups(self.paths, &["embed_tokens.weight".to_string()]);
        let mut states: Vec<Vec<Tensor>> = Vec::with_capacity(self.paths.len());
        for (p, path) in self.paths.iter().enumerate() {
            let hs = match groups[p] {
                g if g < p => states[g].clone(),
                _ => prompts
                    .iter()
                    .map(|ids| Embedding::gather(path.source, path.precision, ids))
                    .collect::<Result<Vec<_>>>()?,
            };
            states.push(hs);
        }
        Ok(states)
    }

    /// Path p's layer over `inputs` (one per prompt), reusing the outputs
    /// (and routings) of an earlier run of the same layer (`done`) on
    /// bitwise-equal inputs, except the prompt a [`Mode::Snapshot`] names,
    /// which runs and leaves its state.
    fn forward(
        &self,
        layer: &DecoderLayer,
        p: usize,
        inputs: &[Tensor],
        done: &[Done],
        mode: Mode,
        extra: Vec<Sequence>,
    ) -> Result<(Outputs, Ran)> {
        let (local, mut snapshot) = match mode {
            Mode::Local => (true, None),
            Mode::Own => (false, None),
            Mode::Snapshot { prompt, at, into } => (false, Some((prompt, at, into))),
        };
        let mut reused: Vec<Option<(Tensor, Option<Routing>)>> = Vec::with_capacity(inputs.len());
        for (k, h) in inputs.iter().enumerate() {
            if snapshot.as_ref().is_some_and(|s| s.0 == k) {
                reused.push(None);
                continue;
            }
            let earlier = done
                .iter()
                .enumerate()
                .map(|(j, (i, _, _))| (j, std::slice::from_ref(&i[k])));
            reused.push(
                same_input(earlier, std::slice::from_ref(h))?
                    .map(|j| (done[j].1[k].clone(), done[j].2[k].clone())),
            );
        }
        let todo: Vec<usize> = (0..inputs.len()).filter(|&k| reused[k].is_none()).collect();
        if let Some(&first) = todo.first() {
            self.at_prompt(p, first, local);
        }
        let mut seqs: Vec<Sequence> = todo
            .iter()
            .map(|&k| Sequence {
                h: &inputs[k],
                pos: &self.pos[k],
                form: self.form,
                state: None,
                snapshot: if snapshot.as_ref().is_some_and(|s| s.0 == k) {
                    snapshot.take().map(|(_, at, into)| (at, into))
                } else {
                    None
                },
            })
            .collect();
        if let Some((prompt, _, _)) = snapshot {
            return Err(crate::error::Error::Tensor(candle_core::Error::Msg(
                format!(
                    "the cached decode's prompt {prompt} is not among the {} prompts",
                    inputs.len()
                ),
            )));
        }
        seqs.extend(extra);
        let mut ran = layer.forward_batch(&mut seqs, self.spec)?;
        let extra = ran.split_off(todo.len().min(ran.len()));
        for (&k, r) in todo.iter().zip(ran) {
            reused[k] = Some(r);
        }
        Ok((reused.into_iter().flatten().unzip(), extra))
    }

    /// Runs decoder layer `l` on every path: the propagated outputs (each
    /// path on its own history) and, with `local`, every path's layer on
    /// path 0's input (`None` for path 0); the MoE routers' choices of both.
    fn layer(
        &self,
        l: usize,
        states: &[Vec<Tensor>],
        local: bool,
        decode_in: &[DecodeRows],
    ) -> Result<LayerRun> {
        let names = self.spec.layer_tensor_names(l);
        let groups = share_groups(self.paths, &names);
        let layers = load_shared(self.paths, &groups, |s, p| {
            DecoderLayer::load(self.spec, s, l, p)
        })?;
        self.progress
            .loading
            .inc(group_bytes(self.paths, &names, &groups));
        let mut next: Vec<Vec<Tensor>> = Vec::with_capacity(self.paths.len());
        let mut routes: Vec<Vec<Option<Routing>>> = Vec::with_capacity(self.paths.len());
        let mut decode: Vec<DecodeRows> = Vec::with_capacity(decode_in.len());
        let mut stacked_local: Vec<Option<Outputs>> = Vec::with_capacity(self.paths.len());
        for p in 0..self.paths.len() {
            let done: Vec<Done> = (0..p)
                .filter(|&q| groups[q] == groups[p])
                .map(|q| {
                    (
                        states[q].as_slice(),
                        next[q].as_slice(),
                        routes[q].as_slice(),
                    )
                })
                .collect();
            // A path alone in its group runs its local forward (its layer on
            // path 0's input) stacked with its own: nothing to reuse either way.
            let n = self.paths.len();
            let stack_local = local
                && p > 0
                && !self.paths[p].noise_shadow
                && (0..n).all(|q| q == p || groups[q] != groups[p]);
            let with_local = if stack_local {
                states[0].as_slice()
            } else {
                &[]
            };
            let ((out, r), rows, lo) = match (&self.decode, decode_in.get(p)) {
                (Some(plan), Some(rows)) => {
                    let same: Vec<usize> = (0..p).filter(|&q| groups[q] == groups[p]).collect();
                    let same: Vec<(usize, &[Tensor], &DecodeRows)> = same
                        .into_iter()
                        .map(|q| (q, states[q].as_slice(), &decode_in[q]))
                        .collect();
                    let own = Own {
                        inputs: &states[p],
                        done: &done,
                        locals: with_local,
                        rows,
                    };
                    self.with_decode(&layers[p], p, own, plan, &decode, &same)?
                }
                _ => {
                    let extra = self.local_sequences(with_local);
                    let (out, lo) =
                        self.forward(&layers[p], p, &states[p], &done, Mode::Own, extra)?;
                    (out, None, lo)
                }
            };
            next.push(out);
            routes.push(r);
            decode.extend(rows);
            stacked_local.push(stack_local.then(|| lo.into_iter().unzip::<_, _, Vec<_>, Vec<_>>()));
        }
        let (locals, local_routes) = if local {
            self.local_forwards(&layers, &groups, states, (&next, &routes), stacked_local)?
        } else {
            (vec![None; self.paths.len()], vec![None; self.paths.len()])
        };
        // A dense layer has no router: its routings are all `None`.
        let routing: Vec<Vec<Routing>> = routes
            .into_iter()
            .map(|r| r.into_iter().flatten().collect())
            .collect();
        Ok(LayerRun {
            next,
            decode,
            local: locals,
            routing,
            local_routing: local_routes,
        })
    }

    /// Every path's layer on path 0's input (`None` for path 0): the forward
    /// stacked with its own where it ran one, path 0's output where the
    /// layer is shared with path 0, else any path's with the same layer run
    /// on that input, else its own forward of it.
    fn local_forwards(
        &self,
        layers: &[std::sync::Arc<DecoderLayer>],
        groups: &[usize],
        states: &[Vec<Tensor>],
        (next, routes): (&[Vec<Tensor>], &[Vec<Option<Routing>>]),
        mut stacked_local: Vec<Option<Outputs>>,
    ) -> Result<(LocalPerPath, Vec<Option<Vec<Routing>>>)> {
        let n = self.paths.len();
        let (mut locals, mut local_routes) = (vec![None; n], vec![None; n]);
        for p in (1..n).filter(|&p| !self.paths[p].noise_shadow) {
            if let Some(Some((o, r))) = stacked_local.get_mut(p).map(Option::take) {
                locals[p] = Some(o);
                local_routes[p] = r.into_iter().collect::<Option<Vec<_>>>();
                continue;
            }
            // Path p's layer on path 0's input: path 0's output when the
            // layer is shared with path 0, else reuse any path q with the
            // same layer already run on that input.
            let (o, r) = if groups[p] == groups[0] {
                (next[0].clone(), routes[0].clone())
            } else {
                let done: Vec<Done> = (0..n)
                    .filter(|&q| q != p && groups[q] == groups[p])
                    .map(|q| {
                        (
                            states[q].as_slice(),
                            next[q].as_slice(),
                            routes[q].as_slice(),
                        )
                    })
                    .collect();
                self.forward(&layers[p], p, &states[0], &done, Mode::Local, Vec::new())?
                    .0
            };
            locals[p] = Some(o);
            local_routes[p] = r.into_iter().collect::<Option<Vec<_>>>();
        }
        Ok((locals, local_routes))
    }

    /// Path 0's inputs `inputs` as fresh sequences of a batch (a local forward).
    fn local_sequences<'s>(&'s self, inputs: &'s [Tensor]) -> Vec<Sequence<'s>> {
        inputs
            .iter()
            .zip(&self.pos)
            .map(|(h, pos)| Sequence {
                h,
                pos,
                form: self.form,
                state: None,
                snapshot: None,
            })
            .collect()
    }

    /// The final norm over the last layer's outputs (propagated and local)
    /// and over the cached decode's steps (`decode[p].steps`; empty without one).
    fn final_norm(
        &self,
        states: &[Vec<Tensor>],
        local: &[Option<Vec<Tensor>>],
        decode: &[DecodeRows],
    ) -> Result<(PerPath, LocalPerPath, Vec<Tensor>)> {
        let names = ["norm.weight".to_string()];
        let groups = share_groups(self.paths, &names);
        let norms = load_shared(self.paths, &groups, |s, p| FinalNorm::load(self.spec, s, p))?;
        self.progress
            .loading
            .inc(group_bytes(self.paths, &names, &groups));
        let apply = |norm: &FinalNorm, hs: &[Tensor]| -> Result<Vec<Tensor>> {
            hs.iter().map(|h| norm.forward(h)).collect()
        };
        let local = local
            .iter()
            .zip(&norms)
            .map(|(lo, norm)| lo.as_ref().map(|v| apply(norm, v)).transpose())
            .collect::<Result<_>>()?;
        let states = norms
            .iter()
            .zip(states)
            .map(|(norm, hs)| apply(norm, hs))
            .collect::<Result<_>>()?;
        let steps = norms
            .iter()
            .zip(decode)
            .map(|(norm, rows)| norm.forward(&rows.steps))
            .collect::<Result<_>>()?;
        Ok((states, local, steps))
    }
}

/// Runs `prompts` through every path in lock-step, reporting to `obs`.
///
/// Streaming: the embeddings are gathered by row from the mapped checkpoint,
/// one decoder layer's weights are materialised at a time (once for all paths
/// reading the same bytes in the same dtype) and dropped before the next, and
/// the LM head is applied in vocabulary chunks. A layer shared by two paths is
/// run once when its inputs are bitwise equal as well (the outputs would be
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
    progress: &RunProgress,
) -> Result<()> {
    let n = spec.num_layers();
    let run = Run {
        spec,
        paths,
        pos: prompts
            .iter()
            .map(|p| spec.positions(0, p.len()))
            .collect::<Result<_>>()?,
        form: opts.form,
        progress,
        decode: match opts.cached_decode {
            Some(c) => match prompts.get(c.prompt) {
                Some(ids) => DecodePlan::new(spec, c, ids.len())?,
                None => None,
            },
            None => None,
        },
    };
    progress.loading.set_length(run.total_bytes());
    progress.layers.set_message("embeddings");
    let none: Vec<Option<Vec<Tensor>>> = vec![None; paths.len()];
    let mut states = run.embed(prompts)?;
    obs.hidden_states(0, HiddenKind::Embedding, &states, &none)?;
    let mut decode: Vec<DecodeRows> = match &run.decode {
        Some(plan) => states
            .iter()
            .zip(paths)
            .filter(|(_, p)| !p.noise_shadow)
            .map(|(s, _)| plan.steps_input(&s[plan.check.prompt]))
            .collect::<Result<_>>()?,
        None => Vec::new(),
    };
    for l in 0..n {
        progress
            .layers
            .set_message(format!("layer {l} ({})", spec.layer_types[l].as_str()));
        progress.loading.set_message(format!("layer {l}"));
        progress.prompts.set_position(0);
        let LayerRun {
            next,
            decode: decoded,
            local,
            routing,
            local_routing,
        } = run.layer(l, &states, opts.local, &decode)?;
        states = next;
        decode = decoded;
        if l + 1 < n {
            let kind = HiddenKind::Layer(spec.layer_types[l]);
            obs.hidden_states(l + 1, kind, &states, &local)?;
        } else {
            obs.last_layer_output(&states)?;
            let (normed, local, steps) = run.final_norm(&states, &local, &decode)?;
            states = normed;
            obs.hidden_states(n, HiddenKind::FinalNorm, &states, &local)?;
            if let Some(plan) = &run.decode {
                obs.cached_decode(plan.check, plan.pre, &steps)?;
            }
        }
        if routing.iter().any(|r| !r.is_empty()) {
            obs.routing(l, &routing, &local_routing)?;
        }
        progress.prompts.set_position(prompts.len() as u64);
        progress.layers.inc(1);
    }
    progress.layers.set_message("lm_head");
    progress.loading.set_message("lm_head (vocabulary chunks)");
    obs.logits(&run.logits(&states)?)
}
