//! The command line: clap definitions, the flag groups the verbs share
//! (target, prompts, run, report folder, drafter evaluation), and the one
//! place each flag is parsed into a typed value ([`LoadingPath`],
//! [`Precision`], [`GdnForm`], [`EndRule`](crate::drafter::eval::EndRule), [`DeviceSpec`]). An unknown
//! value is a clap error (exit 2). [`run`] dispatches to [`crate::commands`]
//! and prints or writes what comes back; `main.rs` only calls it. The
//! engine-capture flags (`import`, `drafter --features`) are in `engines`.

mod engines;

use std::path::PathBuf;

use clap::builder::RangedU64ValueParser;
use clap::{Args, Parser, Subcommand};

use crate::commands::{compare, diff, drafter, dump, features, inventory, prompts, triage};
use crate::device::DeviceSpec;
use crate::error::{Error, Result};
use crate::loading::LoadingPath;
use crate::models::GdnForm;
use crate::output::{ReportFolder, ReportSettings};
use crate::parity::dumps::DiffSettings;
use crate::parity::noise::FloorPlan;
use crate::precision::Precision;
use crate::prompts::DefaultPrompts;
use crate::report::{self, Document};
use crate::session::Target;
use crate::triage::harness as triage_harness;
use crate::triage::TriageSettings;

mod drafter_args;
mod help;
mod prompt_args;
mod values;
use drafter_args::{
    BudgetArgs, DrafterEvalArgs, EndRuleArgs, EngineMetricsArgs, ReplayArgs, TrajectoryArgs,
};
use prompt_args::PromptArgs;
use values::{dir_or_id, DtypeArg};

/// `hsparity`.
#[derive(Parser)]
#[command(
    name = "hsparity",
    version,
    about = "Do two ways of loading the same checkpoint produce the same hidden states?",
    after_help = help::after_help()
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// What each loading path (Auto class) would load from the checkpoint, header-only.
    Inventory(InventoryArgs),
    /// Run the same prompts through loading paths in lock-step; per-layer parity.
    #[command(after_help = help::after_help())]
    Compare(CompareArgs),
    /// Compare two dumps (hsparity.dump.v1, from hsparity, tools/dump_hidden_states.py or `import`): where
    /// they part and why; or two checkpoint directories' tensors (equal, dtype-rounded, off by or scaled by a
    /// constant, transposed, rows permuted, one side only).
    #[command(after_help = help::diff_after_help())]
    Diff(DiffArgs),
    /// DFlash drafter acceptance length τ (and DDTree-N) on each loading path.
    Drafter(DrafterArgs),
    /// Rank the usual suspects of a drafter regression by what they cost in τ.
    Triage(TriageArgs),
    /// Write one loading path's hidden states to safetensors (hsparity.dump.v1, docs/dump-format.md).
    Dump(DumpArgs),
    /// What a run would feed the model: each prompt's text after the chat template, and its token ids.
    Prompts(PromptsArgs),
    /// Convert an engine's hidden states (SpecForge, vLLM, SGLang) to a dump, layer indices mapped to transformers'.
    Import(engines::ImportArgs),
}

/// `--observed-tau`: a finite τ, 0..=1024 (NaN, ±Inf and negatives refused).
fn observed_tau(s: &str) -> std::result::Result<f64, String> {
    drafter_args::finite_in(s, 0.0, 1024.0)
}

/// Loading paths, comma-separated; an empty list (`--paths ""`) and a path
/// named twice are refused.
fn distinct(paths: Vec<LoadingPath>) -> Result<Vec<LoadingPath>> {
    if paths.is_empty() {
        return Err(Error::Input(
            "--paths is empty: name at least one loading path (causal-lm, vlm, image-text-to-text)"
                .into(),
        ));
    }
    for (i, p) in paths.iter().enumerate() {
        if paths[..i].contains(p) {
            return Err(Error::Input(format!("--paths names {p} twice")));
        }
    }
    Ok(paths)
}

