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
use super::pairs::{compare_prompts, RouterAgreement};
use super::verdict::Tolerance;
use crate::error::{Error, Result};
use crate::models::moe::Routing;
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
    /// MoE targets: per MoE layer, the run's router choices against its
    /// shadow's (layer order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routers: Vec<RouterNoise>,
}

/// The run's router against its noise shadow's at one MoE layer: how many
/// token × slot choices rounding alone flips there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterNoise {
    /// Decoder layer.
    pub layer: usize,
    /// token × slot choices compared.
    pub slots: usize,
    /// Choices where the shadow's expert differs (slot by slot).
    pub slots_differing: usize,
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
            routers: Vec::new(),
        }
    }

    /// Measures MoE layer `layer`'s router: the run's choices against its
    /// shadow's (per prompt).
    ///
    /// Errors: choices of different token counts or top-k.
    pub fn measure_router(
        &mut self,
        layer: usize,
        run: &[Routing],
        shadow: &[Routing],
    ) -> Result<()> {
        let a = RouterAgreement::of(run, shadow, None)?;
        self.routers.push(RouterNoise {
            layer,
            slots: a.slots,
            slots_differing: a.slots_differing,
        });
        Ok(())
    }

    /// The shadow's router flips at decoder layer `layer`, when measured.
    pub fn router(&self, layer: usize) -> Option<RouterNoise> {
        self.routers.iter().find(|r| r.layer == layer).copied()
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
        let mut routers: std::collections::BTreeMap<usize, RouterNoise> =
            a.routers.iter().map(|r| (r.layer, *r)).collect();
        for r in &b.routers {
            routers
                .entry(r.layer)
                .and_modify(|x| {
                    let rate = |n: &RouterNoise| n.slots_differing as f64 / n.slots.max(1) as f64;
                    if rate(r) > rate(x) {
                        *x = *r;
                    }
                })
                .or_insert(*r);
        }
        Some(Self {
            rows: rows.into_values().collect(),
            last_layer_output: last,
            routers: routers.into_values().collect(),
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
        let all_objects = |key: &str| {
            v[key]
                .as_array()
                .is_some_and(|r| r.iter().all(|x| x.is_object()))
        };
        let objects = v.is_object()
            && all_objects("rows")
            && (v.get("routers").is_none() || all_objects("routers"))
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
        if let Some(r) = f.routers.iter().find(|r| r.slots_differing > r.slots) {
            return Err(bad(format!(
                "router of layer {} has {} of {} choices differing (at most all of them)",
                r.layer, r.slots_differing, r.slots
            )));
        }
        if f.routers.windows(2).any(|w| w[0].layer >= w[1].layer) {
            return Err(bad(
                "has routers out of order or repeated (layers must ascend)".into(),
            ));
        }
        if let (Some(n), Some(r)) = (num_layers, f.routers.last()) {
            if r.layer >= n {
                return Err(bad(format!(
                    "has a router at layer {} of the dump's {n} layers",
                    r.layer
                )));
            }
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
mod tests;
