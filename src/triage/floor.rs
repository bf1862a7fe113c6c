//! The noise floor of the baseline's taps: the baseline's forward over its
//! own tokens again, as its noise shadow (`NoiseShadow`: products rounded
//! the other way near rounding midpoints; run in the baseline's own sweep,
//! [`super::groups::Group::shadow_taps`]), and per tap the drift between
//! the two (`docs/noise-floor.md`). A suspect computing in the baseline's
//! half dtype whose taps lie inside the band differs from it by numerics
//! noise only.

use candle_core::Tensor;

use super::groups::Base;
use crate::error::Result;
use crate::parity::metrics::Accumulator;
use crate::parity::noise::{FloorPlan, NoiseFloor, NoiseRow};
use crate::precision::Precision;

/// The floor of the baseline's taps `taps` (rows indexed by the tap's
/// `hidden_states` index, `l + 1`; the last layer's tap is its raw output,
/// at index N): per tap, the drift between the baseline's features and its
/// noise shadow's taps over the same tokens, which the baseline's sweep ran
/// ([`Base::shadow_taps`], [`wanted`]); `None` when it did not (f32, or the
/// floor skipped).
///
/// Errors: a tensor failure.
pub fn of_taps(prec: Precision, base: &Base, taps: &[usize]) -> Result<Option<NoiseFloor>> {
    let Some(shadow) = &base.shadow_taps else {
        return Ok(None);
    };
    let mut rows = Vec::with_capacity(taps.len());
    for (j, &l) in taps.iter().enumerate() {
        let mut acc = Accumulator::default();
        for (k, (feats, out)) in base.feats.iter().zip(shadow).enumerate() {
            let h = out[j].dim(1)?;
            let ours: Tensor = feats.narrow(1, j * h, h)?;
            acc.add(k, &ours, &out[j])?;
        }
        // A tap the shadow leaves bitwise has no band: the dtype's tolerance
        // judges it (an empty band would fail any legitimate change).
        rows.extend(NoiseRow::of(l + 1, &acc.finish()).filter(|r| r.rel_l2 > 0.0));
    }
    Ok(Some(NoiseFloor::new(prec, rows)))
}

/// Whether the baseline's sweep runs its noise shadow: in half precision,
/// unless `plan` skips the floor.
pub fn wanted(prec: Precision, plan: FloorPlan) -> bool {
    plan != FloorPlan::Skip && prec != Precision::F32
}
