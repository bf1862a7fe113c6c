//! Expert fusion of `qwen3_5_moe` checkpoints, as transformers 5.23.0 does it
//! at load time, from tensor headers only.
//!
//! transformers stores a layer's routed experts as two 3-D parameters,
//! `mlp.experts.gate_up_proj` `[E, 2I, H]` (expert `e`'s gate rows `[0, I)`,
//! then its up rows `[I, 2I)`) and `mlp.experts.down_proj` `[E, H, I]`.
//! Checkpoints that keep one tensor per expert
//! (`mlp.experts.{e}.{gate,up,down}_proj.weight`: FP8 checkpoints, what
//! `save_pretrained` writes for a model built with `from_config`, and the
//! MTP layer of Qwen3.5-35B-A3B) are fused on the way in by two
//! `WeightConverter`s (`conversion_mapping.py`, `mapping["qwen2_moe"]`, added
//! to `mapping["qwen3_5_moe_text"]` in `_build_checkpoint_conversion_mapping`):
//!
//! * `mlp.experts.*.gate_proj.weight` + `mlp.experts.*.up_proj.weight` →
//!   `mlp.experts.gate_up_proj` with `[MergeModulelist(dim=0), Concatenate(dim=1)]`
//!   (`core_model_loading.py`: `MergeModulelist.convert` stacks each pattern's
//!   tensors, `Concatenate.convert` joins them in source-pattern order: gate, then up);
//! * `mlp.experts.*.down_proj.weight` → `mlp.experts.down_proj` with `[MergeModulelist(dim=0)]`.
//!
//! Experts are stacked in the order the loader visits the keys:
//! `convert_and_load_state_dict_in_model` sorts the checkpoint by
//! `dot_natural_key` ([`dot_natural_cmp`]), so expert 10 follows expert 9.
//!
//! **Scope** (`conversion_mapping.py::get_model_conversion_mapping`, the
//! `scope_prefix` set for sub-models): the transforms are the same on every
//! path, only their scope differs ([`ConversionScope`]). For
//! `AutoModelForCausalLM` the root model is `qwen3_5_moe_text`, so they are
//! unscoped and also fire on `mtp.layers.0.mlp.experts.{e}.*` (the fused
//! `mtp.…` names are then dropped by `_keys_to_ignore_on_load_unexpected`
//! `^mtp.*`). For `AutoModel` and `AutoModelForImageTextToText` only the
//! `language_model` sub-model (`Qwen3_5MoeTextModel`) has a mapping, scoped to
//! keys under `model.language_model.` or `language_model.`
//! (`WeightTransform._scoped_match`); `mtp.*` keys stay per expert and are
//! dropped one by one.
//!
//! A [`ConversionPlan`] names each fused parameter the way a fused checkpoint
//! stores it (`model.language_model.layers.3.mlp.experts.gate_up_proj`,
//! `mtp.layers.0.mlp.experts.down_proj`): after the plan, a per-expert
//! checkpoint reads like a fused one, and the path's renames and ignore rules
//! apply to the fused names unchanged.
//!
//! transformers itself checks nothing about the experts: a missing expert
//! gives a size MISMATCH error, a missing projection or unequal shapes a
//! CONVERSION error (both `RuntimeError`), and an index gap whose count still
//! equals `num_experts` (`0-4, 6-8`) loads silently with experts shifted by
//! one slot (`fixtures/moe/errors/*/load_report.json`). [`plan`] refuses all
//! of them, naming the expert.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use candle_core::{Device, Tensor};
use serde::Serialize;

use crate::checkpoint::{TensorHeader, Weights};
use crate::error::{Error, Result};
use crate::precision::Precision;

/// Which checkpoint keys a loading path's expert conversion applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConversionScope {
    /// `AutoModelForCausalLM` (`Qwen3_5MoeForCausalLM`): unscoped, every key,
    /// `mtp.*` included.
    Unscoped,
    /// `AutoModel` (`Qwen3_5MoeModel`) and `AutoModelForImageTextToText`
    /// (`Qwen3_5MoeForConditionalGeneration`): keys under
    /// `model.language_model.` or `language_model.` only.
    LanguageModel,
}

impl ConversionScope {
    /// True when the conversion sees checkpoint key `key`.
    pub fn covers(self, key: &str) -> bool {
        match self {
            ConversionScope::Unscoped => true,
            ConversionScope::LanguageModel => {
                key.starts_with("model.language_model.") || key.starts_with("language_model.")
            }
        }
    }
}

