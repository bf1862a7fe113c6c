//! The expert conversion of one loading path applied to the checkpoint's
//! headers ([`Entries`]), and the inventory's **converted** category
//! ([`Converted`]).
//!
//! transformers 5.23 fuses per-expert keys while it renames
//! (`core_model_loading.py::convert_and_load_state_dict_in_model`); hsparity
//! does it first, from the [`super::experts::plan`] of the path's class
//! ([`ModelClass::expert_scope`]): the checkpoint is seen as a list of
//! entries in checkpoint order where each fused parameter stands, named as a
//! fused checkpoint stores it, in place of its first source key. The path's
//! renames, ignore rules and matching then run over the entries unchanged
//! (`docs/moe.md` §3 explains why the order does not matter).
//!
//! Counting: an entry stands for its checkpoint keys. `dropped_by_rule` and
//! `unexpected` count checkpoint keys (a fused `mtp.*` parameter dropped by
//! `^mtp.*` counts its 3E sources, as transformers' own counts do), while
//! `consumed` counts state-dict entries (a fused parameter once), so
//! `tensors == consumed + missing` holds on every path and the checkpoint
//! keys a path reads are `consumed − converted.parameters + converted.checkpoint_keys`.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::checkpoint::{HeaderIndex, ModelConfig, TensorHeader};
use crate::error::Result;
use crate::loading::experts::{self, ConversionScope, FusedParam, FusionRule};
use crate::loading::paths::ModelClass;

/// One conversion rule's share of [`Converted`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConvertedRule {
    /// The rule as transformers' load report names it ([`FusionRule::name`]).
    pub rule: String,
    /// Checkpoint keys it fused.
    pub checkpoint_keys: usize,
    /// Model parameters it produced.
    pub parameters: usize,
}

/// Per-expert keys a rule fused onto a name the model does not have, then
/// dropped by an ignore rule or reported UNEXPECTED (`mtp.*` on `causal-lm`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DroppedConversion {
    /// The rule ([`FusionRule::name`]).
    pub rule: String,
    /// Checkpoint keys it fused.
    pub checkpoint_keys: usize,
    /// The fused names transformers reports (after the path's renames).
    pub reported_as: Vec<String>,
}

/// The **converted** category of a path's inventory (MoE families only):
/// how many checkpoint keys were fused into how many parameters, by which
/// rule, in which scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Converted {
    /// `unscoped` (every key, `mtp.*` included) or `language_model` (keys
    /// under `model.language_model.` / `language_model.` only).
    pub scope: &'static str,
    /// Checkpoint keys fused into model parameters.
    pub checkpoint_keys: usize,
    /// Model parameters produced by the conversion (each counts once in `consumed`).
    pub parameters: usize,
    /// Per rule (gate-up, then down): keys and parameters.
    pub rules: Vec<ConvertedRule>,
    /// Keys fused and then dropped (counted in `dropped_by_rule` / `unexpected`).
    pub then_dropped: Vec<DroppedConversion>,
}

impl Converted {
    /// `96 → 8` (checkpoint keys → parameters), the inventory table's cell.
    pub fn cell(&self) -> String {
        format!("{} → {}", self.checkpoint_keys, self.parameters)
    }

    /// One line: scope, keys → parameters per rule, and what was fused then dropped.
    pub fn describe(&self) -> String {
        let per_rule: Vec<String> = self
            .rules
            .iter()
            .map(|r| format!("{} → {}", r.checkpoint_keys, r.parameters))
            .collect();
        let mut s = format!(
            "converted ({}): {} checkpoint keys fused into {} parameters{}",
            self.scope,
            self.checkpoint_keys,
            self.parameters,
            if per_rule.is_empty() {
                String::new()
            } else {
                format!(" (gate_up, down: {})", per_rule.join(", "))
            }
        );
        if !self.then_dropped.is_empty() {
            let keys: usize = self.then_dropped.iter().map(|d| d.checkpoint_keys).sum();
            let names: Vec<&str> = self
                .then_dropped
                .iter()
                .flat_map(|d| d.reported_as.iter().map(String::as_str))
                .collect();
            s.push_str(&format!(
                "; {keys} keys fused then dropped ({})",
                names.join(", ")
            ));
        }
        s
    }
}

impl ConversionScope {
    /// `unscoped` or `language_model` (the report's `converted.scope`).
    pub fn as_str(self) -> &'static str {
        match self {
            ConversionScope::Unscoped => "unscoped",
            ConversionScope::LanguageModel => "language_model",
        }
    }
}

/// A rule in the inventory's rules line: `mlp.experts.{e}.{gate,up}_proj.weight
/// -> mlp.experts.gate_up_proj [E, 2I, H]`, `mlp.experts.{e}.down_proj.weight
/// -> mlp.experts.down_proj [E, H, I]`.
pub fn short_rule(r: FusionRule) -> &'static str {
    match r {
        FusionRule::GateUp => {
            "mlp.experts.{e}.{gate,up}_proj.weight -> mlp.experts.gate_up_proj [E, 2I, H]"
        }
        FusionRule::Down => "mlp.experts.{e}.down_proj.weight -> mlp.experts.down_proj [E, H, I]",
    }
}

