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

use serde::Serialize;

use crate::checkpoint::config::TextConfig;
use crate::checkpoint::{Checkpoint, ResolvedSource};
use crate::error::{Error, Result};
use crate::loading::paths::{resolve_dtype, LoadingPath, ModelClass};
use crate::loading::spec::{self, Component, ExpectedTensor};
use crate::loading::view::{TensorView, WeightOrigin};
use crate::precision::Precision;

/// Current `schema_version` of [`Inventory`].
pub const SCHEMA_VERSION: u32 = 1;

/// Tensors, parameters and bytes of one component on one path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ComponentCount {
    /// True when the component is part of the path's model. Then the counts
    /// are the model's state-dict entries and `bytes` = params × the path's
    /// dtype size. When false, the counts are the checkpoint tensors of that
    /// component (dropped or unexpected) and `bytes` is their size on disk.
    pub loaded: bool,
    /// Number of tensors.
    pub tensors: usize,
    /// Number of parameters (elements).
    pub params: u64,
    /// Bytes (see `loaded`).
    pub bytes: u64,
}

/// What one loading path does with the checkpoint (`inventory --json`,
/// DESIGN §2). Invariant: `tensors == consumed + missing`.
#[derive(Debug, Clone, Serialize)]
pub struct PathInventory {
    /// Path name: `causal-lm`, `vlm`, `image-text-to-text`.
    pub name: String,
    /// The transformers Auto class.
    pub auto_class: String,
    /// The class it instantiates.
    pub class: String,
    /// Resolved compute dtype (`f32`, `bf16`, `f16`).
    pub dtype: Precision,
    /// Why: `text_config.dtype`, `config.dtype`, `index metadata.dtype`, or
    /// `first weight on disk (<shard>: <tensor>)`.
    pub dtype_reason: String,
    /// Model state-dict entries (a tied `lm_head.weight` counts).
    pub tensors: usize,
    /// State-dict entries filled from checkpoint bytes (a tied lm_head counts: it reads the embedding).
    pub consumed: usize,
    /// Checkpoint tensors dropped silently by `_keys_to_ignore_on_load_unexpected`.
    pub dropped_by_rule: usize,
    /// Checkpoint tensors the model has no place for (reported UNEXPECTED, then dropped).
    pub unexpected: usize,
    /// State-dict entries absent from the checkpoint (reported MISSING, newly initialised).
    pub missing: usize,
    /// True when `lm_head.weight` takes the embedding's values (or the reverse).
    pub tied_lm_head: bool,
    /// Renames that applied (`"model.language_model.X -> model.X"`) and ignore rules (`"ignore ^mtp.*"`).
    pub rules: Vec<String>,
    /// Missing state-dict keys (model naming).
    pub missing_names: Vec<String>,
    /// Unexpected checkpoint keys (after renames).
    pub unexpected_names: Vec<String>,
    /// Checkpoint keys dropped by an ignore rule (all of them, checkpoint order).
    pub dropped_names: Vec<String>,
    /// Missing key → the init transformers would use (`normal(0, 0.02)`, `zeros`, `ones`, `log(U(0.01, 16))`).
    pub missing_init: BTreeMap<String, String>,
    /// Number of checkpoint keys renamed on the way in.
    pub renamed: usize,
    /// Model parameters, a tied lm_head not counted twice (`model.num_parameters()`).
    pub params: u64,
    /// Per component: `language_model`, `vision_tower`, `mtp`, `lm_head`.
    pub components: BTreeMap<String, ComponentCount>,
    /// Other remarks (tie decisions, ...).
    pub notes: Vec<String>,
}

/// `inventory --json`: all paths over one checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Inventory {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The checkpoint argument as given.
    pub checkpoint: String,
    /// What it resolved to.
    pub source: ResolvedSource,
    /// `model_type` of `config.json`.
    pub model_type: String,
    /// Tensors on disk.
    pub checkpoint_tensors: usize,
    /// Parameters on disk.
    pub checkpoint_params: u64,
    /// Number of shard files.
    pub shards: usize,
    /// Tensor count per on-disk dtype (`"BF16": 1199`).
    pub checkpoint_dtypes: BTreeMap<String, usize>,
    /// One entry per requested path.
    pub paths: Vec<PathInventory>,
    /// Loading paths that do not apply to this checkpoint, with the reason.
    pub not_applicable: Vec<String>,
}