/// One of the two expert `WeightConverter`s of `mapping["qwen2_moe"]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FusionRule {
    /// gate and up projections → `mlp.experts.gate_up_proj` `[E, 2I, H]`.
    GateUp,
    /// down projections → `mlp.experts.down_proj` `[E, H, I]`.
    Down,
}

impl FusionRule {
    /// The rule as the load reports (`fixtures/moe/*/golden/load_report.json`,
    /// `fixtures/qwen3.5-35b-a3b/expected_counts.json`) name it: source
    /// patterns, target, operations.
    pub fn name(self) -> &'static str {
        match self {
            FusionRule::GateUp => {
                "mlp.experts.*.gate_proj.weight + mlp.experts.*.up_proj.weight -> \
                 mlp.experts.gate_up_proj [MergeModulelist(dim=0), Concatenate(dim=1)]"
            }
            FusionRule::Down => {
                "mlp.experts.*.down_proj.weight -> mlp.experts.down_proj [MergeModulelist(dim=0)]"
            }
        }
    }

    /// Last name component of the fused parameter: `gate_up_proj` or `down_proj`.
    pub fn target(self) -> &'static str {
        match self {
            FusionRule::GateUp => "gate_up_proj",
            FusionRule::Down => "down_proj",
        }
    }
}

/// One fused expert parameter of a [`ConversionPlan`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FusedParam {
    /// Its name in checkpoint naming: the per-expert keys' prefix +
    /// `mlp.experts.gate_up_proj` / `mlp.experts.down_proj`.
    pub name: String,
    /// The converter that builds it.
    pub rule: FusionRule,
    /// Checkpoint keys in fusion order: [`FusionRule::GateUp`]:
    /// `experts.0.gate_proj.weight … experts.{E-1}.gate_proj.weight`, then
    /// `experts.0.up_proj.weight …`; [`FusionRule::Down`]: `experts.0.down_proj.weight …`.
    pub sources: Vec<String>,
    /// `[E, 2I, H]` (gate-up) or `[E, H, I]` (down).
    pub shape: Vec<usize>,
    /// Distinct on-disk dtypes of the sources (transformers casts each to the
    /// parameter dtype; every published checkpoint has one).
    pub dtypes: Vec<String>,
}

impl FusedParam {
    /// Number of experts `E`.
    pub fn num_experts(&self) -> usize {
        self.shape[0]
    }

    /// Elements of the fused parameter.
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }
}

/// The expert fusion one loading path applies to a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversionPlan {
    /// The scope the plan was made for.
    pub scope: ConversionScope,
    /// Fused parameters, in [`dot_natural_cmp`] order of their names.
    pub fused: Vec<FusedParam>,
}

impl ConversionPlan {
    /// True when nothing is fused (a fused checkpoint, or no MoE keys in scope).
    pub fn is_empty(&self) -> bool {
        self.fused.is_empty()
    }

    /// Checkpoint keys consumed by the conversion.
    pub fn converted_keys(&self) -> usize {
        self.fused.iter().map(|f| f.sources.len()).sum()
    }

    /// Per rule: (checkpoint keys, fused parameters).
    pub fn by_rule(&self) -> BTreeMap<FusionRule, (usize, usize)> {
        let mut m = BTreeMap::new();
        for f in &self.fused {
            let e = m.entry(f.rule).or_insert((0, 0));
            e.0 += f.sources.len();
            e.1 += 1;
        }
        m
    }

    /// The fused parameters whose name starts with `prefix` (e.g. `mtp.`).
    pub fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a FusedParam> + 'a {
        self.fused
            .iter()
            .filter(move |f| f.name.starts_with(prefix))
    }

    /// The fused parameter `name`, if the plan has it.
    pub fn get(&self, name: &str) -> Option<&FusedParam> {
        self.fused.iter().find(|f| f.name == name)
    }

    /// Map from each source key to the fused parameter that consumes it.
    pub fn source_map(&self) -> BTreeMap<&str, &FusedParam> {
        self.fused
            .iter()
            .flat_map(|f| f.sources.iter().map(move |s| (s.as_str(), f)))
            .collect()
    }
}

/// The three per-expert projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Proj {
    Gate,
    Up,
    Down,
}

