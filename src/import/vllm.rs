//! vLLM's `extract_hidden_states` speculative method with the
//! `ExampleHiddenStatesConnector` (vllm-project/vllm,
//! `vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py`):
//! one `safetensors.torch.save_file({"hidden_states", "token_ids"})` per request at
//! `{shared_storage_path}/{req_id}.safetensors`.
//!
//! `hidden_states` is `[T, L, H]` in current vLLM and `[L, T, H]` in the first
//! connector (`torch.stack(..., dim=0)`); the layout is told apart by which
//! axis has T = `token_ids.len()` rows (a note says which was found, and
//! `[T, L, H]` is assumed when T = L). `token_ids` are the prompt ids (prompt +
//! output minus the last with `include_output_tokens`).
//!
//! Aux id k (`eagle_aux_hidden_state_layer_ids`, given as
//! [`ImportOptions::layer_ids`]) is `hidden_states[k]`: vLLM's model loops call
//! `_maybe_add_hidden_state(.., 0, embeddings)` before the first layer and
//! `idx + 1` after layer idx with `hidden_states + residual`. Id N is therefore
//! the last layer's output *before* the final norm: it is imported as
//! [`StateIndex::LastLayerOutput`], never as `hidden_states[N]`, which is why
//! N ([`ImportOptions::num_layers`]) is required.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use safetensors::{Dtype, SafeTensors};

use super::{
    check_width, files_under, Format, ImportOptions, Imported, ImportedPrompt, IndexMapping,
    LayerMapping, StateIndex,
};
use crate::error::{Error, Result};

/// Some(true) when the file is a safetensors file with `hidden_states` and
/// `token_ids`, Some(false) for another safetensors file, None when unreadable.
pub fn looks_like(path: &Path) -> Result<Option<bool>> {
    let bytes = crate::input::read(path)?;
    Ok(match SafeTensors::read_metadata(&bytes) {
        Err(_) => None,
        Ok((_, meta)) => {
            let t = meta.tensors();
            Some(t.contains_key("hidden_states") && t.contains_key("token_ids"))
        }
    })
}

fn request_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = files_under(path, &|n| n.ends_with(".safetensors"))?;
    if files.is_empty() {
        return Err(Error::Input(format!(
            "{}: no {{req_id}}.safetensors files in this folder",
            path.display()
        )));
    }
    files.sort_by_key(|p| request_order(p));
    let numbers: Vec<u64> = files.iter().map(|p| request_order(p).0).collect();
    let numbered = numbers.iter().filter(|&&n| n != u64::MAX).count();
    let name = |i: usize| {
        files[i]
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    if numbered > 0 && numbered < files.len() {
        return Err(Error::Input(format!(
            "{}: request files numbered by vLLM's LLM (e.g. {}) beside others (e.g. {}): one capture run per folder, so that the order is the prompts'",
            path.display(),
            name(0),
            name(numbered)
        )));
    }
    if let Some(i) = (1..numbered).find(|&i| numbers[i] == numbers[i - 1]) {
        return Err(Error::Input(format!(
            "{}: two files of request {} ({} and {}): captures of two runs in one folder",
            path.display(),
            numbers[i],
            name(i - 1),
            name(i)
        )));
    }
    Ok(files)
}

/// Where a capture file sorts: by its request id's leading number, in
/// numeric order ("2" before "10"): `LLM` numbers its requests in
/// submission order (`vllm/entrypoints/llm.py`, `request_counter`) and vLLM
/// 0.32 appends a random suffix (`vllm/v1/engine/input_processor.py`:
/// `f"{external_req_id}-{random_uuid():.8}"`), so `10-aaba4a94` is the
/// eleventh prompt. Then by name; names that do not start with a number
/// come after them, by name.
fn request_order(p: &Path) -> (u64, PathBuf) {
    let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let lead = stem.split(['-', '_']).next().unwrap_or("");
    (lead.parse::<u64>().unwrap_or(u64::MAX), p.to_path_buf())
}

fn float_dtype(d: Dtype) -> Option<DType> {
    match d {
        Dtype::F32 => Some(DType::F32),
        Dtype::BF16 => Some(DType::BF16),
        Dtype::F16 => Some(DType::F16),
        Dtype::F64 => Some(DType::F64),
        _ => None,
    }
}

