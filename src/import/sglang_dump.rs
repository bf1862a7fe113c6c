//! SGLang's tensor dumper (sgl-project/sglang, `python/sglang/srt/debug_utils/dumper.py`,
//! `_Dumper._dump_single`): one `torch.save({"value": tensor, "meta": {...}})`
//! per dump at `{DUMPER_DIR}/{DUMPER_EXP_NAME}/` with the tags in the file name,
//! `"___".join(f"{k}={v}")` of `step` (older versions: `forward_pass_id`),
//! `rank`, `dump_index`, `name`, then the context tags (`layer_id` under
//! `...layers.N`). With `DUMPER_NON_INTRUSIVE_MODE=all` a module's output is
//! `non_intrusive__{module}.output`, a tuple output by position (`.output.0`,
//! `.output.1`); the core fields `input_ids` and `positions` are dumped under
//! their own names.
//!
//! Which dumped tensors are residual-stream states (everything else is listed
//! as skipped):
//! - `…embed_tokens.output` → `hidden_states[0]`;
//! - `…layers.L.input_layernorm.output.1` → `hidden_states[L]`: SGLang's fused
//!   add-norm returns `(normed, hidden + residual)`, the sum being the stream
//!   entering layer L (the same "before layer L" point its aux capture uses);
//! - the final norm's `…norm.output.0` → `hidden_states[N]` (needs N), its
//!   `…norm.output.1` → [`StateIndex::LastLayerOutput`] (pre-norm).
//!
//! Each step is one forward pass. Its token rows are split into runs of
//! consecutive `positions`; a run starting at 0 opens a sequence, a run
//! starting at p continues the sequence that has p tokens (a decode step), so
//! a request's prefill and decode steps become one prompt. One rank is read
//! (the lowest, or [`ImportOptions::rank`]); the others must hold the same
//! tensors (the residual stream is replicated under tensor parallelism) and
//! any difference is reported.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod steps;

use super::{files_under, ImportOptions, Imported, StateIndex};
use crate::error::{Error, Result};
use steps::{Reader, Steps};

/// The tags of a dumper file name (`step=0___rank=1___…___layer_id=3.pt`).
#[derive(Debug, Clone)]
pub struct DumpFile {
    /// The file.
    pub path: PathBuf,
    /// Every `k=v` tag of the name.
    pub tags: BTreeMap<String, String>,
    /// Forward pass (`step`, or the older `forward_pass_id`).
    pub step: u64,
    /// Tensor-parallel rank.
    pub rank: u64,
    /// The dumped tensor's name (`model.layers.3.input_layernorm.output.1` …).
    pub name: String,
}

/// Parses the `k=v___` tags of a dumper file name (None when it is no dumper name).
pub fn parse_name(path: &Path) -> Result<Option<DumpFile>> {
    let Some(fname) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(None);
    };
    let Some(stem) = fname.strip_suffix(".pt") else {
        return Ok(None);
    };
    if !stem.contains('=') {
        return Ok(None);
    }
    let mut tags = BTreeMap::new();
    for kv in stem.split("___") {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(Error::Format(format!(
                "{}: file name part {kv:?} is not k=v (SGLang dumper names are k=v joined by ___)",
                path.display()
            )));
        };
        tags.insert(k.to_string(), v.to_string());
    }
    let num = |k: &str| -> Result<Option<u64>> {
        tags.get(k)
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    Error::Format(format!("{}: tag {k}={v} is not a number", path.display()))
                })
            })
            .transpose()
    };
    let step = match (num("step")?, num("forward_pass_id")?) {
        (Some(s), _) | (None, Some(s)) => s,
        (None, None) => {
            return Err(Error::Format(format!(
                "{}: no step (or forward_pass_id) tag in the file name",
                path.display()
            )))
        }
    };
    let rank = num("rank")?.ok_or_else(|| {
        Error::Format(format!("{}: no rank tag in the file name", path.display()))
    })?;
    let name = tags.get("name").cloned().ok_or_else(|| {
        Error::Format(format!("{}: no name tag in the file name", path.display()))
    })?;
    Ok(Some(DumpFile {
        path: path.to_path_buf(),
        tags,
        step,
        rank,
        name,
    }))
}

fn dumper_files_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let p = e.map_err(|e| Error::io(dir, e))?.path();
        if p.is_file()
            && p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".pt") && n.contains('='))
        {
            v.push(p);
        }
    }
    v.sort();
    Ok(v)
}

