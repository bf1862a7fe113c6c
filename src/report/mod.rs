//! Reports: one envelope ([`Report`]) shared by every verb, the body each
//! verb puts in it, and the renderers. Renderers never compute: every number
//! is in the report (hyperfine's `export/` pattern).
//!
//! - [`compare`], [`diff`], [`drafter`] (and [`features`], `drafter --features`),
//!   [`triage`], [`import`]: the body of each verb's report and its terminal /
//!   Markdown rendering;
//! - [`inventory`]: the inventory table;
//! - [`tabular`]: the one row model every table is built in, sunk into
//!   comfy-table or Markdown; [`mod@format`]: number formatting;
//! - `compare::{terminal, markdown, svg}`: `compare`'s terminal text,
//!   `report.md` and `parity.svg`; [`json`]: the one JSON printer.
//!
//! The JSON shape is documented field by field in `docs/report-schema.md` and
//! checked against `docs/report.schema.json` by `tests/report_schema.rs`.

pub mod compare;
pub mod diff;
pub mod drafter;
pub mod features;
pub mod format;
mod hashes;
pub mod import;
pub mod inventory;
pub mod json;
pub mod localisation;
pub mod prompts;
pub mod tabular;
pub mod triage;
pub mod weights;

pub use hashes::{file_sha256, prompts_sha256, short_sha256};

use serde::Serialize;

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::parity::Verdict;
use crate::prompts::{Prompt, PromptBasis, Rendering, Resolved};
use crate::session::Session;

pub use compare::CompareReport;
pub use diff::DiffReport;
pub use drafter::DrafterReport;
pub use import::ImportReport;
pub use prompts::PromptsReport;
pub use triage::TriageReport;

/// Version of the JSON schema (`schema_version`).
pub const SCHEMA_VERSION: u32 = 1;

/// How taps map to `hidden_states` (stated in every report).
pub const TAP_CONVENTION: &str =
    "tap L = output of decoder layer L = hidden_states[L+1] (DFlash / SpecForge convention)";

/// Which verb wrote a report (`kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// `hsparity compare`.
    Compare,
    /// `hsparity diff`.
    Diff,
    /// `hsparity drafter` (and `compare --drafter`'s `drafter` member).
    Drafter,
    /// `hsparity triage`.
    Triage,
    /// `hsparity prompts`.
    Prompts,
    /// `hsparity import`.
    Import,
    /// `hsparity inventory`.
    Inventory,
    /// `hsparity diff CKPT_A CKPT_B`: two checkpoints' tensors.
    Weights,
}

/// The target a run read, when it read one (`diff` reads dumps only).
#[derive(Debug, Clone, Serialize)]
pub struct TargetFacts {
    /// Checkpoint argument.
    pub checkpoint: String,
    /// Hub revision/commit when resolved from the cache.
    pub revision: Option<String>,
    /// sha256 of `config.json` (hex, first 16 chars).
    pub config_sha256: String,
    /// sha256 over the prompts' token ids (hex, first 16 chars).
    pub prompts_sha256: String,
    /// The chat template that rendered the prompts; `null` when none did.
    pub chat_template: Option<TemplateFacts>,
    /// `--enable-thinking` as given: `true`, `false`, or `unset` (not passed
    /// to the template, which is not `false`).
    pub enable_thinking: &'static str,
    /// `--system`: the system turn put before each conversation, or `null`.
    pub system: Option<String>,
    /// `--prompt-set` (or a drafter run's default): the built-in set, its
    /// data and selection, or `null`.
    pub prompt_set: Option<PromptSetFacts>,
    /// Which prompts ran: `given` (by the prompt options), `parity-builtin`,
    /// `drafter-default`, `builtin-ids` or `trajectories`.
    pub prompt_basis: PromptBasis,
    /// The prompts in words: count, set, templated or raw, thinking flag
    /// (what every τ says it was measured on).
    pub prompts_described: String,
    /// Every prompt: where it came from, its token count and the sha256 of
    /// the text tokenised.
    pub prompts: Vec<PromptFacts>,
}

