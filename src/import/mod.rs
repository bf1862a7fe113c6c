//! Hidden states written by other engines, read into one neutral value with
//! the layer indices mapped to transformers' `hidden_states` convention.
//!
//! The convention everything is mapped to (hsparity's, [`crate::dump`]'s):
//! `hidden_states[0]` is the embedding output, `hidden_states[l+1]` the output
//! of decoder layer `l` (pre-norm residual stream), `hidden_states[N]` the
//! FINAL-NORMED output. The raw output of the last layer (before the final
//! norm) has no `hidden_states` index: it is [`StateIndex::LastLayerOutput`]
//! (a dump's `last_layer_output`), and no engine's "layer N" is ever put at
//! index N.
//!
//! Formats (one module each):
//! - [`Format::Specforge`]: SpecForge offline-capture records (`data_{i}.ckpt`,
//!   `.ckpt.gz`), DFlash (`hidden_states` = taps concatenated, tap L is
//!   `hidden_states[L+1]`) and EAGLE-3 (`aux_hidden_state`, final-normed
//!   `hidden_state`); trailing right-padding is trimmed;
//! - [`Format::Vllm`]: the `extract_hidden_states` connector's per-request
//!   safetensors; aux id k is `hidden_states[k]`, id N the pre-norm last layer;
//! - [`Format::SglangDump`]: SGLang dumper `.pt` files (`{"value", "meta"}`,
//!   tags in the `k=v___` file name), stitched per forward pass and rank;
//! - [`Format::SglangJson`]: a `/generate` response with `return_hidden_states`
//!   (final-normed last layer, one row per fed token) plus the prompt ids sent.
//!
//! [`read`] takes the format, [`detect`] finds it where the file makes it
//! unambiguous, [`read_auto`] does both. Bad input is an [`Error::Format`] (a
//! malformed file: one line naming the file and the key) or [`Error::Input`]
//! (a missing option, an unknown or ambiguous format, a path that is no
//! regular file or directory).

mod checks;
mod pickle_bounds;
pub mod sglang_dump;
pub mod sglang_json;
pub mod specforge;
pub mod to_dump;
pub mod torch_zip;
pub mod vllm;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use serde::Serialize;

use crate::error::{Error, Result};

/// An engine file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// SpecForge offline-capture records (`data_{i}.ckpt` / `.ckpt.gz`).
    Specforge,
    /// vLLM `extract_hidden_states` per-request safetensors.
    Vllm,
    /// SGLang dumper `.pt` files.
    SglangDump,
    /// SGLang `/generate` response JSON with `return_hidden_states`.
    SglangJson,
}

impl Format {
    /// Every format, in the order choices are listed.
    pub const ALL: [Format; 4] = [
        Format::Specforge,
        Format::Vllm,
        Format::SglangDump,
        Format::SglangJson,
    ];

