//! Emulation of transformers 5.23.0 `from_pretrained` key handling for one
//! loading path, header-only: renames, ignore rules, unexpected, missing,
//! tied, shape checks. Produces a [`PathInventory`] and a [`TensorView`].
//!
//! Sources (5.23.0): `modeling_utils.py::_load_pretrained_model` and the
//! base-model-prefix handling, `conversion_mapping.py` (`qwen3_5_text`:
//! `PrefixChange(prefix_to_remove="language_model", model_prefix="model")`,
//! 1253; legacy `^model.language_model.model → model.language_model`,
//! 2162-2175), `core_model_loading.py::PrefixChange` (1184-1228),
//! `_keys_to_ignore_on_load_unexpected` in `modeling_qwen3_5.py` (918, 1656),
//! `modeling_utils.py::tie_weights` (symmetric tie during `from_pretrained`).

use std::collections::{BTreeMap, HashMap};

use crate::checkpoint::{Checkpoint, HeaderIndex, ModelConfig, TensorHeader};
use crate::error::{Error, Result};
use crate::loading::conversion::Entries;
use crate::loading::inventory::{ComponentCount, PathInventory, ResolvedPath};
use crate::loading::paths::{resolve_dtype, LoadingPath, ModelClass};
use crate::loading::spec::{self, Component, ExpectedTensor};
use crate::loading::tie::{tie, Tie};
use crate::loading::view::{TensorView, WeightOrigin};

use crate::precision::Precision;

/// One state-dict entry the class expects.
pub(super) struct ModelKey {
    pub(super) key: String,
    exp: ExpectedTensor,
    component: Component,
    /// Name relative to the text model (for the view), `None` for vision.
    text_name: Option<String>,
}

/// A prefix rename `from… -> to…`.
struct Rename {
    from: &'static str,
    to: &'static str,
    label: &'static str,
}

/// Regex `^pat` where `pat` is a literal with `.` wildcards and an optional
/// trailing `.*` (the only shapes `_keys_to_ignore_on_load_unexpected` uses here).
pub fn ignore_matches(pattern: &str, key: &str) -> bool {
    let p = pattern.trim_start_matches('^').trim_end_matches(".*");
    let (pb, kb) = (p.as_bytes(), key.as_bytes());
    kb.len() >= pb.len() && pb.iter().zip(kb).all(|(a, b)| *a == b'.' || a == b)
}

/// One line for the common "wrong prefix" failure: when at least half of the
/// model's tensors are MISSING and the UNEXPECTED keys (lm_head aside) share a
/// dotted prefix, name it instead of listing hundreds of keys, with the fix:
/// the prefix `saved` that transformers' own `save_pretrained` writes for
/// this config (the full model class's), which every loading path maps.
fn diagnose_prefix(
    missing: usize,
    tensors: usize,
    unexpected: &[String],
    (want, saved): (&str, &str),
) -> Option<String> {
    if missing < 2 || missing * 2 < tensors {
        return None;
    }
    let keys: Vec<&str> = unexpected
        .iter()
        .map(String::as_str)
        .filter(|k| !k.starts_with("lm_head."))
        .collect();
    let first = keys.first()?;
    let mut segs: Vec<&str> = first.split('.').collect();
    segs.pop();
    for k in &keys[1..] {
        let ks: Vec<&str> = k.split('.').collect();
        let n = segs.iter().zip(&ks).take_while(|(a, b)| a == b).count();
        segs.truncate(n);
    }
    // Stop before the per-layer part (`layers.3…`) and require a real prefix.
    if let Some(pos) = segs.iter().position(|s| *s == "layers") {
        segs.truncate(pos);
    }
    if segs.is_empty() {
        return None;
    }
    let prefix = format!("{}.", segs.join("."));
    let want = if want.is_empty() { "(no prefix)" } else { want };
    Some(format!(
        "{missing} of {tensors} tensors MISSING (random init): {} checkpoint keys sit under `{prefix}`, \
         which no rename rule maps to this class's `{want}`. Fix: re-save the weights under `{saved}` \
         (what save_pretrained of the full model writes, and every loading path maps), or load with a \
         loading path whose inventory is clean (hsparity inventory)",
        keys.len()
    ))
}

