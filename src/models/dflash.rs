//! DFlash v1 block-diffusion drafter (`DFlashDraftModel`, z-lab `dflash/model.py`
//! @44947fb L185-345; the `dflash` 0.1.0 wheel's forward is identical).
//!
//! The drafter has no embedding and no LM head: the block `[anchor, M, …, M]`
//! is embedded with the **target's** `embed_tokens` and its outputs go through
//! the target's `lm_head`. Target hidden states at `target_layer_ids` enter
//! only as extra keys/values: `c = hidden_norm(fc(ctx))` is projected by every
//! layer's `k_proj`/`v_proj` (then `k_norm` and rope at the context rows'
//! absolute positions) and prepended to the block's own keys/values. Full
//! layers attend without a mask; sliding layers are causal within the block and
//! windowed (`_attention_mask` of the wheel).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::loading::WeightSource;
use crate::models::layers::attention::repeat_kv;
use crate::models::layers::linear;
use crate::models::layers::mlp::Mlp;
use crate::models::layers::norm::PlainRmsNorm;
use crate::models::layers::rope::Rotary;
use crate::precision::Precision;

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
    /// Window of the sliding layers.
    pub sliding_window: Option<usize>,
    /// `output_multiplier` (default 1).
    pub output_multiplier: f64,
    /// `final_logit_softcapping` (none by default).
    pub final_logit_softcapping: Option<f64>,
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
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
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
        let v2_markers = [
            "selector_top_k",
            "attention_conv",
            "mlp_conv",
            "candidate_selector",
            "conv_kernel_size",
        ];
        if arch.contains("DFlash2") || v2_markers.iter().any(|k| get(cfg, k).is_some()) {
            return Err(bad(format!(
                "this is a DFlash2-style drafter ({}); hsparity implements DFlash v1 (DFlashDraftModel) only",
                if arch.is_empty() { "has DFlash2 fields" } else { arch }
            )));
        }
        let usize_of = |name: &str| -> Result<usize> {
            match get(cfg, name) {
                Some(v) => v.as_u64().map(|x| x as usize).ok_or_else(|| {
                    bad(format!("{name} must be a non-negative integer, found {v}"))
                }),
                None => Err(bad(format!("missing {name}"))),
            }
        };
        let hidden_size = usize_of("hidden_size")?;
        let num_attention_heads = usize_of("num_attention_heads")?;
        let head_dim = match get(cfg, "head_dim") {
            Some(_) => usize_of("head_dim")?,
            None => hidden_size / num_attention_heads.max(1),
        };
        let num_hidden_layers = usize_of("num_hidden_layers")?;
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
        let layer_types = layer_types(cfg, num_hidden_layers)?;
        let sliding_window = match get(cfg, "sliding_window") {
            Some(_) => Some(usize_of("sliding_window")?),
            None => None,
        };
        if sliding_window == Some(0) {
            return Err(bad(
                "sliding_window = 0: a window must hold at least one position".into(),
            ));
        }
        if head_dim % 2 != 0 {
            return Err(bad(format!(
                "head_dim = {head_dim}: rotary embedding needs an even head_dim"
            )));
        }
        if layer_types.contains(&DraftLayerType::SlidingAttention) && sliding_window.is_none() {
            return Err(bad("sliding_attention layers but no sliding_window".into()));
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
        Ok(Self {
            hidden_size,
            intermediate_size: usize_of("intermediate_size")?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: get(cfg, "rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta,
            block_size,
            target_layer_ids,
            mask_token_id,
            layer_types,
            sliding_window,
            output_multiplier: get(cfg, "output_multiplier")
                .and_then(Value::as_f64)
                .unwrap_or(1.0),
            final_logit_softcapping: get(cfg, "final_logit_softcapping")
                .and_then(Value::as_f64)
                .filter(|x| *x > 0.0),
        })
    }
}

