//! The noise floor of the baseline's taps: the baseline's forward over its
//! own tokens again, as its noise shadow ([`NoiseShadow`]: products rounded
//! the other way near rounding midpoints), and per tap the drift between
//! the two (`docs/noise-floor.md`). A suspect computing in the baseline's
//! half dtype whose taps lie inside the band differs from it by numerics
//! noise only.

use candle_core::Tensor;

use super::groups::Base;
use crate::drafter::faults::Faults;
use crate::drafter::target::{Capture, TargetModel};
use crate::drafter::{teacher_forced, Forced};
use crate::error::Result;
use crate::loading::NoiseShadow;
use crate::models::GdnForm;
use crate::parity::metrics::Accumulator;
use crate::parity::noise::{FloorPlan, NoiseFloor, NoiseRow};
use crate::precision::Precision;

/// The floor of the baseline's taps `taps` (rows indexed by the tap's
/// `hidden_states` index, `l + 1`; the last layer's tap is its raw output,
/// at index N), measured on the baseline's tokens
/// (`base`, prompts of `prompt_lens` tokens) as `plan` says; `None` in f32.
///
/// Errors: a tensor failure.
pub fn of_taps(
    base_target: &TargetModel,
    base: &Base,
    (taps, prompt_lens): (&[usize], &[usize]),
    plan: FloorPlan,
) -> Result<Option<NoiseFloor>> {
    if plan == FloorPlan::Skip || base_target.prec == Precision::F32 {
        return Ok(None);
    }
    let shadow = NoiseShadow(base_target.weights);
    let target = TargetModel {
        weights: &shadow,
        ..*base_target
    };
    let seqs: Vec<Forced> = base
        .tokens
        .iter()
        .zip(prompt_lens)
        .map(|(tokens, &prompt_len)| Forced {
            tokens,
            prompt_len,
            form: GdnForm::Chunked,
            decode_shift: 0,
            faults: Faults::default(),
        })
        .collect();
    let caps: Vec<Capture> = taps.iter().map(|&l| Capture::Tap(l)).collect();
    let outs = teacher_forced(&target, &seqs, &caps, false)?;
    let mut rows = Vec::with_capacity(taps.len());
    for (j, &l) in taps.iter().enumerate() {
        let mut acc = Accumulator::default();
        for (k, (feats, out)) in base.feats.iter().zip(&outs).enumerate() {
            let h = out.captures[j].dim(1)?;
            let ours: Tensor = feats.narrow(1, j * h, h)?;
            acc.add(k, &ours, &out.captures[j])?;
        }
        // A tap the shadow leaves bitwise has no band: the dtype's tolerance
        // judges it (an empty band would fail any legitimate change).
        rows.extend(NoiseRow::of(l + 1, &acc.finish()).filter(|r| r.rel_l2 > 0.0));
    }
    Ok(Some(NoiseFloor::new(base_target.prec, rows)))
}
