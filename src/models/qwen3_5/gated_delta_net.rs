//! Gated DeltaNet `Qwen3_5GatedDeltaNet` (`modeling_qwen3_5.py`, lines 495-656),
//! with the delta-rule kernel in both of transformers' forms, side by side:
//! [`chunked`] (`torch_chunk_gated_delta_rule`, chunk 64, used for every
//! prefill) and [`recurrent`] (`torch_recurrent_gated_delta_rule`, used for
//! single-token decode). The kernels are plain Rust loops over f32 buffers:
//! 20-30x faster on CPU than the same recurrence as per-token candle tensor
//! ops (each op allocates and dispatches; the state is a few KB). The kernels
//! live in `super::delta_rule` ([`chunked`], [`recurrent`]).

use candle_core::Tensor;

use crate::error::Result;
use crate::loading::WeightSource;
use crate::models::layers::norm::RmsNormGated;
use crate::models::layers::{apply_each, matrix, param, with_f32, Matrix, Rows, StateUse};
use crate::models::LayerGeometry;

mod conv;
mod faults;
pub use super::delta_rule::{chunked, recurrent};

/// Chunk length of `torch_chunk_gated_delta_rule`.
pub const CHUNK_SIZE: usize = 64;

/// Which form of the delta rule to run over a sequence (`--gdn-form`;
/// serialised `chunked` / `recurrent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GdnForm {
    /// `torch_chunk_gated_delta_rule` (what transformers runs for any T > 1).
    #[default]
    Chunked,
    /// `torch_recurrent_gated_delta_rule`, token by token.
    Recurrent,
}

impl GdnForm {
    /// `chunked` or `recurrent`.
    pub fn name(self) -> &'static str {
        match self {
            GdnForm::Chunked => "chunked",
            GdnForm::Recurrent => "recurrent",
        }
    }

    /// The sentence a report's environment states.
    pub fn describe(self) -> &'static str {
        match self {
            GdnForm::Chunked => "chunked (chunk 64, as transformers prefill)",
            GdnForm::Recurrent => "recurrent",
        }
    }
}

/// Per-layer decode state (`LinearAttentionLayer` in transformers'
/// `DynamicCache`): the last `K-1` raw (pre-conv) `mixed_qkv` columns and the
/// f32 recurrent state.
///
/// A block can be fed *tentatively* ([`Self::begin_tentative`]): the layer
/// then keeps what it computed per block token (the raw conv inputs and the
/// delta-rule inputs k, v, g, β), and [`Self::commit`] leaves the state as if
/// only the first `n` tokens had been fed — the correct form of the cache
/// crop a speculative-decoding loop needs (transformers 5.23's
/// `LinearAttentionLayer.crop` rolls back the conv state only).
#[derive(Debug, Clone)]
pub struct GdnState {
    /// `[K-1, C]`, row-major, oldest first.
    pub conv: Vec<f32>,
    /// `[nv, dk, dv]`, row-major.
    pub recurrent: Vec<f32>,
    /// Keep the next block's per-token inputs for [`Self::commit`].
    keep_block: bool,
    /// The tentative block: state before it, its conv history and inputs.
    block: Option<Box<Block>>,
    /// Drop the state before this row of the next forward ([`Self::reset_before`]).
    reset_row: Option<usize>,
}

/// What a tentatively fed block leaves to roll the state forward by a prefix.
#[derive(Debug, Clone)]
struct Block {
    /// `[K-1+T, C]`: the conv history before the block, then its raw inputs.
    padded: Vec<f32>,
    /// The recurrent state before the block.
    recurrent: Vec<f32>,
    /// The block's delta-rule inputs.
    inputs: DeltaRuleInputs,
    /// Conv channels C.
    channels: usize,
}

impl GdnState {
    /// Zero state for a layer of this geometry.
    pub fn zeros(geo: &LayerGeometry) -> Self {
        let c = geo.conv_dim();
        Self {
            conv: vec![0.0; (geo.conv_kernel - 1) * c],
            recurrent: vec![0.0; geo.lin_v_heads * geo.lin_k_dim * geo.lin_v_dim],
            keep_block: false,
            block: None,
            reset_row: None,
        }
    }

    /// The next forward is a tentative block: keep its per-token inputs.
    pub fn begin_tentative(&mut self) {
        self.keep_block = true;
        self.block = None;
    }

