//! Per-layer parity of path pairs `(paths[0], paths[j])`, computed on the fly
//! as the capture streams `hidden_states` (see `docs/architecture.md`,
//! "lock-step capture").

use candle_core::Tensor;
use serde::Serialize;

use super::localise::{Localisation, PositionProfile, PromptAgreement, PromptInputs};
use super::metrics::{Accumulator, Metrics};
use super::noise::{BandRole, NoiseCell, NoiseFloor};
pub use super::routers::RouterAgreement;
use super::verdict::{Tolerance, Verdict};
use crate::capture::{HiddenKind, Observer};
use crate::error::Result;
use crate::models::moe::Routing;
use crate::precision::Precision;

/// One `hidden_states` index of a pair (a JSON row of `pairs[].hidden_states`).
#[derive(Debug, Clone, Serialize)]
pub struct HiddenStateRow {
    /// transformers `hidden_states` index: 0 embeddings, l+1 output of layer l, N final-normed.
    pub index: usize,
    /// What the entry is (`embedding`, `linear_attention`, `full_attention`,
    /// `decoder_layer` in dumps, `final_norm`).
    pub layer_type: HiddenKind,
    /// Propagated comparison: each path fed its own history.
    #[serde(flatten)]
    pub metrics: Metrics,
    /// Verdict of the propagated comparison.
    pub verdict: Verdict,
    /// Local comparison: path b's layer fed path a's input (isolates the layer).
    pub local: Option<Metrics>,
    /// Verdict of the local comparison.
    pub local_verdict: Option<Verdict>,
    /// On warn/fail, the tolerance that would have passed.
    pub needed_to_pass: Option<String>,
    /// Paths whose weights for this hidden state (its layer, or the embedding
    /// / final norm) include MISSING, randomly initialised tensors.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub random_init: Vec<String>,
    /// The MoE router's top-k agreement of the layer this row is the output
    /// of (MoE families only; absent for the dense ones and the embeddings).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub router: Option<RouterAgreement>,
    /// Per prompt: its own verdict, the positions that agree and the first
    /// that departs ([`super::localise`]).
    pub prompts: Vec<PromptAgreement>,
    /// The row against the noise floor's band at this index, when the pair
    /// has a floor ([`PairReport::noise_floor`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub noise: Option<NoiseCell>,
}

/// The comparison of two loading paths over all prompts.
#[derive(Debug, Clone, Serialize)]
pub struct PairReport {
    /// Reference path (`rel_l2` is measured against `b`).
    pub a: String,
    /// Compared path.
    pub b: String,
    /// dtype path `a` computed in.
    pub dtype_a: Precision,
    /// dtype path `b` computed in.
    pub dtype_b: Precision,
    /// First `hidden_states` index whose verdict is not pass.
    pub first_divergent: Option<usize>,
    /// First `hidden_states` index that is not bitwise identical.
    pub first_non_bitwise: Option<usize>,
    /// Rows by `hidden_states` index.
    pub hidden_states: Vec<HiddenStateRow>,
    /// Where agreement ends at the first divergent hidden state, and the
    /// boundary it coincides with (set by [`PairReport::localise`]).
    pub localisation: Option<Localisation>,
    /// Raw last-layer output (pre final norm).
    pub last_layer_output: Option<Metrics>,
    /// Logits, when both paths have an LM head.
    pub logits: Option<Metrics>,
    /// Verdict on the logits.
    pub logits_verdict: Option<Verdict>,
    /// Fraction of tokens whose greedy (argmax) next token agrees, when both have logits.
    pub argmax_agreement: Option<f64>,
    /// Paths whose `lm_head` is randomly initialised (their logits are noise).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logits_random_init: Vec<String>,
    /// Tolerances applied.
    pub tolerance: Tolerance,
    /// Which dtype's tolerance judged the rows and why, in words (`bf16
    /// tolerance`, `f32 tolerance (bf16 vs f16 paths are held to f32's: …)`).
    pub tolerance_rule: String,
    /// The measured noise floor of path `a`'s half-precision run (of both
    /// dumps' runs, the wider, in `diff`), when one was measured
    /// ([`super::noise`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub noise_floor: Option<NoiseFloor>,
    /// What the floor's band does to the verdicts (`null`: shown only, or
    /// no floor): set when both sides compute in the same half precision.
    pub noise_role: Option<BandRole>,
}