/// The text prefix transformers' `save_pretrained` writes for `cfg`: the
/// image-text-to-text class's (`model.language_model.`) when the config has
/// one, else the causal LM's (`model.`).
fn saved_prefix(cfg: &ModelConfig) -> &'static str {
    LoadingPath::ImageTextToText
        .class_for(cfg)
        .or_else(|| LoadingPath::CausalLm.class_for(cfg))
        .map_or("model.", ModelClass::text_prefix)
}

/// Step 1: what the class expects, in `state_dict()` order.
fn expected_keys(cfg: &ModelConfig, class: ModelClass) -> Result<Vec<ModelKey>> {
    let mut model: Vec<ModelKey> = Vec::new();
    if let Some(vp) = class.vision_prefix() {
        for e in spec::vision_tensors(cfg.vision_config.as_ref())? {
            model.push(ModelKey {
                key: format!("{vp}{}", e.key),
                exp: e,
                component: Component::VisionTower,
                text_name: None,
            });
        }
    }
    for e in spec::text_tensors(&cfg.text)? {
        model.push(ModelKey {
            key: format!("{}{}", class.text_prefix(), e.key),
            text_name: Some(e.key.clone()),
            exp: e,
            component: Component::LanguageModel,
        });
    }
    if class.has_lm_head() {
        let e = spec::lm_head_tensor(&cfg.text);
        model.push(ModelKey {
            key: e.key.clone(),
            text_name: Some(e.key.clone()),
            exp: e,
            component: Component::LmHead,
        });
    }
    Ok(model)
}

/// The checkpoint's keys after the renames `class` applies.
struct Renamed {
    /// Per checkpoint tensor: its key as the model sees it.
    keys: Vec<String>,
    /// Per checkpoint tensor: the name transformers reports it under when
    /// UNEXPECTED (after the conversion renames, before the base-model prefix).
    reported: Vec<String>,
    /// Renames and prefix rules that applied, then the ignore rules.
    rules: Vec<String>,
}

/// Step 2: the conversion renames in transformers' order, then the
/// base-model prefix key by key, as `core_model_loading.py`
/// `rename_source_key` decides it against the model's state dict
/// (`base_model_prefix = "model"`): a key starting with `model` whose rest
/// is a model key loses the prefix, else a key that is a model key once
/// `model.` is prepended gains it (a vision tower saved as `visual.*` loads
/// into `model.visual.*`). `tensors`: the checkpoint's entries (expert
/// conversion applied); `model`: the class's state-dict keys.
fn rename(tensors: &[TensorHeader], class: ModelClass, model: &[ModelKey]) -> Renamed {
    let mut renames = vec![Rename {
        from: "model.language_model.model.",
        to: "model.language_model.",
        label: "model.language_model.model.X -> model.language_model.X (legacy)",
    }];
    if class.uses_text_config() {
        renames.push(Rename {
            from: "model.language_model.",
            to: "model.",
            label: "model.language_model.X -> model.X",
        });
    }
    let mut used = vec![false; renames.len()];
    let mut keys: Vec<String> = tensors
        .iter()
        .map(|t| {
            let mut k = t.name.clone();
            for (i, r) in renames.iter().enumerate() {
                if let Some(rest) = k.strip_prefix(r.from) {
                    k = format!("{}{rest}", r.to);
                    used[i] = true;
                }
            }
            k
        })
        .collect();
    let mut rules: Vec<String> = renames
        .iter()
        .zip(&used)
        .filter(|(_, u)| **u)
        .map(|(r, _)| r.label.to_string())
        .collect();
    let reported = keys.clone();
    let known: std::collections::HashSet<&str> = model.iter().map(|m| m.key.as_str()).collect();
    let (mut stripped, mut added) = (false, false);
    for k in keys.iter_mut() {
        // `re.sub("^model.", "", key, count=1)`: the `.` matches any character.
        let rest = k
            .strip_prefix("model")
            .and_then(|r| r.char_indices().nth(1).map(|(i, _)| &r[i..]));
        if let Some(rest) = rest.filter(|r| known.contains(r)) {
            *k = rest.to_string();
            stripped = true;
        } else if known.contains(format!("model.{k}").as_str()) {
            *k = format!("model.{k}");
            added = true;
        }
    }
    if stripped {
        rules.push("model.X -> X".to_string());
    }
    if added {
        rules.push("X -> model.X (base-model keys)".to_string());
    }
    rules.extend(
        class
            .ignore_patterns()
            .iter()
            .map(|p| format!("ignore {p}")),
    );
    Renamed {
        keys,
        reported,
        rules,
    }
}