impl TargetFacts {
    /// The facts of `ckpt` run on `prompts` made as `rendering` says.
    ///
    /// Errors: `config.json` cannot be read again for its hash.
    pub fn of(ckpt: &Checkpoint, prompts: &[Prompt], rendering: &Rendering) -> Result<Self> {
        let src = &ckpt.source;
        Ok(TargetFacts {
            checkpoint: src.display.clone(),
            revision: src.commit.clone().or_else(|| src.revision.clone()),
            config_sha256: file_sha256(&ckpt.config_path)?,
            prompts_sha256: prompts_sha256(prompts),
            chat_template: rendering.template.as_ref().map(|t| TemplateFacts {
                file: t.path.display().to_string(),
                name: t.name.clone(),
                sha256: t.sha256.clone(),
            }),
            enable_thinking: crate::chat::thinking_label(rendering.enable_thinking),
            system: rendering.system.clone(),
            prompt_set: rendering.prompt_set.as_ref().map(|s| PromptSetFacts {
                name: s.spec.name,
                n: s.spec.n,
                sets: s
                    .sets
                    .iter()
                    .map(|(src, selection)| SetFacts {
                        name: src.name,
                        file: src.file,
                        sha256: src.sha256.clone(),
                        records: src.records,
                        license: src.license,
                        upstream: src.upstream,
                        selection: selection.clone(),
                    })
                    .collect(),
            }),
            prompt_basis: rendering.basis,
            prompts_described: crate::prompts::describe(prompts, rendering),
            prompts: prompts
                .iter()
                .enumerate()
                .map(|(k, p)| PromptFacts::of(k, p))
                .collect(),
        })
    }

    /// How the prompts were rendered, in words, when a chat template
    /// rendered them (`None` otherwise): template file and sha256, the
    /// thinking flag, the system turn, the prompt set.
    pub fn rendering_line(&self) -> Option<String> {
        let t = self.chat_template.as_ref()?;
        let mut line = format!(
            "chat template {}{} (sha256 {}), enable_thinking {}",
            t.file,
            t.name
                .as_ref()
                .map(|n| format!(" [{n}]"))
                .unwrap_or_default(),
            &t.sha256[..t.sha256.len().min(16)],
            self.enable_thinking
        );
        if let Some(s) = &self.system {
            line.push_str(&format!(", system turn {:?}", crate::text::preview(s)));
        }
        if let Some(s) = &self.prompt_set {
            line.push_str(&format!(", prompt set {}", s.describe()));
        }
        Some(line)
    }
}

/// The chat template a run rendered its prompts with (`environment.chat_template`).
#[derive(Debug, Clone, Serialize)]
pub struct TemplateFacts {
    /// The file: a `.jinja` file (the checkpoint's `chat_template.jinja`, or
    /// `--chat-template`), or `tokenizer_config.json` for its
    /// `chat_template` key.
    pub file: String,
    /// The template's name when the checkpoint has several (`default`, …).
    pub name: Option<String>,
    /// sha256 of the template text (64 hex digits).
    pub sha256: String,
}

/// The built-in benchmark set a run used (`environment.prompt_set`).
#[derive(Debug, Clone, Serialize)]
pub struct PromptSetFacts {
    /// Set name (`gsm8k`, …, or `mix` for all five).
    pub name: &'static str,
    /// `NAME:N`'s N (`--max-samples N` of z-lab/dflash `benchmark.py`), or `null`.
    pub n: Option<usize>,
    /// Each set run (five for `mix`): its data and selection.
    pub sets: Vec<SetFacts>,
}

impl PromptSetFacts {
    /// `gsm8k:2 (2 of 1319 records, MIT)`, `mix:2 (2 each of gsm8k, …)`.
    pub fn describe(&self) -> String {
        let spec = match self.n {
            Some(n) => format!("{}:{n}", self.name),
            None => self.name.to_string(),
        };
        match self.sets.as_slice() {
            [one] => {
                let taken = self.n.map_or(one.records, |n| n.min(one.records));
                format!(
                    "{spec} ({taken} of {} records, {})",
                    one.records, one.license
                )
            }
            many => {
                let names: Vec<&str> = many.iter().map(|s| s.name).collect();
                let each = self
                    .n
                    .map_or("every record".to_string(), |n| format!("{n} each"));
                format!("{spec} ({each} of {})", names.join(", "))
            }
        }
    }
}

