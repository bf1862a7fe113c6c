//! `hsparity compare`: the same prompts through two or more loading paths in
//! lock-step, per-layer parity, the prefill-vs-incremental check, and
//! optionally the drafter's τ on every path.

use candle_core::Tensor;

use crate::capture::{self, CachedDecode, CaptureOptions, HiddenKind, Observer, PathModel};
use crate::drafter::{self, DrafterSettings};
use crate::error::{Error, Result};
use crate::loading::{self, LoadingPath, WeightOrigin, WeightSource};
use crate::models::moe::Routing;
use crate::models::GdnForm;
use crate::parity::{incremental, PairObserver, PairReport, Verdict};
use crate::precision::Precision;
use crate::progress::RunProgress;
use crate::prompts::preview;
use crate::report::compare::{summarize, Compare, LmHeadOrigin, PathRun, PromptInfo};
use crate::report::{CompareReport, DrafterReport, Environment, Kind, Report, TAP_CONVENTION};
use crate::session::{Session, Target};

/// Options of `compare`.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Checkpoint, prompts, seed, device.
    pub target: Target,
    /// Loading paths (≥ 2); the first is the reference `a` of every pair.
    pub paths: Vec<LoadingPath>,
    /// `None` = what each path would load with; else this dtype for every path.
    pub dtype: Option<Precision>,
    /// Drafter taps (decoder-layer indices) to mark.
    pub taps: Vec<usize>,
    /// Delta-rule form.
    pub gdn_form: GdnForm,
    /// Prefill-vs-incremental check: `None` = automatic (see
    /// [`INCREMENTAL_AUTO_BYTES`]), `Some(b)` = forced on/off.
    pub incremental: Option<bool>,
    /// Also evaluate a DFlash drafter on every path (`--drafter`).
    pub drafter: Option<DrafterSettings>,
    /// Hide progress.
    pub quiet: bool,
    /// The command line, for the report's "reproduce" section.
    pub command_line: String,
}

/// The prefill-vs-incremental check adds, per path and layer, a prefill of
/// one prompt and 8 single-token steps to the capture's sweep, on the layer
/// already loaded. Where the steps' products can run in one pass over each
/// weight ([`crate::kernels::Capabilities::cpu_reads_weights_once`]: the CPU
/// has the single-row kernel, whatever `HSPARITY_NO_AVX512_GEMM` says, so that
/// the switch changes the check's speed, not whether it runs) that costs a few percent of
/// the sweep and the check runs by default on any model; elsewhere each step
/// reads the layer's weights again (from memory), and by default it runs when
/// the f32 text weights take at most this many bytes. With `--gdn-form
/// recurrent` the check is a second layer-major pass over the checkpoint, and
/// the byte limit applies too.
pub const INCREMENTAL_AUTO_BYTES: u64 = 4 << 30;