    /// Keeps the first `n` tokens of the tentative block: the conv history
    /// ends at token `n − 1` and the recurrent state is the pre-block state
    /// advanced token by token (`torch_recurrent_gated_delta_rule`) through
    /// those `n` tokens. All of the block (`n = T`) keeps the state the block
    /// forward computed. No tentative block: nothing to do.
    pub fn commit(&mut self, n: usize) {
        let Some(b) = self.roll_conv_back(n) else {
            return;
        };
        self.recurrent = b.recurrent;
        if n > 0 {
            recurrent(&b.inputs.prefix(n), &mut self.recurrent);
        }
    }
}

/// Inputs of the delta-rule kernel for one sequence, after GVA expansion (value
/// head `h` reads key head `h / (nv/nk)`), all f32, row-major.
#[derive(Debug, Clone)]
pub struct DeltaRuleInputs {
    /// Tokens.
    pub t: usize,
    /// Heads (value heads).
    pub heads: usize,
    /// Key dim.
    pub dk: usize,
    /// Value dim.
    pub dv: usize,
    /// `[T, heads, dk]`, raw (the kernel l2-normalises and scales).
    pub q: Vec<f32>,
    /// `[T, heads, dk]`, raw (the kernel l2-normalises).
    pub k: Vec<f32>,
    /// `[T, heads, dv]`.
    pub v: Vec<f32>,
    /// Log decay `g ≤ 0`, `[T, heads]`.
    pub g: Vec<f32>,
    /// Write strength `β ∈ (0, 1)`, `[T, heads]`.
    pub beta: Vec<f32>,
}

impl DeltaRuleInputs {
    /// The first `n` tokens.
    pub fn prefix(&self, n: usize) -> Self {
        let (nh, dk, dv) = (self.heads, self.dk, self.dv);
        Self {
            t: n,
            heads: nh,
            dk,
            dv,
            q: self.q[..n * nh * dk].to_vec(),
            k: self.k[..n * nh * dk].to_vec(),
            v: self.v[..n * nh * dv].to_vec(),
            g: self.g[..n * nh].to_vec(),
            beta: self.beta[..n * nh].to_vec(),
        }
    }
}

/// `softplus` with torch's defaults (β = 1, threshold 20).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `linear_attn.*` of one linear-attention layer.
#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    /// `[2Dk+Dv, H]`.
    in_proj_qkv: Matrix,
    /// `[Dv, H]`.
    in_proj_z: Matrix,
    /// `[nv, H]`.
    in_proj_b: Matrix,
    /// `[nv, H]`.
    in_proj_a: Matrix,
    /// Depthwise causal conv weight `[K, C]` (checkpoint `[C, 1, K]`,
    /// transposed), row-major.
    conv_w_t: Vec<f32>,
    /// `-exp(A_log)`, `[nv]`.
    neg_a: Vec<f32>,
    /// `[nv]`.
    dt_bias: Vec<f32>,
    norm: RmsNormGated,
    /// `[H, Dv]`.
    out_proj: Matrix,
    geo: LayerGeometry,
}

impl GatedDeltaNet {
    /// The same layer with its products' f32 sums rounded as `rounding`
    /// says (what loading it through the noise shadow gives).
    pub fn with_rounding(self, rounding: crate::precision::ProductRounding) -> Self {
        Self {
            in_proj_qkv: self.in_proj_qkv.with_rounding(rounding),
            in_proj_z: self.in_proj_z.with_rounding(rounding),
            in_proj_b: self.in_proj_b.with_rounding(rounding),
            in_proj_a: self.in_proj_a.with_rounding(rounding),
            out_proj: self.out_proj.with_rounding(rounding),
            ..self
        }
    }

