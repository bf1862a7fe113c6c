//! Layers the decoder families share (candle, f32 storage, the model dtype
//! emulated by [`Precision`] rounding): linear maps, RMS norms, rotary
//! embedding, softmax attention (gated for Qwen3.5, plain for Qwen3), and
//! the SwiGLU MLP. Each follows `transformers/models/qwen3_5/modeling_qwen3_5.py`
//! (5.23.0) or `models/qwen3/modeling_qwen3.py` where those differ.
//!
//! [`Matrix`] is where candle tensors meet hsparity's own kernels
//! ([`crate::kernels`]): it asks [`kernels::plan`] which kernel computes a
//! product exactly, hands it the tensors' values as slices, and falls back
//! to candle's GEMM where none does.

pub mod attention;
pub mod causal_softmax;
pub mod elementwise;
pub mod gqa;
pub mod mlp;
pub mod norm;
pub mod rope;

use std::sync::OnceLock;

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::kernels::{self, Pairs, Plan, Route, Stored, Weight};
use crate::loading::WeightSource;
use crate::precision::{Precision, ProductRounding};

/// `x · Wᵀ` for `x`: `[T, in]`, `w`: `[out, in]` → `[T, out]` (nn.Linear, no
/// bias), accumulated in f32 and rounded once to `prec` as a CPU half GEMM does.
pub fn linear(x: &Tensor, w: &Tensor, prec: Precision) -> Result<Tensor> {
    prec.round(&x.matmul(&w.t()?)?)
}

/// [`linear`] with its f32 sums rounded as `rounding` says.
pub fn linear_rounded(
    x: &Tensor,
    w: &Tensor,
    prec: Precision,
    rounding: ProductRounding,
) -> Result<Tensor> {
    let k = w.dim(w.rank() - 1)?;
    prec.round_products(&x.matmul(&w.t()?)?, k, rounding)
}

/// What the rows of a layer's input are, which decides how its products
/// are made (candle sums a single row in another order than a stack).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// One sequence's tokens (a prefill, or any forward of `T` tokens): one
    /// product over all rows.
    Tokens,
    /// Single-token decode steps, one per row: each row its own product
    /// ([`Matrix::linear_each_row`]), as `T` separate forwards compute it.
    Steps,
}

/// The weight `[out, in]` of a linear map, as [`matrix`] loads it: f32, or
/// its bf16 pairs as the kernels read them ([`Pairs`], half the bytes of
/// the f32 copy) — a model computing in bf16 on a CPU with the bf16 dot
/// product, or a bf16 checkpoint in a model computing in f32 or f16 on a
/// CPU with the f32 kernel, which widens the pairs (and rounds them to f16)
/// into per-thread panels, once per product. The f32 widening is made on
/// first need for the products no kernel computes (tiny shapes), kept until
/// the layer is dropped.
#[derive(Debug, Clone)]
pub struct Matrix {
    dims: [usize; 2],
    wide: OnceLock<Tensor>,
    pairs: Option<std::sync::Arc<Pairs>>,
    /// How its f32 sums are rounded (the source's,
    /// [`WeightSource::product_rounding`]).
    rounding: ProductRounding,
    /// Keep the f32 widening of the pairs once made (a layer's weight,
    /// dropped with the layer); `false` for a weight held for a whole run
    /// ([`Self::transient_widening`]), widened anew where needed.
    keep_wide: bool,
    /// Never the AMX kernel: candle's sums on every CPU
    /// ([`Self::with_candle_sums`]).
    candle_sums: bool,
    /// The model dtype the pairs are read for.
    pairs_for: PairsFor,
}

/// The model a weight's bf16 pairs are read for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PairsFor {
    /// A bf16 model: any kernel that reads pairs.
    Bf16,
    /// An f32 model on a bf16 checkpoint: the f32 and single-row kernels
    /// only, never a bf16 kernel (whose sums treat subnormals as zero where
    /// the f32 route keeps them).
    F32,
    /// An f16 model on a bf16 checkpoint: as [`PairsFor::F32`], each value
    /// rounded to f16 as it is read.
    F16,
}

impl Matrix {
    /// An f32 weight `[out, in]`, used as given.
    ///
    /// Errors: not 2-D.
    pub fn new(w: Tensor) -> Result<Self> {
        let (n, k) = w.dims2()?;
        Ok(Self {
            dims: [n, k],
            wide: OnceLock::from(w),
            pairs: None,
            rounding: ProductRounding::Nearest,
            keep_wide: true,
            candle_sums: false,
            pairs_for: PairsFor::Bf16,
        })
    }