    /// The name used on the command line (`specforge`, `vllm`, `sglang-dump`, `sglang-json`).
    pub fn name(self) -> &'static str {
        match self {
            Format::Specforge => "specforge",
            Format::Vllm => "vllm",
            Format::SglangDump => "sglang-dump",
            Format::SglangJson => "sglang-json",
        }
    }

    /// Parses a [`Format::name`]; the error lists the choices.
    pub fn parse(s: &str) -> Result<Format> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                Error::Input(format!(
                    "unknown format {s:?}: expected one of {}",
                    choices()
                ))
            })
    }

    /// The engine's layer-index convention, in one sentence.
    pub fn convention(self) -> &'static str {
        match self {
            Format::Specforge => {
                "SpecForge/SGLang tap L (target_layer_ids, aux layers) is the residual stream SGLang captures \
                 before layer L+1, i.e. hidden_states[L+1]; a tap on the last layer is the pre-norm \
                 last_layer_output, never hidden_states[N]; EAGLE-3's hidden_state is the final-normed hidden_states[N]"
            }
            Format::Vllm => {
                "vLLM aux id k (eagle_aux_hidden_state_layer_ids) is hidden_states[k] (0 = embeddings); id N is \
                 the last layer's output before the final norm (last_layer_output), never hidden_states[N]"
            }
            Format::SglangDump => {
                "SGLang dumper names: embed_tokens.output = hidden_states[0]; layers.L.input_layernorm.output.1 \
                 (the fused add-norm's residual sum entering layer L) = hidden_states[L]; the final norm's \
                 output.0 = hidden_states[N], its output.1 = last_layer_output (pre-norm)"
            }
            Format::SglangJson => {
                "SGLang return_hidden_states holds the tensor fed to the LM head: the final-normed \
                 hidden_states[N], one row per fed token (prefill rows, then one per decode step)"
            }
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn choices() -> String {
    Format::ALL.map(|f| f.name()).join(", ")
}

/// What the file does not say and the reader needs (all optional; each
/// format names what it misses).
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// SpecForge: the tapped layers in the order they are concatenated (a DFlash
    /// drafter's `dflash_config.target_layer_ids`, or EAGLE-3's aux layers).
    pub target_layer_ids: Option<Vec<usize>>,
    /// vLLM: `eagle_aux_hidden_state_layer_ids` as given to the connector run.
    pub layer_ids: Option<Vec<usize>>,
    /// Hidden size H (checked when given; otherwise taken from the file).
    pub hidden_size: Option<usize>,
    /// Number of decoder layers N of the target (needed wherever an engine's
    /// state may be the final or the last layer's).
    pub num_layers: Option<usize>,
    /// SGLang JSON: the prompt ids sent, one list per response.
    pub prompt_ids: Option<Vec<Vec<i64>>>,
    /// Keep trailing right-padding (SpecForge) instead of trimming it.
    pub keep_padding: bool,
    /// SGLang dumper: read this rank (default: the lowest; other ranks are checked against it).
    pub rank: Option<usize>,
}

/// Where a stored state lands in transformers' convention. Serialised as
/// the index (a number) or `"last_layer_output"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StateIndex {
    /// `hidden_states[i]`.
    Hidden(usize),
    /// The raw output of the last decoder layer, before the final norm (no `hidden_states` index).
    LastLayerOutput,
}

impl Serialize for StateIndex {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            StateIndex::Hidden(i) => s.serialize_u64(*i as u64),
            StateIndex::LastLayerOutput => s.serialize_str("last_layer_output"),
        }
    }
}

impl fmt::Display for StateIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateIndex::Hidden(i) => write!(f, "hidden_states[{i}]"),
            StateIndex::LastLayerOutput => f.write_str("last_layer_output (pre-norm)"),
        }
    }
}

/// One stored layer and where it was put.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerMapping {
    /// Where it sits in the file (`hidden_states[..., 0:64]`, `hidden_states[:, 2]`, a dumper name).
    pub stored_as: String,
    /// The engine's own id for it (a tap, an aux id, a `layer_id` tag), when it has one.
    pub engine_id: Option<usize>,
    /// Its place in transformers' convention.
    pub index: StateIndex,
}

/// The index mapping of an import, as data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexMapping {
    /// The format it applies to.
    pub format: Format,
    /// The engine's convention ([`Format::convention`]).
    pub convention: String,
    /// Stored layer → index, in file order.
    pub layers: Vec<LayerMapping>,
}

impl IndexMapping {
    /// One line per stored layer (`stored_as (engine id k) -> hidden_states[i]`).
    pub fn lines(&self) -> Vec<String> {
        self.layers
            .iter()
            .map(|l| match l.engine_id {
                Some(id) => format!("{} (engine id {id}) -> {}", l.stored_as, l.index),
                None => format!("{} -> {}", l.stored_as, l.index),
            })
            .collect()
    }
}

/// Rows removed from the end of one prompt (SpecForge right-padding).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trim {
    /// Prompt index in [`Imported::prompts`].
    pub prompt: usize,
    /// The file it came from.
    pub source: PathBuf,
    /// Rows in the file.
    pub rows_in_file: usize,
    /// Rows kept.
    pub rows_kept: usize,
    /// Why (`input_ids == 0 and loss_mask == 0`).
    pub reason: String,
}

