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

use super::Drafter;
use crate::error::Result;
use crate::models::layers::rows_batchable;

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
        let b = noise.dim(0)?;
        let Some(from) = self.cached_from(ctx.len.min(start), start, b) else {
            return self.forward(noise, &rows(0, start)?, 0, start);
        };
        let fresh = start - from;
        let c_proj = if fresh > 0 {
            Some(self.project_context(&rows(from, start)?)?)
        } else {
            None
        };
        let held = ctx.len;
        // Rows past those held, per layer: kept once the forward succeeds.
        let mut added: Vec<(Tensor, Tensor)> = Vec::new();
        let layers = &ctx.kv;
        let mut keys = |i: usize, k: Tensor, v: Tensor| -> Result<(Tensor, Tensor)> {
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
        let y = self.run_layers(noise, c_proj.as_ref(), from, start, start, &mut keys)?;
        for (i, (k, v)) in added.into_iter().enumerate() {
            match ctx.kv.get_mut(i) {
                Some((kp, vp)) => {
                    kp.push(k);
                    vp.push(v);
                }
                None => ctx.kv.push((vec![k], vec![v])),
            }
        }
        ctx.len = ctx.len.max(start);
        Ok(y)
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
