//! Dump files: hidden states of one loading path (or one engine's capture) in
//! safetensors, the format of `hsparity.dump.v1` (`docs/dump-format.md`),
//! readable and writable from Python with `safetensors.torch`.
//!
//! Keys for prompt `k`: `p{k}.input_ids` (I64 `[T]`), `p{k}.hidden_states.{i}`
//! (F32 `[T, H]`, transformers' `output_hidden_states` entries, the last one
//! final-normed), `p{k}.last_layer_output` (F32 `[T, H]`, raw output of the
//! last decoder layer), `p{k}.logits` (F32 `[T, V]`, paths with an LM head)
//! and `p{k}.loss_mask` (I64 `[T]`, an imported training record's). A *full*
//! dump (what `hsparity dump` and `tools/dump_hidden_states.py` write) holds
//! every index i = 0..=N and the ids; a *partial* one (an engine's capture,
//! converted by `hsparity import`) holds only some indices, and may lack
//! `input_ids`. Every prompt of a dump holds the same indices. `__metadata__`
//! holds `format`, `checkpoint`, `loading_path`, `class`, `dtype`,
//! `num_layers`, `tool_version` (and, for an import, `source_format`,
//! `hidden_states_indices`, `layer_mapping`, …); none of it is required to read.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
use crate::models::moe::Routing;

mod routing;

/// The `format` metadata value of a dump.
pub const FORMAT: &str = "hsparity.dump.v1";

/// Captured tensors for one prompt.
#[derive(Debug, Clone, Default)]
pub struct DumpPrompt {
    /// `[T]` token ids; `None` in a file written without them (its inputs
    /// cannot be verified).
    pub input_ids: Option<Vec<i64>>,
    /// `[T]` loss mask (0 on the prompt, 1 on the trained-on response), when recorded.
    pub loss_mask: Option<Vec<i64>>,
    /// `[T]` the attention mask the forward was given (1 attended, 0
    /// masked), when the writer had one.
    pub attention_mask: Option<Vec<i64>>,
    /// `[T]` the position ids the forward was given, when the writer had them.
    pub position_ids: Option<Vec<i64>>,
    /// How many of the T positions are the prompt (prefill); positions from
    /// it on came from cached decode steps. `None`: all prefill, or unknown.
    pub prompt_length: Option<usize>,
    /// `[T, H]` f32 by `hidden_states` index: 0..=N in a full dump, some of
    /// them in a partial one.
    pub hidden_states: BTreeMap<usize, Tensor>,
    /// `[T, H]` f32, when recorded.
    pub last_layer_output: Option<Tensor>,
    /// `[T, V]` f32, when recorded.
    pub logits: Option<Tensor>,
    /// The MoE router's choices by decoder layer (`p{k}.router.{l}.indices`
    /// and `.weights`), when recorded; weights NaN where a dump holds indices only.
    pub routing: BTreeMap<usize, Routing>,
}

impl DumpPrompt {
    /// T: the number of token rows.
    pub fn rows(&self) -> usize {
        if let Some(ids) = &self.input_ids {
            return ids.len();
        }
        self.hidden_states
            .values()
            .chain(&self.last_layer_output)
            .next()
            .and_then(|t| t.dim(0).ok())
            .unwrap_or(0)
    }
}

/// `tensors` and `meta` as a safetensors file on `out`, in the layout
/// safetensors' `serialize_to_file` writes (tensors by descending dtype
/// alignment, then name; the header padded with spaces to 8 bytes) but with
/// every header key in sorted order, where that function writes the
/// metadata in a `HashMap`'s (random) order: the same dump, the same bytes.
fn write_safetensors(
    out: &mut impl std::io::Write,
    tensors: &[(String, Tensor)],
    meta: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    use safetensors::View;
    let mut order: Vec<&(String, Tensor)> = tensors.iter().collect();
    let dtype = |t: &Tensor| <Tensor as View>::dtype(t);
    order.sort_by(|(a, x), (b, y)| dtype(y).cmp(&dtype(x)).then(a.cmp(b)));
    // A BTreeMap, so the keys are sorted whatever serde_json's features.
    let mut header = BTreeMap::new();
    header.insert("__metadata__".to_string(), serde_json::json!(meta));
    let mut offset = 0;
    for (name, t) in &order {
        let n = <Tensor as View>::data_len(t);
        let info = serde_json::json!({
            "dtype": dtype(t),
            "shape": <Tensor as View>::shape(t),
            "data_offsets": [offset, offset + n],
        });
        header.insert(name.clone(), info);
        offset += n;
    }
    let mut bytes = serde_json::to_vec(&header)?;
    bytes.resize(bytes.len().next_multiple_of(8), b' ');
    out.write_all(&(bytes.len() as u64).to_le_bytes())?;
    out.write_all(&bytes)?;
    for (_, t) in order {
        write_data(out, t)?;
    }
    Ok(())
}