/// The captured states of one prompt (one token sequence).
#[derive(Debug, Clone)]
pub struct ImportedPrompt {
    /// The file (or folder) it came from.
    pub source: PathBuf,
    /// `[T]` token ids.
    pub input_ids: Vec<i64>,
    /// `[T]` loss mask, when the file has one.
    pub loss_mask: Option<Vec<i64>>,
    /// F32 `[T, H]` by `hidden_states` index (only the indices the file holds).
    pub hidden_states: BTreeMap<usize, Tensor>,
    /// F32 `[T, H]`: the last layer's raw output (pre-norm), when the file holds it.
    pub last_layer_output: Option<Tensor>,
    /// `[T]` position ids, when the file records them (SGLang's dumper).
    pub position_ids: Option<Vec<i64>>,
    /// Tokens of the prompt, when the file shows where the cached decode
    /// starts (an SGLang dump: the rows before the first single-row step).
    pub prompt_length: Option<usize>,
}

impl ImportedPrompt {
    /// The state at `index`, if held.
    pub fn state(&self, index: StateIndex) -> Option<&Tensor> {
        match index {
            StateIndex::Hidden(i) => self.hidden_states.get(&i),
            StateIndex::LastLayerOutput => self.last_layer_output.as_ref(),
        }
    }

    fn insert(&mut self, index: StateIndex, t: Tensor) {
        match index {
            StateIndex::Hidden(i) => {
                self.hidden_states.insert(i, t);
            }
            StateIndex::LastLayerOutput => self.last_layer_output = Some(t),
        }
    }
}

/// An import: prompts in order, the mapping, and what was done to the data.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The format read.
    pub format: Format,
    /// The path given.
    pub path: PathBuf,
    /// Stored layer → `hidden_states` index, with the convention sentence.
    pub mapping: IndexMapping,
    /// Prompts `p0, p1, …` in file order (SpecForge `data_{i}`, vLLM request ids, SGLang steps).
    pub prompts: Vec<ImportedPrompt>,
    /// Hidden size H.
    pub hidden_size: usize,
    /// N, when known (from the options).
    pub num_layers: Option<usize>,
    /// The dtype the engine stored (`bf16`, `f32`, `f16`, `f64`; SGLang JSON floats: `bf16` when every
    /// value is a bf16 value, as `tensor.tolist()` of a bf16 tensor gives, else `json-float`).
    pub stored_dtype: String,
    /// Trailing rows removed, per prompt that had any.
    pub trimmed: Vec<Trim>,
    /// Everything else worth saying (layout found, ranks checked, names skipped), one line each.
    pub notes: Vec<String>,
}

impl Imported {
    /// The state indices every prompt holds, sorted.
    pub fn indices(&self) -> Vec<StateIndex> {
        let mut idx: Vec<StateIndex> = self.mapping.layers.iter().map(|l| l.index).collect();
        idx.sort();
        idx.dedup();
        idx
    }

    /// The `hidden_states` indices held (no [`StateIndex::LastLayerOutput`]), sorted.
    pub fn hidden_indices(&self) -> Vec<usize> {
        self.indices()
            .into_iter()
            .filter_map(|i| match i {
                StateIndex::Hidden(i) => Some(i),
                StateIndex::LastLayerOutput => None,
            })
            .collect()
    }

    /// Per `hidden_states` index, one `[T_k, H]` tensor per prompt: the shape
    /// [`crate::parity::align::align`] takes.
    pub fn rows_by_index(&self) -> BTreeMap<usize, Vec<Tensor>> {
        let mut out = BTreeMap::new();
        for i in self.hidden_indices() {
            let rows: Option<Vec<Tensor>> = self
                .prompts
                .iter()
                .map(|p| p.hidden_states.get(&i).cloned())
                .collect();
            if let Some(rows) = rows {
                out.insert(i, rows);
            }
        }
        out
    }

    /// Human-readable summary lines: format, convention, mapping, trims, notes.
    pub fn summary(&self) -> Vec<String> {
        let mut v = vec![
            format!(
                "{}: {} ({} prompt{}, H = {}, stored {})",
                self.path.display(),
                self.format,
                self.prompts.len(),
                if self.prompts.len() == 1 { "" } else { "s" },
                self.hidden_size,
                self.stored_dtype
            ),
            format!("convention: {}", self.mapping.convention),
        ];
        v.extend(self.mapping.lines().into_iter().map(|l| format!("  {l}")));
        for t in &self.trimmed {
            v.push(format!(
                "trimmed p{}: {} -> {} rows ({}; {})",
                t.prompt,
                t.rows_in_file,
                t.rows_kept,
                t.reason,
                t.source.display()
            ));
        }
        v.extend(self.notes.iter().cloned());
        v
    }
}

