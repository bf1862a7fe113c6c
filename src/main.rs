//! `hsparity` command line: clap definitions that call into the library.
//! Exit codes: 0 parity holds, 1 a tolerance is exceeded or a path has missing
//! tensors, 2 bad input or usage.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use hsparity::commands::{self, compare, diff, drafter, dump, inventory, triage};
use hsparity::device::DeviceSpec;
use hsparity::error::Result;
use hsparity::models::precision::Precision;
use hsparity::models::qwen3_5::GdnForm;
use hsparity::prompts::{parse_ids, PromptOptions};
use hsparity::report;

#[derive(Parser)]
#[command(
    name = "hsparity",
    version,
    about = "Do two ways of loading the same checkpoint produce the same hidden states?",
    after_help = "Loading paths: causal-lm (AutoModelForCausalLM), vlm (AutoModel), image-text-to-text (AutoModelForImageTextToText).\nExit codes: 0 parity holds and inventories are clean; 1 a tolerance is exceeded or a path has missing (randomly initialised) or non-finite tensors; 2 bad input or usage."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// What each loading path (Auto class) would load from the checkpoint, header-only.
    Inventory {
        /// Checkpoint directory, or Hub id org/name[@rev] in the local HF cache.
        checkpoint: String,
        /// Loading paths, comma-separated, from causal-lm, vlm, image-text-to-text (default: every path that applies).
        #[arg(long)]
        paths: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run the same prompts through loading paths in lock-step; per-layer parity.
    Compare(CompareArgs),
    /// Compare two dumps (hsparity.dump.v1, from hsparity or tools/dump_hidden_states.py).
    Diff {
        /// Reference dump (safetensors).
        a: PathBuf,
        /// Compared dump (safetensors).
        b: PathBuf,
        /// Compare a's hidden_states[i] with b's hidden_states[i + OFFSET] (the other tap convention: ±1).
        #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
        tap_offset: i64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        report: ReportArgs,
    },
    /// DFlash drafter acceptance length τ (and DDTree-N) on each loading path.
    Drafter(DrafterArgs),
    /// Rank the usual suspects of a drafter regression by what they cost in τ.
    Triage(TriageArgs),
    /// Write one loading path's hidden states to safetensors (hsparity.dump.v1, see README).
    Dump(DumpArgs),
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

/// What `diff` and `triage` write into their report folder.
const REPORT_MD_JSON: [&str; 2] = ["report.md", "report.json"];

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
    /// The report folder, checked before the run (none of `files` overwritten
    /// without --force, writable), or `None` with --no-report. `base` names
    /// the default folder.
    fn prepare(&self, base: &str, files: &[&str]) -> Result<Option<PathBuf>> {
        if self.no_report {
            return Ok(None);
        }
        let dir = match &self.name {
            Some(n) => {
                compare::validate_report_name(n)?;
                self.report_dir.join(n)
            }
            None => compare::default_report_dir(&self.report_dir, base),
        };
        compare::prepare_report_dir(&dir, files, self.force)?;
        Ok(Some(dir))
    }

    /// Writes `report.json` and `report.md` atomically into `dir`.
    fn write(&self, dir: &std::path::Path, json: &str, md: &str) -> Result<()> {
        hsparity::output::write_atomic(&dir.join("report.json"), json.as_bytes(), self.force)?;
        hsparity::output::write_atomic(&dir.join("report.md"), md.as_bytes(), self.force)?;
        eprintln!(
            "report: {} (and report.json)",
            dir.join("report.md").display()
        );
        Ok(())
    }
}

#[derive(Args)]
struct PromptArgs {
    /// Prompt text (needs tokenizer.json); repeatable.
    #[arg(long = "prompt")]
    prompt: Vec<String>,
    /// Prompt as token ids, e.g. 1,2,3; repeatable (use --prompt-ids=... for a value starting with '-').
    #[arg(long = "prompt-ids")]
    prompt_ids: Vec<String>,
    /// JSONL file: one {"text": ...} or {"input_ids": [...]} per line.
    #[arg(long)]
    prompts: Option<PathBuf>,
}

