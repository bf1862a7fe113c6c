//! The forward passes of an SGLang dump read into sequences: per step, the
//! rank's `input_ids`, `positions` and residual-stream states (checked against
//! the other ranks), stitched into one sequence per request by their positions.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use candle_core::Tensor;

use super::{state_of, DumpFile};
use crate::error::{Error, Result};
use crate::import::torch_zip;
use crate::import::{
    as_2d, check_width, Format, ImportOptions, Imported, ImportedPrompt, IndexMapping,
    LayerMapping, StateIndex,
};

pub(super) struct Seq {
    ids: Vec<i64>,
    positions: Vec<i64>,
    states: BTreeMap<StateIndex, Vec<Tensor>>,
    extended_at: Option<u64>,
    /// Per forward pass that extended it: the step and its rows.
    steps: Vec<(u64, usize)>,
}

impl Seq {
    /// The rows before the first single-row step (a cached decode step),
    /// when one follows multi-row ones: the prompt. `None` when the steps
    /// do not show it (one step, or no decode step).
    fn prompt_length(&self) -> Option<usize> {
        let first_decode = self.steps.iter().position(|&(_, rows)| rows == 1)?;
        (first_decode > 0).then(|| self.steps[..first_decode].iter().map(|&(_, r)| r).sum())
    }

    /// `prefill 64 + prefill chunk 64 + 2 decode steps`: what each forward
    /// pass was, from its rows (a multi-row pass after a decode step is a
    /// speculative verify or another chunk: said as rows).
    fn kinds(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        let mut decoded = false;
        let mut decodes = 0;
        let flush = |parts: &mut Vec<String>, n: &mut usize| {
            if *n > 0 {
                parts.push(format!("{n} decode step{}", if *n == 1 { "" } else { "s" }));
                *n = 0;
            }
        };
        for (k, &(_, rows)) in self.steps.iter().enumerate() {
            if rows == 1 && k > 0 {
                decodes += 1;
                decoded = true;
                continue;
            }
            flush(&mut parts, &mut decodes);
            parts.push(match (k, decoded) {
                (0, _) => format!("prefill {rows}"),
                (_, false) => format!("prefill chunk {rows}"),
                (_, true) => format!(
                    "a {rows}-row pass after decoding (a speculative verify or a new chunk)"
                ),
            });
        }
        flush(&mut parts, &mut decodes);
        parts.join(" + ")
    }
}

/// The files of one forward pass of one rank, by dumped name.
pub(super) type StepFiles = BTreeMap<String, DumpFile>;

/// step -> rank -> name -> file.
pub(super) type Steps = BTreeMap<u64, BTreeMap<u64, StepFiles>>;

/// One state of a step: its rows, the dumped name, its `layer_id` tag.
pub(super) type StepState = (Tensor, String, Option<usize>);

/// The `value` tensor of a dumper file.
pub(super) fn load(f: &DumpFile, key_what: &str) -> Result<torch_zip::RawTensor> {
    let rec = torch_zip::read_record(&f.path)?;
    rec.tensor("value", &f.path)?.cloned().ok_or_else(|| {
        Error::Format(format!(
            "{}: no `value` key ({key_what}; the dumper saves {{\"value\", \"meta\"}}); keys found: {:?}",
            f.path.display(),
            rec.keys()
        ))
    })
}

/// What a read accumulates over the steps.
pub(super) struct Reader<'a> {
    pub(super) dir: PathBuf,
    pub(super) opts: &'a ImportOptions,
    pub(super) rank: u64,
    pub(super) only_step: Option<u64>,
    pub(super) notes: Vec<String>,
    pub(super) skipped: BTreeSet<String>,
    pub(super) width: Option<usize>,
    pub(super) dtype: String,
    pub(super) seqs: Vec<Seq>,
    pub(super) layers: Option<Vec<LayerMapping>>,
    pub(super) rank_diffs: BTreeMap<u64, f64>,
}