impl Proj {
    fn name(self) -> &'static str {
        match self {
            Proj::Gate => "gate_proj",
            Proj::Up => "up_proj",
            Proj::Down => "down_proj",
        }
    }
}

/// `(prefix, expert, projection)` of a per-expert key
/// `{prefix}mlp.experts.{e}.{gate,up,down}_proj.weight`; `prefix` is empty
/// or ends with `.`. Other keys (`…weight_scale_inv`, fused names) give `None`.
fn parse_expert_key(key: &str) -> Option<(&str, usize, Proj)> {
    let rest = key.strip_suffix(".weight")?;
    let (rest, proj) = if let Some(r) = rest.strip_suffix(".gate_proj") {
        (r, Proj::Gate)
    } else if let Some(r) = rest.strip_suffix(".up_proj") {
        (r, Proj::Up)
    } else if let Some(r) = rest.strip_suffix(".down_proj") {
        (r, Proj::Down)
    } else {
        return None;
    };
    let (head, idx) = rest.rsplit_once('.')?;
    if idx.is_empty() || !idx.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let prefix = head.strip_suffix("mlp.experts")?;
    if !(prefix.is_empty() || prefix.ends_with('.')) {
        return None;
    }
    Some((prefix, idx.parse().ok()?, proj))
}

/// transformers' `dot_natural_key` order (`core_model_loading.py`): names
/// split on `.`; an all-digit part compares as a number and before any text
/// part; a text part compares by its text without trailing digits, then by
/// those digits as a number (`shard_2` before `shard_11`).
pub fn dot_natural_cmp(a: &str, b: &str) -> Ordering {
    #[derive(PartialEq, Eq, PartialOrd, Ord)]
    enum Part<'s> {
        Num(u128),
        Text(&'s str, Option<u128>),
    }
    fn parts(s: &str) -> impl Iterator<Item = Part<'_>> {
        s.split('.').map(|p| {
            if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                Part::Num(p.parse().unwrap_or(u128::MAX))
            } else {
                let text = p.trim_end_matches(|c: char| c.is_ascii_digit());
                let digits = &p[text.len()..];
                Part::Text(
                    text,
                    (!digits.is_empty()).then(|| digits.parse().unwrap_or(u128::MAX)),
                )
            }
        })
    }
    parts(a).cmp(parts(b))
}

fn expert_range(set: &BTreeSet<usize>) -> String {
    let mut out: Vec<String> = Vec::new();
    let v: Vec<usize> = set.iter().copied().collect();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

/// One group's per-expert tensors: `(expert, projection)` → header.
type Group<'h> = BTreeMap<(usize, Proj), &'h TensorHeader>;

/// The per-expert keys `scope` covers, grouped by their prefix (everything
/// before `mlp.experts.`).
///
/// Errors: two keys for the same expert and projection ([`Error::Checkpoint`]).
fn group_expert_keys(
    headers: &[TensorHeader],
    scope: ConversionScope,
) -> Result<BTreeMap<&str, Group<'_>>> {
    let mut groups: BTreeMap<&str, Group<'_>> = BTreeMap::new();
    for t in headers.iter().filter(|t| scope.covers(&t.name)) {
        let Some((prefix, e, proj)) = parse_expert_key(&t.name) else {
            continue;
        };
        if let Some(prev) = groups.entry(prefix).or_default().insert((e, proj), t) {
            return Err(Error::Checkpoint(format!(
                "tensors {} and {} are both expert {e}'s {} of {prefix}mlp.experts",
                prev.name,
                t.name,
                proj.name()
            )));
        }
    }
    Ok(groups)
}

/// Refuses a group whose fused name is on disk as well.
fn check_not_also_fused(experts: &str, g: &Group<'_>, names: &BTreeSet<&str>) -> Result<()> {
    for rule in [FusionRule::GateUp, FusionRule::Down] {
        let n = format!("{experts}.{}", rule.target());
        if names.contains(n.as_str()) {
            return Err(Error::Checkpoint(format!(
                "{n} is on disk fused and per expert ({} …): transformers would load one of them into \
                 the same parameter; keep one layout",
                g.values().next().expect("non-empty group").name
            )));
        }
    }
    Ok(())
}

