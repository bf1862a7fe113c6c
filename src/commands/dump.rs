//! `hsparity dump`: one loading path's hidden states in the dump format
//! (`hsparity.dump.v1`, [`crate::dump`]).

use std::path::Path;

use candle_core::Tensor;

use crate::capture::{self, CaptureOptions, HiddenKind, Observer, PathModel};
use crate::dump::{Dump, DumpPrompt, FORMAT};
use crate::error::Result;
use crate::loading::{LoadingPath, NoiseShadow};
use crate::models::moe::Routing;
use crate::models::GdnForm;
use crate::parity::noise::{FloorPlan, NoiseFloor};
use crate::precision::Precision;
use crate::progress::RunProgress;
use crate::session::{Session, Target};

/// Settings of a dump run.
#[derive(Debug, Clone, Copy, Default)]
pub struct DumpOptions {
    /// Record logits (paths with an LM head).
    pub logits: bool,
    /// Delta-rule form.
    pub form: GdnForm,
    /// Measure the noise floor of a half-precision run (`--no-noise-floor` skips it).
    pub noise_floor: FloorPlan,
    /// Hide progress.
    pub quiet: bool,
}

/// Collects every tensor of path 0 into a [`Dump`] (the capture emits logits
/// only when they were asked for).
struct Collect {
    dump: Dump,
    /// The run against its noise shadow (path 1), when it runs one.
    floor: Option<NoiseFloor>,
}

impl Observer for Collect {
    fn hidden_states(
        &mut self,
        index: usize,
        _: HiddenKind,
        states: &[Vec<Tensor>],
        _: &[Option<Vec<Tensor>>],
    ) -> Result<()> {
        for (p, h) in self.dump.prompts.iter_mut().zip(&states[0]) {
            p.hidden_states.insert(index, h.clone());
        }
        if let (Some(f), Some(shadow)) = (&mut self.floor, states.get(1)) {
            f.measure(index, &states[0], shadow)?;
        }
        Ok(())
    }
    fn last_layer_output(&mut self, states: &[Vec<Tensor>]) -> Result<()> {
        for (p, h) in self.dump.prompts.iter_mut().zip(&states[0]) {
            p.last_layer_output = Some(h.clone());
        }
        if let (Some(f), Some(shadow)) = (&mut self.floor, states.get(1)) {
            f.measure_last(&states[0], shadow)?;
        }
        Ok(())
    }
    fn logits(&mut self, logits: &[Option<Vec<Tensor>>]) -> Result<()> {
        if let Some(l) = &logits[0] {
            for (p, x) in self.dump.prompts.iter_mut().zip(l) {
                p.logits = Some(x.clone());
            }
        }
        Ok(())
    }
    fn routing(
        &mut self,
        layer: usize,
        routing: &[Vec<Routing>],
        _: &[Option<Vec<Routing>>],
    ) -> Result<()> {
        for (p, r) in self.dump.prompts.iter_mut().zip(&routing[0]) {
            p.routing.insert(layer, r.clone());
        }
        if let (Some(f), Some(shadow)) = (&mut self.floor, routing.get(1)) {
            f.measure_router(layer, &routing[0], shadow)?;
        }
        Ok(())
    }
}

/// Runs `path` over the prompts and returns the dump (not yet written).
///
/// Errors: as [`Session::open`] and the capture.
pub fn run(target: &Target, path: LoadingPath, opts: &DumpOptions) -> Result<Dump> {
    Ok(run_checked(target, path, opts)?.0)
}