/// `t`'s bytes as safetensors stores them (little-endian): an f32 CPU
/// tensor's straight from its storage through a small buffer, others
/// through safetensors' `View` (a copy of the whole tensor).
fn write_data(out: &mut impl std::io::Write, t: &Tensor) -> std::io::Result<()> {
    if t.dtype() == DType::F32 && t.device().is_cpu() {
        let written = crate::models::layers::with_f32(t, |v| {
            let mut buf = Vec::with_capacity(1 << 20);
            for chunk in v.chunks(1 << 18) {
                buf.clear();
                buf.extend(chunk.iter().flat_map(|x| x.to_le_bytes()));
                out.write_all(&buf)?;
            }
            Ok(())
        });
        if let Ok(written) = written {
            return written;
        }
    }
    out.write_all(&<Tensor as safetensors::View>::data(t))
}

/// `t` as f32 on the host (captures may live on a GPU).
fn host_f32(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::F32)?.to_device(&Device::Cpu)?)
}

/// A whole dump: metadata plus prompts in order.
#[derive(Debug, Clone, Default)]
pub struct Dump {
    /// `__metadata__` (string → string).
    pub metadata: BTreeMap<String, String>,
    /// Prompts `p0, p1, …`.
    pub prompts: Vec<DumpPrompt>,
}

/// Tensors by name, in the order a dump file holds them.
type NamedTensors = Vec<(String, Tensor)>;

impl Dump {
    /// The dtype the metadata names, parsed here for every reader of a dump
    /// (`f32`, `bf16`, `f16` or their torch names; f32 when it names none).
    ///
    /// Errors: another name ([`Error::Input`], naming the file `name`).
    pub fn dtype(&self, name: &str) -> Result<crate::precision::Precision> {
        use crate::precision::Precision;
        match self.metadata.get("dtype") {
            None => Ok(Precision::F32),
            Some(s) => Precision::from_name(s).ok_or_else(|| {
                Error::Input(format!(
                    "{name}: __metadata__ dtype {s:?} is not f32, bf16 or f16 (or their torch names)"
                ))
            }),
        }
    }

    /// The `hidden_states` indices every prompt holds, ascending.
    pub fn indices(&self) -> Vec<usize> {
        self.prompts
            .first()
            .map(|p| p.hidden_states.keys().copied().collect())
            .unwrap_or_default()
    }

    /// The NaN and ±Inf values `hidden_states[index]` holds, and the prompts
    /// holding any (`dump`'s overflow finding, `diff`'s NaN summary).
    ///
    /// Errors: a tensor failure.
    pub fn non_finite(&self, index: usize) -> Result<NonFinite> {
        let mut nf = NonFinite::default();
        for (k, p) in self.prompts.iter().enumerate() {
            let Some(t) = p.hidden_states.get(&index) else {
                continue;
            };
            let v = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
            let (nan, inf) = (
                v.iter().filter(|x| x.is_nan()).count(),
                v.iter().filter(|x| x.is_infinite()).count(),
            );
            if nan + inf > 0 {
                nf.prompts.push(k);
            }
            (nf.nan, nf.inf) = (nf.nan + nan, nf.inf + inf);
        }
        Ok(nf)
    }

    /// N: the metadata's `num_layers`, else the last index of a dump holding
    /// every index 0..=N (a full dump written without metadata), else unknown.
    pub fn num_layers(&self) -> Option<usize> {
        if let Some(n) = self.metadata.get("num_layers").and_then(|s| s.parse().ok()) {
            return Some(n);
        }
        let idx = self.indices();
        let contiguous = idx.iter().enumerate().all(|(j, &i)| i == j);
        (contiguous && idx.len() > 1).then(|| idx.len() - 1)
    }