/// Refuses an index gap (an index `>= num_experts`) or a missing expert.
fn check_indices(experts: &str, g: &Group<'_>, num_experts: usize) -> Result<()> {
    let present: BTreeSet<usize> = g.keys().map(|(e, _)| *e).collect();
    let missing: BTreeSet<usize> = (0..num_experts).filter(|e| !present.contains(e)).collect();
    if let Some(extra) = present.range(num_experts..).next() {
        let first_missing = missing
            .iter()
            .next()
            .map(|m| format!("expert {m} is missing and "))
            .unwrap_or_default();
        return Err(Error::Checkpoint(format!(
            "{experts}: expert index gap: {first_missing}expert {extra} is present, but config.json has \
             num_experts = {num_experts} (indices on disk: {}); transformers 5.23 stacks the experts in \
             index order and loads them into the wrong slots without a warning",
            expert_range(&present)
        )));
    }
    if let Some(m) = missing.iter().next() {
        return Err(Error::Checkpoint(format!(
            "{experts}: expert {m} is missing ({} of {num_experts} experts on disk: {}); transformers \
             5.23 fails with a size mismatch",
            present.len(),
            expert_range(&present)
        )));
    }
    Ok(())
}

/// Refuses an expert without one of its three projections.
fn check_projections(experts: &str, g: &Group<'_>, num_experts: usize) -> Result<()> {
    const ALL: [Proj; 3] = [Proj::Gate, Proj::Up, Proj::Down];
    for e in 0..num_experts {
        if let Some(proj) = ALL.into_iter().find(|p| !g.contains_key(&(e, *p))) {
            let have: Vec<&str> = ALL
                .into_iter()
                .filter(|p| g.contains_key(&(e, *p)))
                .map(Proj::name)
                .collect();
            return Err(Error::Checkpoint(format!(
                "{experts}: expert {e} has {} but no {} ({experts}.{e}.{}.weight is missing); \
                 transformers 5.23 fails the expert conversion",
                have.join(" and "),
                proj.name(),
                proj.name()
            )));
        }
    }
    Ok(())
}

/// `(I, H)` from expert 0's gate projection; refuses a projection of
/// another shape (`gate`/`up` `[I, H]`, `down` `[H, I]`).
fn check_shapes(experts: &str, g: &Group<'_>, num_experts: usize) -> Result<(usize, usize)> {
    let gate0 = &g[&(0, Proj::Gate)].shape;
    let [i, h] = gate0[..] else {
        return Err(Error::Checkpoint(format!(
            "{experts}: expert 0's gate_proj.weight has shape {gate0:?}, expected [I, H]"
        )));
    };
    for e in 0..num_experts {
        for (proj, want) in [
            (Proj::Gate, [i, h]),
            (Proj::Up, [i, h]),
            (Proj::Down, [h, i]),
        ] {
            let t = g[&(e, proj)];
            if t.shape[..] != want {
                return Err(Error::Checkpoint(format!(
                    "{experts}: expert {e}'s {}.weight has shape {:?}, expert 0's projections give {:?} \
                     (gate/up [I, H] = [{i}, {h}], down [H, I]); transformers 5.23 cannot stack unequal experts",
                    proj.name(),
                    t.shape,
                    want
                )));
            }
        }
    }
    Ok((i, h))
}

/// The two fused parameters of a checked group.
fn fused_pair(
    experts: &str,
    g: &Group<'_>,
    num_experts: usize,
    (i, h): (usize, usize),
) -> [FusedParam; 2] {
    let dtypes = |projs: &[Proj]| -> Vec<String> {
        let s: BTreeSet<&str> = g
            .iter()
            .filter(|((_, p), _)| projs.contains(p))
            .map(|(_, t)| t.dtype.as_str())
            .collect();
        s.into_iter().map(str::to_string).collect()
    };
    let keys = |proj: Proj| -> Vec<String> {
        (0..num_experts)
            .map(|e| g[&(e, proj)].name.clone())
            .collect()
    };
    let mut gate_up = keys(Proj::Gate);
    gate_up.extend(keys(Proj::Up));
    [
        FusedParam {
            name: format!("{experts}.gate_up_proj"),
            rule: FusionRule::GateUp,
            sources: gate_up,
            shape: vec![num_experts, 2 * i, h],
            dtypes: dtypes(&[Proj::Gate, Proj::Up]),
        },
        FusedParam {
            name: format!("{experts}.down_proj"),
            rule: FusionRule::Down,
            sources: keys(Proj::Down),
            shape: vec![num_experts, h, i],
            dtypes: dtypes(&[Proj::Down]),
        },
    ]
}