    /// Loads `{prefix}.{in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,out_proj}.weight`,
    /// `{prefix}.conv1d.weight`, `{prefix}.A_log`, `{prefix}.dt_bias`, `{prefix}.norm.weight`.
    pub fn load(src: &dyn WeightSource, prefix: &str, geo: LayerGeometry) -> Result<Self> {
        let p = geo.prec;
        let conv = param(src, &format!("{prefix}.conv1d.weight"), p)?;
        let (c, kk) = (geo.conv_dim(), geo.conv_kernel);
        let conv_w = conv.flatten_all()?.to_vec1::<f32>()?;
        // The loader checks the shape against the spec too; the transpose
        // below must not index past a short weight whatever the source.
        if conv_w.len() != c * kk {
            let n = conv_w.len();
            return Err(candle_core::Error::Msg(format!(
                "{prefix}.conv1d.weight holds {n} values; the config gives {c} channels × {kk} taps"
            ))
            .into());
        }
        let conv_w_t = (0..kk * c).map(|i| conv_w[(i % c) * kk + i / c]).collect();
        let a_log = param(src, &format!("{prefix}.A_log"), p)?.to_vec1::<f32>()?;
        Ok(Self {
            in_proj_qkv: matrix(src, &format!("{prefix}.in_proj_qkv.weight"), p)?,
            in_proj_z: matrix(src, &format!("{prefix}.in_proj_z.weight"), p)?,
            in_proj_b: matrix(src, &format!("{prefix}.in_proj_b.weight"), p)?,
            in_proj_a: matrix(src, &format!("{prefix}.in_proj_a.weight"), p)?,
            conv_w_t,
            // -A_log.float().exp(): f32 from the dtype-rounded parameter.
            neg_a: a_log.iter().map(|a| -a.exp()).collect(),
            dt_bias: param(src, &format!("{prefix}.dt_bias"), p)?.to_vec1::<f32>()?,
            norm: RmsNormGated::load(src, &format!("{prefix}.norm"), geo.eps, p)?,
            out_proj: matrix(src, &format!("{prefix}.out_proj.weight"), p)?,
            geo,
        })
    }

    /// The input projections of each of `xs` (`[T_j, H]`, independent
    /// sequences), each weight read once for all of them where that is
    /// bitwise ([`apply_each`]).
    fn project(&self, xs: &[&Tensor], rows: Rows) -> Result<Vec<InProj>> {
        let each = |m: &Matrix| apply_each(m, xs, self.geo.prec, rows);
        let (qkv, z) = (each(&self.in_proj_qkv)?, each(&self.in_proj_z)?);
        let (b, a) = (each(&self.in_proj_b)?, each(&self.in_proj_a)?);
        Ok(qkv
            .into_iter()
            .zip(z)
            .zip(b.into_iter().zip(a))
            .map(|((qkv, z), (b, a))| InProj { qkv, z, b, a })
            .collect())
    }

    /// Causal conv + SiLU and gates from one sequence's projections `p`,
    /// giving the kernel inputs, `z` (`[T, nv, dv]`) and rows `keep` of the
    /// conv's padded input (`[K-1+T, C]`; empty without). `conv_state`
    /// supplies the preceding `K-1` raw columns and is updated.
    fn prepare(
        &self,
        p: InProj,
        conv_state: &mut [f32],
        reset: Option<usize>,
        keep: Option<std::ops::Range<usize>>,
    ) -> Result<(DeltaRuleInputs, Tensor, Vec<f32>)> {
        let geo = &self.geo;
        let t = p.qkv.dim(0)?;
        let c = geo.conv_dim();
        let hist = geo.conv_kernel - 1;
        let (nk, nv, dk, dv) = (
            geo.lin_k_heads,
            geo.lin_v_heads,
            geo.lin_k_dim,
            geo.lin_v_dim,
        );
        let prec = geo.prec;
        let ((q, k, v), kept, next) = with_f32(&p.qkv, |mixed| {
            let x = conv::Padded {
                hist: conv_state,
                new: mixed,
                c,
            };
            let qkv = conv::conv_split(&x, &self.conv_w_t, reset, prec, (nk, nv, dk, dv));
            (
                qkv,
                keep.map(|r| x.rows(r)).unwrap_or_default(),
                x.rows(t..t + hist),
            )
        })?;
        conv_state.copy_from_slice(&next);
        if let Some(r) = reset {
            faults::clear_before_reset(conv_state, c, t, r);
        }
        let b = p.b.flatten_all()?.to_vec1::<f32>()?;
        let a = p.a.flatten_all()?.to_vec1::<f32>()?;
        // beta = b.sigmoid() in the model dtype; g = -exp(A_log)·softplus(a + dt_bias) in f32.
        let beta = b
            .iter()
            .map(|&b| prec.round_f32(1.0 / (1.0 + (-b).exp())))
            .collect();
        let g = a
            .iter()
            .enumerate()
            .map(|(i, &a)| self.neg_a[i % nv] * softplus(a + self.dt_bias[i % nv]))
            .collect();
        let z = p.z.reshape((t, nv, dv))?;
        Ok((
            DeltaRuleInputs {
                t,
                heads: nv,
                dk,
                dv,
                q,
                k,
                v,
                g,
                beta,
            },
            z,
            kept,
        ))
    }