/// The target of a run: checkpoint and prompts.
#[derive(Args)]
struct TargetArgs {
    /// Checkpoint directory, or Hub id org/name[@rev] in the local HF cache.
    #[arg(value_parser = dir_or_id())]
    checkpoint: String,
    #[command(flatten)]
    prompts: PromptArgs,
}

/// How the verbs that run the model run it.
#[derive(Args)]
struct RunArgs {
    /// Seed for tensors a loading path would initialise randomly (MISSING).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Compute device: cpu, or cuda / cuda:N (build with --features cuda).
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

impl TargetArgs {
    /// The target, every path computing in `dtype` (`None`: its own).
    fn target(&self, run: &RunArgs, dtype: Option<Precision>) -> Target {
        Target {
            checkpoint: self.checkpoint.clone(),
            prompts: self.prompts.options(),
            seed: run.seed,
            device: run.device,
            dtype,
        }
    }
}

/// Where `compare`, `diff` and `triage` write report.md / report.json.
#[derive(Args)]
struct ReportArgs {
    /// Folder for reports (files go to <DIR>/<NAME>/).
    #[arg(long, default_value = "reports")]
    report_dir: PathBuf,
    /// Report name (default: checkpoint name + UTC time stamp).
    #[arg(long)]
    name: Option<String>,
    /// Do not write report files.
    #[arg(long)]
    no_report: bool,
    /// Overwrite existing report files.
    #[arg(long)]
    force: bool,
}

impl ReportArgs {
    /// The checked report folder of a `D` report named after `base`.
    fn prepare<D: Document>(&self, base: &str) -> Result<Option<ReportFolder>> {
        ReportSettings {
            dir: self.report_dir.clone(),
            name: self.name.clone(),
            enabled: !self.no_report,
            force: self.force,
        }
        .prepare(base, D::FILES)
    }
}

#[derive(Args)]
struct InventoryArgs {
    /// Checkpoint directory, or Hub id org/name[@rev] in the local HF cache.
    #[arg(value_parser = dir_or_id())]
    checkpoint: String,
    /// Loading paths, comma-separated (default: every path that applies).
    #[arg(long, value_enum, value_delimiter = ',')]
    paths: Option<Vec<LoadingPath>>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct CompareArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Loading paths to compare, comma-separated; the first is the reference.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "causal-lm,vlm"
    )]
    paths: Vec<LoadingPath>,
    /// Compute dtype: auto (what each loading path would pick), f32, bf16 or f16.
    #[arg(long, value_enum, default_value = "auto")]
    dtype: DtypeArg,
    /// Drafter tap layers to mark (decoder-layer indices; tap L = hidden_states[L+1]).
    #[arg(long, value_delimiter = ',')]
    taps: Vec<usize>,
    /// Gated DeltaNet form.
    #[arg(long, value_enum, default_value = "chunked")]
    gdn_form: GdnForm,
    #[command(flatten)]
    report: ReportArgs,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Also evaluate this DFlash drafter (directory or Hub id) on every path.
    #[arg(value_parser = dir_or_id(), long)]
    drafter: Option<String>,
    /// Force the prefill-vs-incremental check (by default it runs on any model where this CPU has AVX-512F, whose 8 single-token steps then read each layer's weights once; elsewhere, or with --gdn-form recurrent, for models up to 4 GiB of f32 weights).
    #[arg(long, conflicts_with = "no_incremental")]
    incremental: bool,
    /// Skip the prefill-vs-incremental check.
    #[arg(long)]
    no_incremental: bool,
    /// Skip the noise floor of a bf16/f16 run: its noise shadow, one more forward of the reference path, whose drift sets the band a difference is numerics noise within (docs/noise-floor.md).
    #[arg(long)]
    no_noise_floor: bool,
    #[command(flatten)]
    eval: DrafterEvalArgs,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct DiffArgs {
    /// Reference dump (safetensors), or a checkpoint directory.
    a: PathBuf,
    /// Compared dump (safetensors), or a checkpoint directory (with a directory as A).
    b: PathBuf,
    /// Compare a's hidden_states[i] with b's hidden_states[i + OFFSET] (the other tap convention: ±1), -1024..=1024.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true, value_parser = clap::value_parser!(i64).range(-1024..=1024))]
    tap_offset: i64,
    /// For every hidden_states index of b, find the index of a it matches best (cosine) and report the offset.
    #[arg(long)]
    align: bool,
    /// b's last hidden state is the pre-norm output of the last decoder layer (a decoder-layer hook, vLLM's
    /// aux state N): compare it with a's last_layer_output instead of the final-normed hidden_states[N].
    #[arg(long)]
    b_last_pre_norm: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    report: ReportArgs,
}

