//! Dump files: hidden states of one loading path in safetensors, the format of
//! `hsparity.dump.v1` (README, "Dump format"), readable and writable from Python with
//! `safetensors.torch`.
//!
//! Keys for prompt `k`: `p{k}.input_ids` (I64 `[T]`), `p{k}.hidden_states.{i}`
//! (F32 `[T, H]`, i = 0..=N, transformers' `output_hidden_states` entries, the
//! last one final-normed), `p{k}.last_layer_output` (F32 `[T, H]`, raw output of
//! the last decoder layer) and `p{k}.logits` (F32 `[T, V]`, paths with an LM
//! head). `__metadata__` holds `format`, `checkpoint`, `loading_path`, `class`,
//! `dtype`, `num_layers`, `tool_version`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

/// The `format` metadata value of a dump.
pub const FORMAT: &str = "hsparity.dump.v1";

/// Captured tensors for one prompt.
#[derive(Debug, Clone)]
pub struct DumpPrompt {
    /// `[T]` token ids.
    pub input_ids: Vec<i64>,
    /// N+1 entries of `[T, H]` f32.
    pub hidden_states: Vec<Tensor>,
    /// `[T, H]` f32, when recorded.
    pub last_layer_output: Option<Tensor>,
    /// `[T, V]` f32, when recorded.
    pub logits: Option<Tensor>,
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

impl Dump {
    /// Serialises to safetensors bytes (tensors as F32, ids as I64).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        for (k, p) in self.prompts.iter().enumerate() {
            let ids = Tensor::from_slice(&p.input_ids, p.input_ids.len(), &Device::Cpu)?;
            tensors.push((format!("p{k}.input_ids"), ids));
            for (i, h) in p.hidden_states.iter().enumerate() {
                tensors.push((format!("p{k}.hidden_states.{i}"), host_f32(h)?));
            }
            if let Some(t) = &p.last_layer_output {
                tensors.push((format!("p{k}.last_layer_output"), host_f32(t)?));
            }
            if let Some(t) = &p.logits {
                tensors.push((format!("p{k}.logits"), host_f32(t)?));
            }
        }
        let meta: HashMap<String, String> = self.metadata.clone().into_iter().collect();
        let views = tensors.iter().map(|(n, t)| (n.as_str(), t));
        safetensors::serialize(views, Some(meta))
            .map_err(|e| Error::Format(format!("serialising dump: {e}")))
    }

    /// Writes the dump atomically to `path` (see [`crate::output::write_atomic`]).
    pub fn write(&self, path: &Path, force: bool) -> Result<()> {
        crate::output::write_atomic(path, &self.to_bytes()?, force)
    }

    /// Reads a dump written by hsparity or by Python. Errors ([`Error::Format`]):
    /// not a safetensors file, no `p0.input_ids`, a prompt without
    /// `hidden_states.0`, a gap in the hidden-state indices, or a tensor whose
    /// shape disagrees with its `input_ids`.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
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
            let Some(ids) = all.remove(&format!("p{k}.input_ids")) else {
                break;
            };
            if ids.dtype().is_float() {
                return Err(bad(format!(
                    "p{k}.input_ids has dtype {:?}: token ids must be integers (I64)",
                    ids.dtype()
                )));
            }
            let input_ids = ids.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?;
            let t = input_ids.len();
            let mut hidden_states = Vec::new();
            for i in 0.. {
                match all.remove(&format!("p{k}.hidden_states.{i}")) {
                    Some(h) => {
                        hidden_states.push(as_rows(h, t, &format!("p{k}.hidden_states.{i}"), path)?)
                    }
                    None => break,
                }
            }
            if hidden_states.is_empty() {
                return Err(bad(format!(
                    "p{k} has input_ids but no p{k}.hidden_states.0"
                )));
            }
            let last_layer_output = all
                .remove(&format!("p{k}.last_layer_output"))
                .map(|h| as_rows(h, t, &format!("p{k}.last_layer_output"), path))
                .transpose()?;
            let logits = all
                .remove(&format!("p{k}.logits"))
                .map(|h| as_rows(h, t, &format!("p{k}.logits"), path))
                .transpose()?;
            prompts.push(DumpPrompt {
                input_ids,
                hidden_states,
                last_layer_output,
                logits,
            });
        }
        if prompts.is_empty() {
            return Err(bad(
                "no p0.input_ids: not an hsparity dump (hsparity.dump.v1: p{k}.input_ids and p{k}.hidden_states.{i}; see the README's dump format)".into(),
            ));
        }
        let n0 = prompts[0].hidden_states.len();
        if let Some((k, p)) = prompts
            .iter()
            .enumerate()
            .find(|(_, p)| p.hidden_states.len() != n0)
        {
            return Err(bad(format!(
                "p{k} has {} hidden states but p0 has {n0}: every prompt of a dump must come from the same model",
                p.hidden_states.len()
            )));
        }
        if let Some(stray) = all.keys().find(|n| n.contains("hidden_states.")) {
            return Err(bad(format!(
                "{stray} does not follow a contiguous p{{k}}.hidden_states.{{i}} sequence"
            )));
        }
        Ok(Dump { metadata, prompts })
    }
}

/// Accepts `[T, X]` or `[1, T, X]` (a Python batch dim), returns f32 `[T, X]`.
fn as_rows(t: Tensor, rows: usize, name: &str, path: &Path) -> Result<Tensor> {
    let t = if t.rank() == 3 && t.dim(0)? == 1 {
        t.squeeze(0)?
    } else {
        t
    };
    if t.rank() != 2 || t.dim(0)? != rows {
        return Err(Error::Format(format!(
            "{}: {name} has shape {:?}, expected [{rows}, _] to match input_ids",
            path.display(),
            t.dims()
        )));
    }
    Ok(t.to_dtype(DType::F32)?)
}
