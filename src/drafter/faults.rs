//! What a sequence's decode state does differently from the correct loop:
//! the faults of eval harnesses and serving engines that triage emulates
//! (`harness-gdn-crop`, `gdn-state-reset@K`, `kv-fp8`). The default is the
//! correct loop.

use crate::models::CacheCrop;

/// How a [`super::target::Sequence`] departs from the correct decode state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Faults {
    /// How a verified block's rejected tail is cropped
    /// ([`CacheCrop::ConvOnly`]: z-lab `dflash_generate` on transformers 5.23.0).
    pub crop: CacheCrop,
    /// Absolute position before which the Gated DeltaNet conv and recurrent
    /// state are dropped (a prefix cache or chunked prefill that restores the
    /// attention KV but not the linear-attention state).
    pub gdn_reset_at: Option<usize>,
    /// Attention K and V stored as fp8 e4m3 with vLLM's default scale
    /// ([`crate::models::layers::attention::KvCache::fp8`]).
    pub kv_fp8: bool,
}

impl Faults {
    /// True for the correct loop.
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }
}
