//! The measured noise floor of a half-precision run: per `hidden_states`
//! index, how far the same path drifts from its shadow, a second
//! implementation whose products round the other way wherever another
//! summation order could ([`ProductRounding::NearMidpointsFlipped`]), and
//! the band a second implementation's difference is expected inside
//! (`docs/noise-floor.md`).
//!
//! [`ProductRounding::NearMidpointsFlipped`]: crate::precision::ProductRounding

use serde::{Deserialize, Serialize};

use candle_core::Tensor;

use super::metrics::Metrics;
use super::pairs::compare_prompts;
use super::verdict::Tolerance;
use crate::error::{Error, Result};
use crate::precision::Precision;

/// Whether a half-precision run measures its noise floor (`--no-noise-floor` skips it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FloorPlan {
    /// Run the noise shadow beside the path (one more forward of it).
    #[default]
    Measure,
    /// No shadow: the rows are judged by the dtype's tolerance alone.
    Skip,
}

/// What the band does to a pair's verdicts (both sides in the same half
/// precision; otherwise the band is shown beside the rows only, the dtype
/// difference being the finding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BandRole {
    /// Both sides are hsparity's own arithmetic (`compare`'s loading
    /// paths): they share every kernel, so a difference beyond the band is
    /// the paths computing something else, at least a warning; inside it, a
    /// pass.
    Bounds,
    /// The sides are two implementations (`diff` of dumps, engine
    /// captures): the band widens the dtype's pass thresholds (a difference
    /// inside it passes whatever its size); one beyond the band that the
    /// dtype's tolerance passes is reported as beyond the floor, not failed
    /// (an implementation that rounds elsewhere, as an engine's fused
    /// kernels do, differs by more than reordered products).
    Widens,
}

impl FloorPlan {
    /// The plan of a `--no-noise-floor` flag (`skip`: given).
    pub fn skipping(skip: bool) -> Self {
        if skip {
            FloorPlan::Skip
        } else {
            FloorPlan::Measure
        }
    }
}

/// The run against its noise shadow at one `hidden_states` index.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoiseRow {
    /// `hidden_states` index.
    pub index: usize,
    /// Relative L2 of the run against its shadow.
    pub rel_l2: f64,
    /// Smallest per-token cosine of the run against its shadow.
    pub cos_min: f64,
}

impl NoiseRow {
    /// Per metric the larger drift of `self` and `other` (`self`'s index).
    fn wider(&self, other: &NoiseRow) -> NoiseRow {
        NoiseRow {
            index: self.index,
            rel_l2: self.rel_l2.max(other.rel_l2),
            cos_min: self.cos_min.min(other.cos_min),
        }
    }

    /// The row of `m` (the run against its shadow) at `index`; `None` where
    /// either holds NaN or ±Inf (the run overflows there: no band).
    pub fn of(index: usize, m: &Metrics) -> Option<Self> {
        let finite =
            m.nan_count + m.inf_count == 0 && m.rel_l2.is_finite() && m.cos_min.is_finite();
        finite.then_some(Self {
            index,
            rel_l2: m.rel_l2,
            cos_min: m.cos_min,
        })
    }
}

/// How many times the shadow's drift a second implementation may differ by
/// and still be numerics noise: two independent orders each drift from the
/// path's exact arithmetic about as far as the shadow does, so their
/// difference reaches about twice it (measured on the corpus of
/// `tools/noise_corpus.py`, `docs/noise-floor.md`).
pub const SCALE: f64 = 2.0;

/// The method [`NoiseFloor::method`] names.
pub const METHOD: &str = "midpoint-flips";

/// A run's noise floor: per `hidden_states` index, the run against its
/// noise shadow. Serialised into a dump's `__metadata__` (`noise_floor`)
/// and into reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoiseFloor {
    /// How the shadow was computed ([`METHOD`]).
    pub method: String,
    /// The factor from the shadow's drift to the band ([`SCALE`]).
    pub scale: f64,
    /// The dtype the run and its shadow computed in (bf16 or f16).
    pub dtype: Precision,
    /// Per index, in index order.
    pub rows: Vec<NoiseRow>,
    /// The last decoder layer's pre-norm output (`index`: the number of
    /// layers), when the run recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_layer_output: Option<NoiseRow>,
}

