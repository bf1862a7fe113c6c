//! The drafter's `config.json`, as `DFlashDraftModel` reads it.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

/// Attention layout of one draft layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DraftLayerType {
    /// No mask: the block sees every context row and itself bidirectionally.
    FullAttention,
    /// Causal within the block, window over context + block.
    SlidingAttention,
}

/// The drafter's `config.json`, as `DFlashDraftModel` reads it (fields under
/// `dflash_config` win over the top level, as in the wheel's `_draft_value`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct DflashConfig {
    /// `hidden_size` (must equal the target's).
    pub hidden_size: usize,
    /// `intermediate_size` of the draft MLPs.
    pub intermediate_size: usize,
    /// Draft layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Key/value heads (defaults to the attention heads).
    pub num_key_value_heads: usize,
    /// `head_dim` (defaults to hidden / heads).
    pub head_dim: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f64,
    /// Rope base (default rope only).
    pub rope_theta: f64,
    /// Draft block length B.
    pub block_size: usize,
    /// Target decoder layers whose outputs are tapped (`hidden_states[L+1]`).
    pub target_layer_ids: Vec<usize>,
    /// Token whose target embedding fills the masked block slots.
    pub mask_token_id: u32,
    /// Per draft layer: full or sliding attention.
    pub layer_types: Vec<DraftLayerType>,
    /// Window of the sliding layers, as transformers' `Qwen3Config`
    /// (`__post_init__`, the class dflash 0.1.0 loads drafters with)
    /// resolves it: the config's `sliding_window` (4096 when absent) when
    /// `use_sliding_window` is true, else none — the sliding layers then
    /// attend causally within the block without a window.
    pub sliding_window: Option<usize>,
    /// Config flags that ask for a forward the DFlash one does not have
    /// (`norm_before_fc: true`: a norm on the taps before `fc`, as SGLang's
    /// and speculators' EAGLE-3 drafters read it), as `name: value`.
    pub ignored_flags: Vec<String>,
    /// The window the config names but does not use: `sliding_window` is
    /// set, the layers are `sliding_attention`, and `use_sliding_window` is
    /// not true.
    pub sliding_window_unused: Option<usize>,
    /// `output_multiplier` (default 1).
    pub output_multiplier: f64,
    /// `final_logit_softcapping` (none by default).
    pub final_logit_softcapping: Option<f64>,
    /// `num_target_layers`: the decoder layers of the target it was made
    /// for, when the config records them (dflash's `DFlashDraftModel`
    /// configs do).
    pub num_target_layers: Option<usize>,
    /// `vocab_size`: the vocabulary of the target it was made for (a DFlash
    /// drafter reads the target's embeddings and LM head), when recorded.
    pub vocab_size: Option<usize>,
    /// `target_hidden_size`: the width of the target's hidden states the
    /// `fc` reads, when recorded (vLLM `qwen3_dflash.py`
    /// `_get_dflash_fc_input_size` and SpecForge read it; absent = `hidden_size`).
    pub target_hidden_size: Option<usize>,
    /// `draft_vocab_size`: the vocabulary the drafts are scored over, when
    /// recorded (vLLM `DFlashQwen3ForCausalLM`; absent = `vocab_size`).
    /// dflash drafts through the target's whole LM head.
    pub draft_vocab_size: Option<usize>,
}

fn get<'a>(cfg: &'a Value, name: &str) -> Option<&'a Value> {
    cfg.get("dflash_config")
        .and_then(|d| d.get(name))
        .filter(|v| !v.is_null())
        .or_else(|| cfg.get(name).filter(|v| !v.is_null()))
}