/// As [`run`], with the path's weight findings (MISSING or NaN/Inf weights,
/// [`Session::findings`]): the dump holds what the path computes, and the
/// findings make the run exit 1, as they make `compare` fail.
///
/// Errors: as [`run`].
pub fn run_checked(
    target: &Target,
    path: LoadingPath,
    opts: &DumpOptions,
) -> Result<(Dump, Vec<String>)> {
    let session = Session::open(target, &[path])?;
    let p = &session.paths[0];
    let precision = p.compute;
    let (logits, form, quiet) = (opts.logits, opts.form, opts.quiet);
    let mut obs = Collect {
        dump: Dump::default(),
        floor: None,
    };
    obs.dump.prompts = session
        .prompts
        .iter()
        .map(|pr| DumpPrompt {
            input_ids: Some(pr.ids.iter().map(|&i| i as i64).collect()),
            ..Default::default()
        })
        .collect();
    let meta = &mut obs.dump.metadata;
    meta.insert("format".into(), FORMAT.into());
    meta.insert("checkpoint".into(), target.checkpoint.clone());
    meta.insert("loading_path".into(), path.name().into());
    meta.insert("class".into(), p.inventory.class.clone());
    meta.insert("dtype".into(), precision.to_string());
    meta.insert("num_layers".into(), session.spec.num_layers().to_string());
    if let Some(moe) = &session.spec.moe {
        // What a reader checks the router choices against.
        meta.insert("num_experts".into(), moe.config.num_experts.to_string());
        meta.insert("top_k".into(), moe.config.num_experts_per_tok.to_string());
    }
    meta.insert(
        "tool_version".into(),
        format!("hsparity {}", env!("CARGO_PKG_VERSION")),
    );
    let pb = RunProgress::new(session.spec.num_layers(), session.prompts.len(), quiet);
    let shadow = NoiseShadow(&p.view);
    let mut models = vec![PathModel {
        name: path.name().into(),
        source: &p.view,
        has_lm_head: p.view.has_lm_head() && logits,
        precision,
        noise_shadow: false,
    }];
    if precision != Precision::F32 && opts.noise_floor == FloorPlan::Measure {
        models.push(PathModel {
            name: format!("{} (noise shadow)", path.name()),
            source: &shadow,
            has_lm_head: false,
            precision,
            noise_shadow: true,
        });
        obs.floor = Some(NoiseFloor::new(precision, Vec::new()));
    }
    capture::run(
        &session.spec,
        &models,
        &session.prompt_ids(),
        CaptureOptions {
            form,
            local: false,
            cached_decode: None,
        },
        &mut obs,
        &pb,
    )?;
    pb.finish();
    // Which kernels summed the products: a bf16 dump made with the AMX
    // kernel agrees with another machine's to the noise floor, not bitwise.
    obs.dump
        .metadata
        .insert("kernels".into(), crate::kernels::ran().join(","));
    if let Some(floor) = obs.floor.take().filter(|f| !f.rows.is_empty()) {
        obs.dump
            .metadata
            .insert("noise_floor".into(), floor.to_metadata());
    }
    let mut findings = session.findings();
    let weights = !findings.is_empty();
    findings.extend(non_finite(&obs.dump, precision, weights)?);
    Ok((obs.dump, findings))
}

/// The first hidden state holding NaN or ±Inf, as a finding: the dump is
/// written as computed, and the run exits 1. `weights`: the path's weights
/// are a finding already (MISSING, NaN/Inf), which the states inherit.
///
/// Errors: a tensor failure.
fn non_finite(
    dump: &Dump,
    precision: crate::precision::Precision,
    weights: bool,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for index in dump.indices() {
        let nf = dump.non_finite(index)?;
        if nf.total() > 0 {
            let why = match weights {
                true => "from the weights above".to_string(),
                false => format!("the {precision} run overflows from there on"),
            };
            out.push(format!(
                "hidden_states[{index}] holds {} NaN and {} Inf values (prompt{} {}): {why} (the dump is written as computed)",
                nf.nan,
                nf.inf,
                if nf.prompts.len() == 1 { "" } else { "s" },
                crate::parity::verdict::runs_text(&crate::parity::verdict::runs(&nf.prompts), "p")
            ));
            break;
        }
    }
    Ok(out)
}

/// Runs and writes to `out` (atomic; refuses to overwrite without `force`,
/// checked before the run); returns the dump and the weight findings.
///
/// Errors: as [`run`] and [`Dump::write`].
pub fn run_to_file(
    target: &Target,
    path: LoadingPath,
    opts: &DumpOptions,
    out: &Path,
    force: bool,
) -> Result<(Dump, Vec<String>)> {
    crate::output::check_overwrite(out, force)?;
    let (dump, findings) = run_checked(target, path, opts)?;
    dump.write(out, force)?;
    Ok((dump, findings))
}