/// The expert fusion a loading path with `scope` applies to a checkpoint with
/// these headers, for a config with `num_experts` experts per layer
/// (`text_config.num_experts`, the MTP layer included). Header-only.
///
/// Per-expert keys are grouped by their prefix (everything before
/// `mlp.experts.`); each group becomes one [`FusionRule::GateUp`] and one
/// [`FusionRule::Down`] parameter. Keys outside `scope` and fused keys are
/// left alone.
///
/// Errors ([`Error::Checkpoint`], one line naming the expert): an expert
/// missing (fewer than `num_experts` indices), an index gap (an index
/// `>= num_experts`), an expert lacking one of its three projections, a
/// projection whose shape differs from expert 0's or does not fit
/// (`gate`/`up` `[I, H]`, `down` `[H, I]`), two keys for the same expert and
/// projection, or a group whose fused name is also on disk.
pub fn plan(
    headers: &[TensorHeader],
    scope: ConversionScope,
    num_experts: usize,
) -> Result<ConversionPlan> {
    let groups = group_expert_keys(headers, scope)?;
    let names: BTreeSet<&str> = headers.iter().map(|t| t.name.as_str()).collect();
    let mut fused = Vec::new();
    for (prefix, g) in &groups {
        let experts = format!("{prefix}mlp.experts");
        check_not_also_fused(&experts, g, &names)?;
        check_indices(&experts, g, num_experts)?;
        check_projections(&experts, g, num_experts)?;
        let ih = check_shapes(&experts, g, num_experts)?;
        fused.extend(fused_pair(&experts, g, num_experts, ih));
    }
    fused.sort_by(|a, b| dot_natural_cmp(&a.name, &b.name));
    Ok(ConversionPlan { scope, fused })
}

/// Expert `e`'s slice of a planned fused parameter, `[2I, H]` (gate rows,
/// then up rows) or `[H, I]`, as f32 rounded to `prec` (`Precision::F32`:
/// the stored values), read from the per-expert tensors only: what
/// `fused.get(e)` of the materialised parameter would hold.
///
/// Errors: `e >= E` ([`Error::Input`]); as [`Weights::load_f32_rounded`].
pub fn materialize_expert(
    weights: &Weights,
    p: &FusedParam,
    e: usize,
    prec: Precision,
) -> Result<Tensor> {
    let n = p.num_experts();
    if e >= n {
        return Err(Error::Input(format!(
            "expert {e} of {} requested, it has {n} experts",
            p.name
        )));
    }
    match p.rule {
        FusionRule::GateUp => {
            let gate = weights.load_f32_rounded(&p.sources[e], prec)?;
            let up = weights.load_f32_rounded(&p.sources[n + e], prec)?;
            Ok(Tensor::cat(&[&gate, &up], 0)?)
        }
        FusionRule::Down => weights.load_f32_rounded(&p.sources[e], prec),
    }
}

/// A planned fused parameter as one f32 CPU tensor of its fused shape,
/// rounded to `prec` (`Precision::F32`: the stored values): the per-expert
/// tensors stacked in expert order (`MergeModulelist(dim=0)`, `torch.stack`),
/// gate and up joined along dim 1 (`Concatenate(dim=1)`, `torch.cat`) —
/// bitwise what transformers loads in f32.
///
/// Errors: as [`Weights::load_f32_rounded`].
pub fn materialize(weights: &Weights, p: &FusedParam, prec: Precision) -> Result<Tensor> {
    let experts = (0..p.num_experts())
        .map(|e| materialize_expert(weights, p, e, prec))
        .collect::<Result<Vec<_>>>()?;
    let t = Tensor::stack(&experts, 0)?;
    debug_assert_eq!(t.dims(), &p.shape[..]);
    Ok(t.to_device(&Device::Cpu)?)
}

/// Expert `e` of a parameter stored fused on disk (`[E, 2I, H]` or
/// `[E, H, I]`): `[2I, H]` or `[H, I]` as f32 rounded to `prec`, reading only
/// that expert's bytes (streaming one expert at a time).
///
/// Errors: as [`Weights::load_row_range`] (unknown name, `e` out of range).
pub fn fused_expert(weights: &Weights, name: &str, e: usize, prec: Precision) -> Result<Tensor> {
    Ok(weights.load_row_range(name, e, 1, Some(prec))?.squeeze(0)?)
}

#[cfg(test)]
mod tests;
