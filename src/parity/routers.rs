//! MoE routers compared: the top-k agreement of two paths at a layer
//! ([`RouterAgreement`], `pairs[].hidden_states[].router`), read against the
//! noise shadow's flips, and the router choices two dumps recorded
//! (`p{k}.router.{l}.indices`, `docs/dump-format.md`), compared layer by
//! layer as `compare` compares two paths' routers.

use serde::Serialize;

use super::noise::NoiseFloor;
use super::pairs::PairReport;
use crate::dump::Dump;
use crate::error::{Error, Result};
use crate::models::moe::Routing;

/// The MoE router's top-k agreement between two paths at one decoder layer
/// (`pairs[].hidden_states[].router`, on the row of the layer's output).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct RouterAgreement {
    /// token × slot choices compared (tokens of every prompt × top-k).
    pub slots: usize,
    /// Choices where path b's expert differs from path a's (slot by slot,
    /// `torch.topk` order: a reordering of the same experts counts).
    pub slots_differing: usize,
    /// Tokens whose set of k experts differs (slot order aside).
    pub tokens_with_other_experts: usize,
    /// The same count with b's layer fed a's input (the *local*
    /// comparison): the flips this layer makes by itself. `None` without it.
    pub local_slots_differing: Option<usize>,
    /// The choices the measured noise floor's shadow flips at this layer
    /// (rounding alone), when the pair has a floor with the layer's router.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub noise_slots_differing: Option<usize>,
    /// Whether `slots_differing` is at most [`super::noise::SCALE`] times
    /// (`noise_slots_differing` plus one): no more flips than another
    /// summation order makes (numerics noise; plus one because a shadow that
    /// flips none at a layer does not show that rounding cannot flip there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub within_noise_floor: Option<bool>,
}

impl RouterAgreement {
    /// a's and b's choices over the same prompts (`local`: b's layer on a's input).
    ///
    /// Errors: routings of different prompts or shapes ([`crate::error::Error::Input`]).
    pub fn of(a: &[Routing], b: &[Routing], local: Option<&[Routing]>) -> Result<Self> {
        let mut r = RouterAgreement::default();
        for (x, y) in a.iter().zip(b) {
            r.slots += x.indices.len();
            r.slots_differing += x.slots_differing(y)?;
            r.tokens_with_other_experts += x.tokens_with_other_experts(y)?;
        }
        if let Some(l) = local {
            let mut n = 0;
            for (x, y) in a.iter().zip(l) {
                n += x.slots_differing(y)?;
            }
            r.local_slots_differing = Some(n);
        }
        Ok(r)
    }

    /// `0/456`, or `3/456 (local 1)` when the local comparison flips some;
    /// `▲` after it when the flips lie beyond the noise floor's.
    pub fn cell(&self) -> String {
        let beyond = if self.within_noise_floor == Some(false) {
            " ▲"
        } else {
            ""
        };
        match self.local_slots_differing {
            Some(l) if l > 0 => format!(
                "{}/{} (local {l}){beyond}",
                self.slots_differing, self.slots
            ),
            _ => format!("{}/{}{beyond}", self.slots_differing, self.slots),
        }
    }

    /// How many flips the floor allows at this layer: [`super::noise::SCALE`]
    /// × (the shadow's + 1), when read against one.
    pub fn floor_allows(&self) -> Option<f64> {
        self.noise_slots_differing
            .map(|n| super::noise::SCALE * (n as f64 + 1.0))
    }
}

/// An MoE pair's routers read against the noise floor's
/// ([`PairReport::routers_against_floor`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RouterFloor {
    /// Every layer read against it flips no more than it allows.
    Within {
        /// The shadow's flips, summed over the layers.
        noise: usize,
        /// The choices compared there.
        slots: usize,
    },
    /// The first layer whose flips go beyond it.
    Beyond {
        /// Decoder layer.
        layer: usize,
        /// Its agreement (with the shadow's count).
        agreement: RouterAgreement,
    },
}

/// An MoE pair's routers over every layer compared
/// ([`PairReport::router_totals`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterTotals {
    /// MoE layers compared.
    pub layers: usize,
    /// token × slot choices compared over them.
    pub slots: usize,
    /// Choices that differ.
    pub slots_differing: usize,
    /// token-layers with another expert set.
    pub tokens_with_other_experts: usize,
    /// The first layer whose choices differ, with its agreement.
    pub first: Option<(usize, RouterAgreement)>,
}

impl PairReport {
    /// Records the router agreement of decoder layer `layer` on the row of
    /// `hidden_states[layer + 1]` (none when the pair has no such row).
    pub fn set_router(&mut self, layer: usize, mut agreement: RouterAgreement) {
        // Judged only where the floor bounds or widens (same dtype): across
        // dtypes the floor is shown, never a judge.
        let floor = self.noise_role.and(self.noise_floor.as_ref());
        if let Some(n) = floor.and_then(|f| f.router(layer)) {
            agreement.noise_slots_differing = Some(n.slots_differing);
            agreement.within_noise_floor = agreement
                .floor_allows()
                .map(|allows| agreement.slots_differing as f64 <= allows);
        }
        if let Some(row) = self.hidden_states.iter_mut().find(|r| r.index == layer + 1) {
            row.router = Some(agreement);
        }
    }