impl PairReport {
    /// An empty report for `a` (computed in `dtype_a`) vs `b` (in `dtype_b`).
    /// Tolerances: those of the common dtype; when the dtypes differ, the f32
    /// ones — the paths then compute different things, and that is the finding.
    pub fn new(a: &str, dtype_a: Precision, b: &str, dtype_b: Precision) -> Self {
        let (tolerance, tolerance_rule) = if dtype_a == dtype_b {
            (
                Tolerance::for_precision(dtype_a),
                format!("{dtype_a} tolerance"),
            )
        } else {
            (
                Tolerance::for_precision(Precision::F32),
                format!(
                    "f32 tolerance ({dtype_a} vs {dtype_b} paths are held to f32's: the dtype difference is the finding)"
                ),
            )
        };
        Self {
            a: a.to_string(),
            b: b.to_string(),
            dtype_a,
            dtype_b,
            first_divergent: None,
            first_non_bitwise: None,
            hidden_states: Vec::new(),
            localisation: None,
            last_layer_output: None,
            logits: None,
            logits_verdict: None,
            argmax_agreement: None,
            logits_random_init: Vec::new(),
            tolerance,
            tolerance_rule,
            noise_floor: None,
            noise_role: None,
        }
    }

    /// Sets the noise floor the rows pushed from now on are read against; it
    /// takes `role` in their verdicts when both sides compute in the same
    /// half precision.
    pub fn set_noise_floor(&mut self, floor: Option<NoiseFloor>, role: BandRole) {
        let same_half = self.dtype_a == self.dtype_b && self.dtype_a != Precision::F32;
        self.noise_role = (floor.is_some() && same_half).then_some(role);
        self.noise_floor = floor;
    }

    /// The verdict on the last decoder layer's pre-norm output, when
    /// compared: by its band where the noise floor judges, as
    /// [`Self::row_tolerance`] judges a row.
    pub fn last_layer_verdict(&self) -> Option<Verdict> {
        let m = self.last_layer_output.as_ref()?;
        let band = self
            .noise_floor
            .as_ref()
            .and_then(NoiseFloor::last_layer_band);
        Some(self.tolerance_with(band).judge(m))
    }

    /// The last layer's pre-norm output against its band, when both exist.
    pub fn last_layer_noise(&self) -> Option<NoiseCell> {
        let m = self.last_layer_output.as_ref()?;
        let band = self.noise_floor.as_ref()?.last_layer_band()?;
        Some(NoiseCell::of(band, m))
    }

    /// The tolerance row `index` is judged by: where the noise floor takes a
    /// role ([`Self::noise_role`]) and measured this index, the dtype's with
    /// the band as its pass thresholds ([`BandRole::Bounds`]) or the pass
    /// thresholds widened to the band ([`BandRole::Widens`]); else the dtype's.
    pub fn row_tolerance(&self, index: usize) -> Tolerance {
        self.tolerance_with(self.noise_floor.as_ref().and_then(|f| f.band(index)))
    }

    /// The dtype's tolerance with `band` as its pass thresholds where the
    /// noise floor judges.
    fn tolerance_with(&self, band: Option<super::noise::Band>) -> Tolerance {
        match (band, self.noise_role) {
            (Some(b), Some(role)) => role.tolerance(self.tolerance, b),
            _ => self.tolerance,
        }
    }