    /// An f32 CPU weight holding bf16 values, kept as [`Pairs`] only.
    ///
    /// Errors: not 2-D, or a value that is not bf16.
    pub fn bf16(w: &Tensor) -> Result<Self> {
        Ok(Self::of_pairs(pairs_of(w)?))
    }

    /// A weight kept as its bf16 pairs.
    fn of_pairs(pairs: Pairs) -> Self {
        Self {
            dims: pairs.dims(),
            wide: OnceLock::new(),
            pairs: Some(std::sync::Arc::new(pairs)),
            rounding: ProductRounding::Nearest,
            keep_wide: true,
            candle_sums: false,
            pairs_for: PairsFor::Bf16,
        }
    }

    /// A loaded parameter `w` (rounded to `prec`) as [`matrix`] keeps it: its
    /// bf16 pairs when `prec` is bf16 on a CPU with the bf16 dot product,
    /// else `w` as given. `keep_f32`: keep `w` next to the pairs too (a
    /// short-lived weight such as an LM-head chunk, widened never).
    ///
    /// Errors: not 2-D.
    pub fn of_param(w: Tensor, prec: Precision, keep_f32: bool) -> Result<Self> {
        if !(prec == Precision::Bf16
            && w.device().is_cpu()
            && kernels::capabilities().keeps_bf16_pairs())
        {
            return Self::new(w);
        }
        let mut m = Self::bf16(&w)?;
        if keep_f32 {
            m.wide = OnceLock::from(w);
        }
        Ok(m)
    }

    /// The same weight with its f32 sums rounded as `rounding` says.
    pub fn with_rounding(mut self, rounding: ProductRounding) -> Self {
        self.rounding = rounding;
        self
    }

    /// `x`'s f32 sums of `k` products each, rounded to `prec` as this
    /// weight's rounding says.
    fn round(&self, y: &Tensor, prec: Precision) -> Result<Tensor> {
        prec.round_products(y, self.dims[1], self.rounding)
    }

    /// `[out, in]`.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The same weight, never keeping an f32 widening of its pairs: the
    /// products no bf16 kernel computes widen it for the call alone. For a
    /// weight held for a whole run (a drafter's), whose widening would
    /// double its bytes.
    pub fn transient_widening(mut self) -> Self {
        self.keep_wide = false;
        self
    }

    /// The same weight, its products candle's sums on every CPU: the bf16
    /// pairs never go to the AMX kernel (whose sums agree to rounding), so
    /// what it computes does not depend on the CPU (a drafter's: τ is
    /// compared across machines and with dflash's).
    pub fn with_candle_sums(mut self) -> Self {
        self.candle_sums = true;
        self
    }