/// Which checkpoint entry fills each model key, and what is dropped.
struct Matched {
    /// Per model key: the checkpoint entry (index into [`Entries::tensors`]) that fills it.
    source: Vec<Option<usize>>,
    /// Entries dropped by an ignore rule.
    dropped: Vec<usize>,
    /// Entries the model has no place for.
    unexpected: Vec<usize>,
    /// Checkpoint keys renamed on the way in.
    renamed: usize,
}

/// Step 3: matches renamed checkpoint keys to model keys.
///
/// Errors ([`Error::Checkpoint`]): two checkpoint keys renamed onto one model key.
fn match_keys(
    entries: &Entries,
    renamed: &[String],
    model: &[ModelKey],
    class: ModelClass,
    path: LoadingPath,
) -> Result<Matched> {
    let index: HashMap<&str, usize> = model
        .iter()
        .enumerate()
        .map(|(i, m)| (m.key.as_str(), i))
        .collect();
    let ignores = class.ignore_patterns();
    let mut m = Matched {
        source: vec![None; model.len()],
        dropped: Vec::new(),
        unexpected: Vec::new(),
        renamed: 0,
    };
    for (hi, (t, rk)) in entries.tensors.iter().zip(renamed).enumerate() {
        if *rk != t.name {
            m.renamed += entries.keys_of(hi);
        }
        if let Some(&mi) = index.get(rk.as_str()) {
            if let Some(prev) = m.source[mi] {
                return Err(Error::Checkpoint(format!(
                    "tensors {} and {} both map to model key {rk} on {path}",
                    entries.tensors[prev].name, t.name
                )));
            }
            m.source[mi] = Some(hi);
        } else if ignores
            .iter()
            .any(|p| ignore_matches(p, rk) || ignore_matches(p, &t.name))
        {
            m.dropped.push(hi);
        } else {
            m.unexpected.push(hi);
        }
    }
    Ok(m)
}

/// Step 4: every consumed tensor has the shape the config implies.
///
/// Errors ([`Error::Checkpoint`], naming the tensor and its shard).
fn check_shapes(
    headers: &HeaderIndex,
    entries: &Entries,
    model: &[ModelKey],
    source: &[Option<usize>],
    path: LoadingPath,
) -> Result<()> {
    for (m, s) in model.iter().zip(source) {
        if let Some(hi) = s {
            let t = &entries.tensors[*hi];
            if t.shape != m.exp.shape {
                let fused = entries
                    .fused
                    .get(hi)
                    .map(|f| format!(" (fused from {} per-expert keys)", f.sources.len()))
                    .unwrap_or_default();
                return Err(Error::Checkpoint(format!(
                    "tensor {}{fused} (model key {} on {path}): expected shape {:?} from config.json, found {:?} in {}",
                    t.name,
                    m.key,
                    m.exp.shape,
                    t.shape,
                    headers.shard_of(t).file_name
                )));
            }
        }
    }
    Ok(())
}