/// Runs the comparison and returns the report.
///
/// Errors ([`Error::Input`] unless noted): fewer than two paths, a tap
/// outside `0..num_hidden_layers`, a drafter that does not fit the target,
/// and anything [`Session::open`] or the capture returns.
pub fn run(opts: &CompareOptions) -> Result<CompareReport> {
    if opts.paths.len() < 2 {
        return Err(Error::Input(format!(
            "compare needs at least two loading paths, got {}",
            opts.paths.len()
        )));
    }
    let mut session = Session::open(&opts.target, &opts.paths)?;
    // The drafter is loaded and checked (config, taps, mask id, weights,
    // positions, supplied trajectories) before the capture, and evaluated
    // after it on this session.
    let drafter = match &opts.drafter {
        Some(d) => {
            drafter::check_tau_gap(d.max_tau_gap)?;
            let given = drafter::attach_trajectories(
                &mut session,
                d.trajectories.as_ref(),
                opts.target.prompts.names_prompts(),
            )?;
            let (dr, dprec, given) =
                drafter::load_checked(&session, &d.source, d.replay, 0, given)?;
            Some((d, dr, dprec, given))
        }
        None => None,
    };
    let taps = match (&drafter, opts.taps.is_empty()) {
        (Some((_, dr, _, _)), true) => dr.cfg.target_layer_ids.clone(),
        _ => opts.taps.clone(),
    };
    check_taps(&taps, session.spec.num_layers())?;
    let precisions: Vec<Precision> = session
        .paths
        .iter()
        .map(|p| opts.dtype.unwrap_or(p.dtype))
        .collect();
    let mut notes = Vec::new();
    let mut paths_run = paths_as_run(&session, &precisions, opts, &mut notes);
    let check = incremental_wanted(&session, opts);
    let captured = capture_pairs(&session, &precisions, opts, check.is_ok())?;
    let mut pairs = captured.pairs;
    mark_random_init(&mut pairs, &session);
    attach_non_finite(&session, &mut paths_run, &mut notes);
    let (mut verdict, mut summary) = summarize(&pairs, &paths_run);
    let incremental = match (check, captured.decode) {
        (Err(skipped), _) => {
            notes.push(skipped);
            Vec::new()
        }
        (Ok(()), Some((at, steps))) => {
            incremental::from_capture(&session, &precisions, at, &captured.full_rows, &steps)?
        }
        (Ok(()), None) => incremental::check_all(&session, &precisions, &captured.full_rows)?,
    };
    for c in incremental.iter().filter(|c| c.verdict != Verdict::Pass) {
        verdict = Verdict::Fail;
        summary.push_str(&format!(
            "; {}: cached decode departs from the full forward (max abs diff {:.3e})",
            c.path, c.metrics.max_abs
        ));
    }
    let drafter = match drafter {
        Some((d, dr, dprec, given)) => {
            let (mut eval, dnotes) = drafter::paths::evaluate(
                &session,
                &dr,
                dprec,
                d,
                given.as_ref(),
                opts.dtype,
                opts.quiet,
            )?;
            eval.tau_gap_interval = drafter::gap::gap(&eval, opts.target.seed);
            let env = Environment::of_session(&session, GdnForm::Chunked)?;
            let rep = crate::report::drafter::build(eval, env, opts.command_line.clone(), dnotes);
            append_drafter(&rep, &mut verdict, &mut summary);
            Some(rep)
        }
        None => None,
    };
    let inventory = loading::inventory::inventory_of(
        &session.ckpt,
        session.paths.iter().map(|p| p.inventory.clone()).collect(),
    );
    let body = Compare {
        tap_convention: TAP_CONVENTION.into(),
        taps,
        inventory,
        paths: paths_run,
        prompts: prompt_infos(&session),
        pairs,
        drafter,
        incremental,
    };
    Ok(Report::new(
        Kind::Compare,
        verdict,
        &summary,
        Environment::of_session(&session, opts.gdn_form)?,
        opts.command_line.clone(),
        notes,
        body,
    ))
}

/// Refuses a tap outside the model's decoder layers.
fn check_taps(taps: &[usize], n: usize) -> Result<()> {
    match taps.iter().find(|&&t| t >= n) {
        Some(bad) => Err(Error::Input(format!(
            "--taps {bad}: the model has decoder layers 0..{} ({TAP_CONVENTION})",
            n - 1
        ))),
        None => Ok(()),
    }
}