    /// The weight in f32: as held, or widened from its bf16 pairs (once and
    /// kept, unless [`Self::transient_widening`]).
    pub fn f32(&self) -> Result<std::borrow::Cow<'_, Tensor>> {
        if let Some(w) = self.wide.get() {
            return Ok(std::borrow::Cow::Borrowed(w));
        }
        let Some(p) = &self.pairs else {
            return Err(candle_core::Error::Msg(
                "a linear weight holds neither f32 nor bf16 values".into(),
            )
            .into());
        };
        let [n, k] = p.dims();
        let mut v = p.widen();
        if self.pairs_for == PairsFor::F16 {
            Precision::F16.round_slice(&mut v);
        }
        let w = Tensor::from_vec(v, (n, k), &Device::Cpu)?;
        if !self.keep_wide {
            return Ok(std::borrow::Cow::Owned(w));
        }
        Ok(std::borrow::Cow::Borrowed(self.wide.get_or_init(|| w)))
    }

    /// `x · Wᵀ` rounded to `prec`, as [`linear`] on the f32 weight gives it,
    /// bit for bit: by the kernel [`kernels::plan`] names for the shape (a
    /// single row on the gemv route, the weight read as stored; the blocked
    /// route on the bf16 pairs by a bf16 kernel, else by the f32 kernel on
    /// the f32 weight or the pairs widened), else candle's GEMM.
    /// The one exception: bf16 pairs on the blocked route on a CPU with
    /// AMX-BF16 ([`kernels::Kernel::Bf16Amx`]) give the tile unit's sums,
    /// which agree with `linear`'s to rounding, not bitwise.
    pub fn linear(&self, x: &Tensor, prec: Precision) -> Result<Tensor> {
        let y = match *x.dims() {
            [m, k] => match kernels::route(m, self.dims[0], k) {
                Route::Gemv if m == 1 => self.single_rows(x)?,
                Route::Blocked { .. } => self.blocked(x)?,
                _ => None,
            },
            _ => None,
        };
        match y {
            Some(y) => self.round(&y, prec),
            None => linear_rounded(x, &*self.f32()?, prec, self.rounding),
        }
    }

    /// `x · Wᵀ` on candle's blocked route by a kernel of hsparity's own, not
    /// rounded: the bf16 pairs by the AMX kernel or the bf16 kernel (bf16
    /// inputs and values; an even k-block for the latter), else the weight
    /// (f32, or its pairs widened as it goes) by the f32 kernel; `None`
    /// where none computes it.
    fn blocked(&self, x: &Tensor) -> Result<Option<Tensor>> {
        let ((m, k), n) = (x.dims2()?, self.dims[0]);
        if !x.device().is_cpu() {
            return Ok(None);
        }
        let mut caps = *kernels::capabilities();
        caps.no_amx |= self.candle_sums;
        let caps = &caps;
        if let Some(p) = self
            .pairs
            .as_ref()
            .filter(|_| self.pairs_for == PairsFor::Bf16)
        {
            if let Some(plan) = kernels::plan(m, n, k, Stored::Bf16, caps) {
                if matches!(
                    plan.kernel(),
                    kernels::Kernel::Bf16Gemm | kernels::Kernel::Bf16Amx
                ) {
                    if let Some(y) = with_f32(x, |v| plan.run(v, Weight::Bf16(p)))?? {
                        return Ok(Some(Tensor::from_vec(y, (m, n), x.device())?));
                    }
                }
            }
        }
        let Some(plan) = kernels::plan(m, n, k, Stored::F32, caps) else {
            return Ok(None);
        };
        if let Some(p) = &self.pairs {
            let y = with_f32(x, |xv| plan.run(xv, self.pairs_weight(p)))??;
            return Ok(y
                .map(|y| Tensor::from_vec(y, (m, n), x.device()))
                .transpose()?);
        }
        let w = self.f32()?;
        if !w.device().is_cpu() {
            return Ok(None);
        }
        let y = with_f32(x, |xv| with_f32(&w, |wv| plan.run(xv, Weight::F32(wv))))???;
        Ok(y.map(|y| Tensor::from_vec(y, (m, n), x.device()))
            .transpose()?)
    }

    /// [`Self::linear`] on [`Rows::Tokens`], [`Self::linear_each_row`] on
    /// [`Rows::Steps`].
    pub fn apply(&self, x: &Tensor, prec: Precision, rows: Rows) -> Result<Tensor> {
        match rows {
            Rows::Tokens => self.linear(x, prec),
            Rows::Steps => self.linear_each_row(x, prec),
        }
    }

    /// `x [S, in]` as `S` separate products, rounded to `prec`: bitwise `S`
    /// calls of [`Self::linear`] on one row each (what `S` single-token
    /// decode steps compute), made in one pass over the weight where the
    /// single-row kernel reproduces candle's single-row route (more than 256
    /// outputs, a CPU with AVX-512F, a row-major `x`), else row by row.
    ///
    /// Errors: a tensor failure.
    pub fn linear_each_row(&self, x: &Tensor, prec: Precision) -> Result<Tensor> {
        let s = x.dim(0)?;
        if let Some(y) = self.single_rows(x)? {
            return self.round(&y, prec);
        }
        let rows = (0..s)
            .map(|r| self.linear(&x.narrow(0, r, 1)?, prec))
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor::cat(&rows, 0)?)
    }

    /// The single-row kernel's plan for this weight and rows of `k` values
    /// on this CPU: each row its own product, the weight read as stored.
    fn gemv_plan(&self, k: usize) -> Option<Plan> {
        let stored = if self.pairs.is_some() {
            Stored::Bf16
        } else {
            Stored::F32
        };
        kernels::plan(1, self.dims[0], k, stored, kernels::capabilities())
            .filter(|p| p.kernel() == kernels::Kernel::Gemv)
    }

    /// Each row of `x [S, in]` as its own single-row product, not rounded,
    /// when the single-row kernel reproduces candle's single-row route for
    /// this weight on the CPU (read as stored: bf16 pairs widened, and
    /// rounded to f16 for an f16 model, as they load; no f32 copy);
    /// `None` elsewhere.
    fn single_rows(&self, x: &Tensor) -> Result<Option<Tensor>> {
        let &[s, k] = x.dims() else {
            return Ok(None);
        };
        if !(x.device().is_cpu() && x.is_contiguous()) {
            return Ok(None);
        }
        let Some(plan) = self.gemv_plan(k) else {
            return Ok(None);
        };
        let n = self.dims[0];
        let y = match (&self.pairs, self.wide.get()) {
            (Some(p), _) => with_f32(x, |xv| plan.run(xv, self.pairs_weight(p)))??,
            (None, Some(w)) if w.device().is_cpu() => {
                with_f32(x, |xv| with_f32(w, |wv| plan.run(xv, Weight::F32(wv))))???
            }
            _ => return Ok(None),
        };
        Ok(y.map(|y| Tensor::from_vec(y, (s, n), x.device()))
            .transpose()?)
    }

    /// The pairs as the kernels read them: as stored, or rounded to f16.
    fn pairs_weight<'p>(&self, p: &'p Pairs) -> Weight<'p> {
        if self.pairs_for == PairsFor::F16 {
            Weight::Bf16InF16(p)
        } else {
            Weight::Bf16(p)
        }
    }

    /// True when the rows of an `[m, in]` input are computed exactly as in
    /// any taller stack of rows (see [`rows_batchable`]; the bf16 kernel sums
    /// as candle's blocked kernel does, so the same shapes qualify).
    pub fn rows_batchable(&self, m: usize) -> bool {
        let on_cpu = self.pairs.is_some() || self.wide.get().is_some_and(|w| w.device().is_cpu());
        on_cpu && rows_batchable(m, self.dims[1], self.dims[0])
    }
}

