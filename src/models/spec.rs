//! The weight-free part of a decoder: its geometry ([`LayerGeometry`]), layer
//! kinds and rope ([`TextModelSpec`]), and the rope tables of one forward
//! ([`Positions`]). Built from the text config; shared by every family.

use candle_core::{Device, Tensor};

use crate::checkpoint::config::{Family, LayerType, MoeConfig, TextConfig};
use crate::error::Result;
use crate::models::family::ModelFamily;
use crate::models::layers::rope::Rotary;
use crate::models::moe::RouterSoftmax;
use crate::precision::Precision;

/// Dimensions a layer needs, copied out of [`TextConfig`].
#[derive(Debug, Clone, Copy)]
pub struct LayerGeometry {
    /// `hidden_size` H.
    pub hidden: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Key/value heads (GQA).
    pub num_kv_heads: usize,
    /// `head_dim`.
    pub head_dim: usize,
    /// Gated DeltaNet key heads nk.
    pub lin_k_heads: usize,
    /// Gated DeltaNet value heads nv.
    pub lin_v_heads: usize,
    /// Gated DeltaNet key head dim dk.
    pub lin_k_dim: usize,
    /// Gated DeltaNet value head dim dv.
    pub lin_v_dim: usize,
    /// Causal conv kernel K.
    pub conv_kernel: usize,
    /// `rms_norm_eps`.
    pub eps: f64,
    /// Compute dtype emulated by every op of the layer.
    pub prec: Precision,
}

impl LayerGeometry {
    /// From the text config, computing in `prec`.
    pub fn new(cfg: &TextConfig, prec: Precision) -> Self {
        Self {
            hidden: cfg.hidden_size,
            num_heads: cfg.num_attention_heads,
            num_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            lin_k_heads: cfg.linear_num_key_heads,
            lin_v_heads: cfg.linear_num_value_heads,
            lin_k_dim: cfg.linear_key_head_dim,
            lin_v_dim: cfg.linear_value_head_dim,
            conv_kernel: cfg.linear_conv_kernel_dim,
            eps: cfg.rms_norm_eps,
            prec,
        }
    }

    /// The same geometry computing in `prec`.
    pub fn with_precision(self, prec: Precision) -> Self {
        Self { prec, ..self }
    }

    /// Conv channels `2·nk·dk + nv·dv`.
    pub fn conv_dim(&self) -> usize {
        2 * self.lin_k_heads * self.lin_k_dim + self.lin_v_heads * self.lin_v_dim
    }
}

/// Rope tables for the absolute positions of one forward's tokens.
#[derive(Debug, Clone)]
pub struct Positions {
    /// `[T, rd]`.
    pub cos: Tensor,
    /// `[T, rd]`.
    pub sin: Tensor,
}

/// The MoE family's block sizes and how its routers take their softmax.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeSpec {
    /// Experts, top-k, expert and shared-expert sizes.
    pub config: MoeConfig,
    /// transformers' f32 softmax, or the model dtype (the `router-dtype` suspect).
    pub router_softmax: RouterSoftmax,
}

/// Shared, weight-free pieces of a decoder: family, geometry, layer kinds, rope.
#[derive(Debug, Clone)]
pub struct TextModelSpec {
    /// The config's model family.
    pub family: Family,
    /// Its model file, which builds the layers (chosen once, from `family`).
    pub model: &'static dyn ModelFamily,
    /// Geometry (computing in f32; layers take their own dtype).
    pub geo: LayerGeometry,
    /// The mixer of each decoder layer.
    pub layer_types: Vec<LayerType>,
    /// Rotary embedding.
    pub rotary: Rotary,
    /// The sparse MoE block of every layer ([`Family::Qwen3_5Moe`] only).
    pub moe: Option<MoeSpec>,
    /// Where activations live (weights arrive there through the
    /// [`crate::loading::WeightSource`]); host-side tables such as rope are
    /// copied to it.
    pub device: Device,
}

impl TextModelSpec {
    /// On the CPU. Errors: invalid `layer_types` (see [`TextConfig::layer_types`]).
    pub fn new(cfg: &TextConfig) -> Result<Self> {
        Ok(Self {
            family: cfg.family,
            model: crate::models::family::of(cfg.family),
            geo: LayerGeometry::new(cfg, Precision::F32),
            layer_types: cfg.layer_types()?,
            rotary: Rotary::new(cfg.rope_theta(), cfg.rotary_dim()),
            moe: cfg.moe.map(|config| MoeSpec {
                config,
                router_softmax: RouterSoftmax::F32,
            }),
            device: Device::Cpu,
        })
    }

    /// The same spec with the MoE routers taking their softmax as `softmax`
    /// says (no change for a dense family).
    pub fn with_router_softmax(mut self, softmax: RouterSoftmax) -> Self {
        if let Some(m) = self.moe.as_mut() {
            m.router_softmax = softmax;
        }
        self
    }

    /// The same spec computing on `device`.
    pub fn with_device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Number of decoder layers N (`hidden_states` has N+1 entries).
    pub fn num_layers(&self) -> usize {
        self.layer_types.len()
    }

    /// Rope tables for positions `offset .. offset+T`.
    pub fn positions(&self, offset: usize, t: usize) -> Result<Positions> {
        let pos: Vec<usize> = (offset..offset + t).collect();
        let (cos, sin) = self.rotary.cos_sin(&pos, &self.device)?;
        Ok(Positions { cos, sin })
    }

    /// Names (relative to the text model) of every tensor layer `i` reads.
    pub fn layer_tensor_names(&self, i: usize) -> Vec<String> {
        self.model.layer_tensor_names(i, self.layer_types[i])
    }
}