/// One built-in set of a run's prompt set (`environment.prompt_set.sets[]`).
#[derive(Debug, Clone, Serialize)]
pub struct SetFacts {
    /// Set name (`gsm8k`, …).
    pub name: &'static str,
    /// The data file (repository path; embedded in the binary).
    pub file: &'static str,
    /// sha256 of the data file (64 hex digits).
    pub sha256: String,
    /// Records the set has.
    pub records: usize,
    /// SPDX license of the data.
    pub license: &'static str,
    /// Where the data comes from.
    pub upstream: &'static str,
    /// How the records were chosen, in words.
    pub selection: String,
}

/// One prompt as fed to the model (`environment.prompts[]`).
#[derive(Debug, Clone, Serialize)]
pub struct PromptFacts {
    /// Prompt index `k` (dump keys `p{k}.*`).
    pub index: usize,
    /// `text`, `ids`, `builtin`, `messages` or `prompt-set`.
    pub source: &'static str,
    /// Where it was given: `--prompt #1`, `prompts.jsonl:3`, `gsm8k row 1101`, …
    pub origin: String,
    /// True when the chat template rendered its text.
    pub chat: bool,
    /// Number of tokens.
    pub tokens: usize,
    /// sha256 (64 hex digits) of the text tokenised (the template's
    /// rendering, or the text itself); `null` for token ids.
    pub rendered_sha256: Option<String>,
}

impl PromptFacts {
    /// The facts of prompt `k`.
    pub fn of(k: usize, p: &Prompt) -> Self {
        PromptFacts {
            index: k,
            source: p.kind(),
            origin: p.origin.clone(),
            chat: p.chat.is_some(),
            tokens: p.ids.len(),
            rendered_sha256: p.rendered_sha256(),
        }
    }
}

/// Facts needed to reproduce a run.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    /// `hsparity x.y.z`.
    pub hsparity_version: String,
    /// The checkpoint and prompts (absent for `diff`).
    #[serde(flatten)]
    pub target: Option<TargetFacts>,
    /// Compute device (`cpu`, `cuda:N`).
    pub device: String,
    /// Worker threads used by the matmuls.
    pub threads: usize,
    /// Peak resident memory of the run in bytes (VmHWM from the OS, after
    /// the run; `null` where the OS does not say).
    pub peak_rss_bytes: Option<u64>,
    /// Gated DeltaNet form of the target's forward (absent for `diff`).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "describe_form"
    )]
    pub gdn_form: Option<crate::models::GdnForm>,
    /// hsparity's own CPU kernels: what this CPU and environment allow, and
    /// which ran in this process ([`crate::kernels`]).
    pub kernels: KernelFacts,
}

/// `environment.kernels`: the CPU features the kernels look at, the
/// kernels the CPU and the environment's switches allow, and those that ran
/// (in this process, up to the report; none ran on a machine or a run where
/// candle's GEMM computed everything, with the same results).
#[derive(Debug, Clone, Serialize)]
pub struct KernelFacts {
    /// CPU features (`avx2`, `avx512f`, `avx512bf16`, `avx512bf16-slow`,
    /// `amx-bf16`).
    pub cpu_features: Vec<&'static str>,
    /// What turned kernels off: switches set in the environment
    /// (`HSPARITY_NO_AVX512_GEMM`, `HSPARITY_NO_BF16_DOT`, `HSPARITY_NO_AMX`,
    /// `HSPARITY_NO_AVX512_DELTA`) and the OS's refusal of AMX's tile state.
    pub disabled_by: Vec<&'static str>,
    /// Kernels that may run.
    pub available: Vec<&'static str>,
    /// Kernels that ran.
    pub ran: Vec<&'static str>,
}

impl KernelFacts {
    /// Read now, from [`crate::kernels::capabilities`] and [`crate::kernels::ran`].
    pub fn now() -> Self {
        let caps = crate::kernels::capabilities();
        let disabled_by = caps.disabled_by();
        KernelFacts {
            cpu_features: caps.cpu_features(),
            disabled_by,
            available: caps.available(),
            ran: crate::kernels::ran(),
        }
    }
}