/// A loading path resolved against a checkpoint.
#[derive(Debug, Clone)]
pub struct ResolvedPath {
    /// The path.
    pub path: LoadingPath,
    /// The class it builds.
    pub class: ModelClass,
    /// Resolved dtype (same as `inventory.dtype`).
    pub dtype: Precision,
    /// The inventory.
    pub inventory: PathInventory,
    /// Text-model tensors for the candle model.
    pub view: TensorView,
    /// The text config the model is built from.
    pub text_config: TextConfig,
}

impl ResolvedPath {
    /// The same path with missing tensors initialised from `seed` and every
    /// tensor placed on `device`.
    pub fn seeded(mut self, seed: u64, device: &candle_core::Device) -> Self {
        self.view = self.view.with_seed(seed).with_device(device.clone());
        self
    }
}

struct ModelKey {
    key: String,
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
/// dotted prefix, name it instead of listing hundreds of keys.
fn diagnose_prefix(
    missing: usize,
    tensors: usize,
    unexpected: &[String],
    want: &str,
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
         which no rename rule maps to this class's `{want}`",
        keys.len()
    ))
}

/// Resolves `path` on `ckpt`: what the class expects, what the checkpoint
/// provides after renames, what is dropped, unexpected, missing or tied, the
/// dtype, and the text tensor view. Reads headers only.
///
/// Errors: `image-text-to-text` on a `qwen3_5_text` config ([`Error::Input`]);
/// a consumed tensor whose header shape differs from the config-derived one,
/// or two checkpoint keys renamed onto the same model key
/// ([`Error::Checkpoint`], naming the tensor); dtype errors from
/// [`resolve_dtype`].
pub fn resolve(ckpt: &Checkpoint, path: LoadingPath) -> Result<ResolvedPath> {
    let cfg = &ckpt.config;
    let headers = &ckpt.headers;
    let class = path.class_for(cfg).ok_or_else(|| {
        Error::Input(format!(
            "loading path {path} ({}) does not apply to model_type {:?}: transformers has no {} mapping for it",
            path.auto_class(),
            cfg.model_type,
            path.auto_class()
        ))
    })?;
    let tc = &cfg.text;

    // 1. What the model expects, in state-dict order.
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
    for e in spec::text_tensors(tc)? {
        model.push(ModelKey {
            key: format!("{}{}", class.text_prefix(), e.key),
            text_name: Some(e.key.clone()),
            exp: e,
            component: Component::LanguageModel,
        });
    }
    if class.has_lm_head() {
        let e = spec::lm_head_tensor(tc);
        model.push(ModelKey {
            key: e.key.clone(),
            text_name: Some(e.key.clone()),
            exp: e,
            component: Component::LmHead,
        });
    }
    let model_index: HashMap<&str, usize> = model
        .iter()
        .enumerate()
        .map(|(i, m)| (m.key.as_str(), i))
        .collect();

    // 2. Renames, in the order transformers applies them.
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
    let apply = |k: &str, used: &mut Vec<bool>| -> String {
        let mut k = k.to_string();
        for (i, r) in renames.iter().enumerate() {
            if let Some(rest) = k.strip_prefix(r.from) {
                k = format!("{}{rest}", r.to);
                used[i] = true;
            }
        }
        k
    };
    let mut used = vec![false; renames.len()];
    let mut renamed: Vec<String> = headers
        .tensors
        .iter()
        .map(|t| apply(&t.name, &mut used))
        .collect();
    let mut rules: Vec<String> = renames
        .iter()
        .zip(&used)
        .filter(|(_, u)| **u)
        .map(|(r, _)| r.label.to_string())
        .collect();

    // transformers reports UNEXPECTED keys under their names after the
    // conversion renames but before the base-model prefix step.
    let reported_names = renamed.clone();

    // Base-model prefix (`base_model_prefix = "model"`): strip it when loading a
    // base class from a head checkpoint, add it when loading a head class from
    // a base checkpoint.
    let has_prefix = renamed.iter().any(|k| k.starts_with("model."));
    if !class.has_base_prefix() && has_prefix {
        let mut any = false;
        for k in renamed.iter_mut() {
            if let Some(rest) = k.strip_prefix("model.") {
                *k = rest.to_string();
                any = true;
            }
        }
        if any {
            rules.push("model.X -> X".to_string());
        }
    } else if class.has_base_prefix() && !has_prefix && !renamed.is_empty() {
        for k in renamed.iter_mut() {
            if !k.starts_with("lm_head.") {
                *k = format!("model.{k}");
            }
        }
        rules.push("X -> model.X (base-model checkpoint)".to_string());
    }
    let ignores = class.ignore_patterns();
    rules.extend(ignores.iter().map(|p| format!("ignore {p}")));

    // 3. Match checkpoint keys to model keys.
    let mut source: Vec<Option<usize>> = vec![None; model.len()]; // model idx -> header idx
    let mut dropped = Vec::new();
    let mut unexpected = Vec::new();
    let mut n_renamed = 0;
    for (hi, (t, rk)) in headers.tensors.iter().zip(&renamed).enumerate() {
        if *rk != t.name {
            n_renamed += 1;
        }
        if let Some(&mi) = model_index.get(rk.as_str()) {
            if let Some(prev) = source[mi] {
                return Err(Error::Checkpoint(format!(
                    "tensors {} and {} both map to model key {rk} on {path}",
                    headers.tensors[prev].name, t.name
                )));
            }
            source[mi] = Some(hi);
        } else if ignores
            .iter()
            .any(|p| ignore_matches(p, rk) || ignore_matches(p, &t.name))
        {
            dropped.push(hi);
        } else {
            unexpected.push(hi);
        }
    }

    // 4. Shapes of consumed tensors.
    for (m, s) in model.iter().zip(&source) {
        if let Some(hi) = s {
            let t = &headers.tensors[*hi];
            if t.shape != m.exp.shape {
                return Err(Error::Checkpoint(format!(
                    "tensor {} (model key {} on {path}): expected shape {:?} from config.json, found {:?} in {}",
                    t.name,
                    m.key,
                    m.exp.shape,
                    t.shape,
                    headers.shard_of(t).file_name
                )));
            }
        }
    }

    // 5. Tie (`modeling_utils.py::tie_weights` with missing_keys: symmetric).
    let tie = if class.uses_text_config() {
        tc.tie_word_embeddings.unwrap_or(false)
    } else {
        cfg.tie_word_embeddings.unwrap_or(false)
    };
    let tie_field = if class.uses_text_config() && cfg.is_vlm() {
        "text_config.tie_word_embeddings"
    } else {
        "tie_word_embeddings"
    };
    let mut notes = Vec::new();
    let mut tied: HashMap<usize, usize> = HashMap::new(); // model idx -> header idx
    let mut tied_lm_head = false;
    if class.has_lm_head() && tie {
        let embed_key = format!("{}embed_tokens.weight", class.text_prefix());
        let (ei, li) = (
            model_index[embed_key.as_str()],
            model_index["lm_head.weight"],
        );
        match (source[ei], source[li]) {
            (Some(e), None) => {
                tied.insert(li, e);
                tied_lm_head = true;
                rules.push(format!("tie lm_head.weight -> {embed_key} ({tie_field})"));
            }
            (None, Some(l)) => {
                tied.insert(ei, l);
                tied_lm_head = true;
                rules.push(format!("tie {embed_key} -> lm_head.weight ({tie_field}; embedding absent)"));
            }
            (Some(_), Some(_)) => notes.push(format!(
                "{tie_field} is true but both lm_head.weight and {embed_key} are on disk: transformers ties \
                 them only if their values are equal, so the on-disk lm_head.weight is used (same values either way)"
            )),
            (None, None) => {}
        }
    }

    // 6. Assemble.
    let (dtype, dtype_reason) = resolve_dtype(cfg, class, headers)?;
    let mut missing_names = Vec::new();
    let mut missing_init = BTreeMap::new();
    let mut view_entries = Vec::new();
    let mut components: BTreeMap<String, ComponentCount> = BTreeMap::new();
    let mut params = 0u64;
    for (mi, m) in model.iter().enumerate() {
        let numel: u64 = m.exp.shape.iter().map(|&d| d as u64).product();
        // A tied parameter is one tensor: count it once, as
        // `model.num_parameters()` (named_parameters de-duplicates) does.
        if !tied.contains_key(&mi) {
            params += numel;
        }
        let c = components
            .entry(m.component.as_str().to_string())
            .or_default();
        c.loaded = true;
        c.tensors += 1;
        c.params += numel;
        c.bytes += numel * dtype.size();
        let origin = if let Some(hi) = source[mi] {
            WeightOrigin::Checkpoint {
                key: headers.tensors[hi].name.clone(),
            }
        } else if let Some(&hi) = tied.get(&mi) {
            WeightOrigin::Tied {
                key: headers.tensors[hi].name.clone(),
            }
        } else {
            missing_names.push(m.key.clone());
            missing_init.insert(m.key.clone(), m.exp.init.to_string());
            WeightOrigin::Missing {
                init: m.exp.init,
                shape: m.exp.shape.clone(),
            }
        };
        if let Some(n) = &m.text_name {
            view_entries.push((n.clone(), origin));
        }
    }
    for &hi in dropped.iter().chain(&unexpected) {
        let t = &headers.tensors[hi];
        let comp = Component::of_checkpoint_key(&t.name);
        let c = components.entry(comp.as_str().to_string()).or_default();
        if !c.loaded {
            c.tensors += 1;
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
        components.entry(comp.as_str().to_string()).or_default();
    }

    let consumed = model.len() - missing_names.len();
    let unexpected_names: Vec<String> = unexpected
        .iter()
        .map(|&i| reported_names[i].clone())
        .collect();
    if let Some(d) = diagnose_prefix(
        missing_names.len(),
        model.len(),
        &unexpected_names,
        class.text_prefix(),
    ) {
        notes.insert(0, d);
    }
    let inventory = PathInventory {
        name: path.name().to_string(),
        auto_class: path.auto_class().to_string(),
        class: class.name().to_string(),
        dtype,
        dtype_reason,
        tensors: model.len(),
        consumed,
        dropped_by_rule: dropped.len(),
        unexpected: unexpected.len(),
        missing: missing_names.len(),
        tied_lm_head,
        rules,
        missing_names,
        unexpected_names,
        dropped_names: dropped
            .iter()
            .map(|&i| headers.tensors[i].name.clone())
            .collect(),
        missing_init,
        renamed: n_renamed,
        params,
        components,
        notes,
    };
    let view = TensorView::new(ckpt.weights.clone(), view_entries);
    Ok(ResolvedPath {
        path,
        class,
        dtype,
        inventory,
        view,
        text_config: tc.clone(),
    })
}

/// The inventory of `paths` over `ckpt` (all applicable paths when `paths`
/// is empty). Header-only: never reads tensor data.
///
/// Errors: as [`resolve`] for each path.
pub fn inventory(ckpt: &Checkpoint, paths: &[LoadingPath]) -> Result<Inventory> {
    let list = if paths.is_empty() {
        LoadingPath::applicable(&ckpt.config)
    } else {
        paths.to_vec()
    };
    let paths = list
        .into_iter()
        .map(|p| resolve(ckpt, p).map(|r| r.inventory))
        .collect::<Result<Vec<_>>>()?;
    Ok(inventory_of(ckpt, paths))
}

/// The checkpoint-level [`Inventory`] around path inventories already
/// resolved (e.g. by a [`crate::session::Session`]).
pub fn inventory_of(ckpt: &Checkpoint, paths: Vec<PathInventory>) -> Inventory {
    let mut checkpoint_dtypes = BTreeMap::new();
    for t in &ckpt.headers.tensors {
        *checkpoint_dtypes.entry(t.dtype.clone()).or_insert(0) += 1;
    }
    Inventory {
        schema_version: SCHEMA_VERSION,
        checkpoint: ckpt.source.display.clone(),
        source: ckpt.source.clone(),
        model_type: ckpt.config.model_type.clone(),
        checkpoint_tensors: ckpt.headers.len(),
        checkpoint_params: ckpt.headers.total_params(),
        shards: ckpt.headers.shards.len(),
        checkpoint_dtypes,
        paths,
        not_applicable: LoadingPath::ALL
            .into_iter()
            .filter(|p| p.class_for(&ckpt.config).is_none())
            .map(|p| {
                format!(
                    "{} ({}) does not apply to model_type {}: transformers raises \"Unrecognized configuration class\"",
                    p.name(),
                    p.auto_class(),
                    ckpt.config.model_type
                )
            })
            .collect(),
    }
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