/// Step 6: per model key its origin (checkpoint, tied, MISSING with its
/// init), parameters and bytes per component, the view entries.
struct Assembled {
    missing_names: Vec<String>,
    missing_init: BTreeMap<String, String>,
    view_entries: Vec<(String, WeightOrigin)>,
    components: BTreeMap<String, ComponentCount>,
    params: u64,
}

fn assemble(
    entries: &Entries,
    model: &[ModelKey],
    matched: &Matched,
    tie: &Tie,
    dtype: Precision,
) -> Assembled {
    let mut a = Assembled {
        missing_names: Vec::new(),
        missing_init: BTreeMap::new(),
        view_entries: Vec::new(),
        components: BTreeMap::new(),
        params: 0,
    };
    for (mi, m) in model.iter().enumerate() {
        let numel: u64 = m.exp.shape.iter().map(|&d| d as u64).product();
        // A tied parameter is one tensor: count it once, as
        // `model.num_parameters()` (named_parameters de-duplicates) does.
        if !tie.tied.contains_key(&mi) {
            a.params += numel;
        }
        let c = a
            .components
            .entry(m.component.as_str().to_string())
            .or_default();
        c.loaded = true;
        c.tensors += 1;
        c.params += numel;
        c.bytes += numel * dtype.size();
        let origin = if let Some(hi) = matched.source[mi] {
            match entries.fused.get(&hi) {
                Some(f) => WeightOrigin::Converted { param: f.clone() },
                None => WeightOrigin::Checkpoint {
                    key: entries.tensors[hi].name.clone(),
                },
            }
        } else if let Some(&hi) = tie.tied.get(&mi) {
            WeightOrigin::Tied {
                key: entries.tensors[hi].name.clone(),
            }
        } else {
            a.missing_names.push(m.key.clone());
            a.missing_init.insert(m.key.clone(), m.exp.init.to_string());
            WeightOrigin::Missing {
                init: m.exp.init,
                shape: m.exp.shape.clone(),
            }
        };
        if let Some(n) = &m.text_name {
            a.view_entries.push((n.clone(), origin));
        }
    }
    for &hi in matched.dropped.iter().chain(&matched.unexpected) {
        let t = &entries.tensors[hi];
        let comp = Component::of_checkpoint_key(&t.name);
        let c = a.components.entry(comp.as_str().to_string()).or_default();
        if !c.loaded {
            c.tensors += entries.keys_of(hi);
            c.params += t.numel();
            c.bytes += t.nbytes();
        }
    }
    for comp in [
        Component::LanguageModel,
        Component::VisionTower,
        Component::Mtp,
        Component::LmHead,
    ] {
        a.components.entry(comp.as_str().to_string()).or_default();
    }
    a
}

/// Checkpoint keys behind `list` (entries), in checkpoint order.
fn key_names(headers: &HeaderIndex, entries: &Entries, list: &[usize]) -> Vec<String> {
    let mut hs: Vec<usize> = list
        .iter()
        .flat_map(|&i| entries.members(i).iter().copied())
        .collect();
    hs.sort_unstable();
    hs.into_iter()
        .map(|h| headers.tensors[h].name.clone())
        .collect()
}

/// Inserts the conversion rules that fired before the ignore rules.
fn with_conversion_rules(mut rules: Vec<String>, entries: &Entries) -> Vec<String> {
    let at = rules
        .iter()
        .position(|r| r.starts_with("ignore "))
        .unwrap_or(rules.len());
    rules.splice(at..at, entries.rules());
    rules
}