/// The band around one `hidden_states` index: a difference with relative
/// L2 at most `rel_l2` and smallest cosine at least `cos_min` is noise.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Band {
    /// Largest relative L2 inside the band.
    pub rel_l2: f64,
    /// Smallest per-token cosine inside the band.
    pub cos_min: f64,
}

impl Band {
    /// How many bands `m` lies from agreement: the larger of its relative L2
    /// over the band's and its angle over the band's (`1 − cos` grows as
    /// the angle squared); at most 1 inside the band. A difference over an
    /// empty band (the shadow bitwise there) is infinitely far.
    pub fn ratio(&self, m: &Metrics) -> f64 {
        let over = |x: f64, band: f64| match (x <= 0.0, band <= 0.0) {
            (true, _) => 0.0,
            (false, true) => f64::INFINITY,
            (false, false) => x / band,
        };
        let rel = over(m.rel_l2, self.rel_l2);
        let angle = over(1.0 - m.cos_min, 1.0 - self.cos_min).sqrt();
        if m.bitwise {
            0.0
        } else {
            rel.max(angle)
        }
    }
}

impl BandRole {
    /// The dtype's tolerance `t` with `band` taking this role: its pass
    /// thresholds ([`BandRole::Bounds`]) or the pass thresholds widened to
    /// it ([`BandRole::Widens`]); `t`'s warn limits stay. A band wider than
    /// them is not capped: a deep MoE's routing flips take two valid bf16
    /// runs below cos 0.99, and the report says so
    /// ([`crate::parity::PairReport::wide_band_note`]).
    pub fn tolerance(self, t: Tolerance, band: Band) -> Tolerance {
        let (cos, rel) = match self {
            BandRole::Bounds => (band.cos_min, band.rel_l2),
            BandRole::Widens => (band.cos_min.min(t.pass_cos), band.rel_l2.max(t.pass_rel_l2)),
        };
        Tolerance {
            pass_cos: cos,
            pass_rel_l2: rel,
            ..t
        }
    }
}

impl NoiseFloor {
    /// The floor of a run in `dtype` whose shadow rows are `rows`.
    pub fn new(dtype: Precision, rows: Vec<NoiseRow>) -> Self {
        Self {
            method: METHOD.into(),
            scale: SCALE,
            dtype,
            rows,
            last_layer_output: None,
        }
    }

    /// Measures `index`: the run's tensors against its shadow's (per
    /// prompt); nothing where either holds NaN or ±Inf.
    ///
    /// Errors: tensors of different shapes.
    pub fn measure(&mut self, index: usize, run: &[Tensor], shadow: &[Tensor]) -> Result<()> {
        self.rows
            .extend(NoiseRow::of(index, &compare_prompts(run, shadow)?));
        Ok(())
    }

    /// Measures the last decoder layer's pre-norm output (indexed after the
    /// rows measured so far), as [`Self::measure`].
    ///
    /// Errors: as [`Self::measure`].
    pub fn measure_last(&mut self, run: &[Tensor], shadow: &[Tensor]) -> Result<()> {
        let index = self.rows.last().map_or(0, |r| r.index + 1);
        self.last_layer_output = NoiseRow::of(index, &compare_prompts(run, shadow)?);
        Ok(())
    }

    /// The band at `index`, when the floor measured it.
    pub fn band(&self, index: usize) -> Option<Band> {
        self.rows
            .iter()
            .find(|r| r.index == index)
            .map(|r| self.band_of(r))
    }

    /// The band of the last decoder layer's pre-norm output, when measured.
    pub fn last_layer_band(&self) -> Option<Band> {
        self.last_layer_output.as_ref().map(|r| self.band_of(r))
    }

    fn band_of(&self, r: &NoiseRow) -> Band {
        let s = self.scale;
        Band {
            rel_l2: s * r.rel_l2,
            cos_min: 1.0 - s * s * (1.0 - r.cos_min).max(0.0),
        }
    }

    /// Per index the wider of two runs' floors (either may be absent): every
    /// index either measured, the larger drift where both did.
    pub fn wider(a: Option<&Self>, b: Option<&Self>) -> Option<Self> {
        let (a, b) = match (a, b) {
            (Some(a), Some(b)) => (a, b),
            (a, b) => return a.or(b).cloned(),
        };
        let mut rows: std::collections::BTreeMap<usize, NoiseRow> =
            a.rows.iter().map(|r| (r.index, *r)).collect();
        for r in &b.rows {
            rows.entry(r.index)
                .and_modify(|x| *x = x.wider(r))
                .or_insert(*r);
        }
        let last = match (&a.last_layer_output, &b.last_layer_output) {
            (Some(x), Some(y)) => Some(x.wider(y)),
            (x, y) => x.or(*y),
        };
        Some(Self {
            rows: rows.into_values().collect(),
            last_layer_output: last,
            ..a.clone()
        })
    }