    /// True when the dump holds every index 0..=N.
    pub fn is_full(&self) -> bool {
        match self.num_layers() {
            Some(n) => self.indices() == (0..=n).collect::<Vec<_>>(),
            None => false,
        }
    }

    /// True when the prompts carry their `input_ids`.
    pub fn has_input_ids(&self) -> bool {
        self.prompts.iter().all(|p| p.input_ids.is_some())
    }

    /// The tensors a dump file holds (hidden states, outputs and logits as
    /// F32, ids and masks as I64), and the metadata.
    fn tensors(&self) -> Result<(NamedTensors, BTreeMap<String, String>)> {
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        let ints = |v: &Vec<i64>| Tensor::from_slice(v, v.len(), &Device::Cpu);
        for (k, p) in self.prompts.iter().enumerate() {
            if let Some(ids) = &p.input_ids {
                tensors.push((format!("p{k}.input_ids"), ints(ids)?));
            }
            for (field, v) in [
                ("loss_mask", &p.loss_mask),
                ("attention_mask", &p.attention_mask),
                ("position_ids", &p.position_ids),
            ] {
                if let Some(v) = v {
                    tensors.push((format!("p{k}.{field}"), ints(v)?));
                }
            }
            if let Some(n) = p.prompt_length {
                tensors.push((format!("p{k}.prompt_length"), ints(&vec![n as i64])?));
            }
            for (i, h) in &p.hidden_states {
                tensors.push((format!("p{k}.hidden_states.{i}"), host_f32(h)?));
            }
            if let Some(t) = &p.last_layer_output {
                tensors.push((format!("p{k}.last_layer_output"), host_f32(t)?));
            }
            if let Some(t) = &p.logits {
                tensors.push((format!("p{k}.logits"), host_f32(t)?));
            }
            tensors.extend(routing::to_tensors(k, &p.routing)?);
        }
        Ok((tensors, self.metadata.clone()))
    }

    /// Writes the dump atomically to `path` (see
    /// [`crate::output::write_atomic_with`]) as safetensors, streamed tensor
    /// by tensor (the file's bytes are not held in memory at once); the same
    /// dump gives the same bytes (the header's keys in sorted order).
    pub fn write(&self, path: &Path, force: bool) -> Result<()> {
        let (tensors, meta) = self.tensors()?;
        crate::output::write_atomic_with(path, force, |tmp| {
            let file = std::fs::File::create(tmp).map_err(|e| Error::io(tmp, e))?;
            let mut out = std::io::BufWriter::new(file);
            write_safetensors(&mut out, &tensors, &meta)
                .and_then(|()| std::io::Write::flush(&mut out))
                .map_err(|e| Error::io(path, e))
        })
    }

    /// Reads a dump written by hsparity or by Python, full or partial.
    /// Errors ([`Error::Format`]): not a safetensors file; no `p0.*` state;
    /// prompts not numbered `p0, p1, …` without gaps; a prompt without any
    /// state; a non-numeric index; float token ids; a tensor whose rows
    /// disagree with its prompt's; prompts holding different indices or
    /// states, or ids in some prompts only.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = crate::input::read(path)?;
        let bad = |m: String| Error::Format(format!("{}: {m}", path.display()));
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)
            .map_err(|e| bad(format!("not a safetensors file: {e}")))?;
        let metadata: BTreeMap<String, String> = meta
            .metadata()
            .clone()
            .map(|m| m.into_iter().collect())
            .unwrap_or_default();
        let mut all = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
            .map_err(|e| bad(format!("unreadable tensors: {e}")))?;
        let mut prompts = Vec::new();
        for k in 0.. {
            match read_prompt(&mut all, k, path)? {
                Some(p) => prompts.push(p),
                None => break,
            }
        }
        if let Some(stray) = all.keys().filter(|n| prompt_field(n).is_some()).min() {
            return Err(bad(format!(
                "{stray} but no p{}: prompts are numbered p0, p1, … without gaps",
                prompts.len()
            )));
        }
        if prompts.is_empty() {
            return Err(bad(
                "no p0.hidden_states.{i} (nor p0.last_layer_output): not an hsparity dump (hsparity.dump.v1: \
                 p{k}.hidden_states.{i}, with p{k}.input_ids; see docs/dump-format.md)"
                    .into(),
            ));
        }
        check_prompts_agree(&prompts).map_err(bad)?;
        let dump = Dump { metadata, prompts };
        let meta = |key: &str| dump.metadata.get(key).and_then(|s| s.parse().ok());
        let moe = (meta("num_experts"), meta("top_k"));
        routing::check_bounds(&dump.prompts, dump.num_layers(), moe).map_err(bad)?;
        Ok(dump)
    }
}

