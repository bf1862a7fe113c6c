//! The router of the sparse MoE block (`Qwen3_5MoeTopKRouter.forward`):
//! softmax, top-k with torch's CPU tie order, renormalisation and the cast to
//! the model dtype, as transformers 5.23.0 computes them
//! (`models/qwen3_5_moe/modeling_qwen3_5_moe.py`); the choice it makes
//! ([`Routing`]) and how two choices are compared.

use candle_core::{DType, Device, Tensor};

use super::topk::topk_torch_cpu;
use crate::error::{Error, Result};
use crate::precision::Precision;

/// Where the router takes its softmax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RouterSoftmax {
    /// `softmax(logits, dtype=torch.float)`: transformers' router (f32
    /// probabilities, top-k, f32 renormalisation, then the cast).
    #[default]
    F32,
    /// `softmax(logits)` in the model dtype (the `router-dtype` triage
    /// suspect: an eval harness or a port that drops `dtype=torch.float`):
    /// probabilities rounded to the model dtype, top-k on them, their sum and
    /// the division rounded to it too.
    ModelDtype,
}

/// The router's choice for `T` tokens: `top_k` experts per token in
/// `torch.topk` order (descending probability; ties as torch on CPU) and
/// their routing weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// `k`.
    pub top_k: usize,
    /// `[T · k]` expert ids, token-major (token `t`'s slots at `t·k .. t·k+k`).
    pub indices: Vec<u32>,
    /// `[T · k]` routing weights: renormalised in f32, rounded to the model
    /// dtype (f32 storage), aligned with `indices`.
    pub weights: Vec<f32>,
}

impl Routing {
    /// Number of tokens `T`.
    pub fn tokens(&self) -> usize {
        self.indices.len().checked_div(self.top_k).unwrap_or(0)
    }

    /// Token `t`'s expert ids and weights, in slot order.
    pub fn token(&self, t: usize) -> (&[u32], &[f32]) {
        let r = t * self.top_k..(t + 1) * self.top_k;
        (&self.indices[r.clone()], &self.weights[r])
    }

