//! `hsparity compare`: run the same prompts through two or more loading paths
//! in lock-step and report per-layer parity.

use std::path::{Path, PathBuf};

use crate::capture::{self, CaptureOptions, PathModel};
use crate::commands::{file_sha256, prompts_sha256, utc_stamp, Session};
use crate::error::{Error, Result};
use crate::loading::{self, LoadingPath, WeightOrigin};
use crate::models::precision::Precision;
use crate::models::qwen3_5::GdnForm;
use crate::models::WeightSource;
use crate::parity::PairObserver;
use crate::progress::RunProgress;
use crate::prompts::{preview, PromptOptions};
use crate::report::{
    self, Environment, PathRun, PromptInfo, Report, SCHEMA_VERSION, TAP_CONVENTION,
};
use candle_core::Tensor;

/// Options of `compare`.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Checkpoint directory or Hub id.
    pub checkpoint: String,
    /// Loading paths (≥ 2); the first is the reference `a` of every pair.
    pub paths: Vec<LoadingPath>,
    /// Prompt set.
    pub prompts: PromptOptions,
    /// `auto` (what each path would load with) or an explicit dtype for every path.
    pub dtype: String,
    /// Drafter taps (decoder-layer indices) to mark.
    pub taps: Vec<usize>,
    /// Delta-rule form.
    pub gdn_form: GdnForm,
    /// Seed for the init of missing tensors.
    pub seed: u64,
    /// Hide progress.
    pub quiet: bool,
    /// Compute device (`--device`).
    pub device: crate::device::DeviceSpec,
    /// The command line, for the report's "reproduce" section.
    pub command_line: String,
    /// Also evaluate a DFlash drafter on every path (`--drafter`).
    pub drafter: Option<DrafterSettings>,
    /// Prefill-vs-incremental check: `None` = automatic (models up to
    /// [`INCREMENTAL_AUTO_BYTES`] of f32 weights), `Some(b)` = forced on/off.
    pub incremental: Option<bool>,
}

/// The prefill-vs-incremental check streams the weights a second time (one
/// layer at a time, like the capture): by default it runs when the f32 text
/// weights take at most this many bytes, so a 27B run is not doubled.
pub const INCREMENTAL_AUTO_BYTES: u64 = 4 << 30;

/// Cached steps of the prefill-vs-incremental check.
const INCREMENTAL_STEPS: usize = 8;

/// Prefill `ids[..n-s]`, then `s` single cached steps (KV cache, Gated
/// DeltaNet conv and recurrent state; single tokens take the recurrent form,
/// as transformers' decode does); compare the stepped rows' final-normed
/// states with the full forward's.
///
/// Teacher-forced on the prompt's own tokens, so it runs layer-major: each
/// layer's weights are loaded once, run on the full sequence, the prefill
/// and every step, then dropped — one layer resident at a time, as in
/// [`crate::capture::run`].
///
/// `full_last`: the full forward's final-normed states `[T, H]` when the
/// capture already computed them (chunked form, same path and dtype);
/// `None` computes them here.
fn incremental_check(
    session: &Session,
    path: &crate::loading::ResolvedPath,
    prec: Precision,
    full_last: Option<&Tensor>,
) -> Result<Option<crate::report::IncrementalCheck>> {
    use crate::models::qwen3_5::{DecoderLayer, Embedding, FinalNorm};
    let Some(k) = incremental_prompt(session) else {
        return Ok(None);
    };
    let (spec, src) = (&session.spec, &path.view as &dyn WeightSource);
    let ids = &session.prompts[k].ids;
    let steps = INCREMENTAL_STEPS.min(ids.len() - 1);
    let pre = ids.len() - steps;
    let emb = Embedding::gather(src, prec, ids)?;
    let mut full = full_last.is_none().then(|| emb.clone());
    let mut prefill = emb.narrow(0, 0, pre)?;
    let mut stepped: Vec<candle_core::Tensor> = (pre..ids.len())
        .map(|t| emb.narrow(0, t, 1))
        .collect::<candle_core::Result<_>>()?;
    let pos_full = spec.positions(0, ids.len())?;
    let pos_pre = spec.positions(0, pre)?;
    let pos_step: Vec<_> = (pre..ids.len())
        .map(|t| spec.positions(t, 1))
        .collect::<Result<_>>()?;
    for l in 0..spec.num_layers() {
        let layer = DecoderLayer::load(spec, src, l, prec)?;
        if let Some(f) = full.as_mut() {
            *f = layer.forward(f, spec, &pos_full, GdnForm::Chunked, None)?;
        }
        let mut state = layer.new_state(spec);
        prefill = layer.forward(&prefill, spec, &pos_pre, GdnForm::Chunked, Some(&mut state))?;
        for (h, pos) in stepped.iter_mut().zip(&pos_step) {
            *h = layer.forward(h, spec, pos, GdnForm::Recurrent, Some(&mut state))?;
        }
    }
    let norm = FinalNorm::load(spec, src, prec)?;
    let full_last = match (full_last, &full) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => norm.forward(f)?,
        (None, None) => return Ok(None), // not reached: computed above when not given
    };
    let mut acc = crate::parity::Accumulator::default();
    for (j, h) in stepped.iter().enumerate() {
        acc.add(k, &norm.forward(h)?, &full_last.narrow(0, pre + j, 1)?)?;
    }
    let metrics = acc.finish();
    let verdict = crate::parity::Tolerance::for_dtype(prec.name()).judge(&metrics);
    Ok(Some(crate::report::IncrementalCheck {
        path: path.path.name().into(),
        prompt: k,
        prefill_tokens: pre,
        steps,
        metrics,
        verdict,
    }))
}