/// The dump files to read: a folder's own `.pt` files, or those of its one
/// experiment sub-folder; a single file brings the files of its step.
fn collect(path: &Path) -> Result<(PathBuf, Vec<DumpFile>, Option<u64>)> {
    let (dir, only_step) = if path.is_file() {
        let f = parse_name(path)?.ok_or_else(|| {
            Error::Format(format!(
                "{}: not an SGLang dumper file name (k=v tags joined by ___)",
                path.display()
            ))
        })?;
        (
            path.parent().unwrap_or(Path::new(".")).to_path_buf(),
            Some(f.step),
        )
    } else {
        (path.to_path_buf(), None)
    };
    let mut files = dumper_files_in(&dir)?;
    let mut dir = dir;
    if files.is_empty() {
        let subs: BTreeSet<PathBuf> =
            files_under(&dir, &|n| n.ends_with(".pt") && n.contains('='))?
                .into_iter()
                .filter_map(|p| p.parent().map(Path::to_path_buf))
                .collect();
        match subs.len() {
            0 => {
                return Err(Error::Input(format!(
                    "{}: no SGLang dumper files (k=v___….pt) here",
                    dir.display()
                )))
            }
            1 => {
                dir = subs.into_iter().next().expect("one");
                files = dumper_files_in(&dir)?;
            }
            _ => {
                return Err(Error::Input(format!(
                    "{}: several dump experiments ({}); pass one of them",
                    dir.display(),
                    subs.iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
        }
    }
    let mut parsed = Vec::new();
    for f in files {
        if let Some(d) = parse_name(&f)? {
            if only_step.is_none_or(|s| s == d.step) {
                parsed.push(d);
            }
        }
    }
    Ok((dir, parsed, only_step))
}

/// Where a dumped name sits in transformers' convention (None: not a residual-stream state).
pub fn state_of(
    name: &str,
    num_layers: Option<usize>,
) -> std::result::Result<Option<StateIndex>, String> {
    let n = name.strip_prefix("non_intrusive__").unwrap_or(name);
    if n.ends_with("embed_tokens.output") {
        return Ok(Some(StateIndex::Hidden(0)));
    }
    if let Some(rest) = n.strip_suffix(".input_layernorm.output.1") {
        if let Some(pos) = rest.rfind("layers.") {
            if let Ok(l) = rest[pos + "layers.".len()..].parse::<usize>() {
                return Ok(Some(StateIndex::Hidden(l)));
            }
        }
    }
    for (suffix, which) in [(".output.0", 0), (".output.1", 1)] {
        if let Some(module) = n.strip_suffix(suffix) {
            let last = module.rsplit('.').next().unwrap_or(module);
            let under_layers = module.contains("layers.");
            if last == "norm" && !under_layers {
                return if which == 1 {
                    Ok(Some(StateIndex::LastLayerOutput))
                } else {
                    match num_layers {
                        Some(n) => Ok(Some(StateIndex::Hidden(n))),
                        None => Err(format!(
                            "{name} is the final-normed hidden_states[N]: pass the number of layers N"
                        )),
                    }
                };
            }
        }
    }
    Ok(None)
}

/// The rank read: [`ImportOptions::rank`] when present in the dump, else the lowest.
fn choose_rank(dir: &Path, files: &[DumpFile], opts: &ImportOptions) -> Result<u64> {
    let ranks: BTreeSet<u64> = files.iter().map(|f| f.rank).collect();
    match opts.rank {
        Some(r) if !ranks.contains(&(r as u64)) => Err(Error::Input(format!(
            "{}: no files of rank {r} (ranks present: {ranks:?})",
            dir.display()
        ))),
        Some(r) => Ok(r as u64),
        None => {
            ranks.iter().next().copied().ok_or_else(|| {
                Error::Input(format!("{}: no SGLang dumper files here", dir.display()))
            })
        }
    }
}

/// Groups the files by step and rank; one file per name and pass.
fn by_step(files: Vec<DumpFile>) -> Result<Steps> {
    let mut by_step = Steps::new();
    for f in files {
        let slot = by_step
            .entry(f.step)
            .or_default()
            .entry(f.rank)
            .or_default();
        if let Some(prev) = slot.get(&f.name) {
            return Err(Error::Format(format!(
                "{}: the same name as {} in step {} rank {} (two dumps of one tensor per pass)",
                f.path.display(),
                prev.path.display(),
                f.step,
                f.rank
            )));
        }
        slot.insert(f.name.clone(), f);
    }
    Ok(by_step)
}

/// Reads a dump folder (or one dump file and the files of its step).
pub fn read(path: &Path, opts: &ImportOptions) -> Result<Imported> {
    let (dir, files, only_step) = collect(path)?;
    let rank = choose_rank(&dir, &files, opts)?;
    let by_step = by_step(files)?;
    let mut r = Reader {
        dir,
        opts,
        rank,
        only_step,
        notes: Vec::new(),
        skipped: BTreeSet::new(),
        width: None,
        dtype: String::new(),
        seqs: Vec::new(),
        layers: None,
        rank_diffs: BTreeMap::new(),
    };
    let first_step = by_step.keys().next().copied();
    for (&step, per_rank) in &by_step {
        let Some(files) = per_rank.get(&rank) else {
            r.notes.push(format!(
                "step {step} has no files of rank {rank}, step skipped"
            ));
            continue;
        };
        let (ids, positions) = r.ids_and_positions(step, files, first_step == Some(step))?;
        let states = r.step_states(files, per_rank, ids.len())?;
        if states.is_empty() {
            r.notes.push(format!(
                "step {step}: no residual-stream state dumped, step skipped"
            ));
            continue;
        }
        r.check_layers(step, &states)?;
        r.stitch(step, (&ids, &positions), &states)?;
    }
    r.finish(path)
}