    /// The experts at least one token routes to, ascending (the ones a
    /// streaming forward has to load).
    pub fn experts_used(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.indices.iter().map(|&e| e as usize).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// token × slot choices that differ from `other` (same `T` and `k`):
    /// the per-layer routing agreement between two loading paths.
    ///
    /// Errors: different `T` or `k` ([`Error::Input`]).
    pub fn slots_differing(&self, other: &Routing) -> Result<usize> {
        if self.top_k != other.top_k || self.indices.len() != other.indices.len() {
            return Err(Error::Input(format!(
                "routings of {} tokens × top-{} and {} tokens × top-{} cannot be compared",
                self.tokens(),
                self.top_k,
                other.tokens(),
                other.top_k
            )));
        }
        Ok(self
            .indices
            .iter()
            .zip(&other.indices)
            .filter(|(a, b)| a != b)
            .count())
    }

    /// Tokens whose *set* of experts differs from `other`'s (slot order aside).
    ///
    /// Errors: as [`Self::slots_differing`].
    pub fn tokens_with_other_experts(&self, other: &Routing) -> Result<usize> {
        self.slots_differing(other)?;
        Ok((0..self.tokens())
            .filter(|&t| {
                let (mut a, mut b) = (self.token(t).0.to_vec(), other.token(t).0.to_vec());
                a.sort_unstable();
                b.sort_unstable();
                a != b
            })
            .count())
    }

    /// `[T, k]` u32 tensor of the expert ids on `device`.
    pub fn indices_tensor(&self, device: &Device) -> Result<Tensor> {
        Ok(Tensor::from_slice(
            &self.indices,
            (self.tokens(), self.top_k),
            device,
        )?)
    }
}

/// `softmax(x, dtype=float32)` of one row: `exp(x - max) · (1 / Σ exp)`, the
/// sum in index order (torch's `_vec_softmax_lastdim` structure; its
/// vectorised `exp` and lane-wise sum can differ in the last f32 bit).
fn softmax_row(x: &[f32], out: &mut Vec<f32>) {
    out.clear();
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    out.extend(x.iter().map(|&v| (v - m).exp()));
    let s: f32 = out.iter().fold(0.0, |a, &b| a + b);
    let r = 1.0 / s;
    out.iter_mut().for_each(|v| *v *= r);
}

/// `Qwen3_5MoeTopKRouter.forward` from its logits: `logits` `[T, E]` (values
/// in the model dtype, f32 storage) → per token the `top_k` experts of
/// `softmax(logits, dtype=float32)` in [`topk_torch_cpu`] order, their
/// probabilities divided by their f32 sum (taken in slot order, as torch's
/// `sum(dim=-1)` over `k` values does) and rounded to `prec`.
///
/// Errors: `logits` not 2-D or `top_k` not in `1..=E` ([`Error::Input`]).
pub fn route(logits: &Tensor, top_k: usize, prec: Precision) -> Result<Routing> {
    route_with(logits, top_k, prec, RouterSoftmax::F32)
}

/// [`route`] with the softmax taken as `softmax` says: with
/// [`RouterSoftmax::ModelDtype`] the probabilities are rounded to `prec`
/// before the top-k (torch computes a half softmax in f32 and rounds its
/// output), their sum over the `k` slots is rounded, and so is each
/// quotient. In f32 both give the same routing.
///
/// Errors: as [`route`].
pub fn route_with(
    logits: &Tensor,
    top_k: usize,
    prec: Precision,
    softmax: RouterSoftmax,
) -> Result<Routing> {
    let (t, e) = logits.dims2().map_err(|_| {
        Error::Input(format!(
            "router logits have shape {:?}, expected [T, E]",
            logits.dims()
        ))
    })?;
    if top_k == 0 || top_k > e {
        return Err(Error::Input(format!(
            "num_experts_per_tok = {top_k} must be in 1..={e} (num_experts)"
        )));
    }
    let rows = logits
        .to_dtype(DType::F32)?
        .to_device(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let mut indices = Vec::with_capacity(t * top_k);
    let mut weights = Vec::with_capacity(t * top_k);
    let mut probs = Vec::with_capacity(e);
    let half = softmax == RouterSoftmax::ModelDtype;
    for row in rows.chunks_exact(e.max(1)).take(t) {
        softmax_row(row, &mut probs);
        if half {
            probs.iter_mut().for_each(|p| *p = prec.round_f32(*p));
        }
        let idx = topk_torch_cpu(&probs, top_k);
        let mut sum = idx.iter().fold(0.0f32, |a, &i| a + probs[i]);
        if half {
            sum = prec.round_f32(sum);
        }
        for &i in &idx {
            indices.push(i as u32);
            weights.push(prec.round_f32(probs[i] / sum));
        }
    }
    Ok(Routing {
        top_k,
        indices,
        weights,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_renormalises_and_rounds() {
        let logits = Tensor::new(&[[1.0f32, 2.0, 3.0, 0.5]], &Device::Cpu).unwrap();
        let r = route(&logits, 2, Precision::F32).unwrap();
        assert_eq!(r.indices, [2, 1]);
        let (a, b) = (1f32.exp(), 2f32.exp());
        let want = b / (a + b); // e^3 / (e^3 + e^2) = e / (1 + e)
        assert!(
            (r.weights[0] - want).abs() < 1e-6 && (r.weights[0] + r.weights[1] - 1.0).abs() < 1e-6
        );
        let rb = route(&logits, 2, Precision::Bf16).unwrap();
        assert_eq!(rb.weights[0], Precision::Bf16.round_f32(r.weights[0]));
        assert!(route(&logits, 5, Precision::F32).is_err());
    }

    #[test]
    fn model_dtype_softmax_rounds_the_probabilities() {
        let x = [1.0f32, 2.0, 3.0, 0.5];
        let logits = Tensor::new(&[x], &Device::Cpu).unwrap();
        let f = route_with(&logits, 2, Precision::F32, RouterSoftmax::ModelDtype).unwrap();
        assert_eq!(f, route(&logits, 2, Precision::F32).unwrap());
        let b = route_with(&logits, 2, Precision::Bf16, RouterSoftmax::ModelDtype).unwrap();
        assert_eq!(b.indices, [2, 1]);
        let mut p = Vec::new();
        softmax_row(&x, &mut p);
        let r = |v: f32| Precision::Bf16.round_f32(v);
        let (p2, p1) = (r(p[2]), r(p[1]));
        let sum = r(p2 + p1);
        assert_eq!(b.weights, [r(p2 / sum), r(p1 / sum)]);
    }
}