fn short(d: Dtype) -> String {
    match d {
        Dtype::F32 => "f32".into(),
        Dtype::BF16 => "bf16".into(),
        Dtype::F16 => "f16".into(),
        Dtype::F64 => "f64".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn ids_of(view: &safetensors::tensor::TensorView<'_>, what: &str) -> Result<Vec<i64>> {
    let b = view.data();
    Ok(match view.dtype() {
        Dtype::I64 => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect(),
        Dtype::I32 => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64)
            .collect(),
        other => {
            return Err(Error::Format(format!(
                "{what} has dtype {other:?}: token ids must be integers (I64)"
            )))
        }
    })
}

/// The layer ids and N, checked: given, non-empty, within `0..=N`, distinct.
fn checked_ids(path: &Path, opts: &ImportOptions) -> Result<(Vec<usize>, usize)> {
    let ids = opts.layer_ids.clone().ok_or_else(|| {
        Error::Input(format!(
            "{}: vLLM files do not record which layers they hold: pass the \
             eagle_aux_hidden_state_layer_ids of the run (--layer-ids)",
            path.display()
        ))
    })?;
    let n = opts.num_layers.ok_or_else(|| {
        Error::Input(format!(
            "{}: vLLM aux id N is the last layer's output before the final norm, not hidden_states[N]: \
             pass the target's number of layers (--num-layers or the checkpoint) so it lands right",
            path.display()
        ))
    })?;
    if ids.is_empty() {
        return Err(Error::Input(format!(
            "{}: the layer id list is empty",
            path.display()
        )));
    }
    if let Some(&bad) = ids.iter().find(|&&k| k > n) {
        return Err(Error::Input(format!(
            "{}: layer id {bad} does not exist in a {n}-layer target (vLLM ids run 0..={n})",
            path.display()
        )));
    }
    let mut dups = ids.clone();
    dups.sort();
    dups.dedup();
    if dups.len() != ids.len() {
        return Err(Error::Input(format!(
            "{}: layer ids {ids:?} repeat an id",
            path.display()
        )));
    }
    Ok((ids, n))
}

/// Where vLLM aux id `k` lands: `hidden_states[k]`, or the pre-norm last layer for `k = N`.
fn index_of(k: usize, n: usize) -> StateIndex {
    if k == n {
        StateIndex::LastLayerOutput
    } else {
        StateIndex::Hidden(k)
    }
}

/// The layouts seen: `[T, L, H]`, `[L, T, H]`, and files where T = L (taken as `[T, L, H]`).
#[derive(Default)]
struct Layouts {
    tlh: usize,
    lth: usize,
    ambiguous: usize,
    first_tlh: Option<bool>,
}

/// One request file: its prompt and stored dtype.
fn read_request(
    file: &Path,
    (ids, n): (&[usize], usize),
    opts: &ImportOptions,
    width: &mut Option<usize>,
    layouts: &mut Layouts,
) -> Result<(ImportedPrompt, String)> {
    let what = |k: &str| format!("{}: key `{k}`", file.display());
    let bytes = crate::input::read(file)?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| Error::Format(format!("{}: not a safetensors file: {e}", file.display())))?;
    let get = |k: &str| {
        st.tensor(k).map_err(|_| {
            let mut v = st.names();
            v.sort();
            Error::Format(format!(
                "{}: no `{k}` key (the connector writes hidden_states and token_ids); keys found: {v:?}",
                file.display()
            ))
        })
    };
    let tok = get("token_ids")?;
    let token_ids = ids_of(&tok, &what("token_ids"))?;
    if tok.shape().iter().filter(|&&d| d != 1).count() > 1 {
        return Err(Error::Format(format!(
            "{} has shape {:?}, expected [T]",
            what("token_ids"),
            tok.shape()
        )));
    }
    let hs = get("hidden_states")?;
    let Some(dt) = float_dtype(hs.dtype()) else {
        return Err(Error::Format(format!(
            "{} has dtype {:?}: hidden states must be floating point (BF16, F16 or F32)",
            what("hidden_states"),
            hs.dtype()
        )));
    };
    let shape = hs.shape().to_vec();
    let (t, l) = (token_ids.len(), ids.len());
    if shape.len() != 3 {
        return Err(Error::Format(format!(
            "{} has shape {shape:?}, expected [T, L, H] (or the older [L, T, H])",
            what("hidden_states")
        )));
    }
    let tensor = super::stored_to_f32(
        Tensor::from_raw_buffer(hs.data(), dt, &shape, &Device::Cpu)?,
        &what("hidden_states"),
    )?;
    // [T, L, H] (current) or [L, T, H] (the first connector)
    let tlh = if shape[0] == t && shape[1] == l {
        if t == l {
            layouts.ambiguous += 1;
        } else {
            layouts.tlh += 1;
        }
        true
    } else if shape[0] == l && shape[1] == t {
        layouts.lth += 1;
        false
    } else {
        return Err(Error::Format(format!(
            "{} has shape {shape:?}: with {t} token_ids and the {l} layer ids {ids:?} it should be \
             [{t}, {l}, H] (or the older [{l}, {t}, H]); the layer id list does not match the file",
            what("hidden_states")
        )));
    };
    check_width(shape[2], opts, width, &what("hidden_states"))?;
    layouts.first_tlh.get_or_insert(tlh);
    let mut prompt = ImportedPrompt {
        source: file.to_path_buf(),
        input_ids: token_ids,
        loss_mask: None,
        hidden_states: Default::default(),
        last_layer_output: None,
        position_ids: None,
        prompt_length: None,
    };
    for (j, &k) in ids.iter().enumerate() {
        let s = if tlh {
            tensor.narrow(1, j, 1)?.squeeze(1)?
        } else {
            tensor.get(j)?
        };
        prompt.insert(index_of(k, n), s.contiguous()?);
    }
    Ok((prompt, short(hs.dtype())))
}