    /// The delta-rule kernel's inputs for `x` (`[T, H]`, already
    /// `input_layernorm`-ed) from a fresh state: the projections, the causal
    /// conv with its SiLU, the decay and the write strength, as transformers
    /// passes them to `torch_chunk_gated_delta_rule` after its GVA expansion
    /// (the operation census, `examples/op_census.rs`).
    ///
    /// Errors: a tensor failure.
    pub fn delta_rule_inputs(&self, x: &Tensor) -> Result<DeltaRuleInputs> {
        let mut st = GdnState::zeros(&self.geo);
        let p = self.project(&[x], Rows::Tokens)?.remove(0);
        Ok(self.prepare(p, &mut st.conv, None, None)?.0)
    }

    /// `x`: `[T, H]` (already `input_layernorm`-ed) → `[T, H]`. With `state`
    /// the layer continues from it and leaves it at the end of `x`; without,
    /// it starts from zeros (a fresh prefill).
    pub fn forward(
        &self,
        x: &Tensor,
        form: GdnForm,
        state: Option<&mut GdnState>,
    ) -> Result<Tensor> {
        let state = state.map_or(StateUse::Fresh, StateUse::Continue);
        self.run_one(x, form, state, Rows::Tokens)
    }

    /// `S` single-token decode steps from `state` at once: `x` `[S, H]` (one
    /// step per row) → `[S, H]`, bitwise `S` calls of [`Self::forward`] on
    /// one row each in the recurrent form. The conv and the delta rule run
    /// token after token as those calls would; the projections take each
    /// row alone ([`Rows::Steps`]; see [`Matrix::linear_each_row`]).
    /// A state fed tentatively or reset mid-forward runs the steps one by one.
    pub fn forward_steps(&self, x: &Tensor, state: &mut GdnState) -> Result<Tensor> {
        if state.keep_block || state.reset_row.is_some() {
            let rows = (0..x.dim(0)?)
                .map(|r| self.forward(&x.narrow(0, r, 1)?, GdnForm::Recurrent, Some(state)))
                .collect::<Result<Vec<_>>>()?;
            return Ok(Tensor::cat(&rows, 0)?);
        }
        let state = StateUse::Continue(state);
        self.run_one(x, GdnForm::Recurrent, state, Rows::Steps)
    }

    /// [`Self::forward`] of a fresh sequence `x` (`[T, H]`, `T ≥ at ≥ 1`),
    /// also leaving in `snap` the state a prefill of its first `at` tokens
    /// hands on ([`Self::forward_each`] with [`StateUse::Snapshot`]).
    ///
    /// Errors: `at` is 0 or past `T`, or a tensor failure.
    pub fn forward_snapshot(
        &self,
        x: &Tensor,
        form: GdnForm,
        at: usize,
        snap: &mut GdnState,
    ) -> Result<Tensor> {
        let snap = StateUse::Snapshot { at, into: snap };
        self.run_one(x, form, snap, Rows::Tokens)
    }

