//! [`NoiseShadow`]: a loading path's weights read as they are, for a model
//! whose products' f32 sums near a rounding midpoint round the other way
//! ([`ProductRounding::NearMidpointsFlipped`]): the second implementation
//! the noise floor is measured with (`docs/noise-floor.md`).

use std::sync::Arc;

use candle_core::Tensor;

use super::{PairWords, WeightSource};
use crate::error::Result;
use crate::precision::{Precision, ProductRounding};

/// `inner`'s tensors, bitwise, under identities of their own (so that no
/// layer loaded from it is shared with `inner`'s, and no forward either),
/// and [`ProductRounding::NearMidpointsFlipped`] as the rounding of its
/// models' products.
pub struct NoiseShadow<'a>(pub &'a dyn WeightSource);

impl WeightSource for NoiseShadow<'_> {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        self.0.tensor(name)
    }

    fn identity(&self, name: &str) -> String {
        format!("{} (noise shadow)", self.0.identity(name))
    }

    fn tensor_in(&self, name: &str, prec: Precision) -> Result<Tensor> {
        self.0.tensor_in(name, prec)
    }

    fn rows(&self, name: &str, ids: &[u32], prec: Precision) -> Result<Tensor> {
        self.0.rows(name, ids, prec)
    }

    fn row_range(&self, name: &str, start: usize, len: usize, prec: Precision) -> Result<Tensor> {
        self.0.row_range(name, start, len, prec)
    }

    fn bf16_pairs(&self, name: &str) -> Result<PairWords> {
        self.0.bf16_pairs(name)
    }

    fn bf16_pair_rows(&self, name: &str, start: usize, len: usize) -> Result<PairWords> {
        self.0.bf16_pair_rows(name, start, len)
    }

    fn hold_pairs(&self, hold: bool) {
        self.0.hold_pairs(hold)
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.0.shape(name)
    }

    fn stored_bytes(&self, name: &str) -> Option<u64> {
        self.0.stored_bytes(name)
    }

    fn expert(&self, name: &str, e: usize, prec: Precision) -> Result<Tensor> {
        self.0.expert(name, e, prec)
    }

    /// `inner`'s handle: an MoE layer reads its routed experts through it
    /// and takes the rounding from this source when it is loaded.
    fn share(&self) -> Option<Arc<dyn WeightSource + Send + Sync>> {
        self.0.share()
    }

    fn release(&self) {
        self.0.release()
    }

    fn product_rounding(&self) -> ProductRounding {
        ProductRounding::NearMidpointsFlipped
    }
}