/// `rope_theta` from `rope_parameters{rope_theta, rope_type}` or the legacy
/// top-level `rope_theta` + `rope_scaling` (default 10000).
///
/// Errors ([`Error::Config`]): a rope type other than default; a non-number theta.
fn rope_theta(cfg: &Value) -> Result<f64> {
    let bad = Error::Config;
    // Rope: rope_parameters{rope_theta, rope_type} | rope_theta + rope_scaling.
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
        .unwrap_or(10000.0))
}

/// `layer_types` (every layer full attention when absent).
///
/// Errors ([`Error::Config`]): a list of the wrong length or an unknown entry.
fn layer_types(cfg: &Value, num_hidden_layers: usize) -> Result<Vec<DraftLayerType>> {
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
        None => vec![DraftLayerType::FullAttention; num_hidden_layers],
    })
}

/// `target_layer_ids` (top level or `dflash_config`): required.
///
/// Errors ([`Error::Config`]): absent (the fallback formula
/// `build_target_layer_ids` silently picks taps the drafter may not have
/// been trained on, sglang#37475), empty, or not layer indices.
fn target_layer_ids(cfg: &Value) -> Result<Vec<usize>> {
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

/// All tensors of a drafter's safetensors file(s), by name.
pub struct DrafterWeights {
    tensors: HashMap<String, Tensor>,
    files: Vec<PathBuf>,
}

impl DrafterWeights {
    /// Loads every `*.safetensors` in `dir`. Errors: none found, unreadable file.
    pub fn load_dir(dir: &Path) -> Result<Self> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(Error::Checkpoint(format!(
                "drafter {}: no *.safetensors file",
                dir.display()
            )));
        }
        let mut tensors = HashMap::new();
        for f in &files {
            let t = candle_core::safetensors::load(f, &Device::Cpu)
                .map_err(|e| Error::Checkpoint(format!("drafter {}: {e}", f.display())))?;
            tensors.extend(t);
        }
        Ok(Self { tensors, files })
    }

    /// The same weights moved to `device` (a no-op on the CPU).
    ///
    /// Errors: the device cannot hold them (out of memory, driver error).
    pub fn to_device(self, device: &Device) -> Result<Self> {
        if device.is_cpu() {
            return Ok(self);
        }
        let tensors = self
            .tensors
            .into_iter()
            .map(|(k, t)| Ok((k, t.to_device(device)?)))
            .collect::<Result<_>>()?;
        Ok(Self {
            tensors,
            files: self.files,
        })
    }
}

impl WeightSource for DrafterWeights {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        let t = self.tensors.get(name).ok_or_else(|| {
            Error::Checkpoint(format!(
                "drafter {}: tensor {name} is missing",
                self.files
                    .first()
                    .map(|f| f.display().to_string())
                    .unwrap_or_default()
            ))
        })?;
        Ok(t.to_dtype(candle_core::DType::F32)?)
    }

    fn identity(&self, name: &str) -> String {
        format!("drafter:{name}")
    }
}

fn check_shape(src: &dyn WeightSource, name: &str, want: &[usize]) -> Result<Tensor> {
    let t = src.tensor(name)?;
    if t.dims() != want {
        return Err(Error::Checkpoint(format!(
            "drafter tensor {name}: expected shape {want:?}, found {:?}",
            t.dims()
        )));
    }
    Ok(t)
}

struct DraftLayer {
    input_layernorm: PlainRmsNorm,
    q_proj: Tensor,
    k_proj: Tensor,
    v_proj: Tensor,
    o_proj: Tensor,
    q_norm: PlainRmsNorm,
    k_norm: PlainRmsNorm,
    post_attention_layernorm: PlainRmsNorm,
    mlp: Mlp,
    layer_type: DraftLayerType,
}

/// A loaded drafter, computing in f32 (or an emulated half dtype).
pub struct Drafter {
    /// Its config.
    pub cfg: DflashConfig,
    fc: Tensor,
    hidden_norm: PlainRmsNorm,
    layers: Vec<DraftLayer>,
    norm: PlainRmsNorm,
    rotary: Rotary,
    prec: Precision,
}