    /// [`Self::forward`] (or [`Self::forward_snapshot`]) of independent
    /// sequences (`[T_j, H]` each) with their forms and states, each
    /// output the bits of its own call: the products over the stacked rows
    /// where that is bitwise ([`apply_each`]), so each weight is read and
    /// widened once for all of them; the conv and the delta rule per
    /// sequence.
    ///
    /// A snapshot ([`StateUse::Snapshot`]): the kernel runs in two calls
    /// split at `at` rounded down to a chunk boundary (at `at` in the
    /// recurrent form), which is where the one call's chunks end, so the
    /// outputs are the bits of [`Self::forward`]; the state after the
    /// boundary's chunks is taken on through the tokens up to `at` as the
    /// prefill's last (short) chunk takes it. The inputs of every row before
    /// `at` are those a prefill of `at` tokens computes (each row's
    /// projections and causal conv read no later row), so `into` is that
    /// prefill's state, bit for bit, whenever its products sum as this
    /// forward's do.
    ///
    /// Errors: a snapshot's `at` is 0 or past its `T`, or a tensor failure.
    pub fn forward_each(
        &self,
        seqs: Vec<(&Tensor, GdnForm, StateUse<'_, GdnState>)>,
    ) -> Result<Vec<Tensor>> {
        self.run(seqs, Rows::Tokens)
    }

    /// [`Self::forward_each`] on rows that are `rows`.
    fn run(
        &self,
        seqs: Vec<(&Tensor, GdnForm, StateUse<'_, GdnState>)>,
        rows: Rows,
    ) -> Result<Vec<Tensor>> {
        let xs: Vec<&Tensor> = seqs.iter().map(|s| s.0).collect();
        let ys = self
            .project(&xs, rows)?
            .into_iter()
            .zip(seqs)
            .map(|(p, (_, form, state))| match state {
                StateUse::Fresh => self.recurrence(p, form, &mut GdnState::zeros(&self.geo)),
                StateUse::Continue(st) => self.recurrence(p, form, st),
                StateUse::Snapshot { at, into } => self.recurrence_snapshot(p, form, at, into),
            })
            .collect::<Result<Vec<_>>>()?;
        let ys: Vec<&Tensor> = ys.iter().collect();
        apply_each(&self.out_proj, &ys, self.geo.prec, rows)
    }

    /// [`Self::run`] of one sequence.
    fn run_one(
        &self,
        x: &Tensor,
        form: GdnForm,
        s: StateUse<'_, GdnState>,
        rows: Rows,
    ) -> Result<Tensor> {
        Ok(self.run(vec![(x, form, s)], rows)?.remove(0))
    }

    /// One sequence's projections through the conv, the delta rule from
    /// `st` and the gated norm: `[T, nv·dv]`, before `out_proj`.
    fn recurrence(&self, p: InProj, form: GdnForm, st: &mut GdnState) -> Result<Tensor> {
        let before = st.keep_block.then(|| st.recurrent.clone());
        let reset = st.reset_row.take();
        let t = p.qkv.dim(0)?;
        let keep = before.is_some().then(|| 0..t + self.geo.conv_kernel - 1);
        let (inp, z, padded) = self.prepare(p, &mut st.conv, reset, keep)?;
        let o = faults::kernel(&inp, form, &mut st.recurrent, reset);
        if let Some(recurrent) = before {
            st.keep_block = false;
            st.block = Some(Box::new(Block {
                padded,
                recurrent,
                inputs: inp.clone(),
                channels: self.geo.conv_dim(),
            }));
        }
        self.gated(o, &inp, &z)
    }

    /// [`Self::recurrence`] of a fresh sequence, leaving in `snap` the
    /// state after its first `at` tokens ([`Self::forward_each`]).
    fn recurrence_snapshot(
        &self,
        p: InProj,
        form: GdnForm,
        at: usize,
        snap: &mut GdnState,
    ) -> Result<Tensor> {
        let t = p.qkv.dim(0)?;
        if at == 0 || at > t {
            return Err(candle_core::Error::Msg(format!(
                "delta-rule snapshot after token {at} of a {t}-token sequence"
            ))
            .into());
        }
        let mut st = GdnState::zeros(&self.geo);
        let hist = self.geo.conv_kernel - 1;
        let (inp, z, rows) = self.prepare(p, &mut st.conv, None, Some(at..at + hist))?;
        *snap = GdnState::zeros(&self.geo);
        snap.conv.copy_from_slice(&rows);
        let run = |i: &DeltaRuleInputs, s: &mut [f32]| faults::kernel(i, form, s, None);
        let split = match form {
            GdnForm::Chunked => at - at % CHUNK_SIZE,
            GdnForm::Recurrent => at,
        };
        let mut o = match split {
            0 => Vec::with_capacity(t * inp.heads * inp.dv),
            _ => run(&inp.prefix(split), &mut st.recurrent),
        };
        snap.recurrent.copy_from_slice(&st.recurrent);
        if at > split {
            run(&inp.prefix(at).suffix(split), &mut snap.recurrent);
        }
        if t > split {
            o.extend(run(&inp.suffix(split), &mut st.recurrent));
        }
        self.gated(o, &inp, &z)
    }

    /// The delta rule's outputs `o` (`[T, nv, dv]`, f32) cast back to the
    /// input dtype and the gated norm with `z`: `[T, nv·dv]`, `out_proj`'s input.
    fn gated(&self, mut o: Vec<f32>, inp: &DeltaRuleInputs, z: &Tensor) -> Result<Tensor> {
        // The kernel runs in f32 and casts its output back to the input dtype.
        self.geo.prec.round_slice(&mut o);
        let (t, nv, dv) = (inp.t, inp.heads, inp.dv);
        let o = Tensor::from_vec(o, (t, nv, dv), z.device())?;
        Ok(self.norm.forward(&o, z)?.reshape((t, nv * dv))?)
    }
}

/// One sequence's input projections ([`GatedDeltaNet::project`]).
struct InProj {
    /// `in_proj_qkv`: `[T, 2Dk+Dv]`.
    qkv: Tensor,
    /// `in_proj_z`: `[T, Dv]`.
    z: Tensor,
    /// `in_proj_b`: `[T, nv]`.
    b: Tensor,
    /// `in_proj_a`: `[T, nv]`.
    a: Tensor,
}
