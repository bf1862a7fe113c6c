//! The flags of the engine-capture verbs: `import` and `drafter --features`,
//! with the group both share ([`ReadArgs`]: how to read an engine's file),
//! each parsed once into [`ImportOptions`] and [`Format`].

use std::path::PathBuf;

use clap::builder::PossibleValue;
use clap::{Args, ValueEnum};

use crate::commands::import::{self, ImportCmdOptions};
use crate::error::Result;
use crate::import::{Format, ImportOptions};
use crate::prompts::parse_ids;

impl ValueEnum for Format {
    fn value_variants<'a>() -> &'a [Self] {
        &Format::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()).help(match self {
            Format::Specforge => "SpecForge offline-capture records (data_{i}.ckpt, .ckpt.gz)",
            Format::Vllm => "vLLM extract_hidden_states per-request safetensors",
            Format::SglangDump => "SGLang dumper .pt files (k=v___ names)",
            Format::SglangJson => "SGLang /generate response with return_hidden_states",
        }))
    }
}

/// How to read an engine's file (`import`, `drafter --features`).
#[derive(Args)]
pub(super) struct ReadArgs {
    /// Engine format (default: detected where the file makes it unambiguous).
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// SpecForge: the tapped layers concatenated in the record (DFlash target_layer_ids, EAGLE-3 aux layers).
    #[arg(long, value_delimiter = ',')]
    target_layer_ids: Vec<usize>,
    /// vLLM: the eagle_aux_hidden_state_layer_ids the run was given (id k = hidden_states[k]).
    #[arg(long, value_delimiter = ',')]
    layer_ids: Vec<usize>,
    /// SpecForge: keep trailing right-padding (input_ids 0 and loss_mask 0) instead of trimming it.
    #[arg(long)]
    keep_padding: bool,
    /// SGLang dumper: the tensor-parallel rank to read (default: the lowest; the others are checked against it).
    #[arg(long)]
    rank: Option<usize>,
}

impl ReadArgs {
    /// True when any of these flags was given.
    pub(super) fn any(&self) -> bool {
        self.format.is_some()
            || !self.target_layer_ids.is_empty()
            || !self.layer_ids.is_empty()
            || self.keep_padding
            || self.rank.is_some()
    }

    /// The format and the reader options these flags give.
    pub(super) fn options(&self) -> (Option<Format>, ImportOptions) {
        let list = |v: &Vec<usize>| (!v.is_empty()).then(|| v.clone());
        (
            self.format,
            ImportOptions {
                target_layer_ids: list(&self.target_layer_ids),
                layer_ids: list(&self.layer_ids),
                keep_padding: self.keep_padding,
                rank: self.rank,
                ..Default::default()
            },
        )
    }
}

/// `drafter --features FILE` and how to read it.
#[derive(Args)]
pub(super) struct FeaturesArgs {
    /// Evaluate the drafter on the taps this file holds (a dump, or an engine capture `import` reads) over
    /// its own tokens, next to each loading path's own taps over the same tokens.
    #[arg(long, conflicts_with = "trajectories")]
    pub(super) features: Option<PathBuf>,
    #[command(flatten)]
    pub(super) read: ReadArgs,
}

#[derive(Args)]
pub(super) struct ImportArgs {
    /// The engine's file or folder (SpecForge records, vLLM files, SGLang dump folder or response JSON).
    path: PathBuf,
    #[command(flatten)]
    read: ReadArgs,
    /// DFlash drafter (directory or Hub id): its config gives the SpecForge taps, N and H where not given.
    #[arg(long, value_parser = super::values::dir_or_id())]
    drafter: Option<String>,
    /// The target's number of decoder layers N (places the last-layer and final-normed states), 1..=4096.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4096))]
    num_layers: Option<usize>,
    /// The target's hidden size H (checked against the file), 1..=1048576.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_048_576))]
    hidden_size: Option<usize>,
    /// SGLang JSON: the input_ids sent, e.g. 1,2,3; one per response (use --prompt-ids=... for a value starting with '-').
    #[arg(long = "prompt-ids")]
    prompt_ids: Vec<String>,
    /// Write the converted dump here (hsparity.dump.v1 .safetensors); without it only the mapping is reported.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Overwrite an existing --out file.
    #[arg(long)]
    force: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `import`; returns its exit code.
pub(super) fn run_import(a: ImportArgs) -> Result<u8> {
    let (format, mut read) = a.read.options();
    read.num_layers = a.num_layers;
    read.hidden_size = a.hidden_size;
    if !a.prompt_ids.is_empty() {
        let ids = a
            .prompt_ids
            .iter()
            .map(|s| {
                Ok(parse_ids(s)?
                    .into_iter()
                    .map(i64::from)
                    .collect::<Vec<i64>>())
            })
            .collect::<Result<_>>()?;
        read.prompt_ids = Some(ids);
    }
    let rep = import::run(&ImportCmdOptions {
        path: a.path,
        format,
        read,
        drafter: a.drafter,
        out: a.out,
        force: a.force,
        command_line: super::command_line(),
    })?;
    super::finish(&rep, a.json, None)
}