impl Reader<'_> {
    /// The step's `input_ids` and `positions` (0.. when no positions were dumped).
    pub(super) fn ids_and_positions(
        &mut self,
        step: u64,
        files: &StepFiles,
        first: bool,
    ) -> Result<(Vec<i64>, Vec<i64>)> {
        let ids_file = files.get("input_ids").ok_or_else(|| {
            Error::Format(format!(
                "{}: step {step} rank {} has no `input_ids` dump (name=input_ids, a core field: let \
                 DUMPER_FILTER pass it)",
                self.dir.display(),
                self.rank
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
                if first {
                    self.notes.push(
                        "no `positions` dumps: every step is read as a new sequence from position 0".into(),
                    );
                }
                (0..t as i64).collect()
            }
        };
        Ok((ids, positions))
    }

    /// Where dumped `name` lands, with its `layer_id` tag checked; `None` for a name that is no state.
    pub(super) fn index_of(
        &mut self,
        name: &str,
        f: &DumpFile,
    ) -> Result<Option<(StateIndex, Option<usize>)>> {
        let index = match state_of(name, self.opts.num_layers) {
            Ok(Some(i)) => i,
            Ok(None) => {
                self.skipped.insert(name.to_string());
                return Ok(None);
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
        Ok(Some((index, layer_tag)))
    }

    /// The other ranks' copy of `name` must equal `v` (the residual stream is replicated under TP).
    pub(super) fn compare_ranks(
        &mut self,
        name: &str,
        v: &Tensor,
        per_rank: &BTreeMap<u64, StepFiles>,
        what: &str,
    ) -> Result<()> {
        for (&other, files_r) in per_rank {
            if other == self.rank {
                continue;
            }
            let Some(g) = files_r.get(name) else { continue };
            let gv = as_2d(load(g, name)?.to_f32(what)?, what)?;
            if gv.dims() != v.dims() {
                return Err(Error::Format(format!(
                    "{}: shape {:?} on rank {other}, {:?} on rank {}: a sharded tensor, not the \
                     replicated residual stream",
                    g.path.display(),
                    gv.dims(),
                    v.dims(),
                    self.rank
                )));
            }
            let d = (&gv - v)?
                .abs()?
                .flatten_all()?
                .max(0)?
                .to_scalar::<f32>()? as f64;
            let e = self.rank_diffs.entry(other).or_insert(0.0);
            *e = e.max(d);
        }
        Ok(())
    }

    /// The residual-stream states of one step (`t` rows each), checked against the other ranks.
    pub(super) fn step_states(
        &mut self,
        files: &StepFiles,
        per_rank: &BTreeMap<u64, StepFiles>,
        t: usize,
    ) -> Result<BTreeMap<StateIndex, StepState>> {
        let mut states: BTreeMap<StateIndex, StepState> = BTreeMap::new();
        for (name, f) in files {
            if name == "input_ids" || name == "positions" {
                continue;
            }
            let Some((index, layer_tag)) = self.index_of(name, f)? else {
                continue;
            };
            let what = format!("{}: key `value`", f.path.display());
            let raw = load(f, name)?;
            if self.dtype.is_empty() {
                self.dtype = raw.storage.short_float_name().unwrap_or("?").to_string();
            }
            let v = as_2d(raw.to_f32(&what)?, &what)?;
            let (r, w) = v.dims2()?;
            if r != t {
                return Err(Error::Format(format!(
                    "{what} has {r} rows, the step's input_ids {t}"
                )));
            }
            check_width(w, self.opts, &mut self.width, &what)?;
            if let Some(prev) = states.get(&index) {
                return Err(Error::Format(format!(
                    "{}: {name} and {} both map to {index}",
                    f.path.display(),
                    prev.1
                )));
            }
            self.compare_ranks(name, &v, per_rank, &what)?;
            states.insert(index, (v, name.clone(), layer_tag));
        }
        Ok(states)
    }

    /// Every forward pass dumps the same tensors.
    pub(super) fn check_layers(
        &mut self,
        step: u64,
        states: &BTreeMap<StateIndex, StepState>,
    ) -> Result<()> {
        let this: Vec<LayerMapping> = states
            .iter()
            .map(|(i, (_, name, tag))| LayerMapping {
                stored_as: name.clone(),
                engine_id: *tag,
                index: *i,
            })
            .collect();
        match &self.layers {
            None => self.layers = Some(this),
            Some(l) if *l != this => {
                return Err(Error::Format(format!(
                    "{}: step {step} holds {:?}, earlier steps {:?}: every forward pass must dump the same tensors",
                    self.dir.display(),
                    this.iter().map(|x| x.stored_as.clone()).collect::<Vec<_>>(),
                    l.iter().map(|x| x.stored_as.clone()).collect::<Vec<_>>()
                )))
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Appends the step's rows to the sequences they belong to: runs of consecutive positions; a run from
    /// 0 opens a sequence, a run from p continues the one holding p tokens.
    pub(super) fn stitch(
        &mut self,
        step: u64,
        (ids, positions): (&[i64], &[i64]),
        states: &BTreeMap<StateIndex, StepState>,
    ) -> Result<()> {
        let t = ids.len();
        let mut start = 0;
        while start < t {
            let mut end = start + 1;
            while end < t && positions[end] == positions[end - 1] + 1 {
                end += 1;
            }
            let p0 = positions[start];
            let continues = self
                .seqs
                .iter()
                .position(|s| s.ids.len() as i64 == p0 && s.extended_at != Some(step));
            let target = if p0 == 0 || (self.only_step.is_some() && continues.is_none()) {
                if p0 != 0 {
                    self.notes.push(format!(
                        "step {step} read alone: its rows start at position {p0} (a decode step or a cached prefix)"
                    ));
                }
                self.seqs.push(Seq {
                    ids: Vec::new(),
                    positions: Vec::new(),
                    states: BTreeMap::new(),
                    extended_at: None,
                    steps: Vec::new(),
                });
                self.seqs.len() - 1
            } else {
                continues.ok_or_else(|| {
                    Error::Format(format!(
                        "{}: step {step} rows start at position {p0}, but no earlier forward pass left a \
                         sequence of {p0} tokens (the dump starts mid-request, or a cached prefix was \
                         skipped: run the server with --disable-radix-cache)",
                        self.dir.display()
                    ))
                })?
            };
            let s = &mut self.seqs[target];
            s.ids.extend_from_slice(&ids[start..end]);
            s.positions.extend_from_slice(&positions[start..end]);
            for (i, (v, _, _)) in states {
                s.states
                    .entry(*i)
                    .or_default()
                    .push(v.narrow(0, start, end - start)?);
            }
            s.extended_at = Some(step);
            s.steps.push((step, end - start));
            start = end;
        }
        Ok(())
    }

    /// The prompts (one per sequence) and the closing notes.
    pub(super) fn finish(mut self, path: &Path) -> Result<Imported> {
        if !self.skipped.is_empty() {
            self.notes.push(format!(
                "{} dumped name(s) are no residual-stream state and were skipped: {}",
                self.skipped.len(),
                self.skipped.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        let rank = self.rank;
        for (r, d) in &self.rank_diffs {
            self.notes.push(if *d == 0.0 {
                format!("rank {r}: bitwise equal to rank {rank} (replicated residual stream)")
            } else {
                format!("rank {r}: differs from rank {rank} by up to {d:.3e}; rank {rank} imported")
            });
        }
        let mut prompts = Vec::new();
        for s in std::mem::take(&mut self.seqs) {
            let (kinds, prompt_length) = (s.kinds(), s.prompt_length());
            let steps: Vec<u64> = s.steps.iter().map(|&(k, _)| k).collect();
            let mut p = ImportedPrompt {
                source: self.dir.clone(),
                input_ids: s.ids,
                loss_mask: None,
                hidden_states: BTreeMap::new(),
                last_layer_output: None,
                position_ids: Some(s.positions),
                prompt_length,
            };
            for (i, parts) in s.states {
                p.insert(i, Tensor::cat(&parts, 0)?);
            }
            if steps.len() > 1 {
                self.notes.push(format!(
                    "p{}: {} tokens from steps {steps:?} ({kinds}){}",
                    prompts.len(),
                    p.input_ids.len(),
                    prompt_length
                        .map(|n| format!("; p{}.prompt_length {n} recorded", prompts.len()))
                        .unwrap_or_default()
                ));
            }
            prompts.push(p);
        }
        if prompts.is_empty() {
            return Err(Error::Format(format!(
                "{}: no residual-stream state among the dumped names ({})",
                self.dir.display(),
                self.skipped.iter().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        Ok(Imported {
            format: Format::SglangDump,
            path: path.to_path_buf(),
            mapping: IndexMapping {
                format: Format::SglangDump,
                convention: Format::SglangDump.convention().into(),
                layers: self.layers.unwrap_or_default(),
            },
            prompts,
            hidden_size: self.width.unwrap_or(0),
            num_layers: self.opts.num_layers,
            stored_dtype: self.dtype,
            trimmed: Vec::new(),
            notes: self.notes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(rows: &[usize]) -> Seq {
        Seq {
            ids: Vec::new(),
            positions: Vec::new(),
            states: BTreeMap::new(),
            extended_at: None,
            steps: rows
                .iter()
                .enumerate()
                .map(|(k, &r)| (k as u64, r))
                .collect(),
        }
    }

    #[test]
    fn a_chunked_prefill_is_not_called_decode() {
        let s = seq(&[64, 64, 1, 1]);
        assert_eq!(s.kinds(), "prefill 64 + prefill chunk 64 + 2 decode steps");
        assert_eq!(s.prompt_length(), Some(128));
        let only_chunks = seq(&[64, 20]);
        assert_eq!(only_chunks.kinds(), "prefill 64 + prefill chunk 20");
        assert_eq!(only_chunks.prompt_length(), None);
        let verify = seq(&[12, 1, 8]);
        assert!(verify
            .kinds()
            .starts_with("prefill 12 + 1 decode step + a 8-row pass"));
        assert_eq!(verify.prompt_length(), Some(12));
    }
}