/// Loads the weight matrix `name` of a linear map ([`param`]): as bf16
/// pairs when the checkpoint stores it in bf16 and a kernel reads them on
/// this CPU — a model computing in bf16 with a bf16 kernel
/// ([`kernels::Capabilities::keeps_bf16_pairs`]: the AVX512-BF16 or the AMX
/// one; where the AVX512-BF16 instruction is slow the f32 kernel reads the
/// same pairs, [`kernels::Capabilities::bf16_dot_slow`]), or in f32 or f16
/// with the f32 and single-row kernels only (which widen them, and round
/// them to f16, as they go: the values `param` gives, candle's sums, never
/// a bf16 kernel's) — so that
/// [`Matrix::linear`] reads them as stored; f32 otherwise.
pub fn matrix(src: &dyn WeightSource, name: &str, prec: Precision) -> Result<Matrix> {
    let rounding = src.product_rounding();
    let caps = kernels::capabilities();
    let (pairs_for, read_here) = match prec {
        Precision::Bf16 => (PairsFor::Bf16, caps.keeps_bf16_pairs()),
        Precision::F32 => (PairsFor::F32, caps.avx512_gemm()),
        Precision::F16 => (PairsFor::F16, caps.avx512_gemm()),
    };
    if read_here {
        // Stored in bf16: the pairs straight from the checkpoint's bytes.
        if let Some((dims, words)) = src.bf16_pairs(name)? {
            let m = Matrix::of_pairs(Pairs::from_words(dims, words)?).with_rounding(rounding);
            return Ok(Matrix { pairs_for, ..m });
        }
    }
    Ok(Matrix::of_param(param(src, name, prec)?, prec, false)?.with_rounding(rounding))
}

/// Rows `start .. start+len` of the 2-D weight `name` (an LM head's
/// vocabulary chunk) as a short-lived [`Matrix`]: a model computing in bf16
/// on a CPU whose bf16 kernel reads pairs takes them straight from the
/// checkpoint's bf16 bytes (`WeightSource::bf16_pair_rows`: the pairs
/// [`Matrix::of_param`] makes of the loaded rows, without the f32 rows);
/// otherwise the rows rounded to `prec` as [`Matrix::of_param`] keeps them.
///
/// Errors: the rows cannot be read.
pub fn matrix_rows(
    src: &dyn WeightSource,
    name: &str,
    (start, len): (usize, usize),
    prec: Precision,
) -> Result<Matrix> {
    if prec == Precision::Bf16 && kernels::capabilities().keeps_bf16_pairs() {
        if let Some((dims, words)) = src.bf16_pair_rows(name, start, len)? {
            return Ok(Matrix::of_pairs(Pairs::from_words(dims, words)?));
        }
    }
    Matrix::of_param(src.row_range(name, start, len, prec)?, prec, true)
}

