//! The drafter's context keys and values kept across the forwards of one
//! trajectory ([`DraftContext`], [`Drafter::forward_cached`]), as
//! `dflash_generate` keeps them in its `past_key_values`: each round projects
//! only the context rows the last round added, instead of every row since
//! the prompt's first (at a 2048-token prompt that re-projection took about
//! a quarter of a `drafter` run: docs/performance.md).
//!
//! The cached rows are bitwise the rows [`Drafter::forward`] computes over
//! the whole context. A row of `fc`, `k_proj` or `v_proj` depends on how
//! many rows share its product only through candle's route
//! ([`crate::kernels::route`]); on its blocked route outside the small-size
//! rule the k-blocks depend on `k` alone, so a row is the same in any stack
//! of rows that takes that route ([`rows_batchable`]). The cache is used
//! only where the whole-context forward takes that route, and each round
//! projects enough rows (re-projecting a few held ones when too few are
//! new) that its products take it too; anywhere else the forward runs
//! whole. `k_norm`, RoPE and the rounding are per row.

use candle_core::Tensor;

use super::{BlockRun, Drafter};
use crate::error::Result;
use crate::models::layers::{rows_batchable, MAX_STACK_ROWS};

/// One trajectory's context keys and values of every draft layer, at
/// positions `0..len` ([`Drafter::forward_cached`]). Start one per
/// trajectory; it grows as the anchors advance, and a forward at an earlier
/// anchor reads the rows before it. It holds `layers × 2 × kv heads ×
/// head_dim` f32 values per row (40 KB at a 27B target's drafter: less than
/// the row's features); drop it when its trajectory's walks are done.
#[derive(Default)]
pub struct DraftContext {
    /// Context rows held.
    len: usize,
    /// Per layer: keys `[1, kv heads, rows, head_dim]` after `k_norm` and
    /// RoPE, and values of the same shape, in the pieces the forwards
    /// added (joined once per forward, with the block's, not per piece).
    kv: Vec<(Vec<Tensor>, Vec<Tensor>)>,
}

impl DraftContext {
    /// An empty context.
    pub fn new() -> Self {
        Self::default()
    }

    /// Context rows held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The parts of `pieces` (joined along `dim`, in order) that cover the
/// positions `a..e` along it, each narrowed to its share.
///
/// Errors: a piece lacks `dim`.
pub(crate) fn narrow_pieces(
    pieces: &[Tensor],
    dim: usize,
    a: usize,
    e: usize,
) -> Result<Vec<Tensor>> {
    let mut parts = Vec::new();
    let mut at = 0;
    for p in pieces {
        let n = p.dim(dim)?;
        let (lo, hi) = (a.max(at), e.min(at + n));
        if lo < hi {
            parts.push(p.narrow(dim, lo - at, hi - lo)?);
        }
        at += n;
    }
    Ok(parts)
}

/// One draft of a batch ([`Drafter::forward_cached_each`]): the block
/// `noise` (`[B, H]`) at anchor `start`, its trajectory's context `ctx`,
/// and `rows(a, b)`, the target features `[b − a, K·H]` of positions
/// `a..b`.
pub struct CachedDraft<'a> {
    /// The block's tokens embedded by the target.
    pub noise: &'a Tensor,
    /// The anchor's position.
    pub start: usize,
    /// The trajectory's context keys and values.
    pub ctx: &'a mut DraftContext,
    /// The context's features by positions.
    pub rows: &'a dyn Fn(usize, usize) -> Result<Tensor>,
}

impl Drafter {
    /// [`Drafter::forward`] of the block `noise` (`[B, H]`) at anchor `start`
    /// with the context rows `0..start`, reading the keys and values of the
    /// rows `ctx` already holds and projecting only the others: `rows(a, b)`
    /// gives the target features `[b − a, K·H]` of positions `a..b`. Bitwise
    /// [`Drafter::forward`]`(noise, rows(0, start), 0, start)`, which it runs
    /// where the products' route would make cached rows differ (see the
    /// module doc). Every call on one `ctx` must read the same features.
    ///
    /// Errors: as [`Drafter::forward`]; `rows` fails.
    pub fn forward_cached(
        &self,
        noise: &Tensor,
        start: usize,
        ctx: &mut DraftContext,
        rows: &dyn Fn(usize, usize) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let draft = CachedDraft {
            noise,
            start,
            ctx,
            rows,
        };
        Ok(self.forward_cached_each(vec![draft])?.remove(0))
    }

    /// [`Self::forward_cached`] of several drafts, each bitwise its own
    /// call's, the drafter's layers read once for a batch of them
    /// (`Drafter::run_layers_each`: the products over their stacked rows
    /// where the kernel sums each row as alone). Batches are consecutive
    /// drafts whose projected rows (context and block) come to at most
    /// [`MAX_STACK_ROWS`]; a longer draft, or any draft of a drafter held
    /// off the CPU (whose products never stack), runs alone. Each draft
    /// reads its context as held before the call (each holds its own
    /// `&mut`, so no two share one). On an error the drafts' contexts of
    /// the failing batch are unchanged; earlier batches' have advanced.
    ///
    /// Errors: as [`Self::forward_cached`].
    pub fn forward_cached_each(&self, drafts: Vec<CachedDraft<'_>>) -> Result<Vec<Tensor>> {
        let mut out = Vec::with_capacity(drafts.len());
        let (mut batch, mut batch_rows) = (Vec::new(), 0);
        for d in drafts {
            let b = d.noise.dim(0)?;
            // The first context row it projects; `None`: the whole context.
            let from = self.cached_from(d.ctx.len.min(d.start), d.start, b);
            let n = d.start - from.unwrap_or(0) + b;
            let alone = !self.weights.on_cpu() || n > MAX_STACK_ROWS;
            if !batch.is_empty() && (alone || batch_rows + n > MAX_STACK_ROWS) {
                out.extend(self.forward_batch(std::mem::take(&mut batch))?);
                batch_rows = 0;
            }
            batch.push((d, from));
            batch_rows += n;
            if alone {
                out.extend(self.forward_batch(std::mem::take(&mut batch))?);
                batch_rows = 0;
            }
        }
        if !batch.is_empty() {
            out.extend(self.forward_batch(batch)?);
        }
        Ok(out)
    }