    /// The `noise_floor` metadata value of a dump.
    pub fn to_metadata(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses the `noise_floor` metadata value of dump `name`, which
    /// computed in `dtype` and holds a model of `num_layers` layers (when
    /// known): hsparity's method and scale, the dump's own half dtype, rows
    /// of ascending indices within the model, drifts within `[0, 1]` and
    /// cosines within `[−1, 1]`.
    ///
    /// Errors ([`Error::Input`], naming the dump and what is wrong): any other value.
    pub fn from_metadata(
        s: &str,
        name: &str,
        dtype: Precision,
        num_layers: Option<usize>,
    ) -> Result<Self> {
        let bad = |why: String| Error::Input(format!("{name}: __metadata__ noise_floor {why}"));
        let v: serde_json::Value =
            serde_json::from_str(s).map_err(|e| bad(format!("is not JSON ({e})")))?;
        let objects = v.is_object()
            && v["rows"]
                .as_array()
                .is_some_and(|r| r.iter().all(|x| x.is_object()))
            && (v.get("last_layer_output").is_none() || v["last_layer_output"].is_object());
        if !objects {
            return Err(bad(
                "is not a noise floor: expected an object with rows of objects".into(),
            ));
        }
        let f: Self =
            serde_json::from_value(v).map_err(|e| bad(format!("is not a noise floor ({e})")))?;
        if f.method != METHOD || f.scale != SCALE {
            return Err(bad(format!(
                "has method {:?} and scale {} (this hsparity writes and reads {METHOD:?} with a scale of {SCALE})",
                f.method, f.scale
            )));
        }
        if f.dtype != dtype || dtype == Precision::F32 {
            return Err(bad(format!(
                "was measured in {} but the dump holds {dtype} states (a floor belongs to a bf16 or f16 run)",
                f.dtype
            )));
        }
        let in_range =
            |r: &NoiseRow| (0.0..=1.0).contains(&r.rel_l2) && (-1.0..=1.0).contains(&r.cos_min);
        if let Some(r) = f
            .rows
            .iter()
            .chain(&f.last_layer_output)
            .find(|r| !in_range(r))
        {
            return Err(bad(format!(
                "row {} has rel_l2 {} and cos_min {} (a drift lies in [0, 1], a cosine in [-1, 1])",
                r.index, r.rel_l2, r.cos_min
            )));
        }
        if f.rows.windows(2).any(|w| w[0].index >= w[1].index) {
            return Err(bad(
                "has rows out of order or repeated (indices must ascend)".into(),
            ));
        }
        if let Some(n) = num_layers {
            let last = f.last_layer_output.map(|r| r.index);
            if f.rows.last().is_some_and(|r| r.index > n) || last.is_some_and(|i| i != n) {
                return Err(bad(format!(
                    "has indices beyond the dump's {n} layers (rows up to {n}, last_layer_output at {n})"
                )));
            }
        }
        Ok(f)
    }
}

/// One row's place against the band (`pairs[].hidden_states[].noise`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NoiseCell {
    /// The band at this index.
    pub band: Band,
    /// [`Band::ratio`] of the row's difference; `None` (JSON `null`) when
    /// the band is empty (the shadow bitwise there) and the row is not.
    pub ratio: Option<f64>,
    /// The difference lies inside the band: numerics noise.
    pub inside: bool,
}