/// `f` on each of the independent inputs `xs` (`[T_j, ·]` each), bit for
/// bit what `f(xs[j])` gives: the inputs whose row counts `eligible` accepts
/// (an `f` whose output rows then do not depend on the other rows, e.g.
/// [`Matrix::rows_batchable`]) are stacked through one call of `f` per group
/// of at most [`MAX_STACK_ROWS`] rows, so each weight is packed once for all
/// of them; the others run alone.
///
/// Errors: what `f` returns.
pub fn each_stacked(
    xs: &[&Tensor],
    eligible: impl Fn(usize) -> bool,
    f: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Vec<Tensor>> {
    let rows: Vec<usize> = xs.iter().map(|x| x.dim(0).unwrap_or(0)).collect();
    let mut out: Vec<Option<Tensor>> = vec![None; xs.len()];
    for group in stacks(&rows, eligible) {
        let parts: Vec<&Tensor> = group.iter().map(|&j| xs[j]).collect();
        let y = f(&Tensor::cat(&parts, 0)?)?;
        let mut start = 0;
        for &j in &group {
            out[j] = Some(y.narrow(0, start, rows[j])?);
            start += rows[j];
        }
    }
    xs.iter()
        .zip(out)
        .map(|(x, o)| match o {
            Some(o) => Ok(o),
            None => f(x),
        })
        .collect()
}

/// [`Matrix::apply`] on each of the independent inputs `xs`, bit for bit
/// as its own call: one sequence's tokens each ([`Rows::Tokens`]) through
/// one product over the stacked rows wherever the kernel sums each row as
/// in a taller stack ([`each_stacked`], [`Matrix::rows_batchable`]), so the
/// weight is read (and widened) once for them; decode steps
/// ([`Rows::Steps`]) each alone.
///
/// Errors: a tensor failure.
pub fn apply_each(m: &Matrix, xs: &[&Tensor], prec: Precision, rows: Rows) -> Result<Vec<Tensor>> {
    match rows {
        Rows::Tokens => each_stacked(xs, |t| m.rows_batchable(t), |x| m.apply(x, prec, rows)),
        Rows::Steps => xs.iter().map(|x| m.apply(x, prec, rows)).collect(),
    }
}

/// How a token mixer's forward uses its decode state `S` (a Gated
/// DeltaNet's conv and delta-rule state, an attention layer's KV cache).
pub enum StateUse<'s, S> {
    /// None: a fresh prefill.
    Fresh,
    /// Continue from it, and leave it at the end of the forward.
    Continue(&'s mut S),
    /// A fresh prefill that also leaves in `into` the state a prefill of
    /// its first `at` tokens hands on.
    Snapshot {
        /// Tokens of that prefill (`1 ≤ at ≤ T`).
        at: usize,
        /// Where its state goes.
        into: &'s mut S,
    },
}

/// Rows a stack of sequences may hold: enough for the GEMM to pack each
/// weight once for many sequences, few enough that a long prompt set does
/// not hold every row's intermediate activations at once.
pub const MAX_STACK_ROWS: usize = 2048;

/// Groups of at least two of the sequences with `rows[j]` rows that
/// `eligible` accepts, in order, each of at most [`MAX_STACK_ROWS`] rows
/// (a sequence longer than that stays alone).
fn stacks(rows: &[usize], eligible: impl Fn(usize) -> bool) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let (mut cur, mut total) = (Vec::new(), 0);
    for (j, &t) in rows.iter().enumerate() {
        if !eligible(t) || t > MAX_STACK_ROWS {
            continue;
        }
        if total + t > MAX_STACK_ROWS {
            groups.push(std::mem::take(&mut cur));
            total = 0;
        }
        cur.push(j);
        total += t;
    }
    groups.push(cur);
    groups.retain(|g| g.len() > 1);
    groups
}

/// True when [`linear`] on an `[m, k]` input with an `[n, k]` weight computes
/// every output row exactly as it would with more rows stacked under it, so
/// independent sequences can share one product (and one packing of the
/// weight): candle's blocked kernel, whose k-blocks depend on `k` alone,
/// outside the small-size rule ([`kernels::route`]). A taller stack of such
/// rows takes the same route.
pub fn rows_batchable(m: usize, k: usize, n: usize) -> bool {
    matches!(kernels::route(m, n, k), Route::Blocked { small: false, .. })
}

/// The bf16 pairs of a 2-D f32 CPU tensor holding bf16 values.
///
/// Errors: not 2-D, or a value that is not bf16.
pub fn pairs_of(w: &Tensor) -> Result<Pairs> {
    let (n, k) = w.dims2()?;
    with_f32(w, |v| Pairs::of(v, [n, k]))?
}

/// Calls `f` on the values of an f32 CPU tensor, row-major: its own storage
/// when contiguous, else a copy.
pub fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)), Some((s, e))) => {
            Ok(f(&v[s..e]))
        }
        _ => {
            drop(storage);
            Ok(f(&t.flatten_all()?.to_vec1::<f32>()?))
        }
    }
}

/// Loads `name` rounded to the compute dtype (a parameter of a model loaded in `prec`).
pub fn param(src: &dyn WeightSource, name: &str, prec: Precision) -> Result<Tensor> {
    src.tensor_in(name, prec)
}