/// The checkpoint as one path's renames see it: every tensor header, except
/// that the per-expert keys of each fused parameter are replaced by one
/// entry, at the position of its first key in checkpoint order.
pub struct Entries {
    /// The entries (a fused parameter: its name, fused shape, the sources'
    /// dtype, the first source's shard).
    pub tensors: Vec<TensorHeader>,
    /// Entry index → the fused parameter it stands for.
    pub fused: HashMap<usize, FusedParam>,
    /// Entry index → the checkpoint header indices behind it, ascending.
    members: Vec<Vec<usize>>,
    /// The class's conversion scope (`None`: a dense family).
    scope: Option<ConversionScope>,
}

impl Entries {
    /// The entries of `headers` for `class` (the conversion planned with the
    /// config's `num_experts`; none for a dense family). Header-only.
    ///
    /// Errors: the plan's refusals (a missing expert, an index gap, unequal
    /// shapes, …; [`crate::error::Error::Checkpoint`], naming the expert).
    pub fn new(headers: &HeaderIndex, class: ModelClass, cfg: &ModelConfig) -> Result<Self> {
        let scope = class.expert_scope();
        let plan = match (scope, &cfg.text.moe) {
            (Some(s), Some(moe)) => Some(experts::plan(&headers.tensors, s, moe.num_experts)?),
            _ => None,
        };
        let index: HashMap<&str, usize> = headers
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        // Header index → (fused parameter, its members) for each source key.
        let mut owner: HashMap<usize, usize> = HashMap::new();
        let mut groups: Vec<(FusedParam, Vec<usize>)> = Vec::new();
        for f in plan.map(|p| p.fused).unwrap_or_default() {
            let mut m: Vec<usize> = f.sources.iter().map(|s| index[s.as_str()]).collect();
            m.sort_unstable();
            for &hi in &m {
                owner.insert(hi, groups.len());
            }
            groups.push((f, m));
        }
        let mut out = Entries {
            tensors: Vec::with_capacity(headers.tensors.len()),
            fused: HashMap::new(),
            members: Vec::with_capacity(headers.tensors.len()),
            scope,
        };
        for (hi, t) in headers.tensors.iter().enumerate() {
            match owner.get(&hi).map(|&g| &groups[g]) {
                None => {
                    out.tensors.push(t.clone());
                    out.members.push(vec![hi]);
                }
                Some((f, m)) if m[0] == hi => {
                    out.fused.insert(out.tensors.len(), f.clone());
                    out.tensors.push(TensorHeader {
                        name: f.name.clone(),
                        dtype: t.dtype.clone(),
                        shape: f.shape.clone(),
                        data_offsets: (0, 0),
                        shard: t.shard,
                    });
                    out.members.push(m.clone());
                }
                Some(_) => {}
            }
        }
        Ok(out)
    }

    /// Checkpoint keys behind entry `i` (1, or a fused parameter's sources).
    pub fn keys_of(&self, i: usize) -> usize {
        self.members[i].len()
    }

    /// Checkpoint header indices behind entry `i`.
    pub fn members(&self, i: usize) -> &[usize] {
        &self.members[i]
    }

    /// The rules line of the inventory for the conversions that fired.
    pub fn rules(&self) -> Vec<String> {
        let fired: std::collections::BTreeSet<FusionRule> =
            self.fused.values().map(|f| f.rule).collect();
        let scope = self.scope.map(ConversionScope::as_str).unwrap_or("-");
        fired
            .into_iter()
            .map(|r| format!("fuse {} ({scope})", short_rule(r)))
            .collect()
    }

    /// The converted category: `used` are the entries a model key reads,
    /// `reported[i]` entry i's name after the renames (what transformers
    /// reports for a fused parameter it drops). `None` for a dense family.
    pub fn converted(&self, used: &[bool], reported: &[String]) -> Option<Converted> {
        let scope = self.scope?;
        let mut rules: BTreeMap<FusionRule, (usize, usize)> = BTreeMap::new();
        let mut dropped: BTreeMap<FusionRule, (usize, Vec<String>)> = BTreeMap::new();
        let mut fused: Vec<(&usize, &FusedParam)> = self.fused.iter().collect();
        fused.sort_by_key(|(i, _)| **i);
        for (&i, f) in fused {
            if used[i] {
                let e = rules.entry(f.rule).or_default();
                e.0 += f.sources.len();
                e.1 += 1;
            } else {
                let e = dropped.entry(f.rule).or_default();
                e.0 += f.sources.len();
                e.1.push(reported[i].clone());
            }
        }
        let rules: Vec<ConvertedRule> = rules
            .into_iter()
            .map(|(r, (k, p))| ConvertedRule {
                rule: r.name().to_string(),
                checkpoint_keys: k,
                parameters: p,
            })
            .collect();
        Some(Converted {
            scope: scope.as_str(),
            checkpoint_keys: rules.iter().map(|r| r.checkpoint_keys).sum(),
            parameters: rules.iter().map(|r| r.parameters).sum(),
            rules,
            then_dropped: dropped
                .into_iter()
                .map(|(r, (k, names))| DroppedConversion {
                    rule: r.name().to_string(),
                    checkpoint_keys: k,
                    reported_as: names,
                })
                .collect(),
        })
    }
}