/// Passes the capture on to the parity observer and keeps, per path, the
/// final-normed `hidden_states[N]` of prompt `prompt` (the full forward the
/// prefill-vs-incremental check compares against, computed once).
struct KeepFinal<'a> {
    inner: &'a mut PairObserver,
    prompt: Option<usize>,
    rows: Vec<Option<Tensor>>,
}

impl capture::Observer for KeepFinal<'_> {
    fn hidden_states(
        &mut self,
        index: usize,
        kind: capture::HiddenKind,
        states: &[Vec<Tensor>],
        local: &[Option<Vec<Tensor>>],
    ) -> Result<()> {
        if let (capture::HiddenKind::FinalNorm, Some(k)) = (kind, self.prompt) {
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
}

/// The prompt the prefill-vs-incremental check runs on: the first with at
/// least two tokens.
fn incremental_prompt(session: &Session) -> Option<usize> {
    session.prompts.iter().position(|p| p.ids.len() >= 2)
}

/// Drafter settings of `compare --drafter`.
#[derive(Debug, Clone)]
pub struct DrafterSettings {
    /// Drafter directory or Hub id.
    pub source: String,
    /// Greedy tokens per prompt.
    pub max_new_tokens: usize,
    /// DDTree node budget.
    pub ddtree_budget: usize,
    /// Exit 1 when τ differs between paths by more than this.
    pub max_tau_gap: f64,
    /// End-of-generation rule replayed.
    pub end_rule: crate::drafter_eval::EndRule,
}

/// Where a report was written.
#[derive(Debug, Clone)]
pub struct WrittenReport {
    /// `report.md`.
    pub markdown: PathBuf,
    /// `report.json`.
    pub json: PathBuf,
}

/// Runs the comparison and returns the report.
///
/// Errors ([`Error::Input`] unless noted): fewer than two paths, an
/// unsupported `--dtype`, a tap outside `0..num_hidden_layers`, and anything
/// [`Session::open`] or the capture returns.
pub fn run(opts: &CompareOptions) -> Result<Report> {
    if opts.paths.len() < 2 {
        return Err(Error::Input(format!(
            "compare needs at least two loading paths, got {}",
            opts.paths.len()
        )));
    }
    let forced = Precision::parse_or_auto(&opts.dtype)?;
    // The drafter's taps are marked unless --taps says otherwise.
    let mut taps = opts.taps.clone();
    let session = Session::open(
        &opts.checkpoint,
        &opts.paths,
        &opts.prompts,
        opts.seed,
        opts.device,
    )?;
    let n = session.spec.num_layers();
    // The drafter is loaded and checked (config, taps, mask id, weights,
    // positions) before the capture, and evaluated after it on this session.
    let drafter = match &opts.drafter {
        Some(d) => {
            crate::commands::drafter::check_tau_gap(d.max_tau_gap)?;
            let (drafter, dprec) = crate::commands::drafter::load_checked(
                &session,
                &d.source,
                d.max_new_tokens,
                0,
                d.end_rule,
            )?;
            if taps.is_empty() {
                taps = drafter.cfg.target_layer_ids.clone();
            }
            Some((d, drafter, dprec))
        }
        None => None,
    };
    if let Some(bad) = taps.iter().find(|&&t| t >= n) {
        return Err(Error::Input(format!(
            "--taps {bad}: the model has decoder layers 0..{} ({TAP_CONVENTION})",
            n - 1
        )));
    }
    let inventory = loading::inventory::inventory_of(
        &session.ckpt,
        session.paths.iter().map(|p| p.inventory.clone()).collect(),
    );

    let mut notes = Vec::new();
    let precisions: Vec<Precision> = session
        .paths
        .iter()
        .map(|p| forced.unwrap_or(p.dtype.precision()))
        .collect();
    let paths_run: Vec<PathRun> =
        session
            .paths
            .iter()
            .zip(&precisions)
            .map(|(p, prec)| {
                let dtype = p.dtype.name().to_string();
                if forced.is_some() && prec.name() != dtype {
                    notes.push(format!(
                        "{} would load in {dtype} ({}); --dtype {} overrides it",
                        p.path.name(),
                        p.inventory.dtype_reason,
                        prec.name()
                    ));
                }
                if p.inventory.missing > 0 {
                    notes.push(format!(
                    "{} has {} MISSING tensors, initialised as transformers would (seed {}): {}",
                    p.path.name(),
                    p.inventory.missing,
                    opts.seed,
                    p.inventory.missing_names.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
                ));
                }
                PathRun {
                    name: p.path.name().to_string(),
                    class: p.inventory.class.clone(),
                    dtype,
                    dtype_reason: p.inventory.dtype_reason.clone(),
                    compute_dtype: prec.name().into(),
                    missing: p.inventory.missing,
                    tie: p.inventory.tied_lm_head,
                    lm_head: match p.view.origin("lm_head.weight") {
                        None => "none".into(),
                        Some(WeightOrigin::Checkpoint { .. }) => "checkpoint".into(),
                        Some(WeightOrigin::Tied { key }) => format!("tied to {key}"),
                        Some(WeightOrigin::Missing { init, .. }) => {
                            format!("MISSING -> random init ({init})")
                        }
                    },
                    non_finite_weights: Default::default(),
                }
            })
            .collect();

    let models: Vec<PathModel> = session
        .paths
        .iter()
        .zip(&precisions)
        .map(|(p, &precision)| PathModel {
            name: p.path.name().to_string(),
            source: &p.view as &dyn WeightSource,
            has_lm_head: p.view.has_lm_head(),
            precision,
        })
        .collect();
    let names: Vec<(String, String)> = models
        .iter()
        .map(|m| (m.name.clone(), m.precision.name().to_string()))
        .collect();
    let mut obs = PairObserver::new(&names);
    let pb = RunProgress::new(n, session.prompts.len(), opts.quiet);
    // The check's full forward is the capture's own when both use the chunked form.
    let mut keep = KeepFinal {
        inner: &mut obs,
        prompt: incremental_prompt(&session).filter(|_| opts.gdn_form == GdnForm::Chunked),
        rows: Vec::new(),
    };
    capture::run(
        &session.spec,
        &models,
        &session.prompt_ids(),
        CaptureOptions {
            form: opts.gdn_form,
            local: true,
        },
        &mut keep,
        Some(&pb),
    )?;
    let full_rows = std::mem::take(&mut keep.rows);
    pb.finish();
    mark_random_init(&mut obs.pairs, &session);
    let mut paths_run = paths_run;
    // Paths sharing a layer load it once, so merge what any path saw and
    // give each path the entries for checkpoint keys its own view reads.
    let seen: std::collections::BTreeMap<String, crate::loading::NonFinite> = session
        .paths
        .iter()
        .flat_map(|p| p.view.non_finite())
        .collect();
    for (run, p) in paths_run.iter_mut().zip(&session.paths) {
        let reads: std::collections::HashSet<&str> = p
            .view
            .names()
            .iter()
            .filter_map(|n| match p.view.origin(n) {
                Some(WeightOrigin::Checkpoint { key }) | Some(WeightOrigin::Tied { key }) => {
                    Some(key.as_str())
                }
                _ => None,
            })
            .collect();
        run.non_finite_weights = seen
            .iter()
            .filter(|(k, _)| reads.contains(k.as_str()))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        for (name, nf) in &run.non_finite_weights {
            notes.push(format!(
                "{}: weight {name} holds {} NaN and {} Inf values",
                run.name, nf.nan, nf.inf
            ));
        }
    }

    let (mut verdict, mut summary) = report::summarize(&obs.pairs, &paths_run);
    let f32_bytes = session.paths[0]
        .inventory
        .components
        .get("language_model")
        .map(|c| c.params * 4)
        .unwrap_or(0);
    let run_incremental = opts
        .incremental
        .unwrap_or(f32_bytes <= INCREMENTAL_AUTO_BYTES);
    let mut incremental = Vec::new();
    if run_incremental {
        // Paths reading the same bytes in the same dtype give the same check
        // (every kernel is deterministic): run it once for them, as the capture does.
        let mut done: Vec<((Precision, Vec<String>), crate::report::IncrementalCheck)> = Vec::new();
        for (i, (p, &prec)) in session.paths.iter().zip(&precisions).enumerate() {
            let key = crate::commands::weights_key(&session.spec, &p.view, None, prec);
            let check = match done.iter().find(|(k, _)| *k == key) {
                Some((_, c)) => Some(crate::report::IncrementalCheck {
                    path: p.path.name().into(),
                    ..c.clone()
                }),
                None => {
                    let full = full_rows.get(i).and_then(Option::as_ref);
                    incremental_check(&session, p, prec, full)?
                }
            };
            if let Some(c) = &check {
                done.push((key, c.clone()));
            }
            if let Some(c) = check {
                if c.verdict != crate::parity::Verdict::Pass {
                    verdict = crate::parity::Verdict::Fail;
                    summary.push_str(&format!(
                        "; {}: cached decode departs from the full forward (max abs diff {:.3e})",
                        c.path, c.metrics.max_abs
                    ));
                }
                incremental.push(c);
            }
        }
    } else {
        notes.push(format!(
            "prefill-vs-incremental check skipped: it reads every layer a second time ({:.1} GiB in f32); pass --incremental to force it",
            f32_bytes as f64 / (1u64 << 30) as f64
        ));
    }
    let drafter = match drafter {
        Some((d, drafter, dprec)) => {
            let dopts = crate::commands::drafter::DrafterOptions {
                checkpoint: opts.checkpoint.clone(),
                drafter: d.source.clone(),
                paths: opts.paths.clone(),
                prompts: opts.prompts.clone(),
                max_new_tokens: d.max_new_tokens,
                ddtree_budget: d.ddtree_budget,
                max_tau_gap: d.max_tau_gap,
                dtype: opts.dtype.clone(),
                seed: opts.seed,
                quiet: opts.quiet,
                end_rule: d.end_rule,
                device: opts.device,
            };
            let dr = crate::commands::drafter::run_in(&session, &drafter, dprec, &dopts)?;
            let taus: Vec<String> = dr
                .paths
                .iter()
                .map(|p| format!("{:.2}", p.summary.tau_macro))
                .collect();
            summary.push_str(&format!("; drafter τ {}", taus.join(" → ")));
            if dr.verdict != crate::parity::Verdict::Pass {
                verdict = crate::parity::Verdict::Fail;
                summary.push_str(&format!(" (gap {:.3} > {})", dr.tau_gap, dr.max_tau_gap));
            }
            Some(dr)
        }
        None => None,
    };
    let summary = report::tagged(verdict, &summary);
    let exit_code = if verdict == crate::parity::Verdict::Pass {
        0
    } else {
        1
    };
    let src = &session.ckpt.source;
    Ok(Report {
        schema_version: SCHEMA_VERSION,
        verdict,
        summary,
        exit_code,
        environment: Environment {
            hsparity_version: format!("hsparity {}", env!("CARGO_PKG_VERSION")),
            checkpoint: opts.checkpoint.clone(),
            revision: src.commit.clone().or_else(|| src.revision.clone()),
            config_sha256: file_sha256(&session.ckpt.config_path)?,
            prompts_sha256: prompts_sha256(&session.prompts),
            device: opts.device.to_string(),
            threads: candle_core::utils::get_num_threads(),
            peak_rss_bytes: crate::sysinfo::peak_rss_bytes(),
            gdn_form: match opts.gdn_form {
                GdnForm::Chunked => "chunked (chunk 64, as transformers prefill)".into(),
                GdnForm::Recurrent => "recurrent".into(),
            },
        },
        command: opts.command_line.clone(),
        tap_convention: TAP_CONVENTION.into(),
        taps,
        inventory,
        paths: paths_run,
        prompts: session
            .prompts
            .iter()
            .enumerate()
            .map(|(k, p)| PromptInfo {
                index: k,
                source: p.kind().into(),
                tokens: p.ids.len(),
                preview: p.text().map(preview),
            })
            .collect(),
        pairs: obs.pairs,
        notes,
        drafter,
        incremental,
    })
}

/// Tensor names (text-model relative) that `hidden_states[index]` reads
/// directly: the embedding, layer `index − 1`, plus the final norm for the last.
fn tensors_of_index(spec: &crate::models::qwen3_5::TextModelSpec, index: usize) -> Vec<String> {
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
fn mark_random_init(pairs: &mut [crate::parity::PairReport], session: &Session) {
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

/// Checks a `--name`: a plain folder name (no path separators, not `.`/`..`).
pub fn validate_report_name(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\']) {
        return Err(Error::Input(format!(
            "--name {name:?}: expected a plain folder name (no '/', not '.' or '..')"
        )));
    }
    Ok(())
}

/// Default report folder under `report_dir`: the checkpoint's name plus a UTC
/// time stamp, with `-2`, `-3`, … appended if that folder already exists.
pub fn default_report_dir(report_dir: &Path, checkpoint: &str) -> PathBuf {
    let local = Path::new(checkpoint);
    let base = if local.is_dir() {
        local
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
    } else {
        checkpoint
            .split('@')
            .next()
            .and_then(|id| id.rsplit('/').next())
            .map(str::to_string)
    };
    let base = base
        .filter(|b| validate_report_name(b).is_ok() && !b.starts_with('.'))
        .unwrap_or_else(|| "report".into());
    let stem = format!("{base}-{}", utc_stamp());
    let mut dir = report_dir.join(&stem);
    let mut k = 2;
    while dir.exists() {
        dir = report_dir.join(format!("{stem}-{k}"));
        k += 1;
    }
    dir
}

/// The files `compare` writes into its report folder.
pub const REPORT_FILES: [&str; 3] = ["report.md", "report.json", "parity.svg"];

/// Pre-flight for a report folder: refuses any of `files` that exists
/// without `force`, creates the folder and checks it is writable — before
/// the run.
pub fn prepare_report_dir(dir: &Path, files: &[&str], force: bool) -> Result<()> {
    for f in files {
        crate::output::check_overwrite(&dir.join(f), force)?;
    }
    crate::output::ensure_writable_dir(dir)
}

/// Writes `report.md`, `report.json` and `parity.svg` (the plot `report.md`
/// links) into `dir`, each atomically; refuses to overwrite any of them
/// without `force` ([`Error::Refused`]), checked before anything is written.
pub fn write_report(report: &Report, dir: &std::path::Path, force: bool) -> Result<WrittenReport> {
    let [markdown, json, svg] = REPORT_FILES.map(|f| dir.join(f));
    for f in [&markdown, &json, &svg] {
        crate::output::check_overwrite(f, force)?;
    }
    let svg_text = report::svg::render(report)?;
    crate::output::write_atomic(&json, report::json::render(report)?.as_bytes(), force)?;
    crate::output::write_atomic(&svg, svg_text.as_bytes(), force)?;
    crate::output::write_atomic(
        &markdown,
        report::markdown::render(report).as_bytes(),
        force,
    )?;
    Ok(WrittenReport { markdown, json })
}
