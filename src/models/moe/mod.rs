//! The sparse MoE block of `qwen3_5_moe` (`Qwen3_5MoeSparseMoeBlock`), as
//! transformers 5.23.0 computes it on CPU with its default experts
//! implementation, `grouped_mm` (`modeling_utils.py::get_correct_experts_implementation`).
//!
//! Sources: `models/qwen3_5_moe/modeling_qwen3_5_moe.py` — `Qwen3_5MoeTopKRouter.forward`,
//! `Qwen3_5MoeSparseMoeBlock.forward`, `Qwen3_5MoeMLP` (the shared expert) —
//! and `integrations/moe.py::grouped_mm_experts_forward`. Tensors are f32;
//! [`Precision`] rounds to the model dtype where PyTorch produces a bf16/f16
//! tensor, as in the rest of [`crate::models`]:
//!
//! 1. router logits `h · Wᵀ` in the model dtype ([`SparseMoeBlock::router_logits`]);
//! 2. `softmax(logits, dtype=float32)`, `topk` ([`topk_torch_cpu`]: ties
//!    resolved as torch on CPU), the top-k probabilities renormalised in f32
//!    (`v / v.sum()`, always: there is no `norm_topk_prob` switch), then cast
//!    to the model dtype ([`route`]);
//! 3. per expert, one GEMM over the tokens routed to it (`gate_up_proj[e]`,
//!    rounded), `silu(gate) · up` (each rounded), the down GEMM (rounded),
//!    times the token's routing weight (rounded); each token's `k` outputs
//!    summed in f32 in top-k slot order and rounded once
//!    (`weighted_out.view(T, k, H).sum(dim=1)`) ([`routed_experts`]);
//! 4. plus the shared expert `sigmoid(shared_expert_gate(h)) · shared_expert(h)`
//!    ([`SharedExpert`]), the sum rounded.
//!
//! Bitwise parity with torch holds where the kernels agree: the top-k choice
//! given the same logits (checked on tie-heavy rows), the renormalisation
//! (sequential f32 sum, checked) and the slot sum. torch's vectorised `exp`
//! (softmax, silu, sigmoid) and its GEMM blocking differ from candle's in the
//! last f32 bit, which shows as a rare 1-ulp difference in bf16
//! (`tests/moe_block.rs` states the measured tolerances).

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
use crate::loading::WeightSource;
use crate::models::layers::mlp::Mlp;
use crate::precision::Precision;

pub mod topk;

pub use topk::topk_torch_cpu;

/// `x · Wᵀ` (`nn.Linear`, no bias) for `x` `[T, in]`, `w` `[out, in]`,
/// accumulated in f32 and rounded once to `prec`.
fn linear(x: &Tensor, w: &Tensor, prec: Precision) -> Result<Tensor> {
    prec.round(&x.matmul(&w.t()?)?)
}