impl NoiseCell {
    /// `m` against `band`.
    pub fn of(band: Band, m: &Metrics) -> Self {
        let ratio = band.ratio(m);
        Self {
            band,
            ratio: ratio.is_finite().then_some(ratio),
            inside: ratio <= 1.0 && m.nan_count + m.inf_count == 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::HiddenKind;
    use crate::parity::metrics::Accumulator;
    use crate::parity::{PairReport, Verdict};

    /// Metrics of `b` against `a = [1, 0, …]` rows: `b` rotated by `angle`.
    fn rotated(angle: f64) -> Metrics {
        let mut acc = Accumulator::default();
        let a = [1.0f32, 0.0];
        let b = [angle.cos() as f32, angle.sin() as f32];
        acc.add_rows(0, &a, &b, 2);
        acc.finish()
    }

    fn floor_at(index: usize, m: &Metrics) -> NoiseFloor {
        NoiseFloor::new(Precision::Bf16, vec![NoiseRow::of(index, m).unwrap()])
    }

    /// The band is the shadow's drift scaled: rel L2 by the scale, the
    /// angle by the scale too (1 − cos by its square).
    #[test]
    fn band_scales_the_shadows_drift() {
        let shadow = rotated(1e-3);
        let band = floor_at(3, &shadow).band(3).unwrap();
        assert!((band.rel_l2 - SCALE * shadow.rel_l2).abs() < 1e-12);
        let angle = |c: f64| (1.0 - c).max(0.0).sqrt();
        let want = SCALE * angle(shadow.cos_min);
        assert!((angle(band.cos_min) - want).abs() < 1e-9 * want.max(1e-12) + 1e-12);
        assert!(floor_at(3, &shadow).band(4).is_none());
        // Twice the shadow's angle is on the edge; three times is outside.
        let cell = |a: f64| NoiseCell::of(band, &rotated(a));
        assert!(cell(1.5e-3).inside && cell(1.5e-3).ratio.unwrap() < 1.0);
        assert!(!cell(3e-3).inside && cell(3e-3).ratio.unwrap() > 1.4);
        // An empty band (the shadow bitwise there): any difference is outside,
        // with no finite ratio; a bitwise row is inside.
        let empty = Band {
            rel_l2: 0.0,
            cos_min: 1.0,
        };
        let c = NoiseCell::of(empty, &rotated(1e-6));
        assert!(!c.inside && c.ratio.is_none());
        assert!(NoiseCell::of(empty, &rotated(0.0)).inside);
    }

    #[test]
    fn wider_takes_the_larger_drift_per_index() {
        let (a, b) = (floor_at(1, &rotated(1e-3)), floor_at(1, &rotated(4e-3)));
        let w = NoiseFloor::wider(Some(&a), Some(&b)).unwrap();
        assert_eq!(w.rows[0].rel_l2, b.rows[0].rel_l2);
        // Indices only one floor measured are kept.
        let c = floor_at(2, &rotated(1e-3));
        let w = NoiseFloor::wider(Some(&a), Some(&c)).unwrap();
        assert_eq!(w.rows.iter().map(|r| r.index).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(NoiseFloor::wider(Some(&a), None), Some(a.clone()));
        assert_eq!(NoiseFloor::wider(None, None), None);
    }

    #[test]
    fn metadata_round_trips_and_refuses_other_floors() {
        let f = floor_at(2, &rotated(1e-3));
        let read = |s: &str, dtype| NoiseFloor::from_metadata(s, "d.safetensors", dtype, Some(3));
        assert_eq!(read(&f.to_metadata(), Precision::Bf16).unwrap(), f);
        let m = f.to_metadata();
        let r = f.rows[0];
        let row = format!(
            "{{\"index\":2,\"rel_l2\":{},\"cos_min\":{}}}",
            r.rel_l2, r.cos_min
        );
        assert!(m.contains(&row), "{m}");
        let with_row = |new: &str| m.replace(&row, new);
        for (bad, dtype) in [
            ("not json".to_string(), Precision::Bf16),
            (
                "[\"midpoint-flips\",2.0,\"bf16\",[]]".to_string(),
                Precision::Bf16,
            ),
            (m.replace(METHOD, "split-k"), Precision::Bf16),
            (
                m.replace("\"scale\":2.0", "\"scale\":1e10"),
                Precision::Bf16,
            ),
            (m.clone(), Precision::F16),
            (m.replace("\"bf16\"", "\"f32\""), Precision::F32),
            (
                with_row("{\"index\":2,\"rel_l2\":0.5,\"cos_min\":-5.0}"),
                Precision::Bf16,
            ),
            (
                with_row("{\"index\":2,\"rel_l2\":-1.0,\"cos_min\":1.0}"),
                Precision::Bf16,
            ),
            (
                with_row("{\"index\":9,\"rel_l2\":0.1,\"cos_min\":0.9}"),
                Precision::Bf16,
            ),
            (with_row(&format!("{row},{row}")), Precision::Bf16),
            (with_row("[2,0.1,0.9]"), Precision::Bf16),
            (
                m.replace("\"rows\"", "\"extra\":1,\"rows\""),
                Precision::Bf16,
            ),
        ] {
            let e = read(&bad, dtype).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("d.safetensors: __metadata__ noise_floor"),
                "{bad}: {e}"
            );
        }
    }

    /// Bounds (compare's paths): beyond the band is at least a warning even
    /// where the dtype's tolerance passes. Widens (diff): the tolerance's pass
    /// stands, and the row is listed as beyond the floor; a difference the
    /// tolerance fails passes inside a wide band.
    #[test]
    fn roles_judge_as_documented() {
        let shadow = rotated(1e-4);
        let beyond = rotated(1e-3); // 5× the band, within bf16's tolerance
        let judge = |role: BandRole, floor: &NoiseFloor, m: &Metrics| {
            let mut p = PairReport::new("a", Precision::Bf16, "b", Precision::Bf16);
            p.set_noise_floor(Some(floor.clone()), role);
            p.push_row(1, HiddenKind::DecoderLayer, m.clone(), None);
            (p.hidden_states[0].verdict, p.beyond_floor(), p.agreement())
        };
        let floor = floor_at(1, &shadow);
        assert_eq!(by_tolerance(&beyond), Verdict::Pass);
        let (v, beyond_rows, _) = judge(BandRole::Bounds, &floor, &beyond);
        assert_eq!((v, beyond_rows.len()), (Verdict::Warn, 0));
        let (v, beyond_rows, agreement) = judge(BandRole::Widens, &floor, &beyond);
        assert_eq!((v, beyond_rows[0].0.as_str()), (Verdict::Pass, "hs 1"));
        assert_eq!(agreement, "within tolerance");
        let (v, _, agreement) = judge(BandRole::Widens, &floor, &rotated(1.5e-4));
        assert_eq!(
            (v, agreement),
            (Verdict::Pass, "within the measured noise floor")
        );
        // bf16's tolerance warns at cos 0.995 (which fails the run); a band
        // that wide passes it.
        let far = rotated(0.1);
        assert_eq!(by_tolerance(&far), Verdict::Warn);
        let wide = floor_at(1, &rotated(0.06));
        assert_eq!(judge(BandRole::Widens, &wide, &far).0, Verdict::Pass);
        assert_eq!(judge(BandRole::Bounds, &wide, &far).0, Verdict::Pass);
        // A band wider than the dtype's warn limits passes a row inside it
        // (routing flips of a deep MoE) and the pair says so.
        let too_wide = floor_at(1, &rotated(0.2));
        let flipped = rotated(0.15);
        assert_eq!(by_tolerance(&flipped), Verdict::Fail);
        let mut p = PairReport::new("a", Precision::Bf16, "b", Precision::Bf16);
        p.set_noise_floor(Some(too_wide), BandRole::Widens);
        p.push_row(1, HiddenKind::DecoderLayer, flipped, None);
        assert_eq!(p.hidden_states[0].verdict, Verdict::Pass);
        let note = p.wide_band_note().unwrap();
        assert!(
            note.starts_with("the measured noise floor at hs 1 is wider than bf16's warn limits"),
            "{note}"
        );
        // In f16 likewise: a routing flip at cos 0.997 inside a measured
        // band passes, though f16's warn cosine is 0.999.
        let flip = rotated(0.077);
        let f16 = crate::parity::Tolerance::for_precision(Precision::F16);
        assert_eq!(f16.judge(&flip), Verdict::Fail);
        let mut p = PairReport::new("a", Precision::F16, "b", Precision::F16);
        let mut band = floor_at(1, &rotated(0.06));
        band.dtype = Precision::F16;
        p.set_noise_floor(Some(band), BandRole::Widens);
        p.push_row(1, HiddenKind::DecoderLayer, flip, None);
        assert_eq!(p.hidden_states[0].verdict, Verdict::Pass);
        // Different dtypes: the band is shown, never judges.
        let mut p = PairReport::new("a", Precision::Bf16, "b", Precision::F16);
        p.set_noise_floor(Some(wide), BandRole::Widens);
        assert_eq!(p.noise_role, None);
    }

    fn by_tolerance(m: &Metrics) -> Verdict {
        crate::parity::Tolerance::for_precision(Precision::Bf16).judge(m)
    }
}