    /// How the pair agrees when every row passes: `within the measured noise
    /// floor` when the floor takes a role and every differing row (and the
    /// last layer's pre-norm output, when compared) lies inside its band,
    /// else `within tolerance`.
    pub fn agreement(&self) -> &'static str {
        let inside = self
            .hidden_states
            .iter()
            .filter(|r| !r.metrics.bitwise)
            .all(|r| r.noise.is_some_and(|c| c.inside))
            && self
                .last_layer_output
                .as_ref()
                .is_none_or(|m| m.bitwise || self.last_layer_noise().is_some_and(|c| c.inside));
        if self.noise_role.is_some() && inside {
            "within the measured noise floor"
        } else {
            "within tolerance"
        }
    }

    /// A note when the floor judges and its band at some hidden state is
    /// wider than the dtype's warn limits: two valid implementations part
    /// that far there, and hidden states cannot tell a difference of that
    /// size from noise (`None`: no such band).
    pub fn wide_band_note(&self) -> Option<String> {
        let floor = self
            .noise_floor
            .as_ref()
            .filter(|_| self.noise_role.is_some())?;
        let t = self.tolerance;
        let wide: Vec<(usize, f64)> = floor
            .rows
            .iter()
            .filter_map(|r| Some((r.index, floor.band(r.index)?)))
            .filter(|(_, b)| b.cos_min < t.warn_cos || b.rel_l2 > t.warn_rel_l2)
            .map(|(i, b)| (i, b.cos_min))
            .collect();
        let lowest = wide.iter().map(|w| w.1).fold(f64::INFINITY, f64::min);
        let indices: Vec<usize> = wide.into_iter().map(|w| w.0).collect();
        (!indices.is_empty()).then(|| {
            format!(
                "the measured noise floor at {} is wider than {}'s warn limits (band cos_min down to {lowest:.4}): \
                 two valid {} implementations of this model part that far on these prompts (in an MoE, routing \
                 flips at near-ties), so these hidden states cannot tell a difference that small from noise; \
                 compare in f32 (--dtype f32) to resolve it",
                super::verdict::index_runs(&indices),
                self.dtype_a,
                self.dtype_a
            )
        })
    }

    /// `(inside, differing)`: the hidden states that are not bitwise and
    /// carry a band, and how many of them lie inside it.
    pub fn floor_counts(&self) -> (usize, usize) {
        let differing = self
            .hidden_states
            .iter()
            .filter(|r| !r.metrics.bitwise)
            .filter_map(|r| r.noise);
        differing.fold((0, 0), |(i, n), c| (i + usize::from(c.inside), n + 1))
    }

    /// What passes but lies beyond the noise floor's band (`hs 2`, and
    /// `last_layer_output`), with the ratios ([`BandRole::Widens`]: more
    /// than reordered products explain).
    pub fn beyond_floor(&self) -> Vec<(String, Option<f64>)> {
        if self.noise_role != Some(BandRole::Widens) {
            return Vec::new();
        }
        let mut out: Vec<(String, Option<f64>)> = self
            .hidden_states
            .iter()
            .filter(|r| r.verdict == Verdict::Pass)
            .filter_map(|r| {
                let c = r.noise.filter(|c| !c.inside)?;
                Some((format!("hs {}", r.index), c.ratio))
            })
            .collect();
        if self.last_layer_verdict() == Some(Verdict::Pass) {
            if let Some(c) = self.last_layer_noise().filter(|c| !c.inside) {
                out.push(("last_layer_output".into(), c.ratio));
            }
        }
        out
    }

    /// Which rows did not pass and under which rule, when some did not: `hs
    /// 0–3 WARN, hs 4 FAIL under the f32 tolerance (…), pass cos_min ≥
    /// 0.99999 and rel L2 ≤ 1e-4; a WARN row fails the run`.
    pub fn policy(&self) -> Option<String> {
        let rows = |v: Verdict| {
            let idx: Vec<usize> = self
                .hidden_states
                .iter()
                .filter(|r| r.verdict == v)
                .map(|r| r.index)
                .collect();
            (!idx.is_empty()).then(|| format!("{} {}", super::verdict::index_runs(&idx), v.label()))
        };
        let mut parts: Vec<String> = [Verdict::Warn, Verdict::Fail]
            .into_iter()
            .filter_map(rows)
            .collect();
        if let Some(v) = self.logits_verdict.filter(|v| *v != Verdict::Pass) {
            parts.push(format!("logits {}", v.label()));
        }
        if parts.is_empty() {
            return None;
        }
        let warn_note = if parts.iter().any(|p| p.ends_with("WARN")) {
            "; a WARN row fails the run"
        } else {
            ""
        };
        if self.noise_role == Some(BandRole::Bounds) {
            let over: Vec<String> = self
                .hidden_states
                .iter()
                .filter(|r| r.verdict != Verdict::Pass)
                .filter_map(|r| {
                    let c = r.noise?;
                    Some(match c.ratio {
                        Some(x) => format!("hs {} at {x:.1}×", r.index),
                        None => format!("hs {} over an empty band", r.index),
                    })
                })
                .take(3)
                .collect();
            return Some(format!(
                "{} outside the measured {} noise floor ({}; a row passes inside the band two valid {} \
                 implementations of the reference reach, and fails beyond cos_min {} or rel L2 {:.0e}){warn_note}",
                parts.join(", "),
                self.dtype_a,
                over.join(", "),
                self.dtype_a,
                self.tolerance.warn_cos,
                self.tolerance.warn_rel_l2,
            ));
        }
        Some(format!(
            "{} under the {}, {}{warn_note}",
            parts.join(", "),
            self.tolerance_rule,
            self.tolerance.describe()
        ))
    }

    /// Verdict of the pair: the worst over hidden states and logits.
    pub fn verdict(&self) -> Verdict {
        self.hidden_states
            .iter()
            .map(|r| r.verdict)
            .chain(self.logits_verdict)
            .max_by_key(|v| *v as u8)
            .unwrap_or(Verdict::Pass)
    }

    /// Adds one compared index (used by live capture and by dump comparison).
    pub fn push_row(
        &mut self,
        index: usize,
        layer_type: HiddenKind,
        m: Metrics,
        local: Option<Metrics>,
    ) {
        let mut m = m;
        let noise = self
            .noise_floor
            .as_ref()
            .and_then(|f| f.band(index))
            .map(|band| NoiseCell::of(band, &m));
        let tolerance = self.row_tolerance(index);
        let verdict = tolerance.judge(&m);
        let prompts = m
            .profile
            .iter()
            .map(|rows| PromptAgreement::of(rows, &tolerance))
            .collect();
        let local_verdict = local.as_ref().map(|l| self.tolerance.judge(l));
        if verdict != Verdict::Pass && self.first_divergent.is_none() {
            self.first_divergent = Some(index);
        }
        if !m.bitwise && self.first_non_bitwise.is_none() {
            self.first_non_bitwise = Some(index);
        }
        let needed_to_pass = (verdict != Verdict::Pass).then(|| Tolerance::needed_to_pass(&m));
        if self.first_divergent != Some(index) {
            // Only the first divergent row's position profile is kept (the report plots it).
            m.profile = Vec::new();
        }
        self.hidden_states.push(HiddenStateRow {
            index,
            layer_type,
            metrics: m,
            verdict,
            local,
            local_verdict,
            needed_to_pass,
            random_init: Vec::new(),
            router: None,
            prompts,
            noise,
        });
    }

    /// Says where agreement ends at the first divergent hidden state
    /// (`inputs`: what is known of each prompt's inputs; may be empty).
    pub fn localise(&mut self, inputs: &[PromptInputs]) {
        self.localisation = self
            .first_divergent
            .and_then(|i| self.hidden_states.iter().find(|r| r.index == i))
            .map(|r| {
                let tolerance = self.row_tolerance(r.index);
                let profile = r
                    .metrics
                    .profile
                    .iter()
                    .map(|rows| PositionProfile::of(rows, &tolerance))
                    .collect();
                let mut l = super::localise::localise(r.index, &r.prompts, inputs, profile);
                // NaN/Inf rows depart wherever they are: no boundary is evidence.
                if r.metrics.nan_count + r.metrics.inf_count > 0 {
                    (l.boundary, l.cause) = (None, None);
                }
                l
            });
    }

    /// Records the logits comparison.
    pub fn set_logits(&mut self, m: Metrics, argmax_agreement: f64) {
        self.logits_verdict = Some(self.tolerance.judge(&m));
        self.logits = Some(m);
        self.argmax_agreement = Some(argmax_agreement);
    }
}