#[derive(Args)]
struct DrafterArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// DFlash v1 drafter: directory (config.json + safetensors) or Hub id.
    #[arg(value_parser = dir_or_id(), long)]
    drafter: String,
    /// Loading paths, comma-separated; the first is the reference of cross runs.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "causal-lm,vlm"
    )]
    paths: Vec<LoadingPath>,
    #[command(flatten)]
    eval: DrafterEvalArgs,
    /// Target compute dtype: auto (what each loading path would pick), f32, bf16 or f16.
    #[arg(long, value_enum, default_value = "auto")]
    dtype: DtypeArg,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    features: engines::FeaturesArgs,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct TriageArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// DFlash v1 drafter: directory or Hub id.
    #[arg(value_parser = dir_or_id(), long)]
    drafter: String,
    #[command(flatten)]
    replay: ReplayArgs,
    #[command(flatten)]
    end: EndRuleArgs,
    #[command(flatten)]
    budget: BudgetArgs,
    #[command(flatten)]
    trajectories: TrajectoryArgs,
    /// τ seen in the regressed eval: marks the variants consistent with it (a finite number, 0..=1024).
    #[arg(long, value_parser = observed_tau)]
    observed_tau: Option<f64>,
    #[command(flatten)]
    engine: EngineMetricsArgs,
    /// Skip the noise floor of a bf16/f16 baseline's taps (one more forward over its tokens; docs/noise-floor.md).
    #[arg(long)]
    no_noise_floor: bool,
    /// k of the "positions shifted by +k" variant, 1..=65536.
    #[arg(long, default_value_t = 16, value_parser = RangedU64ValueParser::<usize>::new().range(1..=65_536))]
    position_shift: usize,
    /// Position K of gdn-state-reset, 1..=65536 and inside every prompt (default: the middle of each prompt).
    #[arg(long, value_name = "K", value_parser = RangedU64ValueParser::<usize>::new().range(1..=65_536))]
    reset_at: Option<usize>,
    /// P pad tokens of left-pad-unmasked, 0..=65536 (0: not run).
    #[arg(long, value_name = "P", default_value_t = triage_harness::DEFAULT_LEFT_PAD,
          value_parser = RangedU64ValueParser::<usize>::new().range(0..=65_536))]
    left_pad: usize,
    #[command(flatten)]
    report: ReportArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct DumpArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Loading path to run.
    #[arg(long, value_enum)]
    path: LoadingPath,
    /// Output file (.safetensors).
    #[arg(long)]
    out: PathBuf,
    /// Leave out the logits.
    #[arg(long)]
    no_logits: bool,
    /// Skip the noise floor of a bf16/f16 run: its noise shadow, one more forward of the reference path, whose drift sets the band a difference is numerics noise within (docs/noise-floor.md).
    #[arg(long)]
    no_noise_floor: bool,
    /// Compute dtype: auto (what the loading path would pick), f32, bf16 or f16.
    #[arg(long, value_enum, default_value = "auto")]
    dtype: DtypeArg,
    /// Gated DeltaNet form.
    #[arg(long, value_enum, default_value = "chunked")]
    gdn_form: GdnForm,
    /// Overwrite an existing output file.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct PromptsArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// The command line as typed, quoted for a shell.