/// Resolves `path` on `ckpt`: what the class expects, what the checkpoint
/// provides after the expert conversion and the renames, what is dropped,
/// unexpected, missing or tied, the dtype, and the text tensor view. Reads
/// headers only.
///
/// Errors: `image-text-to-text` on a `qwen3_5_text` config ([`Error::Input`]);
/// a consumed tensor whose header shape differs from the config-derived one,
/// or two checkpoint keys renamed onto the same model key
/// ([`Error::Checkpoint`], naming the tensor); an MoE checkpoint whose
/// per-expert keys cannot be fused (a missing expert, an index gap, unequal
/// shapes: [`Error::Checkpoint`] naming the expert, from
/// [`crate::loading::experts::plan`]); dtype errors from [`resolve_dtype`].
pub fn resolve(ckpt: &Checkpoint, path: LoadingPath) -> Result<ResolvedPath> {
    let (cfg, headers) = (&ckpt.config, &*ckpt.headers);
    let class = path.class_for(cfg).ok_or_else(|| {
        Error::Input(format!(
            "loading path {path} ({}) does not apply to model_type {:?}: transformers has no {} mapping for it",
            path.auto_class(),
            cfg.model_type,
            path.auto_class()
        ))
    })?;
    let model = expected_keys(cfg, class)?;
    let entries = Entries::new(headers, class, cfg)?;
    let Renamed {
        keys,
        reported,
        rules,
    } = rename(&entries.tensors, class, &model);
    let mut rules = with_conversion_rules(rules, &entries);
    let matched = match_keys(&entries, &keys, &model, class, path)?;
    check_shapes(headers, &entries, &model, &matched.source, path)?;
    let mut notes = Vec::new();
    let tie = tie(cfg, class, &model, &matched.source, &mut rules, &mut notes);
    let (dtype, dtype_reason) = resolve_dtype(cfg, class, headers)?;
    let a = assemble(&entries, &model, &matched, &tie, dtype);
    let unexpected_names: Vec<String> = matched
        .unexpected
        .iter()
        .map(|&i| reported[i].clone())
        .collect();
    // The note names the keys as the checkpoint stores them (the load
    // report lists them after the conversion renames).
    let stored_unexpected: Vec<String> = matched
        .unexpected
        .iter()
        .map(|&i| entries.tensors[i].name.clone())
        .collect();
    if let Some(d) = diagnose_prefix(
        a.missing_names.len(),
        model.len(),
        &stored_unexpected,
        (class.text_prefix(), saved_prefix(cfg)),
    ) {
        notes.insert(0, d);
    }
    let mut used = vec![false; entries.tensors.len()];
    for &hi in matched.source.iter().flatten() {
        used[hi] = true;
    }
    let keys_of = |list: &[usize]| list.iter().map(|&i| entries.keys_of(i)).sum();
    let inventory = PathInventory {
        name: path.name().to_string(),
        auto_class: path.auto_class().to_string(),
        class: class.name().to_string(),
        dtype,
        dtype_reason,
        tensors: model.len(),
        consumed: model.len() - a.missing_names.len(),
        dropped_by_rule: keys_of(&matched.dropped),
        unexpected: keys_of(&matched.unexpected),
        missing: a.missing_names.len(),
        tied_lm_head: tie.tied_lm_head,
        untied_lm_head: tie.untied_lm_head.clone(),
        converted: entries.converted(&used, &reported),
        rules,
        missing_names: a.missing_names,
        unexpected_names,
        dropped_names: key_names(headers, &entries, &matched.dropped),
        missing_init: a.missing_init,
        renamed: matched.renamed,
        params: a.params,
        components: a.components,
        notes,
    };
    Ok(ResolvedPath {
        path,
        class,
        dtype,
        compute: dtype,
        inventory,
        view: TensorView::new(ckpt.weights.clone(), a.view_entries),
        text_config: cfg.text.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::ignore_matches;

    #[test]
    fn ignore_patterns() {
        assert!(ignore_matches("^mtp.*", "mtp.fc.weight"));
        assert!(ignore_matches(
            "^model.visual.*",
            "model.visual.blocks.0.norm1.weight"
        ));
        assert!(!ignore_matches(
            "^model.visual.*",
            "model.language_model.norm.weight"
        ));
        assert!(!ignore_matches("^mtp.*", "model.mtp"));
    }
}
