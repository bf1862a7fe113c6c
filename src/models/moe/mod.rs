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
//! Streaming: a block loaded from a checkpoint ([`SparseMoeBlock::load`])
//! holds its router and shared expert and reads each routed expert from the
//! mapped checkpoint only when a token first routes to it (one expert's
//! bytes: a row of a fused `[E, …]` tensor, or its per-expert keys), widened
//! and rounded once, then kept while the block lives; experts no token picks
//! are never converted.
//!
//! Bitwise parity with torch holds where the kernels agree: the top-k choice
//! given the same logits (checked on tie-heavy rows), the renormalisation
//! (sequential f32 sum, checked) and the slot sum. torch's vectorised `exp`
//! (softmax, silu, sigmoid) and its GEMM blocking differ from candle's in the
//! last f32 bit, which shows as a rare 1-ulp difference in bf16
//! (`tests/moe_block.rs` states the measured tolerances).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Tensor};

use crate::error::{Error, Result};
use crate::loading::WeightSource;
use crate::models::layers::linear_rounded;
use crate::models::layers::mlp::Mlp;
use crate::precision::{Precision, ProductRounding};

pub mod router;
pub mod topk;

pub use router::{route, route_with, RouterSoftmax, Routing};
pub use topk::topk_torch_cpu;

fn shape_err(what: &str, got: &[usize], want: &str) -> Error {
    Error::Checkpoint(format!(
        "{what} has shape {got:?}, expected {want} for the MoE block"
    ))
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
    (prec, rounding): (Precision, ProductRounding),
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
        let gu = linear_rounded(&x, &w.gate_up, prec, rounding)?;
        let g = prec.round(&gu.narrow(1, 0, inter)?.silu()?)?;
        let m = prec.round(&(g * gu.narrow(1, inter, inter)?)?)?;
        let o = linear_rounded(&m, &w.down, prec, rounding)?;
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
    rounding: ProductRounding,
}

impl SharedExpert {
    /// From the loaded SwiGLU `Qwen3_5MoeMLP` and `shared_expert_gate.weight`
    /// `[1, H]`, both rounded to `prec`.
    pub fn new(mlp: Mlp, gate: Tensor, prec: Precision) -> Self {
        Self {
            mlp,
            gate,
            prec,
            rounding: ProductRounding::Nearest,
        }
    }

    /// `[T, H]` → `[T, H]`.
    pub fn forward(&self, h: &Tensor) -> Result<Tensor> {
        let p = self.prec;
        let s = linear_rounded(h, &self.gate, p, self.rounding)?;
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

/// A shared, lazily filled cache of widened experts (expert id → weights).
type ExpertCache = Arc<Mutex<BTreeMap<usize, ExpertWeights>>>;

/// Where a block's routed experts come from.
#[derive(Clone)]
enum ExpertStore {
    /// Every expert resident: `gate_up_proj` `[E, 2I, H]`, `down_proj` `[E, H, I]`.
    Resident { gate_up: Tensor, down: Tensor },
    /// Read from the source when a token first routes to them, one expert at
    /// a time (its bytes only), widened and rounded once, kept while the
    /// block lives (cloned blocks share the cache).
    Lazy {
        src: Arc<dyn WeightSource + Send + Sync>,
        gate_up: String,
        down: String,
        cache: ExpertCache,
    },
}

impl std::fmt::Debug for ExpertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExpertStore::Resident { gate_up, down } => f
                .debug_struct("Resident")
                .field("gate_up", &gate_up.dims())
                .field("down", &down.dims())
                .finish(),
            ExpertStore::Lazy { gate_up, cache, .. } => f
                .debug_struct("Lazy")
                .field("gate_up", gate_up)
                .field("widened", &cache.lock().map(|c| c.len()).unwrap_or(0))
                .finish(),
        }
    }
}

/// `Qwen3_5MoeSparseMoeBlock`: router, routed experts (resident, or read
/// lazily so that only the experts some token routes to are widened), and
/// the gated shared expert.
#[derive(Debug, Clone)]
pub struct SparseMoeBlock {
    /// `gate.weight` `[E, H]`.
    router: Tensor,
    experts: ExpertStore,
    /// `[E, 2I, H]` of the experts.
    experts_shape: [usize; 3],
    shared: SharedExpert,
    top_k: usize,
    prec: Precision,
    softmax: RouterSoftmax,
    /// How its products' f32 sums are rounded (the source's,
    /// [`WeightSource::product_rounding`]).
    rounding: ProductRounding,
}