fn command_line() -> String {
    std::env::args_os()
        .map(|a| crate::prompts::shell_quote(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Prints `doc` (JSON or the terminal rendering) and writes its report
/// folder; returns its exit code.
fn finish<D: Document>(doc: &D, json: bool, folder: Option<ReportFolder>) -> Result<u8> {
    let text = report::json::render(doc)?;
    if json {
        print!("{text}");
    } else {
        print!("{}", doc.terminal(crate::width::Width::detect()));
    }
    if let Some(f) = folder {
        let mut files = vec![("report.json", text)];
        files.extend(doc.files()?);
        let md = f.dir().join("report.md");
        let others: Vec<&str> = files
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| *n != "report.md")
            .collect();
        f.write(&files)?;
        crate::progress::stderr_line!("report: {} (and {})", md.display(), others.join(", "));
    }
    Ok(doc.exit_code())
}

/// `dump`: writes the file, then exits 1 when the path's weights hold a
/// finding (MISSING or NaN/Inf, as `compare` would fail them).
fn run_dump(a: DumpArgs) -> Result<u8> {
    let opts = dump::DumpOptions {
        logits: !a.no_logits,
        form: a.gdn_form,
        noise_floor: FloorPlan::skipping(a.no_noise_floor),
        quiet: a.run.quiet,
    };
    let target = a.target.target(&a.run, a.dtype.0);
    let (d, findings) = dump::run_to_file(&target, a.path, &opts, &a.out, a.force)?;
    crate::progress::stderr_line!(
        "wrote {} ({} prompt{}, {} hidden states each)",
        a.out.display(),
        d.prompts.len(),
        if d.prompts.len() == 1 { "" } else { "s" },
        d.prompts
            .first()
            .map(|p| p.hidden_states.len())
            .unwrap_or(0)
    );
    if !findings.is_empty() {
        crate::progress::stderr_line!("FAIL: {}", findings.join("; "));
    }
    Ok(u8::from(!findings.is_empty()))
}

/// `compare`: the options resolved from the flags, the report folder claimed
/// before the (possibly long) run.
fn run_compare(a: CompareArgs) -> Result<u8> {
    let drafter = a.drafter.map(|source| a.eval.settings(source));
    let opts = compare::CompareOptions {
        target: match &drafter {
            Some(d) => drafting(a.target.target(&a.run, a.dtype.0), d.trajectories.is_some()),
            None => a.target.target(&a.run, a.dtype.0),
        },
        paths: distinct(a.paths)?,
        taps: a.taps,
        gdn_form: a.gdn_form,
        noise_floor: FloorPlan::skipping(a.no_noise_floor),
        incremental: match (a.incremental, a.no_incremental) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
        drafter,
        quiet: a.run.quiet,
        command_line: command_line(),
    };
    let folder = a
        .report
        .prepare::<report::CompareReport>(&a.target.checkpoint)?;
    finish(&compare::run(&opts)?, a.json, folder)
}

/// `drafter`, or `drafter --features FILE`.
fn run_drafter(a: DrafterArgs) -> Result<u8> {
    let settings = a.eval.settings(a.drafter);
    // `--features` measures τ on the file's prompts.
    let own_prompts = settings.trajectories.is_some() || a.features.features.is_some();
    let opts = drafter::DrafterOptions {
        target: drafting(a.target.target(&a.run, a.dtype.0), own_prompts),
        paths: distinct(a.paths)?,
        drafter: settings,
        quiet: a.run.quiet,
        command_line: command_line(),
    };
    match a.features.features {
        Some(file) => {
            let (format, read) = a.features.read.options();
            let rep = features::run(&features::FeaturesOptions {
                drafter: opts,
                features: file,
                format,
                read,
            })?;
            finish(&rep, a.json, None)
        }
        None if a.features.read.any() => Err(Error::Input(
            "--format, --target-layer-ids, --layer-ids, --keep-padding and --rank say how to read \
             --features FILE; give --features"
                .into(),
        )),
        None => finish(&drafter::run(&opts)?, a.json, None),
    }
}

/// `target` of a drafter evaluation: without prompt options it runs the
/// drafter default ([`DefaultPrompts::Drafter`]), unless `own_prompts` (the
/// supplied trajectories' or features' prompts run).
fn drafting(mut target: Target, own_prompts: bool) -> Target {
    if !own_prompts {
        target.prompts.default = DefaultPrompts::Drafter;
    }
    target
}

/// `triage`: the report folder claimed before the run.
fn run_triage(a: TriageArgs) -> Result<u8> {
    let folder = a
        .report
        .prepare::<report::TriageReport>(&a.target.checkpoint)?;
    let replay = a.replay.replay(a.end.end_rule);
    let rep = triage::run(&triage::TriageOptions {
        target: drafting(
            a.target.target(&a.run, None),
            a.trajectories.trajectories.is_some(),
        ),
        settings: TriageSettings {
            drafter: a.drafter,
            replay,
            observed_tau: a.observed_tau,
            engine_metrics: a.engine.engine_metrics,
            position_shift: a.position_shift,
            seed: a.run.seed,
            quiet: a.run.quiet,
            memory_budget: a.budget.memory_budget,
            harness: triage_harness::HarnessOptions::new(a.reset_at, a.left_pad),
            trajectories: a.trajectories.given(&a.replay),
            noise_floor: FloorPlan::skipping(a.no_noise_floor),
        },
        command_line: command_line(),
    })?;
    finish(&rep, a.json, folder)
}

/// Runs the parsed command line; returns the exit code (0 or 1).
///
/// Errors: every bad input (the binary prints the message and exits 2).
pub fn run(cli: Cli) -> Result<u8> {
    match cli.command {
        Command::Inventory(a) => {
            let paths = a.paths.map(distinct).transpose()?.unwrap_or_default();
            let rep = inventory::run(&a.checkpoint, &paths, command_line())?;
            finish(&rep, a.json, None)
        }
        Command::Compare(a) => run_compare(a),
        Command::Diff(a) if a.a.is_dir() || a.b.is_dir() => {
            if !(a.a.is_dir() && a.b.is_dir()) {
                return Err(Error::Input(format!(
                    "diff compares two dumps (files) or two checkpoints (directories), not one of each: {} is {}, \
                     {} {}",
                    a.a.display(),
                    path_kind(&a.a),
                    a.b.display(),
                    path_kind(&a.b)
                )));
            }
            let dump_only = [
                (a.align, "--align"),
                (a.tap_offset != 0, "--tap-offset"),
                (a.b_last_pre_norm, "--b-last-pre-norm"),
            ];
            if let Some((_, flag)) = dump_only.iter().find(|(set, _)| *set) {
                return Err(Error::Input(format!(
                    "{flag} compares dumps' hidden states; {} and {} are checkpoints, whose tensors diff compares by name",
                    a.a.display(),
                    a.b.display()
                )));
            }
            let folder = a.report.prepare::<report::weights::WeightsReport>("diff")?;
            let rep = diff::run_weights(
                &a.a.to_string_lossy(),
                &a.b.to_string_lossy(),
                command_line(),
            )?;
            finish(&rep, a.json, folder)
        }
        Command::Diff(a) => {
            let folder = a.report.prepare::<report::DiffReport>("diff")?;
            let rep = diff::run(&diff::DiffOptions {
                a: a.a,
                b: a.b,
                settings: DiffSettings {
                    tap_offset: a.tap_offset,
                    align: a.align,
                    b_last_pre_norm: a.b_last_pre_norm,
                },
                command_line: command_line(),
            })?;
            finish(&rep, a.json, folder)
        }
        Command::Drafter(a) => run_drafter(a),
        Command::Triage(a) => run_triage(a),
        Command::Dump(a) => run_dump(a),
        Command::Prompts(a) => {
            let rep = prompts::run(&prompts::PromptsOptions {
                checkpoint: a.target.checkpoint.clone(),
                prompts: a.target.prompts.options(),
                command_line: command_line(),
            })?;
            finish(&rep, a.json, None)
        }
        Command::Import(a) => engines::run_import(a),
    }
}

/// `a directory`, `a file`, `missing` (for `diff`'s message on mixed arguments).
fn path_kind(p: &std::path::Path) -> &'static str {
    match std::fs::metadata(p) {
        Ok(m) => crate::input::kind_of(&m).unwrap_or("a file"),
        Err(_) => "missing",
    }
}