/// Each path as it runs (class, dtypes, lm_head origin), with notes on
/// dtype overrides and MISSING tensors.
fn paths_as_run(
    session: &Session,
    precisions: &[Precision],
    opts: &CompareOptions,
    notes: &mut Vec<String>,
) -> Vec<PathRun> {
    session
        .paths
        .iter()
        .zip(precisions)
        .map(|(p, &prec)| {
            if opts.dtype.is_some() && prec != p.dtype {
                notes.push(format!(
                    "{} would load in {} ({}); --dtype {prec} overrides it",
                    p.path.name(),
                    p.dtype,
                    p.inventory.dtype_reason
                ));
            }
            if p.inventory.missing > 0 {
                notes.push(format!(
                    "{} has {} MISSING tensors, initialised as transformers would (seed {}): {}",
                    p.path.name(),
                    p.inventory.missing,
                    opts.target.seed,
                    p.inventory
                        .missing_names
                        .iter()
                        .take(3)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            PathRun {
                name: p.path.name().to_string(),
                class: p.inventory.class.clone(),
                dtype: p.dtype,
                dtype_reason: p.inventory.dtype_reason.clone(),
                compute_dtype: prec,
                missing: p.inventory.missing,
                tie: p.inventory.tied_lm_head,
                lm_head: match p.view.origin("lm_head.weight") {
                    None => LmHeadOrigin::None,
                    Some(WeightOrigin::Checkpoint { .. } | WeightOrigin::Converted { .. }) => {
                        LmHeadOrigin::Checkpoint
                    }
                    Some(WeightOrigin::Tied { key }) => LmHeadOrigin::Tied(key.clone()),
                    Some(WeightOrigin::Missing { init, .. }) => {
                        LmHeadOrigin::Missing(init.to_string())
                    }
                },
                non_finite_weights: Default::default(),
            }
        })
        .collect()
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
    precisions: &[Precision],
    opts: &CompareOptions,
    incremental: bool,
) -> Result<Captured> {
    let models: Vec<PathModel> = session
        .paths
        .iter()
        .zip(precisions)
        .map(|(p, &precision)| PathModel {
            name: p.path.name().to_string(),
            source: &p.view as &dyn WeightSource,
            has_lm_head: p.view.has_lm_head(),
            precision,
        })
        .collect();
    let names: Vec<(String, Precision)> = models
        .iter()
        .map(|m| (m.name.clone(), m.precision))
        .collect();
    let mut obs = PairObserver::new(&names);
    let pb = RunProgress::new(session.spec.num_layers(), session.prompts.len(), opts.quiet);
    let prompt = incremental::prompt_of(session).filter(|_| opts.gdn_form == GdnForm::Chunked);
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
            form: opts.gdn_form,
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

/// Gives each path the NaN/Inf counts of the checkpoint keys its view reads
/// ([`Session::weight_findings`]).
fn attach_non_finite(session: &Session, paths_run: &mut [PathRun], notes: &mut Vec<String>) {
    for (run, f) in paths_run.iter_mut().zip(session.weight_findings()) {
        run.non_finite_weights = f.non_finite;
        for (name, nf) in &run.non_finite_weights {
            notes.push(format!(
                "{}: weight {name} holds {} NaN and {} Inf values",
                run.name, nf.nan, nf.inf
            ));
        }
    }
}

/// Whether the prefill-vs-incremental check runs: `--incremental` /
/// `--no-incremental`, else automatically for models up to
/// [`INCREMENTAL_AUTO_BYTES`] of f32 weights. `Err`: the note saying why not.
fn incremental_wanted(session: &Session, opts: &CompareOptions) -> std::result::Result<(), String> {
    let f32_bytes = session.paths[0]
        .inventory
        .components
        .get("language_model")
        .map(|c| c.params * 4)
        .unwrap_or(0);
    let in_sweep = opts.gdn_form == GdnForm::Chunked;
    let steps_once = in_sweep
        && session.spec.device.is_cpu()
        && crate::kernels::capabilities().cpu_reads_weights_once();
    match opts.incremental {
        Some(true) => return Ok(()),
        Some(false) => return Err("prefill-vs-incremental check not run (--no-incremental)".into()),
        None if steps_once || f32_bytes <= INCREMENTAL_AUTO_BYTES => return Ok(()),
        None => {}
    }
    let gib = f32_bytes as f64 / (1u64 << 30) as f64;
    let why = if in_sweep {
        format!("without AVX-512F its 8 single-token steps read every layer's weights 8 more times per path ({gib:.1} GiB in f32 each time)")
    } else {
        format!("with --gdn-form recurrent it is a second pass over the checkpoint per path ({gib:.1} GiB in f32)")
    };
    Err(format!(
        "prefill-vs-incremental check skipped: {why}; pass --incremental to force it"
    ))
}

/// Adds the drafter's τ per path to the summary; a τ gap over the limit fails the run.
fn append_drafter(d: &DrafterReport, verdict: &mut Verdict, summary: &mut String) {
    let taus: Vec<String> = d
        .paths
        .iter()
        .map(|p| format!("{:.2}", p.summary.tau_macro))
        .collect();
    summary.push_str(&format!("; drafter τ {}", taus.join(" → ")));
    let interval = d
        .tau_gap_interval
        .as_ref()
        .map(|g| format!(", {}", g.describe()))
        .unwrap_or_default();
    if d.verdict != Verdict::Pass {
        *verdict = Verdict::Fail;
        summary.push_str(&format!(" ({})", d.failures().join("; ")));
    } else if !interval.is_empty() {
        summary.push_str(&format!(" (gap {:.3}{interval})", d.tau_gap));
    }
}

/// The prompts as run.
fn prompt_infos(session: &Session) -> Vec<PromptInfo> {
    session
        .prompts
        .iter()
        .enumerate()
        .map(|(k, p)| PromptInfo {
            index: k,
            source: p.kind().into(),
            tokens: p.ids.len(),
            preview: p.fed_text().map(preview),
            origin: p.origin.clone(),
            chat: p.chat.is_some(),
            rendered_sha256: p.rendered_sha256(),
        })
        .collect()
}

/// Tensor names (text-model relative) that `hidden_states[index]` reads
/// directly: the embedding, layer `index − 1`, plus the final norm for the last.
fn tensors_of_index(spec: &crate::models::TextModelSpec, index: usize) -> Vec<String> {
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

fn is_random(view: &crate::loading::TensorView, name: &str) -> bool {
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
