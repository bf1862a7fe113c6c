//! [`WeightSource`]: how a model reads its weights. A loading path's
//! [`crate::loading::TensorView`] implements it over the mapped checkpoint; a
//! drafter's weights and synthetic tensors implement it too.

use candle_core::Tensor;

use crate::error::Result;
use crate::precision::{Precision, ProductRounding};

/// A bf16 weight as a source hands out its pairs: `[N, K]` and the words
/// ([`crate::kernels::Pairs::from_words`]); `None` where the source cannot.
pub type PairWords = Option<([usize; 2], crate::kernels::Words)>;

/// Where a model gets its weights. Names are relative to the text model, the
/// way `Qwen3_5TextModel` and `Qwen3_5ForCausalLM` see them after the loading
/// path's renames: `embed_tokens.weight`, `layers.{i}.…`, `norm.weight`, and
/// `lm_head.weight`.
pub trait WeightSource {
    /// The tensor `name` as an f32 tensor with the checkpoint's shape, on the
    /// source's device (the CPU unless the source was built for another).
    ///
    /// Errors: the name is unknown to this source, the shard cannot be read, or
    /// the stored dtype cannot be converted.
    fn tensor(&self, name: &str) -> Result<Tensor>;

    /// A key identifying the bytes `name` resolves to (e.g. the checkpoint key
    /// plus dtype, or an init rule plus seed). Two sources giving the same key
    /// for every tensor of a layer may share one loaded copy of that layer.
    fn identity(&self, name: &str) -> String;

    /// `name` rounded to the compute dtype `prec` (a parameter of a model
    /// loaded in `prec`). Sources reading a checkpoint override this to
    /// convert and round in one pass; the result is bitwise the default's.
    fn tensor_in(&self, name: &str, prec: Precision) -> Result<Tensor> {
        prec.round(&self.tensor(name)?)
    }

    /// Rows `ids` of the 2-D tensor `name` (`[ids.len(), cols]`), rounded to
    /// `prec`: an embedding lookup. Sources reading a checkpoint gather the
    /// rows from the mapped file instead of loading the whole table.
    ///
    /// Errors: as [`Self::tensor`]; an id out of range ([`crate::error::Error::Input`]).
    fn rows(&self, name: &str, ids: &[u32], prec: Precision) -> Result<Tensor> {
        select_rows(&self.tensor_in(name, prec)?, name, ids)
    }

    /// Rows `start .. start+len` of `name`, rounded to `prec` (a vocabulary
    /// chunk of the LM head).
    fn row_range(&self, name: &str, start: usize, len: usize, prec: Precision) -> Result<Tensor> {
        Ok(self.tensor_in(name, prec)?.narrow(0, start, len)?)
    }

    /// `name` as bf16 pairs (`Weights::load_bf16_pairs`: `[N, K]` and per
    /// row `w[2p] << 16 | w[2p + 1]`) read straight from a checkpoint that
    /// stores it in bf16, for a model on the CPU whose kernels read pairs
    /// (`models::layers::matrix`: in bf16 as stored, in f32 widened, in f16
    /// widened and rounded); `None` (the default) when the source cannot,
    /// and the caller loads it with [`Self::tensor_in`] instead. The values
    /// are those `tensor_in(name, Bf16)` gives (so `tensor_in(name, F32)`'s
    /// widened), and the NaN/Inf scan is the same. A source may hand the
    /// same words to every caller while one still holds them.
    ///
    /// Errors: as [`Self::tensor`].
    fn bf16_pairs(&self, name: &str) -> Result<PairWords> {
        let _ = name;
        Ok(None)
    }

    /// Rows `start .. start+len` of `name` as [`Self::bf16_pairs`] gives the
    /// whole (`[len, K]`), for an LM head's vocabulary chunk; `None` (the
    /// default) when the source cannot, and the caller reads
    /// [`Self::row_range`] instead.
    ///
    /// Errors: as [`Self::row_range`].
    fn bf16_pair_rows(&self, name: &str, start: usize, len: usize) -> Result<PairWords> {
        let _ = (name, start, len);
        Ok(None)
    }

    /// From `hold` on until it is turned off, [`Self::bf16_pairs`] keeps
    /// the words it hands out and hands them out again (a sweep holds one
    /// layer's reads while the models reading it in bf16, f32 and f16 load
    /// it); turning it off drops them. The default holds nothing.
    fn hold_pairs(&self, hold: bool) {
        let _ = hold;
    }

    /// Shape of `name` without loading it, when the source knows it.
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let _ = name;
        None
    }

    /// Bytes `name` occupies where the source reads it from (the checkpoint
    /// on disk; f32 for a tensor it makes), when it knows the shape: what
    /// the weights progress bar counts.
    fn stored_bytes(&self, name: &str) -> Option<u64> {
        self.shape(name)
            .map(|s| s.iter().map(|&d| d as u64).product::<u64>() * 4)
    }

    /// Expert `e` of the 3-D expert parameter `name` (`[E, …]` → `[…]`),
    /// rounded to `prec`: one routed expert of an MoE layer. Sources reading a
    /// checkpoint read only that expert's bytes.
    ///
    /// Errors: as [`Self::tensor`]; `e` out of range.
    fn expert(&self, name: &str, e: usize, prec: Precision) -> Result<Tensor> {
        Ok(self.tensor_in(name, prec)?.get(e)?)
    }

    /// An owned handle on this source, for a layer that reads its weights
    /// lazily (an MoE layer widens only the experts its tokens route to);
    /// `None` when the source cannot be shared (the layer loads eagerly).
    fn share(&self) -> Option<std::sync::Arc<dyn WeightSource + Send + Sync>> {
        None
    }

    /// How a model loaded from this source rounds its products' f32 sums:
    /// [`ProductRounding::Nearest`] (the default) for every source but
    /// [`super::NoiseShadow`], the noise floor's second implementation.
    fn product_rounding(&self) -> ProductRounding {
        ProductRounding::Nearest
    }

    /// Drops whatever the source made on first use and holds (a generated
    /// tensor); the next read makes it again, bitwise the same. Sources that
    /// hold nothing of their own ignore it.
    fn release(&self) {}
}

/// Checks that every id of `ids` is a row of `name`'s `v` rows.
///
/// Errors: an id out of range ([`crate::error::Error::Input`]).
pub fn check_ids(name: &str, ids: &[u32], v: usize) -> Result<()> {
    match ids.iter().find(|&&i| i as usize >= v) {
        Some(bad) => Err(crate::error::Error::Input(format!(
            "token id {bad} is out of range for {name} with {v} rows"
        ))),
        None => Ok(()),
    }
}

/// Rows `ids` of the loaded 2-D tensor `w` (named `name` in errors), on `w`'s
/// device: an embedding lookup.
///
/// Errors: an id out of range ([`crate::error::Error::Input`]).
pub fn select_rows(w: &Tensor, name: &str, ids: &[u32]) -> Result<Tensor> {
    check_ids(name, ids, w.dim(0)?)?;
    let idx = Tensor::from_slice(ids, ids.len(), w.device())?;
    Ok(w.index_select(&idx, 0)?)
}