/// Refuses anything that is neither a regular file nor a directory (a device, a FIFO, a dangling link).
pub(crate) fn check_path(path: &Path) -> Result<std::fs::Metadata> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    match crate::input::kind_of(&meta) {
        Some(what) if !meta.is_dir() => Err(Error::Input(format!(
            "{}: is {what}, not a regular file or directory (hsparity reads input from regular files only)",
            path.display()
        ))),
        _ => Ok(meta),
    }
}

/// Files under `dir` (recursively) whose names satisfy `keep`, sorted.
pub(crate) fn files_under(dir: &Path, keep: &dyn Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| Error::io(&d, e))? {
            let e = e.map_err(|e| Error::io(&d, e))?;
            let p = e.path();
            let ft = e.file_type().map_err(|err| Error::io(&p, err))?;
            if ft.is_dir() {
                stack.push(p);
            } else if p.file_name().and_then(|n| n.to_str()).is_some_and(keep) {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn is_specforge_name(n: &str) -> bool {
    n.ends_with(".ckpt") || n.ends_with(".ckpt.gz")
}

fn is_dumper_name(n: &str) -> bool {
    n.ends_with(".pt") && n.contains("___") && n.contains('=')
}

/// Finds the format of `path` where the file makes it unambiguous; otherwise
/// refuses with the choices listed.
///
/// - a `.ckpt` / `.ckpt.gz` file, or a folder holding them: SpecForge;
/// - a `.safetensors` file with `hidden_states` and `token_ids`, or a folder of such: vLLM;
/// - a `.pt` file with `k=v___` tags in its name, or a folder of them: SGLang dumper;
///   another `.pt` file is opened: `{"value", "meta"}` is the dumper, `input_ids` + hidden states SpecForge;
/// - a `.json` file with `meta_info.hidden_states`: SGLang JSON.
pub fn detect(path: &Path) -> Result<Format> {
    let meta = check_path(path)?;
    let unknown = |why: String| {
        Error::Input(format!(
            "{}: {why}; pass the format explicitly (one of {})",
            path.display(),
            choices()
        ))
    };
    if meta.is_dir() {
        let mut found = Vec::new();
        if !files_under(path, &is_specforge_name)?.is_empty() {
            found.push(Format::Specforge);
        }
        if !files_under(path, &|n| n.ends_with(".safetensors"))?.is_empty() {
            found.push(Format::Vllm);
        }
        if !files_under(path, &is_dumper_name)?.is_empty() {
            found.push(Format::SglangDump);
        }
        return match found.as_slice() {
            [f] => Ok(*f),
            [] => Err(unknown(
                "no engine capture files in this folder (.ckpt, .ckpt.gz, .safetensors, k=v___.pt)"
                    .into(),
            )),
            many => Err(Error::Input(format!(
                "{}: the folder holds files of several formats ({}); pass one of {}",
                path.display(),
                many.iter().map(|f| f.name()).collect::<Vec<_>>().join(", "),
                choices()
            ))),
        };
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if is_specforge_name(name) {
        return Ok(Format::Specforge);
    }
    if is_dumper_name(name) {
        return Ok(Format::SglangDump);
    }
    if name.ends_with(".safetensors") {
        return match vllm::looks_like(path)? {
            Some(true) => Ok(Format::Vllm),
            Some(false) => Err(unknown(
                "a safetensors file without the vLLM connector's hidden_states and token_ids (an hsparity \
                 dump is compared with `diff` directly)"
                    .into(),
            )),
            None => Err(unknown("not a readable safetensors file".into())),
        };
    }
    if name.ends_with(".json") {
        return if sglang_json::looks_like(path)? {
            Ok(Format::SglangJson)
        } else {
            Err(unknown(
                "a JSON file without meta_info.hidden_states".into(),
            ))
        };
    }
    if name.ends_with(".zst") {
        return Err(unknown(
            "a zstd-compressed file (vLLM OnlineHiddenStatesConnector use_compression): decompress it with \
             `zstd -d` first"
                .into(),
        ));
    }
    // Another name: look inside a torch pickle.
    let head = {
        use std::io::Read;
        let mut b = [0u8; 4];
        let n = crate::input::open(path)?
            .read(&mut b)
            .map_err(|e| Error::io(path, e))?;
        b[..n].to_vec()
    };
    if torch_zip::is_zip(&head) || torch_zip::is_gzip(&head) {
        let rec = torch_zip::read_record(path)?;
        let has = |k: &str| rec.get(k).is_some();
        let dumper = has("value") && has("meta");
        let specforge = has("input_ids") && (has("hidden_states") || has("aux_hidden_state"));
        return match (dumper, specforge) {
            (true, false) => Ok(Format::SglangDump),
            (false, true) => Ok(Format::Specforge),
            _ => Err(unknown(format!(
                "a torch pickle with keys {:?}, neither a SpecForge record nor an SGLang dumper file",
                rec.keys()
            ))),
        };
    }
    Err(unknown("not a file any supported engine writes".into()))
}

/// Reads `path` as `format`.
///
/// Errors: as each format's reader; a layer id given twice; and what no
/// engine writes, checked once for every format (`checks::check_imported`).
pub fn read(path: &Path, format: Format, opts: &ImportOptions) -> Result<Imported> {
    check_path(path)?;
    checks::check_options(path, format, opts)?;
    let imported = match format {
        Format::Specforge => specforge::read(path, opts),
        Format::Vllm => vllm::read(path, opts),
        Format::SglangDump => sglang_dump::read(path, opts),
        Format::SglangJson => sglang_json::read(path, opts),
    }?;
    checks::check_imported(&imported)?;
    Ok(imported)
}

/// [`detect`] then [`read`].
pub fn read_auto(path: &Path, opts: &ImportOptions) -> Result<Imported> {
    let f = detect(path)?;
    read(path, f, opts)
}

/// A stored float tensor as f32. f64 values beyond f32's range are refused:
/// they would land as ±inf, and no engine's bf16/f16/f32 state holds them.
///
/// Errors ([`Error::Format`], naming `what`): such a value.
pub(crate) fn stored_to_f32(t: Tensor, what: &str) -> Result<Tensor> {
    if t.dtype() == candle_core::DType::F64 {
        let v = t.flatten_all()?.to_vec1::<f64>()?;
        if let Some(x) = v
            .iter()
            .find(|x| x.is_finite() && x.abs() > f32::MAX as f64)
        {
            return Err(Error::Format(format!(
                "{what} holds {x:e}, beyond the range of f32 (no engine's bf16, f16 or f32 state holds it; it would land as ±inf)"
            )));
        }
    }
    Ok(t.to_dtype(candle_core::DType::F32)?)
}

/// `t` as `[rows, x]`: accepts `[rows, x]` and `[1, rows, x]` (a Python batch dim).
pub(crate) fn as_2d(t: Tensor, what: &str) -> Result<Tensor> {
    let t = if t.rank() == 3 && t.dim(0)? == 1 {
        t.squeeze(0)?
    } else {
        t
    };
    if t.rank() != 2 {
        return Err(Error::Format(format!(
            "{what} has shape {:?}, expected [T, X] or [1, T, X]",
            t.dims()
        )));
    }
    Ok(t)
}

/// Checks a state's width against `--hidden-size` (when given) and the width seen so far.
pub(crate) fn check_width(
    width: usize,
    opts: &ImportOptions,
    seen: &mut Option<usize>,
    what: &str,
) -> Result<()> {
    if let Some(h) = opts.hidden_size {
        if width != h {
            return Err(Error::Format(format!(
                "{what} is {width} wide, the hidden size given is {h}"
            )));
        }
    }
    match seen {
        Some(h) if *h != width => Err(Error::Format(format!(
            "{what} is {width} wide, earlier states were {h}"
        ))),
        _ => {
            *seen = Some(width);
            Ok(())
        }
    }
}