/// `(k, field)` of a dump key `p{k}.{field}` with a known field, else `None`.
fn prompt_field(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix('p')?;
    let (k, field) = rest.split_once('.')?;
    let k = k.parse().ok()?;
    let known = [
        "input_ids",
        "loss_mask",
        "attention_mask",
        "position_ids",
        "prompt_length",
        "last_layer_output",
        "logits",
    ]
    .contains(&field)
        || field.starts_with("hidden_states.")
        || field.starts_with("router.");
    known.then_some((k, field))
}

/// Integer ids (or a mask) as i64. Errors: a float tensor.
fn ints(t: Tensor, name: &str, path: &Path) -> Result<Vec<i64>> {
    if t.dtype().is_float() {
        // `p0.input_ids` → `input_ids`: say what the field holds.
        let field = name.split_once('.').map_or(name, |(_, f)| f);
        let what = match field {
            "input_ids" => "token ids",
            "attention_mask" => "an attention mask (1 attended, 0 masked)",
            "loss_mask" => "a loss mask (0 or 1)",
            "position_ids" => "position ids",
            "prompt_length" => "a prompt length (a token count)",
            _ => "its values",
        };
        return Err(Error::Format(format!(
            "{}: {name} has dtype {:?}: {what} must be integers (I64)",
            path.display(),
            t.dtype()
        )));
    }
    Ok(t.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?)
}

/// NaN and ±Inf values of one hidden state over a dump's prompts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NonFinite {
    /// NaN values.
    pub nan: usize,
    /// ±Inf values.
    pub inf: usize,
    /// Prompts holding any.
    pub prompts: Vec<usize>,
}

impl NonFinite {
    /// NaN and Inf together.
    pub fn total(&self) -> usize {
        self.nan + self.inf
    }
}

/// Removes prompt `k`'s tensors from `all`; `None` when it has none.
fn read_prompt(
    all: &mut HashMap<String, Tensor>,
    k: usize,
    path: &Path,
) -> Result<Option<DumpPrompt>> {
    let names: Vec<String> = all
        .keys()
        .filter(|n| prompt_field(n).is_some_and(|(j, _)| j == k))
        .cloned()
        .collect();
    if names.is_empty() {
        return Ok(None);
    }
    let mut take = |field: &str| {
        let name = format!("p{k}.{field}");
        all.remove(&name).map(|t| ints(t, &name, path)).transpose()
    };
    let mut p = DumpPrompt {
        input_ids: take("input_ids")?,
        loss_mask: take("loss_mask")?,
        attention_mask: take("attention_mask")?,
        position_ids: take("position_ids")?,
        ..Default::default()
    };
    let length = take("prompt_length")?;
    if let Some(v) = length {
        match v[..] {
            [n] if n >= 0 => p.prompt_length = Some(n as usize),
            ref v => {
                return Err(Error::Format(format!(
                    "{}: p{k}.prompt_length must be one non-negative count, not {v:?}",
                    path.display()
                )))
            }
        }
    }
    let mut rows = p.input_ids.as_ref().map(Vec::len);
    for name in &names {
        let Some(i) = name.strip_prefix(&format!("p{k}.hidden_states.")) else {
            continue;
        };
        let i: usize = i.parse().map_err(|_| {
            Error::Format(format!(
                "{}: {name}: the hidden_states index is not a number",
                path.display()
            ))
        })?;
        let t = all.remove(name).expect("listed");
        p.hidden_states
            .insert(i, as_rows(t, &mut rows, name, path)?);
    }
    for (field, slot) in [
        ("last_layer_output", &mut p.last_layer_output),
        ("logits", &mut p.logits),
    ] {
        let name = format!("p{k}.{field}");
        if let Some(t) = all.remove(&name) {
            *slot = Some(as_rows(t, &mut rows, &name, path)?);
        }
    }
    p.routing = routing::read(all, k, rows, path)?;
    if p.hidden_states.is_empty() && p.last_layer_output.is_none() {
        return Err(Error::Format(format!(
            "{}: p{k} holds no hidden state (p{k}.hidden_states.{{i}} or p{k}.last_layer_output)",
            path.display()
        )));
    }
    if let Some(t) = rows {
        for (field, v) in [
            ("loss_mask", &p.loss_mask),
            ("attention_mask", &p.attention_mask),
            ("position_ids", &p.position_ids),
        ] {
            if let Some(m) = v.as_ref().filter(|m| m.len() != t) {
                return Err(Error::Format(format!(
                    "{}: p{k}.{field} has {} entries, the prompt {t} rows",
                    path.display(),
                    m.len()
                )));
            }
        }
        if let Some(n) = p.prompt_length.filter(|&n| n > t) {
            return Err(Error::Format(format!(
                "{}: p{k}.prompt_length is {n}, more than the prompt's {t} rows",
                path.display()
            )));
        }
    }
    Ok(Some(p))
}

