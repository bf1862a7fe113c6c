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

/// `(layer, field)` of a prompt field `router.{l}.{field}`: `l` a layer
/// number written as a number is (`1`, not `01` or `+1`), `field` one of
/// `indices`, `weights`, `logits`.
pub(super) fn router_field(field: &str) -> Option<(usize, &str)> {
    let (l, what) = field.strip_prefix("router.")?.split_once('.')?;
    let n: usize = l.parse().ok()?;
    (n.to_string() == l && ["indices", "weights", "logits"].contains(&what)).then_some((n, what))
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
/// Errors ([`Error::Format`]): a `p{k}.router.*` key that is not
/// `router.{l}.{indices,weights,logits}`; indices that are not integers or
/// not `[T, k]` (a leading batch dimension of 1 aside) with `k ≥ 1`,
/// negative, beyond `u32`, or naming one expert twice for a token; weights
/// that are not floats, of another shape than their indices, or without
/// indices.
pub(super) fn read(
    all: &mut HashMap<String, Tensor>,
    k: usize,
    rows: Option<usize>,
    path: &Path,
) -> Result<BTreeMap<usize, Routing>> {
    let bad = |m: String| Error::Format(format!("{}: {m}", path.display()));
    let prefix = format!("p{k}.");
    let mut layers = BTreeSet::new();
    for n in all.keys() {
        let Some(field) = n.strip_prefix(&prefix).filter(|f| f.starts_with("router.")) else {
            continue;
        };
        match router_field(field) {
            Some((l, _)) => layers.insert(l),
            None => {
                return Err(bad(format!(
                    "{n}: router choices are p{k}.router.{{layer}}.indices / .weights (docs/dump-format.md)"
                )))
            }
        };
    }
    let mut out = BTreeMap::new();
    for l in layers {
        let name = |f: &str| format!("p{k}.router.{l}.{f}");
        all.remove(&name("logits"));
        let weights = all.remove(&name("weights")).map(unbatched).transpose()?;
        let Some(ids) = all.remove(&name("indices")).map(unbatched).transpose()? else {
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
        if let Some(t) = (0..t).find(|&t| {
            let row = &indices[t * top_k..(t + 1) * top_k];
            row.iter().enumerate().any(|(j, e)| row[..j].contains(e))
        }) {
            return Err(bad(format!(
                "{} names one expert twice for token {t}: a router's top-k are k different experts",
                name("indices")
            )));
        }
        let weights = match weights {
            Some(w) if w.dims() == ids.dims() && w.dtype().is_float() => {
                w.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?
            }
            Some(w) => {
                return Err(bad(format!(
                "{} is {:?} {:?} but {} is {:?}: routing weights are floats of the indices' shape",
                name("weights"),
                w.dtype(),
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

/// `[1, T, k]` (a Python batch dimension) as `[T, k]`; anything else as is.
fn unbatched(t: Tensor) -> Result<Tensor> {
    Ok(if t.rank() == 3 && t.dim(0)? == 1 {
        t.squeeze(0)?
    } else {
        t
    })
}

/// Every router layer below `num_layers`, every expert id below
/// `num_experts` and every top-k equal to `top_k` (the dump's metadata,
/// when it gives them).
///
/// Errors: the first that is not, as a message.
pub(super) fn check_bounds(
    prompts: &[super::DumpPrompt],
    num_layers: Option<usize>,
    (num_experts, top_k): (Option<usize>, Option<usize>),
) -> std::result::Result<(), String> {
    for (k, p) in prompts.iter().enumerate() {
        if let (Some(n), Some(&l)) = (num_layers, p.routing.keys().next_back()) {
            if l >= n {
                return Err(format!(
                    "p{k}.router.{l}: the dump holds a {n}-layer model's states (layers 0..{n})"
                ));
            }
        }
        for (l, r) in &p.routing {
            if let Some(want) = top_k.filter(|&want| want != r.top_k) {
                return Err(format!(
                    "p{k}.router.{l}.indices holds top-{} choices, but __metadata__ top_k is {want}",
                    r.top_k
                ));
            }
            if let (Some(e), Some(&id)) = (num_experts, r.indices.iter().max()) {
                if id as usize >= e {
                    return Err(format!(
                        "p{k}.router.{l}.indices names expert {id}, but __metadata__ num_experts is {e}"
                    ));
                }
            }
        }
    }
    Ok(())
}