    /// One batch of [`Self::forward_cached_each`], each draft with the first
    /// context row it projects (`None`: it runs on the whole context, as
    /// `forward` does).
    fn forward_batch(
        &self,
        mut drafts: Vec<(CachedDraft<'_>, Option<usize>)>,
    ) -> Result<Vec<Tensor>> {
        let projects = |d: &CachedDraft, plan: Option<usize>| plan.is_none_or(|f| d.start > f);
        let mut fresh_rows = Vec::new();
        for (d, plan) in &drafts {
            if projects(d, *plan) {
                fresh_rows.push((d.rows)(plan.unwrap_or(0), d.start)?);
            }
        }
        let mut projected = self
            .project_context_each(&fresh_rows.iter().collect::<Vec<_>>())?
            .into_iter();
        let c_projs: Vec<Option<Tensor>> = drafts
            .iter()
            .map(|(d, plan)| projects(d, *plan).then(|| projected.next()).flatten())
            .collect();
        // Rows past those held, per draft and layer: kept once all succeed.
        let mut added: Vec<Vec<(Tensor, Tensor)>> = drafts.iter().map(|_| Vec::new()).collect();
        let ys = {
            let mut runs = Vec::with_capacity(drafts.len());
            let each = drafts.iter().zip(c_projs).zip(added.iter_mut());
            for (((d, plan), c_proj), added) in each {
                runs.push(match *plan {
                    None => BlockRun::whole(d.noise, c_proj, 0, d.start)?,
                    Some(from) => cached_run(d, from, c_proj, added)?,
                });
            }
            self.run_layers_each(&mut runs)?
        };
        for ((d, plan), added) in drafts.iter_mut().zip(added) {
            if plan.is_none() {
                continue;
            }
            for (i, (k, v)) in added.into_iter().enumerate() {
                match d.ctx.kv.get_mut(i) {
                    Some((kp, vp)) => {
                        kp.push(k);
                        vp.push(v);
                    }
                    None => d.ctx.kv.push((vec![k], vec![v])),
                }
            }
            d.ctx.len = d.ctx.len.max(d.start);
        }
        Ok(ys)
    }

    /// The first context row a cached forward at anchor `start` projects,
    /// with `held` rows held: `held`, or earlier where too few rows are new
    /// for the products to take the route the whole-context forward takes.
    /// `None`: the whole-context forward's products do not take a
    /// row-independent route (or run off the CPU), so it runs whole.
    fn cached_from(&self, held: usize, start: usize, b: usize) -> Option<usize> {
        let (h, kh) = (
            self.cfg.hidden_size,
            self.cfg.target_layer_ids.len() * self.cfg.hidden_size,
        );
        let kvd = self.cfg.num_key_value_heads * self.cfg.head_dim;
        let same_rows = |fresh: usize| {
            (fresh == 0 || rows_batchable(fresh, kh, h)) && rows_batchable(fresh + b, h, kvd)
        };
        if start == 0 || !self.weights.on_cpu() || !same_rows(start) {
            return None;
        }
        // A taller stack takes the same route, so this stops by `from = 0`.
        let mut from = held;
        while !same_rows(start - from) {
            from -= 1;
        }
        Some(from)
    }
}

/// The run of a draft that reads its context's held keys and values
/// (positions `0..from` of them) and projects the rows `from..start`
/// (`c_proj`, none when `from == start`): each layer's keys and values are
/// the held ones before `start`, then the run's; the rows past those held
/// go to `added` (one entry per layer), for the caller to keep.
fn cached_run<'k>(
    d: &'k CachedDraft<'_>,
    from: usize,
    c_proj: Option<Tensor>,
    added: &'k mut Vec<(Tensor, Tensor)>,
) -> Result<BlockRun<'k>> {
    let (start, held, layers) = (d.start, d.ctx.len, &d.ctx.kv);
    let (fresh, b) = (start - from, d.noise.dim(0)?);
    let keys = move |i: usize, k: Tensor, v: Tensor| -> Result<(Tensor, Tensor)> {
        let (mut ks, mut vs) = match layers.get(i) {
            Some((kp, vp)) => (
                narrow_pieces(kp, 2, 0, start)?,
                narrow_pieces(vp, 2, 0, start)?,
            ),
            None => (Vec::new(), Vec::new()),
        };
        if start > held {
            let (a, n) = (held - from, start - held);
            // Copies: a view would keep this forward's whole K and V alive.
            let k_new = k.narrow(2, a, n)?.force_contiguous()?;
            let v_new = v.narrow(2, a, n)?.force_contiguous()?;
            ks.push(k_new.clone());
            vs.push(v_new.clone());
            added.push((k_new, v_new));
        }
        ks.push(k.narrow(2, fresh, b)?);
        vs.push(v.narrow(2, fresh, b)?);
        Ok((Tensor::cat(&ks, 2)?, Tensor::cat(&vs, 2)?))
    };
    Ok(BlockRun {
        noise: d.noise.clone(),
        c_proj,
        ctx_start: from,
        block_start: start,
        keys_before: start,
        keys: Box::new(keys),
    })
}
