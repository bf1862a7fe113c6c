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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    type Group<'h> = BTreeMap<(usize, Proj), &'h TensorHeader>;
    let mut groups: BTreeMap<&str, Group<'_>> = BTreeMap::new();
    let names: BTreeSet<&str> = headers.iter().map(|t| t.name.as_str()).collect();
    for t in headers {
        if !scope.covers(&t.name) {
            continue;
        }
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
    let mut fused = Vec::new();
    for (prefix, g) in &groups {
        let experts = format!("{prefix}mlp.experts");
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
        let present: BTreeSet<usize> = g.keys().map(|(e, _)| *e).collect();
        let missing: BTreeSet<usize> = (0..num_experts).filter(|e| !present.contains(e)).collect();
        let extra: BTreeSet<usize> = present.range(num_experts..).copied().collect();
        if !extra.is_empty() {
            let first_missing = missing
                .iter()
                .next()
                .map(|m| format!("expert {m} is missing and "))
                .unwrap_or_default();
            return Err(Error::Checkpoint(format!(
                "{experts}: expert index gap: {first_missing}expert {} is present, but config.json has \
                 num_experts = {num_experts} (indices on disk: {}); transformers 5.23 stacks the experts in \
                 index order and loads them into the wrong slots without a warning",
                extra.iter().next().expect("non-empty"),
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
        for e in 0..num_experts {
            for proj in [Proj::Gate, Proj::Up, Proj::Down] {
                if !g.contains_key(&(e, proj)) {
                    let have: Vec<&str> = [Proj::Gate, Proj::Up, Proj::Down]
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
        }
        let gate0 = &g[&(0, Proj::Gate)].shape;
        let (i, h) = match gate0[..] {
            [i, h] => (i, h),
            _ => {
                return Err(Error::Checkpoint(format!(
                    "{experts}: expert 0's gate_proj.weight has shape {gate0:?}, expected [I, H]"
                )))
            }
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
        fused.push(FusedParam {
            name: format!("{experts}.gate_up_proj"),
            rule: FusionRule::GateUp,
            sources: gate_up,
            shape: vec![num_experts, 2 * i, h],
            dtypes: dtypes(&[Proj::Gate, Proj::Up]),
        });
        fused.push(FusedParam {
            name: format!("{experts}.down_proj"),
            rule: FusionRule::Down,
            sources: keys(Proj::Down),
            shape: vec![num_experts, h, i],
            dtypes: dtypes(&[Proj::Down]),
        });
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
mod tests {
    use super::*;

    fn h(name: &str, shape: &[usize]) -> TensorHeader {
        TensorHeader {
            name: name.into(),
            dtype: "BF16".into(),
            shape: shape.to_vec(),
            data_offsets: (0, 0),
            shard: 0,
        }
    }

    fn per_expert(prefix: &str, e: usize) -> Vec<TensorHeader> {
        (0..e)
            .flat_map(|i| {
                [
                    h(
                        &format!("{prefix}mlp.experts.{i}.gate_proj.weight"),
                        &[4, 8],
                    ),
                    h(&format!("{prefix}mlp.experts.{i}.up_proj.weight"), &[4, 8]),
                    h(
                        &format!("{prefix}mlp.experts.{i}.down_proj.weight"),
                        &[8, 4],
                    ),
                ]
            })
            .collect()
    }

    #[test]
    fn parses_only_per_expert_weights() {
        assert_eq!(
            parse_expert_key("model.language_model.layers.3.mlp.experts.12.up_proj.weight"),
            Some(("model.language_model.layers.3.", 12, Proj::Up))
        );
        assert_eq!(
            parse_expert_key("mlp.experts.0.down_proj.weight"),
            Some(("", 0, Proj::Down))
        );
        for k in [
            "model.layers.0.mlp.experts.gate_up_proj",
            "model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv",
            "model.layers.0.mlp.shared_expert.gate_proj.weight",
            "model.layers.0.xmlp.experts.0.gate_proj.weight",
            "model.layers.0.mlp.experts.a.gate_proj.weight",
        ] {
            assert_eq!(parse_expert_key(k), None, "{k}");
        }
    }

    #[test]
    fn natural_order_matches_transformers() {
        let mut v = vec![
            "l.experts.10.w",
            "l.experts.9.w",
            "l.experts.2.w",
            "l.shard_11",
            "l.shard_2",
            "l.a",
        ];
        v.sort_by(|a, b| dot_natural_cmp(a, b));
        assert_eq!(
            v,
            [
                "l.a",
                "l.experts.2.w",
                "l.experts.9.w",
                "l.experts.10.w",
                "l.shard_2",
                "l.shard_11"
            ]
        );
    }

    #[test]
    fn orders_sources_numerically_and_scopes() {
        let mut hs = per_expert("model.language_model.layers.0.", 12);
        hs.extend(per_expert("mtp.layers.0.", 12));
        hs.reverse();
        let p = plan(&hs, ConversionScope::Unscoped, 12).unwrap();
        assert_eq!(p.fused.len(), 4);
        assert_eq!(p.converted_keys(), 72);
        let gu = p
            .get("model.language_model.layers.0.mlp.experts.gate_up_proj")
            .unwrap();
        assert_eq!(gu.shape, [12, 8, 8]);
        assert_eq!(
            gu.sources[10],
            "model.language_model.layers.0.mlp.experts.10.gate_proj.weight"
        );
        assert_eq!(
            gu.sources[12],
            "model.language_model.layers.0.mlp.experts.0.up_proj.weight"
        );
        assert_eq!(p.under("mtp.").count(), 2);
        let v = plan(&hs, ConversionScope::LanguageModel, 12).unwrap();
        assert_eq!(v.fused.len(), 2);
        assert_eq!(v.under("mtp.").count(), 0);
    }

    #[test]
    fn refuses_broken_groups_naming_the_expert() {
        let base = per_expert("m.", 4);
        let err = |hs: Vec<TensorHeader>| {
            plan(&hs, ConversionScope::Unscoped, 4)
                .unwrap_err()
                .to_string()
        };
        let e = err(base[..9].to_vec());
        assert!(e.contains("expert 3 is missing"), "{e}");
        let mut gap = base.clone();
        for t in gap.iter_mut().filter(|t| t.name.contains(".2.")) {
            t.name = t.name.replace(".2.", ".4.");
        }
        let e = err(gap);
        assert!(
            e.contains("expert 2 is missing and expert 4 is present"),
            "{e}"
        );
        let e = err(base
            .iter()
            .filter(|t| t.name != "m.mlp.experts.1.up_proj.weight")
            .cloned()
            .collect());
        assert!(
            e.contains("expert 1 has gate_proj and down_proj but no up_proj"),
            "{e}"
        );
        let mut bad = base.clone();
        bad[6].shape = vec![3, 8];
        let e = err(bad);
        assert!(
            e.contains("expert 2's gate_proj.weight has shape [3, 8]"),
            "{e}"
        );
        let mut both = base.clone();
        both.push(h("m.mlp.experts.down_proj", &[4, 8, 4]));
        assert!(err(both).contains("fused and per expert"));
        let mut dup = base;
        dup.push(h("m.mlp.experts.01.gate_proj.weight", &[4, 8]));
        assert!(err(dup).contains("both expert 1's gate_proj"));
    }
}