    /// `(decoder layer, agreement)` of every row carrying a router.
    fn routers(&self) -> impl Iterator<Item = (usize, RouterAgreement)> + '_ {
        self.hidden_states
            .iter()
            .filter_map(|r| Some((r.index.checked_sub(1)?, r.router?)))
    }

    /// The routers over every layer compared; `None` for a dense pair.
    pub fn router_totals(&self) -> Option<RouterTotals> {
        let mut t = RouterTotals {
            layers: 0,
            slots: 0,
            slots_differing: 0,
            tokens_with_other_experts: 0,
            first: None,
        };
        for (l, a) in self.routers() {
            t.layers += 1;
            t.slots += a.slots;
            t.slots_differing += a.slots_differing;
            t.tokens_with_other_experts += a.tokens_with_other_experts;
            if t.first.is_none() && a.slots_differing > 0 {
                t.first = Some((l, a));
            }
        }
        (t.layers > 0).then_some(t)
    }

    /// The routers against the noise floor's: `None` when no layer's router
    /// was read against it; else the first layer whose flips are beyond it,
    /// or the shadow's flips and the choices summed over the layers when
    /// every one lies within it.
    pub fn routers_against_floor(&self) -> Option<RouterFloor> {
        let read: Vec<(usize, RouterAgreement)> = self
            .routers()
            .filter(|(_, a)| a.within_noise_floor.is_some())
            .collect();
        if read.is_empty() {
            return None;
        }
        if let Some(&(layer, agreement)) = read
            .iter()
            .find(|(_, a)| a.within_noise_floor == Some(false))
        {
            return Some(RouterFloor::Beyond { layer, agreement });
        }
        Some(RouterFloor::Within {
            noise: read
                .iter()
                .map(|(_, a)| a.noise_slots_differing.unwrap_or(0))
                .sum(),
            slots: read.iter().map(|(_, a)| a.slots).sum(),
        })
    }
}

/// Sets the router agreement of every decoder layer both dumps hold choices
/// for on the row of its output, and returns notes: choices of layers whose
/// row is not compared (with their counts), choices only one dump holds, or
/// a tap offset (the rows shifted, the router layers not).
///
/// Errors ([`Error::Input`]): a layer whose choices have another top-k or
/// token count in one dump than in the other.
pub fn compare(
    (a, b): (&Dump, &Dump),
    (a_name, b_name): (&str, &str),
    tap_offset: i64,
    pair: &mut PairReport,
) -> Result<Vec<String>> {
    let layers = |d: &Dump| -> Vec<usize> {
        d.prompts
            .first()
            .map(|p| p.routing.keys().copied().collect())
            .unwrap_or_default()
    };
    let (la, lb) = (layers(a), layers(b));
    match (la.is_empty(), lb.is_empty()) {
        (true, true) => return Ok(Vec::new()),
        (false, true) | (true, false) => {
            let (has, lacks) = if lb.is_empty() {
                (a_name, b_name)
            } else {
                (b_name, a_name)
            };
            return Ok(vec![format!(
                "router: only {has} holds router choices, so they are not compared (dump {lacks} with \
                 `hsparity dump` or tools/dump_hidden_states.py to record them)"
            )]);
        }
        _ => {}
    }
    if tap_offset != 0 || a.prompts.len() != b.prompts.len() {
        return Ok(vec![format!(
            "router: choices not compared under --tap-offset {tap_offset} (the rows are shifted, the \
             router layers are the model's)"
        )]);
    }
    let mut unplaced = Vec::new();
    for &l in la.iter().filter(|l| lb.contains(l)) {
        let of = |d: &Dump| {
            d.prompts
                .iter()
                .map(|p| p.routing[&l].clone())
                .collect::<Vec<_>>()
        };
        let (ra, rb) = (of(a), of(b));
        if let Some(k) = (0..ra.len())
            .find(|&k| ra[k].top_k != rb[k].top_k || ra[k].indices.len() != rb[k].indices.len())
        {
            return Err(Error::Input(format!(
                "p{k}.router.{l}: {} tokens × top-{} in {a_name}, {} tokens × top-{} in {b_name}: the \
                 dumps' routers choose among other settings (num_experts_per_tok) or saw other tokens",
                ra[k].tokens(),
                ra[k].top_k,
                rb[k].tokens(),
                rb[k].top_k
            )));
        }
        let agreement = RouterAgreement::of(&ra, &rb, None)?;
        if pair.hidden_states.iter().any(|r| r.index == l + 1) {
            pair.set_router(l, agreement);
        } else {
            unplaced.push(format!(
                "layer {l}: {} of {}",
                agreement.slots_differing, agreement.slots
            ));
        }
    }
    let mut notes = Vec::new();
    if !unplaced.is_empty() {
        notes.push(format!(
            "router: choices differing at layers whose output is not compared ({})",
            unplaced.join(", ")
        ));
    }
    let only: Vec<String> = la
        .iter()
        .chain(&lb)
        .filter(|l| !(la.contains(l) && lb.contains(l)))
        .map(|l| l.to_string())
        .collect();
    if !only.is_empty() {
        notes.push(format!(
            "router: layer(s) {} hold choices in one dump only, not compared",
            only.join(", ")
        ));
    }
    Ok(notes)
}

/// Refuses a noise floor whose router counts are not the dump's own: a
/// router layer the dump records no choices for, or another number of
/// choices than it records there.
///
/// Errors ([`Error::Input`], naming the dump `name`): the first such layer.
pub fn check_floor(floor: &NoiseFloor, dump: &Dump, name: &str) -> Result<()> {
    for r in &floor.routers {
        let slots: Option<usize> = dump
            .prompts
            .iter()
            .map(|p| p.routing.get(&r.layer).map(|x| x.indices.len()))
            .sum();
        if slots != Some(r.slots) {
            return Err(Error::Input(format!(
                "{name}: __metadata__ noise_floor has {} router choices at layer {}, but the dump records {}",
                r.slots,
                r.layer,
                slots.map_or("none".to_string(), |s| s.to_string())
            )));
        }
    }
    Ok(())
}
