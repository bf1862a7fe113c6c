//! A dump's MoE router choices: `p{k}.router.{l}.indices` (I64 `[T, k]`, the
//! experts of decoder layer `l` in `torch.topk` order) and
//! `p{k}.router.{l}.weights` (F32 `[T, k]`, their routing weights), as
//! `Qwen3_5MoeTopKRouter.forward` returns them (`router_indices`,
//! `router_scores`) in transformers 5.23.0. A `p{k}.router.{l}.logits`
//! tensor (the router's logits, which transformers' fixtures record too) is
//! read past.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
use crate::models::moe::Routing;

/// `(layer, field)` of a prompt field `router.{l}.{field}`.
pub(super) fn router_field(field: &str) -> Option<(usize, &str)> {
    let (l, what) = field.strip_prefix("router.")?.split_once('.')?;
    let l = l.parse().ok()?;
    ["indices", "weights", "logits"]
        .contains(&what)
        .then_some((l, what))
}

/// Prompt `k`'s router tensors as tensors to write.
pub(super) fn to_tensors(
    k: usize,
    routing: &BTreeMap<usize, Routing>,
) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::new();
    for (l, r) in routing {
        let shape = (r.tokens(), r.top_k);
        let ids: Vec<i64> = r.indices.iter().map(|&e| i64::from(e)).collect();
        out.push((
            format!("p{k}.router.{l}.indices"),
            Tensor::from_vec(ids, shape, &Device::Cpu)?,
        ));
        if !r.weights.iter().all(|w| w.is_nan()) {
            out.push((
                format!("p{k}.router.{l}.weights"),
                Tensor::from_slice(&r.weights, shape, &Device::Cpu)?,
            ));
        }
    }
    Ok(out)
}

/// Removes prompt `k`'s router tensors from `all` and returns its choices by
/// layer; `rows` is the prompt's token count when known.
///
/// Errors ([`Error::Format`]): indices that are not integers or not
/// `[T, k]` with `k ≥ 1`, negative or beyond `u32`; weights of another shape
/// than their indices, or without indices.
pub(super) fn read(
    all: &mut HashMap<String, Tensor>,
    k: usize,
    rows: Option<usize>,
    path: &Path,
) -> Result<BTreeMap<usize, Routing>> {
    let bad = |m: String| Error::Format(format!("{}: {m}", path.display()));
    let prefix = format!("p{k}.");
    let layers: BTreeSet<usize> = all
        .keys()
        .filter_map(|n| router_field(n.strip_prefix(&prefix)?))
        .map(|(l, _)| l)
        .collect();
    let mut out = BTreeMap::new();
    for l in layers {
        let name = |f: &str| format!("p{k}.router.{l}.{f}");
        all.remove(&name("logits"));
        let weights = all.remove(&name("weights"));
        let Some(ids) = all.remove(&name("indices")) else {
            if weights.is_some() {
                return Err(bad(format!(
                    "{} without {}: the weights need their experts",
                    name("weights"),
                    name("indices")
                )));
            }
            continue;
        };
        let (t, top_k) = match *ids.dims() {
            [t, top_k] if top_k >= 1 && !ids.dtype().is_float() => (t, top_k),
            _ => {
                return Err(bad(format!(
                    "{} is {:?} {:?}: router indices are integers [T, k] (I64)",
                    name("indices"),
                    ids.dtype(),
                    ids.dims()
                )))
            }
        };
        if let Some(r) = rows.filter(|&r| r != t) {
            return Err(bad(format!(
                "{} has {t} rows, the prompt {r}",
                name("indices")
            )));
        }
        let indices = ids
            .to_dtype(DType::I64)?
            .flatten_all()?
            .to_vec1::<i64>()?
            .into_iter()
            .map(|e| u32::try_from(e).ok())
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| {
                bad(format!(
                    "{} holds an expert id outside 0..2^32",
                    name("indices")
                ))
            })?;
        let weights = match weights {
            Some(w) if w.dims() == ids.dims() => {
                w.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?
            }
            Some(w) => {
                return Err(bad(format!(
                    "{} is {:?} but {} is {:?}",
                    name("weights"),
                    w.dims(),
                    name("indices"),
                    ids.dims()
                )))
            }
            None => vec![f32::NAN; indices.len()],
        };
        out.insert(
            l,
            Routing {
                top_k,
                indices,
                weights,
            },
        );
    }
    Ok(out)
}