/// Compares every tensor of one list of prompts: `a[k]` vs `b[k]`.
pub fn compare_prompts(a: &[Tensor], b: &[Tensor]) -> Result<Metrics> {
    let mut acc = Accumulator::default();
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        acc.add(k, x, y)?;
    }
    Ok(acc.finish())
}

/// Fraction of rows whose argmax agrees between `a[k]` and `b[k]` (`[T, V]` each).
pub fn argmax_agreement(a: &[Tensor], b: &[Tensor]) -> Result<f64> {
    let (mut same, mut total) = (0usize, 0usize);
    for (x, y) in a.iter().zip(b) {
        let xa = x.argmax(candle_core::D::Minus1)?.to_vec1::<u32>()?;
        let ya = y.argmax(candle_core::D::Minus1)?.to_vec1::<u32>()?;
        same += xa.iter().zip(&ya).filter(|(p, q)| p == q).count();
        total += xa.len();
    }
    Ok(if total == 0 {
        1.0
    } else {
        same as f64 / total as f64
    })
}

/// [`Observer`] building one [`PairReport`] per `(paths[0], paths[j])`.
pub struct PairObserver {
    /// Reports for j = 1.., in path order.
    pub pairs: Vec<PairReport>,
    /// Path 0's noise floor, measured as the capture goes, when its noise
    /// shadow follows the compared paths in the capture.
    floor: Option<NoiseFloor>,
}