fn shape_err(what: &str, got: &[usize], want: &str) -> Error {
    Error::Checkpoint(format!(
        "{what} has shape {got:?}, expected {want} for the MoE block"
    ))
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
    for row in rows.chunks_exact(e.max(1)).take(t) {
        softmax_row(row, &mut probs);
        let idx = topk_torch_cpu(&probs, top_k);
        let sum = idx.iter().fold(0.0f32, |a, &i| a + probs[i]);
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

/// One routed expert's weights, rounded to the model dtype.
#[derive(Debug, Clone)]
pub struct ExpertWeights {
    /// `gate_up_proj[e]`: `[2I, H]`, gate rows `[0, I)`, up rows `[I, 2I)`.
    pub gate_up: Tensor,
    /// `down_proj[e]`: `[H, I]`.
    pub down: Tensor,
}

/// The routed experts of `grouped_mm_experts_forward` (`integrations/moe.py`):
/// `h` `[T, H]` → `[T, H]`. Experts are visited in ascending id order, and
/// `expert(e)` is called once for each expert some token routes to (a
/// streaming caller loads only those). Per expert: `x_e = h[tokens]`,
/// `gu = round(x_e · gate_upᵀ)`, `m = round(round(silu(gu[:, :I])) · gu[:, I:])`,
/// `o = round(m · downᵀ)`, `o · w` rounded per (token, slot); then per token
/// the `k` slot outputs summed in f32 in slot order and rounded once.
///
/// Errors: shapes that do not fit `h` ([`Error::Checkpoint`]), an expert id
/// of `routing` the callback refuses, candle errors.
pub fn routed_experts(
    h: &Tensor,
    routing: &Routing,
    prec: Precision,
    expert: &mut dyn FnMut(usize) -> Result<ExpertWeights>,
) -> Result<Tensor> {
    let (t, hid) = h.dims2()?;
    let k = routing.top_k;
    if routing.tokens() != t {
        return Err(Error::Input(format!(
            "routing covers {} tokens, hidden states have {t}",
            routing.tokens()
        )));
    }
    let dev = h.device();
    if t == 0 {
        return Ok(Tensor::zeros((0, hid), DType::F32, dev)?);
    }
    // Group the (token, slot) pairs by expert, tokens ascending within each
    // expert (the grouped GEMM's rows; a row's result does not depend on its
    // position in candle's GEMM).
    let mut by_expert: std::collections::BTreeMap<u32, Vec<(u32, usize)>> = Default::default();
    for (s, &e) in routing.indices.iter().enumerate() {
        by_expert
            .entry(e)
            .or_default()
            .push(((s / k) as u32, s % k));
    }
    let mut outs: Vec<Tensor> = Vec::with_capacity(by_expert.len());
    let mut row_of = vec![0u32; t * k]; // (token, slot) -> row in the concatenated outputs
    let mut row = 0u32;
    for (&e, pairs) in &by_expert {
        let w = expert(e as usize)?;
        let (i2, hh) = w.gate_up.dims2()?;
        if hh != hid || i2 % 2 != 0 || w.down.dims() != [hid, i2 / 2] {
            return Err(shape_err(
                &format!("expert {e}'s gate_up {:?} / down", w.gate_up.dims()),
                w.down.dims(),
                &format!("gate_up [2I, {hid}] and down [{hid}, I]"),
            ));
        }
        let inter = i2 / 2;
        let toks: Vec<u32> = pairs.iter().map(|p| p.0).collect();
        let idx = Tensor::from_slice(&toks, toks.len(), dev)?;
        let x = h.index_select(&idx, 0)?;
        let gu = linear(&x, &w.gate_up, prec)?;
        let g = prec.round(&gu.narrow(1, 0, inter)?.silu()?)?;
        let m = prec.round(&(g * gu.narrow(1, inter, inter)?)?)?;
        let o = linear(&m, &w.down, prec)?;
        let rw: Vec<f32> = pairs
            .iter()
            .map(|&(tok, slot)| routing.weights[tok as usize * k + slot])
            .collect();
        let rw = Tensor::from_slice(&rw, (rw.len(), 1), dev)?;
        outs.push(prec.round(&o.broadcast_mul(&rw)?)?);
        for &(tok, slot) in pairs {
            row_of[tok as usize * k + slot] = row;
            row += 1;
        }
    }
    let all = Tensor::cat(&outs, 0)?;
    let gather = Tensor::from_slice(&row_of, t * k, dev)?;
    let per_slot = all.index_select(&gather, 0)?.reshape((t, k, hid))?;
    let mut acc = per_slot.narrow(1, 0, 1)?.squeeze(1)?;
    for j in 1..k {
        acc = (acc + per_slot.narrow(1, j, 1)?.squeeze(1)?)?;
    }
    prec.round(&acc)
}

/// The shared expert and its gate: `sigmoid(shared_expert_gate(h)) ·
/// shared_expert(h)` (`Qwen3_5MoeSparseMoeBlock.forward`), each op rounded
/// to the model dtype.
#[derive(Debug, Clone)]
pub struct SharedExpert {
    mlp: Mlp,
    /// `shared_expert_gate.weight` `[1, H]`.
    gate: Tensor,
    prec: Precision,
}

impl SharedExpert {
    /// From the loaded SwiGLU `Qwen3_5MoeMLP` and `shared_expert_gate.weight`
    /// `[1, H]`, both rounded to `prec`.
    pub fn new(mlp: Mlp, gate: Tensor, prec: Precision) -> Self {
        Self { mlp, gate, prec }
    }

    /// `[T, H]` → `[T, H]`.
    pub fn forward(&self, h: &Tensor) -> Result<Tensor> {
        let p = self.prec;
        let s = linear(h, &self.gate, p)?;
        let s = p.round(&(s.neg()?.exp()? + 1.0)?.recip()?)?;
        p.round(&self.mlp.forward(h)?.broadcast_mul(&s)?)
    }
}

/// What [`SparseMoeBlock::forward`] computed, all `[T, …]` f32 on `h`'s device.
#[derive(Debug, Clone)]
pub struct MoeOutput {
    /// The block's output `[T, H]` (routed + shared, rounded).
    pub output: Tensor,
    /// The router's choice.
    pub routing: Routing,
    /// Router logits `[T, E]` in the model dtype.
    pub router_logits: Tensor,
    /// The routed experts' sum `[T, H]`.
    pub routed: Tensor,
    /// The gated shared expert `[T, H]`.
    pub shared: Tensor,
}

/// `Qwen3_5MoeSparseMoeBlock` with every expert resident.
#[derive(Debug, Clone)]
pub struct SparseMoeBlock {
    /// `gate.weight` `[E, H]`.
    router: Tensor,
    /// `experts.gate_up_proj` `[E, 2I, H]`.
    gate_up: Tensor,
    /// `experts.down_proj` `[E, H, I]`.
    down: Tensor,
    shared: SharedExpert,
    top_k: usize,
    prec: Precision,
}

impl SparseMoeBlock {
    /// From loaded tensors, rounded to `prec`: router `[E, H]`, `gate_up`
    /// `[E, 2I, H]`, `down` `[E, H, I]`, the shared expert's
    /// `gate_proj`/`up_proj` `[S, H]` and `down_proj` `[H, S]`, and
    /// `shared_expert_gate` `[1, H]`; `top_k` = `num_experts_per_tok`.
    ///
    /// Errors: inconsistent shapes ([`Error::Checkpoint`]), `top_k` not in
    /// `1..=E` ([`Error::Input`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        router: Tensor,
        gate_up: Tensor,
        down: Tensor,
        shared_gate_proj: Tensor,
        shared_up_proj: Tensor,
        shared_down_proj: Tensor,
        shared_expert_gate: Tensor,
        top_k: usize,
        prec: Precision,
    ) -> Result<Self> {
        let (e, h) = router
            .dims2()
            .map_err(|_| shape_err("gate.weight", router.dims(), "[E, H]"))?;
        let want_gu = |d: &[usize]| d.len() == 3 && d[0] == e && d[1] % 2 == 0 && d[2] == h;
        if !want_gu(gate_up.dims()) {
            return Err(shape_err(
                "experts.gate_up_proj",
                gate_up.dims(),
                &format!("[{e}, 2I, {h}]"),
            ));
        }
        let i = gate_up.dims()[1] / 2;
        if down.dims() != [e, h, i] {
            return Err(shape_err(
                "experts.down_proj",
                down.dims(),
                &format!("[{e}, {h}, {i}]"),
            ));
        }
        let s = shared_gate_proj.dims().first().copied().unwrap_or(0);
        for (what, t, want) in [
            ("shared_expert.gate_proj.weight", &shared_gate_proj, [s, h]),
            ("shared_expert.up_proj.weight", &shared_up_proj, [s, h]),
            ("shared_expert.down_proj.weight", &shared_down_proj, [h, s]),
            ("shared_expert_gate.weight", &shared_expert_gate, [1, h]),
        ] {
            if t.dims() != want {
                return Err(shape_err(what, t.dims(), &format!("{want:?}")));
            }
        }
        if top_k == 0 || top_k > e {
            return Err(Error::Input(format!(
                "num_experts_per_tok = {top_k} must be in 1..={e} (num_experts)"
            )));
        }
        let mlp = Mlp::new(shared_gate_proj, shared_up_proj, shared_down_proj, prec);
        Ok(Self {
            router,
            gate_up,
            down,
            shared: SharedExpert::new(mlp, shared_expert_gate, prec),
            top_k,
            prec,
        })
    }

    /// Loads `{prefix}.gate.weight`, `{prefix}.experts.gate_up_proj`,
    /// `{prefix}.experts.down_proj`, `{prefix}.shared_expert.{gate,up,down}_proj.weight`
    /// and `{prefix}.shared_expert_gate.weight` from `src` (names as the
    /// model sees them after the loading path's conversion, e.g.
    /// `prefix = "layers.0.mlp"`), rounded to `prec`.
    ///
    /// Errors: as [`WeightSource::tensor_in`] and [`Self::new`].
    pub fn load(
        src: &dyn WeightSource,
        prefix: &str,
        top_k: usize,
        prec: Precision,
    ) -> Result<Self> {
        let p = |s: &str| src.tensor_in(&format!("{prefix}.{s}"), prec);
        Self::new(
            p("gate.weight")?,
            p("experts.gate_up_proj")?,
            p("experts.down_proj")?,
            p("shared_expert.gate_proj.weight")?,
            p("shared_expert.up_proj.weight")?,
            p("shared_expert.down_proj.weight")?,
            p("shared_expert_gate.weight")?,
            top_k,
            prec,
        )
    }

    /// Number of experts `E`.
    pub fn num_experts(&self) -> usize {
        self.router.dims()[0]
    }

    /// `num_experts_per_tok`.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Router logits `[T, E]` = `h · gate.weightᵀ`, rounded to the model dtype.
    pub fn router_logits(&self, h: &Tensor) -> Result<Tensor> {
        linear(h, &self.router, self.prec)
    }

    /// `[T, H]` → the block's output and its parts.
    pub fn forward(&self, h: &Tensor) -> Result<MoeOutput> {
        let router_logits = self.router_logits(h)?;
        let routing = route(&router_logits, self.top_k, self.prec)?;
        let routed = routed_experts(h, &routing, self.prec, &mut |e| {
            Ok(ExpertWeights {
                gate_up: self.gate_up.get(e)?,
                down: self.down.get(e)?,
            })
        })?;
        let shared = self.shared.forward(h)?;
        let output = self.prec.round(&(&routed + &shared)?)?;
        Ok(MoeOutput {
            output,
            routing,
            router_logits,
            routed,
            shared,
        })
    }
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
}
