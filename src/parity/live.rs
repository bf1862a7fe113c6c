//! Parity of live loading paths: one lock-step capture of every path of a
//! session observed pair by pair ([`PairObserver`]), the rows whose weights
//! a path initialised randomly marked, and the prefill-vs-incremental check
//! (in the capture's sweep in the chunked form, else a second pass) as
//! [`IncrementalPlan`] says. What `compare` computes before it reports.

use candle_core::Tensor;

use super::incremental::{self, IncrementalCheck, IncrementalPlan};
use super::noise::FloorPlan;
use super::{PairObserver, PairReport, PromptInputs};
use crate::capture::{self, CachedDecode, CaptureOptions, HiddenKind, Observer, PathModel};
use crate::error::Result;
use crate::loading::{NoiseShadow, TensorView, WeightOrigin, WeightSource};
use crate::models::moe::Routing;
use crate::models::{GdnForm, TextModelSpec};
use crate::precision::Precision;
use crate::progress::RunProgress;
use crate::session::Session;

/// What [`run`] measured.
pub struct LiveParity {
    /// One report per pair of paths (path 0 against each other path).
    pub pairs: Vec<PairReport>,
    /// The prefill-vs-incremental check per path (empty when skipped).
    pub incremental: Vec<IncrementalCheck>,
}

/// Captures every path of `session` in lock-step (delta-rule `form`), pair
/// by pair, and runs the incremental check as `plan` says.
///
/// Errors: the capture's and the check's tensor failures.
pub fn run(
    session: &Session,
    form: GdnForm,
    plan: &IncrementalPlan,
    floor: FloorPlan,
    quiet: bool,
) -> Result<LiveParity> {
    let captured = capture_pairs(session, form, plan.runs(), floor, quiet)?;
    let mut pairs = captured.pairs;
    mark_random_init(&mut pairs, session);
    let inputs: Vec<PromptInputs> = session
        .prompt_ids()
        .iter()
        .map(|ids| PromptInputs {
            ids: Some(ids.iter().map(|&t| i64::from(t)).collect()),
            ..Default::default()
        })
        .collect();
    for pair in &mut pairs {
        pair.localise(&inputs);
    }
    let incremental = match (plan, captured.decode) {
        (IncrementalPlan::Skip(_), _) => Vec::new(),
        (IncrementalPlan::Run, Some((at, steps))) => {
            incremental::from_capture(session, at, &captured.full_rows, &steps)?
        }
        (IncrementalPlan::Run, None) => incremental::check_all(session)?,
    };
    Ok(LiveParity { pairs, incremental })
}

/// Passes the capture on to the parity observer and keeps, per path, the
/// final-normed `hidden_states[N]` of prompt `prompt` (the full forward the
/// prefill-vs-incremental check compares against, computed once), and the
/// capture's cached decode when it ran one.
struct KeepFinal<'a> {
    inner: &'a mut PairObserver,
    prompt: Option<usize>,
    rows: Vec<Option<Tensor>>,
    decode: Option<CachedSteps>,
}

/// `((prompt, prefill tokens), per path the stepped tokens' final-normed
/// states `[steps, H]`)`.
type CachedSteps = ((usize, usize), Vec<Tensor>);

/// What [`capture_pairs`] returns.
struct Captured {
    pairs: Vec<PairReport>,
    /// Per path, the final-normed rows the incremental check compares with.
    full_rows: Vec<Option<Tensor>>,
    /// The cached decode run in the capture's sweep, when it ran.
    decode: Option<CachedSteps>,
}

impl Observer for KeepFinal<'_> {
    fn hidden_states(
        &mut self,
        index: usize,
        kind: HiddenKind,
        states: &[Vec<Tensor>],
        local: &[Option<Vec<Tensor>>],
    ) -> Result<()> {
        if let (HiddenKind::FinalNorm, Some(k)) = (kind, self.prompt) {
            self.rows = states.iter().map(|s| s.get(k).cloned()).collect();
        }
        self.inner.hidden_states(index, kind, states, local)
    }

    fn last_layer_output(&mut self, states: &[Vec<Tensor>]) -> Result<()> {
        self.inner.last_layer_output(states)
    }

    fn logits(&mut self, logits: &[Option<Vec<Tensor>>]) -> Result<()> {
        self.inner.logits(logits)
    }

    fn cached_decode(
        &mut self,
        check: CachedDecode,
        prefill_tokens: usize,
        steps: &[Tensor],
    ) -> Result<()> {
        self.decode = Some(((check.prompt, prefill_tokens), steps.to_vec()));
        Ok(())
    }

    fn routing(
        &mut self,
        layer: usize,
        routing: &[Vec<Routing>],
        local: &[Option<Vec<Routing>>],
    ) -> Result<()> {
        self.inner.routing(layer, routing, local)
    }
}