impl DflashConfig {
    /// Parses a drafter `config.json`.
    ///
    /// Errors ([`Error::Config`], naming the file and field): not JSON; a
    /// DFlash2 (or other non-v1) config; no `target_layer_ids` (the fallback
    /// formula silently picks wrong taps, sglang#37475, so it is refused); no
    /// `mask_token_id`; a missing or mistyped dimension; a rope scaling other
    /// than default; unknown `layer_types`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = crate::input::read_to_string(path)?;
        if let Some(m) = crate::input::bom_message(text.as_bytes()) {
            return Err(Error::Config(format!("{}: {m}", path.display())));
        }
        let cfg: Value = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: not valid JSON: {e}", path.display())))?;
        Self::from_value(&cfg).map_err(|e| match e {
            Error::Config(m) => Error::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// As [`Self::from_file`] on a parsed value.
    pub fn from_value(cfg: &Value) -> Result<Self> {
        let bad = |m: String| Error::Config(m);
        if !cfg.is_object() {
            return Err(bad("drafter config is not a JSON object".into()));
        }
        let arch = cfg
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .unwrap_or("");
        refuse_other_kinds(cfg, arch)?;
        refuse_contradictions(cfg)?;
        let usize_of = |name: &str| -> Result<usize> {
            match get(cfg, name) {
                Some(v) => v.as_u64().map(|x| x as usize).ok_or_else(|| {
                    bad(format!("{name} must be a non-negative integer, found {v}"))
                }),
                None => Err(bad(format!("missing {name}"))),
            }
        };
        let positive = |name: &str| -> Result<usize> {
            match usize_of(name)? {
                0 => Err(bad(format!("{name} = 0: must be at least 1"))),
                n => Ok(n),
            }
        };
        let hidden_size = positive("hidden_size")?;
        let num_attention_heads = positive("num_attention_heads")?;
        let head_dim = match get(cfg, "head_dim") {
            Some(_) => positive("head_dim")?,
            None => hidden_size / num_attention_heads.max(1),
        };
        let num_hidden_layers = positive("num_hidden_layers")?;
        if num_hidden_layers > MAX_LAYERS {
            return Err(bad(format!(
                "num_hidden_layers = {num_hidden_layers}: a DFlash drafter has a few layers; more than \
                 {MAX_LAYERS} is not a drafter config (refused before anything is built from it)"
            )));
        }
        let target_layer_ids = target_layer_ids(cfg)?;
        let mask_token_id = u32::try_from(usize_of("mask_token_id")?)
            .map_err(|_| bad("mask_token_id does not fit a token id".into()))?;
        let block_size = match get(cfg, "block_size") {
            Some(_) => usize_of("block_size")?,
            None => 16,
        };
        if block_size < 2 {
            return Err(bad(format!(
                "block_size {block_size}: a block needs the anchor plus at least one draft slot"
            )));
        }
        let rope_theta = rope_theta(cfg)?;
        let (layer_types, sliding_window, sliding_window_unused) =
            attention(cfg, num_hidden_layers)?;
        if head_dim % 2 != 0 {
            return Err(bad(format!(
                "head_dim = {head_dim}: rotary embedding needs an even head_dim"
            )));
        }
        let num_key_value_heads = match get(cfg, "num_key_value_heads") {
            Some(_) => usize_of("num_key_value_heads")?,
            None => num_attention_heads,
        };
        if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(bad(format!(
                "num_attention_heads {num_attention_heads} is not a multiple of num_key_value_heads {num_key_value_heads}"
            )));
        }
        let rms_norm_eps = number(cfg, "rms_norm_eps")?.unwrap_or(1e-6);
        if rms_norm_eps <= 0.0 {
            return Err(bad(format!(
                "rms_norm_eps = {rms_norm_eps}: must be a positive number"
            )));
        }
        let final_logit_softcapping = number(cfg, "final_logit_softcapping")?.filter(|x| *x > 0.0);
        Ok(Self {
            hidden_size,
            intermediate_size: positive("intermediate_size")?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps,
            rope_theta,
            block_size,
            target_layer_ids,
            mask_token_id,
            layer_types,
            sliding_window,
            sliding_window_unused,
            ignored_flags: ignored_flags(cfg),
            output_multiplier: number(cfg, "output_multiplier")?.unwrap_or(1.0),
            final_logit_softcapping,
            num_target_layers: recorded(cfg, "num_target_layers")?,
            vocab_size: recorded(cfg, "vocab_size")?,
            target_hidden_size: recorded(cfg, "target_hidden_size")?,
            draft_vocab_size: recorded(cfg, "draft_vocab_size")?,
        })
    }
}

/// Refuses what is not a DFlash v1 drafter config: a target checkpoint
/// given where a drafter is expected, or a DFlash2-style drafter.
fn refuse_other_kinds(cfg: &Value, arch: &str) -> Result<()> {
    refuse_eagle3(cfg, arch)?;
    // A target checkpoint given where a drafter is expected.
    let is_target = cfg.get("text_config").is_some()
        || (!arch.is_empty() && !arch.contains("DFlash") && get(cfg, "target_layer_ids").is_none());
    if is_target {
        return Err(Error::Config(format!(
            "this is a target checkpoint ({}), not a DFlash drafter (architectures \
             [\"DFlashDraftModel\"] with dflash_config.target_layer_ids); pass it as the \
             checkpoint and the drafter's folder as --drafter",
            if arch.is_empty() {
                "it has a text_config"
            } else {
                arch
            }
        )));
    }
    let v2_markers = [
        "selector_top_k",
        "attention_conv",
        "mlp_conv",
        "candidate_selector",
        "conv_kernel_size",
    ];
    if arch.contains("DFlash2") || v2_markers.iter().any(|k| get(cfg, k).is_some()) {
        let fields: Vec<&str> = v2_markers
            .iter()
            .copied()
            .filter(|k| get(cfg, k).is_some())
            .collect();
        let what = match (arch.contains("DFlash2"), fields.is_empty()) {
            (true, _) => format!("architectures {arch}"),
            (false, false) => format!("its config has DFlash2 fields: {}", fields.join(", ")),
            (false, true) => arch.to_string(),
        };
        return Err(Error::Config(format!(
            "this is a DFlash2-style drafter ({what}); hsparity implements DFlash v1 only (the z-lab/dflash DFlashDraftModel without those fields)"
        )));
    }
    Ok(())
}

/// Refuses a config that records one fact twice with two values: under
/// `dflash_config` and at the top level (the wheel's `_draft_value` reads
/// `dflash_config` first, SGLang's `DFlashDraftConfig` either; which one a
/// tool reads decides the run, so neither is guessed).
///
/// Errors ([`Error::Config`]): naming the field and both values.
fn refuse_contradictions(cfg: &Value) -> Result<()> {
    let Some(inner) = cfg.get("dflash_config").and_then(Value::as_object) else {
        return Ok(());
    };
    for (k, v) in inner {
        match cfg.get(k) {
            Some(top) if !top.is_null() && !v.is_null() && top != v => {
                return Err(Error::Config(format!(
                    "{k} is {} at the top level and {} under dflash_config: the config contradicts itself (tools differ in which they read); keep one",
                    crate::text::preview(&top.to_string()),
                    crate::text::preview(&v.to_string())
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Refuses an EAGLE-3 drafter (SpecForge `LlamaForCausalLMEagle3`, vLLM
/// `Eagle3LlamaForCausalLM`, or a config with `eagle_config` /
/// `eagle_aux_hidden_state_layer_ids`), naming its taps as `compare --taps`
/// takes them: SpecForge's `eagle_config.eagle_aux_hidden_state_layer_ids`
/// count decoder-layer outputs (its hooks on `layers[idx]`), vLLM's top-level
/// `eagle_aux_hidden_state_layer_ids` the residual entering layer `idx`
/// (`idx - 1`'s output; `llama.py` `LlamaModel.forward`).
fn refuse_eagle3(cfg: &Value, arch: &str) -> Result<()> {
    let nested = cfg
        .get("eagle_config")
        .and_then(|e| e.get("eagle_aux_hidden_state_layer_ids"));
    let top = cfg.get("eagle_aux_hidden_state_layer_ids");
    let eagle = !arch.contains("DFlash")
        && (arch.to_ascii_lowercase().contains("eagle")
            || cfg.get("eagle_config").is_some_and(Value::is_object)
            || top.is_some_and(|v| !v.is_null()));
    if !eagle {
        return Ok(());
    }
    let ids = |v: Option<&Value>, shift: u64| -> Option<Vec<u64>> {
        v?.as_array()?
            .iter()
            .map(|x| x.as_u64().and_then(|i| i.checked_sub(shift)))
            .collect()
    };
    let taps = match (ids(nested, 0), ids(top, 1)) {
        (Some(t), _) => Some((
            t,
            "eagle_config.eagle_aux_hidden_state_layer_ids, SpecForge's layer outputs",
        )),
        (None, Some(t)) => Some((
            t,
            "eagle_aux_hidden_state_layer_ids minus 1: vLLM counts the residual entering a layer",
        )),
        _ => None,
    };
    let hint = match taps {
        Some((t, from)) => {
            let list: Vec<String> = t.iter().map(u64::to_string).collect();
            format!(
                "; to check the target at its taps, run `hsparity compare CHECKPOINT --taps {}` ({from})",
                list.join(",")
            )
        }
        None => "; to check the target at its taps, run `hsparity compare CHECKPOINT --taps L1,L2,L3` with its aux layers (SpecForge's default for N layers: 1, N/2-1, N-4)".into(),
    };
    Err(Error::Config(format!(
        "this is an EAGLE-3 drafter ({}), and hsparity evaluates DFlash drafters only (architectures [\"DFlashDraftModel\"] with dflash_config.target_layer_ids){hint}",
        if arch.is_empty() { "it has eagle_config" } else { arch }
    )))
}

/// A fact about the target the config records (under `dflash_config` or at
/// the top level, as SGLang's `DFlashDraftConfig` reads `num_target_layers`;
/// absent or null: `None`), as a count.
///
/// Errors ([`Error::Config`]): anything but a non-negative integer.
fn recorded(cfg: &Value, name: &str) -> Result<Option<usize>> {
    match get(cfg, name) {
        None => Ok(None),
        Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
            Error::Config(format!("{name} must be a non-negative integer, found {v}"))
        }),
    }
}

/// Draft layers a config may claim ([`DflashConfig::from_value`] refuses
/// more before building anything per layer; the weights must then hold each).
pub const MAX_LAYERS: usize = 1024;

/// An optional finite number field (`dflash_config` first): absent or null
/// gives `None`; a string or any other type is refused, not replaced by the
/// default.
///
/// Errors ([`Error::Config`]): naming the field and what it holds.
fn number(cfg: &Value, name: &str) -> Result<Option<f64>> {
    match get(cfg, name) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => Err(Error::Config(format!(
                "{name} must be a number, found {}",
                crate::text::preview(&v.to_string())
            ))),
        },
    }
}

/// `rope_theta` from `rope_parameters{rope_theta, rope_type}` or the legacy
/// top-level `rope_theta` + `rope_scaling` (default 10000).
///
/// Errors ([`Error::Config`]): a rope type other than default; a non-number theta.
fn rope_theta(cfg: &Value) -> Result<f64> {
    let bad = Error::Config;
    // Rope: rope_parameters{rope_theta, rope_type} | rope_theta + rope_scaling.
    for key in ["rope_parameters", "rope_scaling"] {
        if let Some(v) = cfg.get(key).filter(|v| !v.is_null() && !v.is_object()) {
            return Err(bad(format!(
                "{key} must be an object such as {{\"rope_type\": \"default\", \"rope_theta\": 10000}}, found {}",
                crate::text::preview(&v.to_string())
            )));
        }
    }
    let params = cfg.get("rope_parameters").filter(|v| v.is_object());
    let scaling = cfg.get("rope_scaling").filter(|v| v.is_object());
    for p in [params, scaling].into_iter().flatten() {
        let ty = p
            .get("rope_type")
            .or_else(|| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if ty != "default" {
            return Err(bad(format!(
                "rope_type {ty:?} is not implemented (hsparity implements default rope for drafters)"
            )));
        }
    }
    Ok(params
        .and_then(|p| p.get("rope_theta"))
        .or_else(|| cfg.get("rope_theta"))
        .map(|v| {
            v.as_f64()
                .ok_or_else(|| bad(format!("rope_theta must be a number, found {v}")))
        })
        .transpose()?
        .map(|t| {
            if t.is_finite() && t > 0.0 {
                Ok(t)
            } else {
                Err(bad(format!(
                    "rope_theta = {t}: the rotary base must be a positive number"
                )))
            }
        })
        .transpose()?
        .unwrap_or(10000.0))
}

/// `layer_types` (every layer full attention when absent).
///
/// Errors ([`Error::Config`]): a list of the wrong length or an unknown entry.
/// The draft layers' attention as transformers 5.23.0's `Qwen3Config`
/// resolves it: the layer types, the window in use and a window the config
/// names but does not use ([`DflashConfig::sliding_window`]).
fn attention(
    cfg: &Value,
    num_hidden_layers: usize,
) -> Result<(Vec<DraftLayerType>, Option<usize>, Option<usize>)> {
    let bad = Error::Config;
    let usize_of = |name: &str| -> Result<usize> {
        let v = get(cfg, name).ok_or_else(|| bad(format!("missing {name}")))?;
        v.as_u64()
            .map(|x| x as usize)
            .ok_or_else(|| bad(format!("{name} must be a non-negative integer, found {v}")))
    };
    // transformers 5.23.0 `Qwen3Config`: `sliding_window` defaults to
    // 4096 (an explicit null is none), and `__post_init__` drops it
    // unless `use_sliding_window` is true.
    let declared = match (get(cfg, "sliding_window"), cfg.get("sliding_window")) {
        (Some(_), _) => Some(usize_of("sliding_window")?),
        (None, Some(_)) => None,
        (None, None) => Some(QWEN3_DEFAULT_SLIDING_WINDOW),
    };
    if declared == Some(0) {
        return Err(bad(
            "sliding_window = 0: a window must hold at least one position".into(),
        ));
    }
    let used = match cfg.get("use_sliding_window").filter(|v| !v.is_null()) {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(bad(format!(
                "use_sliding_window must be true or false, found {v}"
            )))
        }
    };
    let sliding_window = declared.filter(|_| used);
    let layer_types = layer_types(cfg, num_hidden_layers, sliding_window)?;
    let sliding_window_unused = declared.filter(|_| {
        !used
            && cfg.get("sliding_window").is_some_and(|v| !v.is_null())
            && layer_types.contains(&DraftLayerType::SlidingAttention)
    });
    Ok((layer_types, sliding_window, sliding_window_unused))
}

/// The flags of `cfg` that change a drafter's forward in other
/// implementations and that dflash 0.1.0's `DFlashDraftModel` never reads:
/// `norm_before_fc` true (SGLang `llama_eagle3.py`, speculators: the taps
/// go through `input_norm` before `fc`).
fn ignored_flags(cfg: &Value) -> Vec<String> {
    ["norm_before_fc"]
        .iter()
        .filter_map(|f| {
            let v = get(cfg, f)?;
            // Python's truthiness, as the engines read the flag.
            let set = match v {
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
                Value::String(t) => !t.is_empty(),
                Value::Array(a) => !a.is_empty(),
                Value::Object(o) => !o.is_empty(),
                Value::Null => false,
            };
            set.then(|| format!("{f}: {v}"))
        })
        .collect()
}

/// `Qwen3Config.sliding_window`'s default (transformers 5.23.0).
const QWEN3_DEFAULT_SLIDING_WINDOW: usize = 4096;

/// `Qwen3Config.max_window_layers`' default (transformers 5.23.0).
const QWEN3_DEFAULT_MAX_WINDOW_LAYERS: usize = 28;

/// The draft layers' types: `layer_types` as given, else as
/// `Qwen3Config.__post_init__` derives them — sliding from
/// `max_window_layers` (28) on when a window is in use, full before.
fn layer_types(
    cfg: &Value,
    num_hidden_layers: usize,
    window: Option<usize>,
) -> Result<Vec<DraftLayerType>> {
    let bad = Error::Config;
    Ok(match cfg.get("layer_types").filter(|v| !v.is_null()) {
        Some(Value::Array(a)) => {
            if a.len() != num_hidden_layers {
                return Err(bad(format!(
                    "layer_types has {} entries, num_hidden_layers is {num_hidden_layers}",
                    a.len()
                )));
            }
            a.iter()
                .map(|t| match t.as_str() {
                    Some("full_attention") => Ok(DraftLayerType::FullAttention),
                    Some("sliding_attention") => Ok(DraftLayerType::SlidingAttention),
                    _ => Err(bad(format!(
                        "layer_types entry {t}: expected full_attention or sliding_attention"
                    ))),
                })
                .collect::<Result<_>>()?
        }
        Some(v) => return Err(bad(format!("layer_types must be a list, found {v}"))),
        None => {
            let from = match cfg.get("max_window_layers").filter(|v| !v.is_null()) {
                None => QWEN3_DEFAULT_MAX_WINDOW_LAYERS,
                Some(v) => v
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| {
                        bad(format!(
                            "max_window_layers must be a whole number, found {v}"
                        ))
                    })?,
            };
            (0..num_hidden_layers)
                .map(|i| match window.is_some() && i >= from {
                    true => DraftLayerType::SlidingAttention,
                    false => DraftLayerType::FullAttention,
                })
                .collect()
        }
    })
}

/// `target_layer_ids` (top level or `dflash_config`): required.
///
/// Errors ([`Error::Config`]): absent (the fallback formula
/// `build_target_layer_ids` silently picks taps the drafter may not have
/// been trained on, sglang#37475), empty, or not layer indices.
fn target_layer_ids(cfg: &Value) -> Result<Vec<usize>> {
    let bad = Error::Config;
    let taps = target_layer_list(cfg)?;
    let mut seen = std::collections::BTreeSet::new();
    if let Some(l) = taps.iter().find(|&&l| !seen.insert(l)) {
        return Err(bad(format!(
            "target_layer_ids {taps:?} repeats layer {l}: DFlash taps are distinct layers (build_target_layer_ids never repeats one)"
        )));
    }
    Ok(taps)
}

/// The `target_layer_ids` list as written.
fn target_layer_list(cfg: &Value) -> Result<Vec<usize>> {
    let bad = Error::Config;
    Ok(match get(cfg, "target_layer_ids") {
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|v| v as usize)
                    .ok_or_else(|| bad(format!("target_layer_ids entry {x} is not a layer index")))
            })
            .collect::<Result<_>>()?,
        Some(v) => return Err(bad(format!("target_layer_ids must be a non-empty list, found {v}"))),
        None => {
            return Err(bad(
                "no target_layer_ids (top level or dflash_config): the fallback formula \
                 build_target_layer_ids silently picks taps the drafter may not have been trained on \
                 (sglang#37475), so hsparity requires the list"
                    .into(),
            ))
        }
    })
}
