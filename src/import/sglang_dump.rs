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

use candle_core::Tensor;

use super::torch_zip;
use super::{
    as_2d, check_width, files_under, Format, ImportOptions, Imported, ImportedPrompt, IndexMapping,
    LayerMapping, StateIndex,
};
use crate::error::{Error, Result};

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

struct Seq {
    ids: Vec<i64>,
    states: BTreeMap<StateIndex, Vec<Tensor>>,
    extended_at: Option<u64>,
    steps: Vec<u64>,
}

/// Reads a dump folder (or one dump file and the files of its step).
pub fn read(path: &Path, opts: &ImportOptions) -> Result<Imported> {
    let (dir, files, only_step) = collect(path)?;
    let ranks: BTreeSet<u64> = files.iter().map(|f| f.rank).collect();
    let rank = match opts.rank {
        Some(r) if !ranks.contains(&(r as u64)) => {
            return Err(Error::Input(format!(
                "{}: no files of rank {r} (ranks present: {ranks:?})",
                dir.display()
            )))
        }
        Some(r) => r as u64,
        None => *ranks.iter().next().ok_or_else(|| {
            Error::Input(format!("{}: no SGLang dumper files here", dir.display()))
        })?,
    };
    // step -> rank -> name -> file
    let mut by_step: BTreeMap<u64, BTreeMap<u64, BTreeMap<String, DumpFile>>> = BTreeMap::new();
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
    let mut notes = Vec::new();
    let mut skipped: BTreeSet<String> = BTreeSet::new();
    let mut width = None;
    let mut dtype = String::new();
    let mut seqs: Vec<Seq> = Vec::new();
    let mut layers: Option<Vec<LayerMapping>> = None;
    let mut rank_diffs: BTreeMap<u64, f64> = BTreeMap::new();
    for (&step, per_rank) in &by_step {
        let Some(files) = per_rank.get(&rank) else {
            notes.push(format!(
                "step {step}: no files of rank {rank}, step skipped"
            ));
            continue;
        };
        let load = |f: &DumpFile, key_what: &str| -> Result<torch_zip::RawTensor> {
            let rec = torch_zip::read_record(&f.path)?;
            rec.tensor("value", &f.path)?.cloned().ok_or_else(|| {
                Error::Format(format!(
                    "{}: no `value` key ({key_what}; the dumper saves {{\"value\", \"meta\"}}); keys found: {:?}",
                    f.path.display(),
                    rec.keys()
                ))
            })
        };
        let ids_file = files.get("input_ids").ok_or_else(|| {
            Error::Format(format!(
                "{}: step {step} rank {rank} has no `input_ids` dump (name=input_ids, a core field: let \
                 DUMPER_FILTER pass it)",
                dir.display()
            ))
        })?;
        let ids = load(ids_file, "input_ids")?
            .to_i64(&format!("{}: key `value`", ids_file.path.display()))?;
        let t = ids.len();
        let positions: Vec<i64> = match files.get("positions") {
            Some(f) => {
                let p =
                    load(f, "positions")?.to_i64(&format!("{}: key `value`", f.path.display()))?;
                if p.len() != t {
                    return Err(Error::Format(format!(
                        "{}: {} positions for {t} input_ids",
                        f.path.display(),
                        p.len()
                    )));
                }
                p
            }
            None => {
                if step == *by_step.keys().next().expect("a step") {
                    notes.push(
                        "no `positions` dumps: every step is read as a new sequence from position 0".into(),
                    );
                }
                (0..t as i64).collect()
            }
        };
        // states of this step
        let mut states: BTreeMap<StateIndex, (Tensor, String, Option<usize>)> = BTreeMap::new();
        for (name, f) in files {
            if name == "input_ids" || name == "positions" {
                continue;
            }
            let index = match state_of(name, opts.num_layers) {
                Ok(Some(i)) => i,
                Ok(None) => {
                    skipped.insert(name.clone());
                    continue;
                }
                Err(m) => return Err(Error::Input(format!("{}: {m}", f.path.display()))),
            };
            let layer_tag = match f.tags.get("layer_id") {
                None => None,
                Some(v) => Some(v.parse::<usize>().map_err(|_| {
                    Error::Format(format!(
                        "{}: tag layer_id={v} is not a number",
                        f.path.display()
                    ))
                })?),
            };
            if let (StateIndex::Hidden(l), Some(tag)) = (index, layer_tag) {
                if l != 0 && tag != l {
                    return Err(Error::Format(format!(
                        "{}: name says layer {l}, tag layer_id={tag}",
                        f.path.display()
                    )));
                }
            }
            let what = format!("{}: key `value`", f.path.display());
            let raw = load(f, name)?;
            if dtype.is_empty() {
                dtype = raw.storage.short_float_name().unwrap_or("?").to_string();
            }
            let v = as_2d(raw.to_f32(&what)?, &what)?;
            let (r, w) = v.dims2()?;
            if r != t {
                return Err(Error::Format(format!(
                    "{what} has {r} rows, the step's input_ids {t}"
                )));
            }
            check_width(w, opts, &mut width, &what)?;
            if let Some(prev) = states.get(&index) {
                return Err(Error::Format(format!(
                    "{}: {name} and {} both map to {index}",
                    f.path.display(),
                    prev.1
                )));
            }
            // other ranks: the residual stream is replicated, so they must agree
            for (&other, files_r) in per_rank {
                if other == rank {
                    continue;
                }
                if let Some(g) = files_r.get(name) {
                    let gv = as_2d(load(g, name)?.to_f32(&what)?, &what)?;
                    if gv.dims() != v.dims() {
                        return Err(Error::Format(format!(
                            "{}: shape {:?} on rank {other}, {:?} on rank {rank}: a sharded tensor, not the \
                             replicated residual stream",
                            g.path.display(),
                            gv.dims(),
                            v.dims()
                        )));
                    }
                    let d = (&gv - &v)?
                        .abs()?
                        .flatten_all()?
                        .max(0)?
                        .to_scalar::<f32>()? as f64;
                    let e = rank_diffs.entry(other).or_insert(0.0);
                    *e = e.max(d);
                }
            }
            states.insert(index, (v, name.clone(), layer_tag));
        }
        if states.is_empty() {
            notes.push(format!(
                "step {step}: no residual-stream state dumped, step skipped"
            ));
            continue;
        }
        let this_layers: Vec<LayerMapping> = states
            .iter()
            .map(|(i, (_, name, tag))| LayerMapping {
                stored_as: name.clone(),
                engine_id: *tag,
                index: *i,
            })
            .collect();
        match &layers {
            None => layers = Some(this_layers),
            Some(l) if *l != this_layers => {
                return Err(Error::Format(format!(
                    "{}: step {step} holds {:?}, earlier steps {:?}: every forward pass must dump the same tensors",
                    dir.display(),
                    this_layers.iter().map(|x| x.stored_as.clone()).collect::<Vec<_>>(),
                    l.iter().map(|x| x.stored_as.clone()).collect::<Vec<_>>()
                )))
            }
            Some(_) => {}
        }
        // runs of consecutive positions
        let mut start = 0;
        while start < t {
            let mut end = start + 1;
            while end < t && positions[end] == positions[end - 1] + 1 {
                end += 1;
            }
            let p0 = positions[start];
            let slice = |x: &Tensor| x.narrow(0, start, end - start);
            let continues = seqs
                .iter()
                .position(|s| s.ids.len() as i64 == p0 && s.extended_at != Some(step));
            let target = if p0 == 0 || (only_step.is_some() && continues.is_none()) {
                if p0 != 0 {
                    notes.push(format!(
                        "step {step} read alone: its rows start at position {p0} (a decode step or a cached prefix)"
                    ));
                }
                seqs.push(Seq {
                    ids: Vec::new(),
                    states: BTreeMap::new(),
                    extended_at: None,
                    steps: Vec::new(),
                });
                seqs.len() - 1
            } else {
                continues.ok_or_else(|| {
                        Error::Format(format!(
                            "{}: step {step} rows start at position {p0}, but no earlier forward pass left a \
                             sequence of {p0} tokens (the dump starts mid-request, or a cached prefix was \
                             skipped: run the server with --disable-radix-cache)",
                            dir.display()
                        ))
                    })?
            };
            let s = &mut seqs[target];
            s.ids.extend_from_slice(&ids[start..end]);
            for (i, (v, _, _)) in &states {
                s.states.entry(*i).or_default().push(slice(v)?);
            }
            s.extended_at = Some(step);
            s.steps.push(step);
            start = end;
        }
    }
    if !skipped.is_empty() {
        notes.push(format!(
            "{} dumped name(s) are no residual-stream state and were skipped: {}",
            skipped.len(),
            skipped.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    for (r, d) in &rank_diffs {
        notes.push(if *d == 0.0 {
            format!("rank {r}: bitwise equal to rank {rank} (replicated residual stream)")
        } else {
            format!("rank {r}: differs from rank {rank} by up to {d:.3e}; rank {rank} imported")
        });
    }
    let mut prompts = Vec::new();
    for s in seqs {
        let mut p = ImportedPrompt {
            source: dir.clone(),
            input_ids: s.ids,
            loss_mask: None,
            hidden_states: BTreeMap::new(),
            last_layer_output: None,
        };
        for (i, parts) in s.states {
            p.insert(i, Tensor::cat(&parts, 0)?);
        }
        if s.steps.len() > 1 {
            notes.push(format!(
                "p{}: {} tokens from steps {:?} (prefill + decode)",
                prompts.len(),
                p.input_ids.len(),
                s.steps
            ));
        }
        prompts.push(p);
    }
    if prompts.is_empty() {
        return Err(Error::Format(format!(
            "{}: no residual-stream state among the dumped names ({})",
            dir.display(),
            skipped.iter().cloned().collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(Imported {
        format: Format::SglangDump,
        path: path.to_path_buf(),
        mapping: IndexMapping {
            format: Format::SglangDump,
            convention: Format::SglangDump.convention().into(),
            layers: layers.unwrap_or_default(),
        },
        prompts,
        hidden_size: width.unwrap_or(0),
        num_layers: opts.num_layers,
        stored_dtype: dtype,
        trimmed: Vec::new(),
        notes,
    })
}