/// The lock-step capture of every path: the pair reports, per path the
/// final-normed rows the incremental check can reuse (chunked form only),
/// and, with `incremental` in the chunked form, the check's cached decode
/// run in the same sweep.
fn capture_pairs(
    session: &Session,
    form: GdnForm,
    incremental: bool,
    floor: FloorPlan,
    quiet: bool,
) -> Result<Captured> {
    let mut models: Vec<PathModel> = session
        .paths
        .iter()
        .map(|p| PathModel {
            name: p.path.name().to_string(),
            source: &p.view as &dyn WeightSource,
            has_lm_head: p.view.has_lm_head(),
            precision: p.compute,
            noise_shadow: false,
        })
        .collect();
    let names: Vec<(String, Precision)> = models
        .iter()
        .map(|m| (m.name.clone(), m.precision))
        .collect();
    let mut obs = PairObserver::new(&names);
    let reference = &session.paths[0];
    let shadow = NoiseShadow(&reference.view);
    if measures_floor(session, floor) {
        models.push(PathModel {
            name: format!("{} (noise shadow)", reference.path.name()),
            source: &shadow,
            has_lm_head: false,
            precision: reference.compute,
            noise_shadow: true,
        });
        obs = obs.with_noise_shadow();
    }
    let pb = RunProgress::new(session.spec.num_layers(), session.prompts.len(), quiet);
    let prompt = incremental::prompt_of(session).filter(|_| form == GdnForm::Chunked);
    let mut keep = KeepFinal {
        inner: &mut obs,
        prompt,
        rows: Vec::new(),
        decode: None,
    };
    capture::run(
        &session.spec,
        &models,
        &session.prompt_ids(),
        CaptureOptions {
            form,
            local: true,
            cached_decode: prompt.filter(|_| incremental).map(|prompt| CachedDecode {
                prompt,
                steps: incremental::STEPS,
            }),
        },
        &mut keep,
        &pb,
    )?;
    let (full_rows, decode) = (std::mem::take(&mut keep.rows), keep.decode.take());
    pb.finish();
    Ok(Captured {
        pairs: obs.pairs,
        full_rows,
        decode,
    })
}

/// Whether the capture runs path 0's noise shadow: `floor` asks for it, path
/// 0 computes in half precision, and some path reads other bytes or
/// computes in another dtype somewhere (paths that read the same bytes in
/// the same dtype everywhere run one forward, and every row is bitwise).
fn measures_floor(session: &Session, floor: FloorPlan) -> bool {
    let a = &session.paths[0];
    if floor == FloorPlan::Skip || a.compute == Precision::F32 {
        return false;
    }
    let n = session.spec.num_layers();
    let names: Vec<String> = (0..=n)
        .flat_map(|i| tensors_of_index(&session.spec, i))
        .collect();
    session.paths[1..].iter().any(|b| {
        b.compute != a.compute
            || names
                .iter()
                .any(|t| b.view.identity(t) != a.view.identity(t))
    })
}

/// Tensor names (text-model relative) that `hidden_states[index]` reads
/// directly: the embedding, layer `index − 1`, plus the final norm for the last.
fn tensors_of_index(spec: &TextModelSpec, index: usize) -> Vec<String> {
    let n = spec.num_layers();
    match index {
        0 => vec!["embed_tokens.weight".into()],
        i => {
            let mut v = spec.layer_tensor_names(i - 1);
            if i == n {
                v.push("norm.weight".into());
            }
            v
        }
    }
}

fn is_random(view: &TensorView, name: &str) -> bool {
    matches!(view.origin(name), Some(WeightOrigin::Missing { .. }))
}

/// Marks every row (and the logits) whose weights include randomly
/// initialised tensors on either path of the pair.
fn mark_random_init(pairs: &mut [PairReport], session: &Session) {
    let by_name = |n: &str| session.paths.iter().find(|p| p.path.name() == n);
    for pair in pairs.iter_mut() {
        let views: Vec<_> = [pair.a.clone(), pair.b.clone()]
            .into_iter()
            .filter_map(|n| by_name(&n).map(|p| (n, &p.view)))
            .collect();
        for row in pair.hidden_states.iter_mut() {
            let names = tensors_of_index(&session.spec, row.index);
            row.random_init = views
                .iter()
                .filter(|(_, v)| names.iter().any(|t| is_random(v, t)))
                .map(|(n, _)| n.clone())
                .collect();
        }
        pair.logits_random_init = views
            .iter()
            .filter(|(_, v)| is_random(v, "lm_head.weight"))
            .map(|(n, _)| n.clone())
            .collect();
    }
}