impl Drafter {
    /// Builds the drafter for a target with `target_hidden` hidden size.
    ///
    /// Errors: a missing tensor; `fc.weight` not `[H, K·H]` with K =
    /// `len(target_layer_ids)`; the drafter's hidden size differs from the
    /// target's (the taps could not feed `fc`); any other shape mismatch.
    pub fn load(
        cfg: DflashConfig,
        src: &dyn WeightSource,
        target_hidden: usize,
        prec: Precision,
    ) -> Result<Self> {
        let h = cfg.hidden_size;
        if h != target_hidden {
            return Err(Error::Config(format!(
                "drafter hidden_size {h} differs from the target's hidden_size {target_hidden}: its fc cannot read the target's hidden states"
            )));
        }
        let k = cfg.target_layer_ids.len();
        let fc = check_shape(src, "fc.weight", &[h, k * h]).map_err(|e| match e {
            Error::Checkpoint(m) => Error::Checkpoint(format!(
                "{m} (fc in-features must be len(target_layer_ids) x hidden_size = {k} x {h})"
            )),
            other => other,
        })?;
        let fc = prec.round(&fc)?;
        let (nh, nkv, hd, inter) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.intermediate_size,
        );
        let eps = cfg.rms_norm_eps;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("layers.{i}");
            let w = |n: &str, shape: &[usize]| -> Result<Tensor> {
                prec.round(&check_shape(src, &format!("{p}.{n}"), shape)?)
            };
            layers.push(DraftLayer {
                input_layernorm: PlainRmsNorm::load(
                    src,
                    &format!("{p}.input_layernorm"),
                    eps,
                    prec,
                )?,
                q_proj: w("self_attn.q_proj.weight", &[nh * hd, h])?,
                k_proj: w("self_attn.k_proj.weight", &[nkv * hd, h])?,
                v_proj: w("self_attn.v_proj.weight", &[nkv * hd, h])?,
                o_proj: w("self_attn.o_proj.weight", &[h, nh * hd])?,
                q_norm: PlainRmsNorm::load(src, &format!("{p}.self_attn.q_norm"), eps, prec)?,
                k_norm: PlainRmsNorm::load(src, &format!("{p}.self_attn.k_norm"), eps, prec)?,
                post_attention_layernorm: PlainRmsNorm::load(
                    src,
                    &format!("{p}.post_attention_layernorm"),
                    eps,
                    prec,
                )?,
                mlp: Mlp::new(
                    w("mlp.gate_proj.weight", &[inter, h])?,
                    w("mlp.up_proj.weight", &[inter, h])?,
                    w("mlp.down_proj.weight", &[h, inter])?,
                    prec,
                ),
                layer_type: cfg.layer_types[i],
            });
        }
        Ok(Self {
            fc,
            hidden_norm: PlainRmsNorm::load(src, "hidden_norm", eps, prec)?,
            norm: PlainRmsNorm::load(src, "norm", eps, prec)?,
            rotary: Rotary::new(cfg.rope_theta, hd),
            layers,
            cfg,
            prec,
        })
    }

    /// Loads `config.json` + weights from a drafter folder.
    pub fn load_dir(dir: &Path, target_hidden: usize, prec: Precision) -> Result<Self> {
        let cfg = DflashConfig::from_file(&dir.join("config.json"))?;
        let w = DrafterWeights::load_dir(dir)?;
        Self::load(cfg, &w, target_hidden, prec)
    }

    /// `forward`: `noise`: `[B, H]` (block tokens embedded by the target),
    /// `ctx`: `[C, K·H]` target features for positions `ctx_start..ctx_start+C`,
    /// block at positions `block_start..block_start+B` (in DFlash
    /// `ctx_start + C == block_start`). Returns the final-normed `[B, H]`.
    pub fn forward(
        &self,
        noise: &Tensor,
        ctx: &Tensor,
        ctx_start: usize,
        block_start: usize,
    ) -> Result<Tensor> {
        let p = self.prec;
        let (b, c) = (noise.dim(0)?, ctx.dim(0)?);
        let (nh, nkv, hd) = (
            self.cfg.num_attention_heads,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim,
        );
        let c_proj = self.hidden_norm.forward(&linear(ctx, &self.fc, p)?)?;
        let positions: Vec<usize> = (ctx_start..ctx_start + c)
            .chain(block_start..block_start + b)
            .collect();
        let (cos, sin) = self.rotary.cos_sin(&positions, ctx.device())?;
        let (cos_q, sin_q) = (cos.narrow(0, c, b)?, sin.narrow(0, c, b)?);
        let scale = (hd as f64).powf(-0.5);
        // One sliding-window mask per forward, shared by the sliding layers.
        let sliding = if self
            .layers
            .iter()
            .any(|l| l.layer_type == DraftLayerType::SlidingAttention)
        {
            Some(self.sliding_mask(b, c, ctx.device())?)
        } else {
            None
        };
        let mut x = noise.clone();
        for layer in &self.layers {
            let h = layer.input_layernorm.forward(&x)?;
            let q = layer
                .q_norm
                .forward(&linear(&h, &layer.q_proj, p)?.reshape((b, nh, hd))?)?;
            let kv_in = Tensor::cat(&[&c_proj, &h], 0)?;
            let k = layer
                .k_norm
                .forward(&linear(&kv_in, &layer.k_proj, p)?.reshape((c + b, nkv, hd))?)?;
            let v = linear(&kv_in, &layer.v_proj, p)?.reshape((c + b, nkv, hd))?;
            let q = q.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
            let k = k.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
            let v = v.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
            let q = self.rotary.apply(&q, &cos_q, &sin_q, p)?;
            let k = self.rotary.apply(&k, &cos, &sin, p)?;
            let (k, v) = (repeat_kv(&k, nh / nkv)?, repeat_kv(&v, nh / nkv)?);
            let mut scores = p.round(&(p.round(&q.matmul(&k.t()?.contiguous()?)?)? * scale)?)?;
            if let (DraftLayerType::SlidingAttention, Some(mask)) = (layer.layer_type, &sliding) {
                scores = scores.broadcast_add(mask)?;
            }
            let probs = p.round(&candle_nn::ops::softmax_last_dim(&scores)?)?;
            let a = p.round(&probs.matmul(&v)?)?;
            let a = a.squeeze(0)?.transpose(0, 1)?.reshape((b, nh * hd))?;
            x = p.round(&(x + linear(&a, &layer.o_proj, p)?)?)?;
            let h2 = layer.post_attention_layernorm.forward(&x)?;
            let m = layer.mlp.forward(&h2)?;
            x = p.round(&(x + m)?)?;
        }
        self.norm.forward(&x)
    }

    /// The wheel's `_attention_mask(is_causal=True, sliding_window=W)` over
    /// `[C + B]` keys for `B` block queries (query i sits at key index C + i).
    fn sliding_mask(&self, b: usize, c: usize, device: &Device) -> Result<Tensor> {
        let w = self.cfg.sliding_window.unwrap_or(usize::MAX);
        let s = c + b;
        let mut m = vec![0f32; b * s];
        for i in 0..b {
            let qp = c + i;
            for kp in 0..s {
                if kp > qp || qp - kp >= w {
                    m[i * s + kp] = f32::NEG_INFINITY;
                }
            }
        }
        Ok(Tensor::from_vec(m, (b, s), device)?)
    }

    /// Draft logits from final-normed outputs with the target's `lm_head`
    /// (`[V, H]`): `compute_logits` (output multiplier and softcap when set).
    pub fn logits(&self, y: &Tensor, lm_head: &Tensor) -> Result<Tensor> {
        let mut l = linear(y, lm_head, self.prec)?;
        if self.cfg.output_multiplier != 1.0 {
            l = (l * self.cfg.output_multiplier)?;
        }
        if let Some(cap) = self.cfg.final_logit_softcapping {
            l = ((l / cap)?.tanh()? * cap)?;
        }
        Ok(l)
    }
}