fn describe_form<S: serde::Serializer>(
    f: &Option<crate::models::GdnForm>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match f {
        Some(f) => s.serialize_str(f.describe()),
        None => s.serialize_none(),
    }
}

impl Environment {
    /// The environment of a run on `session` with the delta-rule `form`.
    /// Peak RSS is read now: build it once the work is done.
    ///
    /// Errors: `config.json` cannot be read again for its hash.
    pub fn of_session(session: &Session, form: crate::models::GdnForm) -> Result<Self> {
        Ok(Environment {
            target: Some(TargetFacts::of(
                &session.ckpt,
                &session.prompts,
                &session.rendering,
            )?),
            device: session.device.to_string(),
            gdn_form: Some(form),
            ..Self::host()
        })
    }

    /// The environment of `prompts`, which resolves prompts on `ckpt` and
    /// runs nothing (no device work, no delta-rule form).
    ///
    /// Errors: `config.json` cannot be read again for its hash.
    pub fn of_prompts(ckpt: &Checkpoint, resolved: &Resolved) -> Result<Self> {
        Ok(Environment {
            target: Some(TargetFacts::of(
                ckpt,
                &resolved.prompts,
                &resolved.rendering,
            )?),
            ..Self::host()
        })
    }

    /// How the prompts were rendered, when a chat template rendered them
    /// ([`TargetFacts::rendering_line`]).
    pub fn rendering_line(&self) -> Option<String> {
        self.target.as_ref().and_then(TargetFacts::rendering_line)
    }

    /// The environment of a run that read no checkpoint (on the host).
    pub fn host() -> Self {
        Environment {
            hsparity_version: format!("hsparity {}", env!("CARGO_PKG_VERSION")),
            target: None,
            device: "cpu".into(),
            threads: candle_core::utils::get_num_threads(),
            peak_rss_bytes: crate::sysinfo::peak_rss_bytes(),
            gdn_form: None,
            kernels: KernelFacts::now(),
        }
    }
}

/// The envelope every verb's report shares: `kind`, `schema_version`,
/// `verdict`, `summary`, `exit_code`, `environment`, `command`, `notes`,
/// then the verb's own members (`body`, flattened into the same object).
#[derive(Debug, Clone, Serialize)]
pub struct Report<B> {
    /// Which verb wrote it.
    pub kind: Kind,
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// `pass` or `fail`.
    pub verdict: Verdict,
    /// One sentence that says it all, starting `PASS:` or `FAIL:`.
    pub summary: String,
    /// Exit code the run ends with (0 pass, 1 fail).
    pub exit_code: i32,
    /// Reproduction facts.
    pub environment: Environment,
    /// The exact command line.
    pub command: String,
    /// Remarks for the reader.
    pub notes: Vec<String>,
    /// The verb's own members.
    #[serde(flatten)]
    pub body: B,
}

impl<B> Report<B> {
    /// A report whose summary is `summary` tagged with the verdict
    /// ([`tagged`]) and whose exit code follows the verdict (0 pass, 1 otherwise).
    pub fn new(
        kind: Kind,
        verdict: Verdict,
        summary: &str,
        environment: Environment,
        command: String,
        notes: Vec<String>,
        body: B,
    ) -> Self {
        let verdict = if verdict == Verdict::Pass {
            Verdict::Pass
        } else {
            Verdict::Fail
        };
        Report {
            kind,
            schema_version: SCHEMA_VERSION,
            verdict,
            summary: tagged(verdict, summary),
            exit_code: i32::from(verdict != Verdict::Pass),
            environment,
            command,
            notes,
            body,
        }
    }
}

impl<B> Report<B> {
    /// A report without a verdict of its own (`triage`: a ranking, which
    /// always passes): `summary` is kept as given, untagged.
    pub fn ranking(
        kind: Kind,
        summary: String,
        environment: Environment,
        command: String,
        notes: Vec<String>,
        body: B,
    ) -> Self {
        Report {
            summary,
            ..Self::new(kind, Verdict::Pass, "", environment, command, notes, body)
        }
    }
}