/// Reads one request file or every `*.safetensors` under a folder (prompts in request-id order).
pub fn read(path: &Path, opts: &ImportOptions) -> Result<Imported> {
    let (ids, n) = checked_ids(path, opts)?;
    let files = request_files(path)?;
    let mut width = None;
    let mut prompts = Vec::new();
    let mut notes = Vec::new();
    let mut dtype = String::new();
    let mut layouts = Layouts::default();
    for file in &files {
        let (prompt, dt) = read_request(file, (&ids, n), opts, &mut width, &mut layouts)?;
        if dtype.is_empty() {
            dtype = dt;
        } else if dt != dtype {
            return Err(Error::Format(format!(
                "{}: stores {dt}, {} stores {dtype}: requests of one capture share a dtype (a dump records one)",
                file.display(),
                files[0].display()
            )));
        }
        prompts.push(prompt);
    }
    let layers = ids
        .iter()
        .enumerate()
        .map(|(j, &k)| LayerMapping {
            stored_as: if layouts.first_tlh == Some(false) {
                format!("hidden_states[{j}]")
            } else {
                format!("hidden_states[:, {j}]")
            },
            engine_id: Some(k),
            index: index_of(k, n),
        })
        .collect();
    if layouts.lth > 0 {
        notes.push(format!(
            "{} file(s) in the older [L, T, H] layout (first ExampleHiddenStatesConnector), read as such",
            layouts.lth
        ));
    }
    if layouts.ambiguous > 0 {
        notes.push(format!(
            "{} file(s) with T = L = {}: layout taken as the current [T, L, H]",
            layouts.ambiguous,
            ids.len()
        ));
    }
    if ids.contains(&n) {
        notes.push(format!(
            "layer id {n} = N: the last layer's raw output before the final norm, imported as last_layer_output"
        ));
    }
    Ok(Imported {
        format: Format::Vllm,
        path: path.to_path_buf(),
        mapping: IndexMapping {
            format: Format::Vllm,
            convention: Format::Vllm.convention().into(),
            layers,
        },
        prompts,
        hidden_size: width.unwrap_or(0),
        num_layers: Some(n),
        stored_dtype: dtype,
        trimmed: Vec::new(),
        notes,
    })
}