impl PromptArgs {
    fn options(&self) -> Result<PromptOptions> {
        Ok(PromptOptions {
            texts: self.prompt.clone(),
            ids: self
                .prompt_ids
                .iter()
                .map(|s| parse_ids(s))
                .collect::<Result<_>>()?,
            file: self.prompts.clone(),
        })
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Form {
    /// Chunked delta rule (chunk 64): what transformers runs for a prefill.
    Chunked,
    /// Token-by-token recurrence.
    Recurrent,
}

impl From<Form> for GdnForm {
    fn from(f: Form) -> Self {
        match f {
            Form::Chunked => GdnForm::Chunked,
            Form::Recurrent => GdnForm::Recurrent,
        }
    }
}

#[derive(Args)]
struct CompareArgs {
    /// Checkpoint directory, or Hub id org/name[@rev] in the local HF cache.
    checkpoint: String,
    /// Loading paths to compare, comma-separated, from causal-lm, vlm, image-text-to-text; the first is the reference.
    #[arg(long, default_value = "causal-lm,vlm")]
    paths: String,
    #[command(flatten)]
    prompts: PromptArgs,
    /// Compute dtype: auto (what each loading path would pick), f32, bf16 or f16.
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Drafter tap layers to mark (decoder-layer indices; tap L = hidden_states[L+1]).
    #[arg(long, value_delimiter = ',')]
    taps: Vec<usize>,
    /// Gated DeltaNet form.
    #[arg(long, value_enum, default_value = "chunked")]
    gdn_form: Form,
    #[command(flatten)]
    report: ReportArgs,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Also evaluate this DFlash drafter (directory or Hub id) on every path.
    #[arg(long)]
    drafter: Option<String>,
    /// Force the prefill-vs-incremental check (by default it runs for models up to 4 GiB of f32 weights; it reads every layer a second time).
    #[arg(long, conflicts_with = "no_incremental")]
    incremental: bool,
    /// Skip the prefill-vs-incremental check.
    #[arg(long)]
    no_incremental: bool,
    #[command(flatten)]
    drafter_opts: DrafterEvalArgs,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct DrafterEvalArgs {
    /// Greedy tokens generated (and replayed) per prompt.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// DDTree node budget (DDTree-N).
    #[arg(long, default_value_t = 8)]
    ddtree_budget: usize,
    /// Exit 1 when τ on two paths differs by more than this.
    #[arg(long, default_value_t = 0.05)]
    max_tau_gap: f64,
    /// End-of-generation rule replayed: main (z-lab GitHub main) or wheel (the dflash 0.1.0 PyPI wheel).
    #[arg(long, value_enum, default_value = "main")]
    end_rule: RuleArg,
}

#[derive(Clone, Copy, ValueEnum)]
enum RuleArg {
    /// z-lab GitHub main: full blocks every round, record a+1.
    Main,
    /// dflash 0.1.0 wheel: last blocks shrink, recorded lengths sum to max_new_tokens - 1.
    Wheel,
}

impl From<RuleArg> for hsparity::drafter_eval::EndRule {
    fn from(r: RuleArg) -> Self {
        match r {
            RuleArg::Main => Self::GithubMain,
            RuleArg::Wheel => Self::Wheel,
        }
    }
}

#[derive(Args)]
struct DrafterArgs {
    /// Target checkpoint directory, or Hub id org/name[@rev] in the local HF cache.
    checkpoint: String,
    /// DFlash v1 drafter: directory (config.json + safetensors) or Hub id.
    #[arg(long)]
    drafter: String,
    /// Loading paths, comma-separated; the first is the reference of cross runs.
    #[arg(long, default_value = "causal-lm,vlm")]
    paths: String,
    #[command(flatten)]
    prompts: PromptArgs,
    #[command(flatten)]
    eval: DrafterEvalArgs,
    /// Target compute dtype: auto (what each loading path would pick), f32, bf16 or f16.
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct TriageArgs {
    /// Target checkpoint directory, or Hub id org/name[@rev] in the local HF cache.
    checkpoint: String,
    /// DFlash v1 drafter: directory or Hub id.
    #[arg(long)]
    drafter: String,
    #[command(flatten)]
    prompts: PromptArgs,
    /// Greedy tokens generated (and replayed) per prompt.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// DDTree node budget.
    #[arg(long, default_value_t = 8)]
    ddtree_budget: usize,
    /// τ seen in the regressed eval: marks the variants consistent with it.
    #[arg(long)]
    observed_tau: Option<f64>,
    /// k of the "positions shifted by +k" variant.
    #[arg(long, default_value_t = 16)]
    position_shift: usize,
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
    /// Checkpoint directory, or Hub id org/name[@rev] in the local HF cache.
    checkpoint: String,
    /// Loading path to run: causal-lm, vlm or image-text-to-text.
    #[arg(long)]
    path: String,
    #[command(flatten)]
    prompts: PromptArgs,
    /// Output file (.safetensors).
    #[arg(long)]
    out: PathBuf,
    /// Leave out the logits.
    #[arg(long)]
    no_logits: bool,
    /// Compute dtype: auto (what the loading path would pick), f32, bf16 or f16.
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Gated DeltaNet form.
    #[arg(long, value_enum, default_value = "chunked")]
    gdn_form: Form,
    /// Overwrite an existing output file.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    run: RunArgs,
}

fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"$`\\".contains(c)) {
                format!("'{}'", a.replace('\'', r"'\''"))
            } else {
                a
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn run(cli: Cli) -> Result<u8> {
    match cli.command {
        Command::Inventory {
            checkpoint,
            paths,
            json,
        } => {
            let paths = paths
                .as_deref()
                .map(commands::parse_paths)
                .transpose()?
                .unwrap_or_default();
            let inv = inventory::run(&checkpoint, &paths)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&inv).expect("inventory serialises")
                );
            } else {
                print!("{}", report::inventory::render_inventory_table(&inv));
            }
            Ok(u8::from(inv.paths.iter().any(|p| p.missing > 0)))
        }
        Command::Compare(a) => {
            let opts = compare::CompareOptions {
                checkpoint: a.checkpoint.clone(),
                paths: commands::parse_paths(&a.paths)?,
                prompts: a.prompts.options()?,
                dtype: a.dtype.clone(),
                taps: a.taps.clone(),
                gdn_form: a.gdn_form.into(),
                seed: a.run.seed,
                quiet: a.run.quiet,
                device: a.run.device,
                command_line: command_line(),
                incremental: if a.incremental {
                    Some(true)
                } else if a.no_incremental {
                    Some(false)
                } else {
                    None
                },
                drafter: a.drafter.clone().map(|source| compare::DrafterSettings {
                    source,
                    max_new_tokens: a.drafter_opts.max_new_tokens,
                    ddtree_budget: a.drafter_opts.ddtree_budget,
                    max_tau_gap: a.drafter_opts.max_tau_gap,
                    end_rule: a.drafter_opts.end_rule.into(),
                }),
            };
            // Refuse or fail before the (possibly long) run, not after.
            let dir = a.report.prepare(&a.checkpoint, &compare::REPORT_FILES)?;
            let rep = compare::run(&opts)?;
            if a.json {
                print!("{}", report::json::render(&rep)?);
            } else {
                print!("{}", report::table::render(&rep));
            }
            if let Some(dir) = &dir {
                let w = compare::write_report(&rep, dir, a.report.force)?;
                eprintln!("report: {} (and report.json)", w.markdown.display());
            }
            Ok(rep.exit_code as u8)
        }
        Command::Diff {
            a,
            b,
            tap_offset,
            json,
            report,
        } => {
            let dir = report.prepare("diff", &REPORT_MD_JSON)?;
            let rep = diff::run(&a, &b, tap_offset, &command_line())?;
            let text = serde_json::to_string_pretty(&rep).expect("report serialises") + "\n";
            if json {
                print!("{text}");
            } else {
                print!("{}", report::diff::render(&rep));
            }
            if let Some(dir) = dir {
                report.write(&dir, &text, &report::diff::markdown(&rep))?;
            }
            Ok(rep.exit_code as u8)
        }
        Command::Drafter(a) => {
            let rep = drafter::run(&drafter::DrafterOptions {
                checkpoint: a.checkpoint.clone(),
                drafter: a.drafter.clone(),
                paths: commands::parse_paths(&a.paths)?,
                prompts: a.prompts.options()?,
                max_new_tokens: a.eval.max_new_tokens,
                ddtree_budget: a.eval.ddtree_budget,
                max_tau_gap: a.eval.max_tau_gap,
                dtype: a.dtype.clone(),
                seed: a.run.seed,
                quiet: a.run.quiet,
                device: a.run.device,
                end_rule: a.eval.end_rule.into(),
            })?;
            if a.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rep).expect("report serialises")
                );
            } else {
                print!("{}", report::table::render_drafter(&rep));
            }
            Ok(rep.exit_code as u8)
        }
        Command::Triage(a) => {
            let dir = a.report.prepare(&a.checkpoint, &REPORT_MD_JSON)?;
            let rep = triage::run(&triage::TriageOptions {
                checkpoint: a.checkpoint.clone(),
                drafter: a.drafter.clone(),
                prompts: a.prompts.options()?,
                max_new_tokens: a.max_new_tokens,
                ddtree_budget: a.ddtree_budget,
                observed_tau: a.observed_tau,
                position_shift: a.position_shift,
                seed: a.run.seed,
                quiet: a.run.quiet,
                device: a.run.device,
                command_line: command_line(),
            })?;
            let json = serde_json::to_string_pretty(&rep).expect("report serialises") + "\n";
            if a.json {
                print!("{json}");
            } else {
                print!("{}", report::triage::render(&rep));
            }
            if let Some(dir) = dir {
                a.report
                    .write(&dir, &json, &report::triage::markdown(&rep))?;
            }
            Ok(rep.exit_code as u8)
        }
        Command::Dump(a) => {
            let path = a.path.parse()?;
            let opts = dump::DumpOptions {
                logits: !a.no_logits,
                form: a.gdn_form.into(),
                seed: a.run.seed,
                dtype: Precision::parse_or_auto(&a.dtype)?,
                quiet: a.run.quiet,
                device: a.run.device,
            };
            let d = dump::run_to_file(
                &a.checkpoint,
                path,
                &a.prompts.options()?,
                &opts,
                &a.out,
                a.force,
            )?;
            eprintln!(
                "wrote {} ({} prompts, {} hidden states each)",
                a.out.display(),
                d.prompts.len(),
                d.prompts
                    .first()
                    .map(|p| p.hidden_states.len())
                    .unwrap_or(0)
            );
            Ok(0)
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