impl<B> Report<B> {
    /// The terminal's last line, so the verdict is where the output ends
    /// too: `verdict: FAIL (exit 1)`; a triage that ranked says it ranked.
    pub fn closing_line(&self) -> String {
        match (self.kind, self.exit_code) {
            (Kind::Triage, 0) => {
                "ranked (exit 0): the suspects the inputs show first, then those that lower τ most; the first line names them\n"
                    .into()
            }
            (_, code) => format!(
                "verdict: {} (exit {code})\n",
                self.verdict.as_str().to_uppercase()
            ),
        }
    }

    /// The report failed by the target's weight findings (MISSING or
    /// NaN/Inf weights, `session::Session::findings`), whatever it measured:
    /// verdict fail, exit 1, the findings first in the summary. Unchanged
    /// when `findings` is empty. What `compare` flags, `drafter`, `drafter
    /// --features` and `triage` flag the same way.
    pub fn with_findings(mut self, findings: &[String]) -> Self {
        if findings.is_empty() {
            return self;
        }
        let body = self
            .summary
            .strip_prefix("PASS: ")
            .or_else(|| self.summary.strip_prefix("FAIL: "))
            .unwrap_or(&self.summary)
            .to_string();
        self.verdict = Verdict::Fail;
        self.exit_code = 1;
        self.summary = tagged(Verdict::Fail, &format!("{}; {body}", findings.join("; ")));
        self
    }
}

impl<B> std::ops::Deref for Report<B> {
    type Target = B;
    fn deref(&self) -> &B {
        &self.body
    }
}

/// The summary line: `PASS: …` or `FAIL: …` before `body`.
pub fn tagged(verdict: Verdict, body: &str) -> String {
    let tag = if verdict == Verdict::Pass {
        "PASS"
    } else {
        "FAIL"
    };
    format!("{tag}: {body}")
}

/// What a verb prints and writes: its terminal text, the files of its report
/// folder besides `report.json`, and its exit code. The JSON is the value
/// itself, printed by [`json::render`].
pub trait Document: Serialize {
    /// Every file its report folder holds (checked before the run); none by
    /// default (a verb without a report folder of its own).
    const FILES: &'static [&'static str] = &[];
    /// The terminal rendering, laid out for `width` (tables fitted, prose
    /// wrapped: [`crate::width::fill`]).
    fn terminal(&self, width: crate::width::Width) -> String;
    /// `(file name, contents)` of the report folder besides `report.json`;
    /// none by default.
    ///
    /// Errors: a renderer that can fail (the SVG plot).
    fn files(&self) -> Result<Vec<(&'static str, String)>> {
        Ok(Vec::new())
    }
    /// The process exit code (0 or 1; 2 never produces a report).
    fn exit_code(&self) -> u8;
}

/// What a verb's body adds to the envelope: its renderings. Every
/// `Report<B>` of such a body is a [`Document`], whose exit code is the
/// envelope's.
pub trait Body: Serialize + Sized {
    /// Every file the report folder holds (see [`Document::FILES`]).
    const FILES: &'static [&'static str] = &[];
    /// The terminal rendering of the whole report, its tables laid out for
    /// `width` (its prose is wrapped by [`Document::terminal`]).
    fn terminal(report: &Report<Self>, width: crate::width::Width) -> String;
    /// The report folder's files besides `report.json` (see
    /// [`Document::files`]).
    ///
    /// Errors: a renderer that can fail.
    fn files(report: &Report<Self>) -> Result<Vec<(&'static str, String)>> {
        let _ = report;
        Ok(Vec::new())
    }
}

impl<B: Body> Document for Report<B> {
    const FILES: &'static [&'static str] = B::FILES;

    fn terminal(&self, width: crate::width::Width) -> String {
        let mut text = B::terminal(self, width);
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&self.closing_line());
        crate::width::fill(&text, width)
    }

    fn files(&self) -> Result<Vec<(&'static str, String)>> {
        B::files(self)
    }

    fn exit_code(&self) -> u8 {
        self.exit_code as u8
    }
}
