//! Sharing between loading paths: which paths read a layer from the same
//! bytes in the same dtype (one loaded copy), and which inputs are bitwise
//! equal (one forward pass).

use std::sync::Arc;

use candle_core::Tensor;

use super::PathModel;
use crate::error::Result;
use crate::loading::WeightSource;
use crate::precision::Precision;

/// Loads one piece per path, sharing it between paths of the same group of
/// [`share_groups`] (same bytes, same dtype).
pub(super) fn load_shared<T>(
    paths: &[PathModel],
    groups: &[usize],
    load: impl Fn(&dyn WeightSource, Precision) -> Result<T>,
) -> Result<Vec<Arc<T>>> {
    let mut out: Vec<Arc<T>> = Vec::with_capacity(paths.len());
    for (p, path) in paths.iter().enumerate() {
        let piece = match groups[p] {
            g if g < p => out[g].clone(),
            _ => Arc::new(load(path.source, path.precision)?),
        };
        out.push(piece);
    }
    Ok(out)
}

/// Groups paths whose `names` resolve to the same bytes and compute in the
/// same dtype: `group[p]` is the first path with p's identity.
pub(super) fn share_groups(paths: &[PathModel], names: &[String]) -> Vec<usize> {
    let ids: Vec<(Precision, Vec<String>)> = paths
        .iter()
        .map(|p| {
            (
                p.precision,
                names.iter().map(|n| p.source.identity(n)).collect(),
            )
        })
        .collect();
    (0..paths.len())
        .map(|p| ids.iter().position(|x| *x == ids[p]).unwrap_or(p))
        .collect()
}

/// Stored bytes of `names` on one path (as the checkpoint holds them:
/// [`crate::loading::WeightSource::stored_bytes`]).
pub(super) fn tensor_bytes(path: &PathModel, names: &[String]) -> u64 {
    names
        .iter()
        .filter_map(|n| path.source.stored_bytes(n))
        .sum()
}

/// Stored bytes of `names` as read once per group (`groups`: [`share_groups`]).
pub(super) fn group_bytes(paths: &[PathModel], names: &[String], groups: &[usize]) -> u64 {
    paths
        .iter()
        .enumerate()
        .filter(|&(p, _)| groups[p] == p)
        .map(|(_, path)| tensor_bytes(path, names))
        .sum()
}

/// True when two tensors hold the same f32 values, bit for bit (at once when
/// they are the same tensor, as a shared path's state is).
pub(super) fn bitwise_equal(a: &Tensor, b: &Tensor) -> Result<bool> {
    if a.id() == b.id() {
        return Ok(true);
    }
    if a.dims() != b.dims() {
        return Ok(false);
    }
    let (a, b) = (a.flatten_all()?, b.flatten_all()?);
    let (va, vb) = (a.to_vec1::<f32>()?, b.to_vec1::<f32>()?);
    Ok(va.iter().zip(&vb).all(|(x, y)| x.to_bits() == y.to_bits()))
}

/// The first of `candidates` whose inputs are bitwise equal to `input`
/// (all tensors pairwise): a forward already run that can be reused, since
/// the same layer on the same input gives the same output.
pub(super) fn same_input<'a>(
    candidates: impl IntoIterator<Item = (usize, &'a [Tensor])>,
    input: &[Tensor],
) -> Result<Option<usize>> {
    for (q, other) in candidates {
        if other.len() != input.len() {
            continue;
        }
        let mut eq = true;
        for (a, b) in other.iter().zip(input) {
            if !bitwise_equal(a, b)? {
                eq = false;
                break;
            }
        }
        if eq {
            return Ok(Some(q));
        }
    }
    Ok(None)
}