/// Every prompt holds the same indices and states, and ids in all or none.
fn check_prompts_agree(prompts: &[DumpPrompt]) -> std::result::Result<(), String> {
    let p0 = &prompts[0];
    let i0: BTreeSet<usize> = p0.hidden_states.keys().copied().collect();
    for (k, p) in prompts.iter().enumerate().skip(1) {
        let ik: BTreeSet<usize> = p.hidden_states.keys().copied().collect();
        if ik != i0 {
            let what = if ik.len() != i0.len() {
                format!(
                    "p{k} has {} hidden states but p0 has {}",
                    ik.len(),
                    i0.len()
                )
            } else {
                format!("p{k} holds hidden_states {ik:?} but p0 holds {i0:?}")
            };
            return Err(format!(
                "{what}: every prompt of a dump must hold the same indices (from the same model)"
            ));
        }
        for (field, a, b) in [
            ("input_ids", p0.input_ids.is_some(), p.input_ids.is_some()),
            (
                "last_layer_output",
                p0.last_layer_output.is_some(),
                p.last_layer_output.is_some(),
            ),
            ("logits", p0.logits.is_some(), p.logits.is_some()),
        ] {
            if a != b {
                return Err(format!(
                    "p{} has {field} but p{} has not: every prompt of a dump holds the same tensors",
                    if a { 0 } else { k },
                    if a { k } else { 0 }
                ));
            }
        }
        let layers = |p: &DumpPrompt| -> String {
            let v: Vec<String> = p
                .routing
                .iter()
                .map(|(l, r)| format!("layer {l} top-{}", r.top_k))
                .collect();
            if v.is_empty() {
                "none".into()
            } else {
                v.join(", ")
            }
        };
        if layers(p) != layers(p0) {
            return Err(format!(
                "p{k} holds router choices at {} but p0 at {}: every prompt of a dump holds the same tensors",
                layers(p),
                layers(p0)
            ));
        }
    }
    Ok(())
}

/// Accepts `[T, X]` or `[1, T, X]` (a Python batch dim), returns f32 `[T, X]`;
/// T must equal `rows` when known (the prompt's ids or its first state), and sets it otherwise.
fn as_rows(t: Tensor, rows: &mut Option<usize>, name: &str, path: &Path) -> Result<Tensor> {
    let t = if t.rank() == 3 && t.dim(0)? == 1 {
        t.squeeze(0)?
    } else {
        t
    };
    let ok = t.rank() == 2 && rows.is_none_or(|r| t.dim(0).is_ok_and(|d| d == r));
    if !ok {
        return Err(Error::Format(format!(
            "{}: {name} has shape {:?}, expected [{}, _] to match {}",
            path.display(),
            t.dims(),
            rows.map(|r| r.to_string()).unwrap_or_else(|| "T".into()),
            if rows.is_some() {
                "the prompt's input_ids (or its first state)"
            } else {
                "[T, H]"
            }
        )));
    }
    if t.dim(0)? == 0 || t.dim(1)? == 0 {
        // Nothing would be compared, and an empty comparison is not parity.
        return Err(Error::Format(format!(
            "{}: {name} has shape {:?}: {}, so there is nothing to compare",
            path.display(),
            t.dims(),
            if t.dim(0)? == 0 {
                "an empty prompt (no tokens)"
            } else {
                "zero-width states"
            }
        )));
    }
    rows.get_or_insert(t.dim(0)?);
    Ok(t.to_dtype(DType::F32)?)
}