impl PairObserver {
    /// `paths`: `(name, compute dtype)` in capture order (≥ 2).
    pub fn new(paths: &[(String, Precision)]) -> Self {
        let (a, da) = &paths[0];
        Self {
            pairs: paths[1..]
                .iter()
                .map(|(b, db)| PairReport::new(a, *da, b, *db))
                .collect(),
            floor: None,
        }
    }

    /// The capture's last path is path 0's noise shadow
    /// ([`crate::loading::NoiseShadow`]): every pair reads its rows against
    /// the floor it measures.
    pub fn with_noise_shadow(mut self) -> Self {
        let dtype = self.pairs.first().map_or(Precision::F32, |p| p.dtype_a);
        self.floor = Some(NoiseFloor::new(dtype, Vec::new()));
        self
    }

    /// `measure` on path 0's floor with path 0's values (states, router
    /// choices) and its shadow's (the capture's last), then the floor so far
    /// to every pair.
    fn measure<T>(
        &mut self,
        per_path: &[Vec<T>],
        measure: impl FnOnce(&mut NoiseFloor, &[T], &[T]) -> Result<()>,
    ) -> Result<()> {
        let (Some(floor), Some(shadow)) = (self.floor.as_mut(), per_path.last()) else {
            return Ok(());
        };
        measure(floor, &per_path[0], shadow)?;
        for pair in &mut self.pairs {
            pair.set_noise_floor(Some(floor.clone()), BandRole::Bounds);
        }
        Ok(())
    }
}

impl Observer for PairObserver {
    fn hidden_states(
        &mut self,
        index: usize,
        kind: HiddenKind,
        states: &[Vec<Tensor>],
        local: &[Option<Vec<Tensor>>],
    ) -> Result<()> {
        self.measure(states, |f, run, shadow| f.measure(index, run, shadow))?;
        for (j, pair) in self.pairs.iter_mut().enumerate() {
            let m = compare_prompts(&states[0], &states[j + 1])?;
            let lm = match &local[j + 1] {
                Some(l) => Some(compare_prompts(&states[0], l)?),
                None => None,
            };
            pair.push_row(index, kind, m, lm);
        }
        Ok(())
    }

    fn last_layer_output(&mut self, states: &[Vec<Tensor>]) -> Result<()> {
        self.measure(states, NoiseFloor::measure_last)?;
        for (j, pair) in self.pairs.iter_mut().enumerate() {
            pair.last_layer_output = Some(compare_prompts(&states[0], &states[j + 1])?);
        }
        Ok(())
    }

    fn logits(&mut self, logits: &[Option<Vec<Tensor>>]) -> Result<()> {
        for (j, pair) in self.pairs.iter_mut().enumerate() {
            if let (Some(a), Some(b)) = (&logits[0], &logits[j + 1]) {
                pair.set_logits(compare_prompts(a, b)?, argmax_agreement(a, b)?);
            }
        }
        Ok(())
    }

    /// Sets the router agreement on the row of `hidden_states[layer + 1]`.
    fn routing(
        &mut self,
        layer: usize,
        routing: &[Vec<Routing>],
        local: &[Option<Vec<Routing>>],
    ) -> Result<()> {
        self.measure(routing, |f, run, shadow| {
            f.measure_router(layer, run, shadow)
        })?;
        for (j, pair) in self.pairs.iter_mut().enumerate() {
            let agreement =
                RouterAgreement::of(&routing[0], &routing[j + 1], local[j + 1].as_deref())?;
            pair.set_router(layer, agreement);
        }
        Ok(())
    }
}