/// Checks the router, the experts' `[E, 2I, H]` / `[E, H, I]` and the shared
/// expert's shapes against each other and `top_k`; returns `[E, 2I, H]`.
fn check_block(
    router: &Tensor,
    gate_up: &[usize],
    down: &[usize],
    shared: [&Tensor; 4],
    top_k: usize,
) -> Result<[usize; 3]> {
    let (e, h) = router
        .dims2()
        .map_err(|_| shape_err("gate.weight", router.dims(), "[E, H]"))?;
    if !(gate_up.len() == 3 && gate_up[0] == e && gate_up[1].is_multiple_of(2) && gate_up[2] == h) {
        return Err(shape_err(
            "experts.gate_up_proj",
            gate_up,
            &format!("[{e}, 2I, {h}]"),
        ));
    }
    let i = gate_up[1] / 2;
    if down != [e, h, i] {
        return Err(shape_err(
            "experts.down_proj",
            down,
            &format!("[{e}, {h}, {i}]"),
        ));
    }
    let s = shared[0].dims().first().copied().unwrap_or(0);
    for (what, t, want) in [
        ("shared_expert.gate_proj.weight", shared[0], [s, h]),
        ("shared_expert.up_proj.weight", shared[1], [s, h]),
        ("shared_expert.down_proj.weight", shared[2], [h, s]),
        ("shared_expert_gate.weight", shared[3], [1, h]),
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
    Ok([e, 2 * i, h])
}

impl SparseMoeBlock {
    /// From loaded tensors, rounded to `prec`, every expert resident: router
    /// `[E, H]`, `gate_up` `[E, 2I, H]`, `down` `[E, H, I]`, the shared
    /// expert's `gate_proj`/`up_proj` `[S, H]` and `down_proj` `[H, S]`, and
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
        let shared = [
            &shared_gate_proj,
            &shared_up_proj,
            &shared_down_proj,
            &shared_expert_gate,
        ];
        let experts_shape = check_block(&router, gate_up.dims(), down.dims(), shared, top_k)?;
        let mlp = Mlp::new(shared_gate_proj, shared_up_proj, shared_down_proj, prec)?;
        Ok(Self {
            router,
            experts: ExpertStore::Resident { gate_up, down },
            experts_shape,
            shared: SharedExpert::new(mlp, shared_expert_gate, prec),
            top_k,
            prec,
            softmax: RouterSoftmax::F32,
            rounding: ProductRounding::Nearest,
        })
    }

    /// Loads `{prefix}.gate.weight`, `{prefix}.shared_expert.*` and
    /// `{prefix}.shared_expert_gate.weight` from `src` (names as the model
    /// sees them after the loading path's conversion, e.g. `prefix =
    /// "layers.0.mlp"`), rounded to `prec`. The experts
    /// `{prefix}.experts.{gate_up_proj,down_proj}` are read lazily, expert by
    /// expert, when `src` can be shared ([`WeightSource::share`]; the
    /// checkpoint's tensor view can), else loaded at once.
    ///
    /// Errors: as [`WeightSource::tensor_in`] and [`Self::new`]; a source
    /// that cannot tell the experts' shapes ([`Error::Checkpoint`]).
    pub fn load(
        src: &dyn WeightSource,
        prefix: &str,
        top_k: usize,
        prec: Precision,
    ) -> Result<Self> {
        Ok(Self::load_parts(src, prefix, top_k, prec)?.with_rounding(src.product_rounding()))
    }

    /// The same block with its products' f32 sums (router, experts, shared
    /// expert and its gate) rounded as `rounding` says: the noise floor's
    /// shadow rounds the router's logits too, so its routing flips where a
    /// logit near a rounding midpoint decides a near-tie.
    pub fn with_rounding(mut self, rounding: ProductRounding) -> Self {
        self.rounding = rounding;
        self.shared.rounding = rounding;
        self.shared.mlp = self.shared.mlp.with_rounding(rounding);
        self
    }

    /// [`Self::load`] with products rounded to nearest.
    fn load_parts(
        src: &dyn WeightSource,
        prefix: &str,
        top_k: usize,
        prec: Precision,
    ) -> Result<Self> {
        let name = |s: &str| format!("{prefix}.{s}");
        let p = |s: &str| src.tensor_in(&name(s), prec);
        let (gate_up, down) = (name("experts.gate_up_proj"), name("experts.down_proj"));
        let Some(shared_src) = src.share() else {
            return Self::new(
                p("gate.weight")?,
                src.tensor_in(&gate_up, prec)?,
                src.tensor_in(&down, prec)?,
                p("shared_expert.gate_proj.weight")?,
                p("shared_expert.up_proj.weight")?,
                p("shared_expert.down_proj.weight")?,
                p("shared_expert_gate.weight")?,
                top_k,
                prec,
            );
        };
        let shape = |n: &str| {
            src.shape(n).ok_or_else(|| {
                Error::Checkpoint(format!("{n}: shape unknown to the weight source"))
            })
        };
        let (router, sg, su, sd, gate) = (
            p("gate.weight")?,
            p("shared_expert.gate_proj.weight")?,
            p("shared_expert.up_proj.weight")?,
            p("shared_expert.down_proj.weight")?,
            p("shared_expert_gate.weight")?,
        );
        let experts_shape = check_block(
            &router,
            &shape(&gate_up)?,
            &shape(&down)?,
            [&sg, &su, &sd, &gate],
            top_k,
        )?;
        Ok(Self {
            router,
            experts: ExpertStore::Lazy {
                src: shared_src,
                gate_up,
                down,
                cache: Arc::default(),
            },
            experts_shape,
            shared: SharedExpert::new(Mlp::new(sg, su, sd, prec)?, gate, prec),
            top_k,
            prec,
            softmax: RouterSoftmax::F32,
            rounding: ProductRounding::Nearest,
        })
    }

    /// The same block with the router's softmax taken as `softmax` says
    /// (the weights are shared).
    pub fn with_router_softmax(mut self, softmax: RouterSoftmax) -> Self {
        self.softmax = softmax;
        self
    }

    /// Number of experts `E`.
    pub fn num_experts(&self) -> usize {
        self.experts_shape[0]
    }

    /// `num_experts_per_tok`.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Experts widened so far (all of them for a resident block).
    pub fn experts_widened(&self) -> usize {
        match &self.experts {
            ExpertStore::Resident { .. } => self.num_experts(),
            ExpertStore::Lazy { cache, .. } => cache.lock().map(|c| c.len()).unwrap_or(0),
        }
    }

    /// Router logits `[T, E]` = `h · gate.weightᵀ`, rounded to the model dtype.
    pub fn router_logits(&self, h: &Tensor) -> Result<Tensor> {
        linear_rounded(h, &self.router, self.prec, self.rounding)
    }

    /// Expert `e`'s weights: a slice of the resident tensors, or read from
    /// the source and widened on first use (then cached).
    fn expert(&self, e: usize) -> Result<ExpertWeights> {
        match &self.experts {
            ExpertStore::Resident { gate_up, down } => Ok(ExpertWeights {
                gate_up: gate_up.get(e)?,
                down: down.get(e)?,
            }),
            ExpertStore::Lazy {
                src,
                gate_up,
                down,
                cache,
            } => {
                if let Some(w) = cache.lock().ok().and_then(|c| c.get(&e).cloned()) {
                    return Ok(w);
                }
                let w = ExpertWeights {
                    gate_up: src.expert(gate_up, e, self.prec)?,
                    down: src.expert(down, e, self.prec)?,
                };
                if let Ok(mut c) = cache.lock() {
                    c.insert(e, w.clone());
                }
                Ok(w)
            }
        }
    }

    /// `[T, H]` → the block's output and its parts.
    pub fn forward(&self, h: &Tensor) -> Result<MoeOutput> {
        let router_logits = self.router_logits(h)?;
        let routing = route_with(&router_logits, self.top_k, self.prec, self.softmax)?;
        let routed = routed_experts(h, &routing, (self.prec, self.rounding), &mut |e| {
            self.expert(e)
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
