//! A drafter's tensors, held in their stored dtype (bf16 for the published
//! drafters) and widened to f32 only when a layer is used.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::checkpoint::{HeaderIndex, Weights};
use crate::error::{Error, Result};
use crate::loading::WeightSource;

/// All tensors of a drafter's safetensors file(s), by name (a clone shares
/// the tensors).
#[derive(Clone)]
pub struct DrafterWeights {
    tensors: HashMap<String, Tensor>,
    files: Vec<PathBuf>,
}

impl DrafterWeights {
    /// The tensors' names (in no order).
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.tensors.keys()
    }

    /// Takes `name` out (its bytes now held elsewhere, e.g. as a prepared
    /// matrix): `None` when it is not held.
    pub fn remove(&mut self, name: &str) -> Option<Tensor> {
        self.tensors.remove(name)
    }

    /// The stored dtype of `name`, when held.
    pub fn dtype(&self, name: &str) -> Option<candle_core::DType> {
        self.tensors.get(name).map(Tensor::dtype)
    }

    /// True when every tensor is on the CPU.
    pub fn on_cpu(&self) -> bool {
        self.tensors.values().all(|t| t.device().is_cpu())
    }

    /// Bytes held (stored dtype).
    pub fn bytes(&self) -> u64 {
        self.tensors
            .values()
            .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
            .sum()
    }

    /// Loads the drafter's weights from `dir` as transformers'
    /// `from_pretrained` finds them (`model.safetensors`, else
    /// `model.safetensors.index.json`; never other `*.safetensors` files
    /// beside them), through the checked header reader of the target's
    /// checkpoints ([`HeaderIndex::read_dir`]), each tensor in its stored
    /// dtype.
    ///
    /// Errors: as [`HeaderIndex::read_dir`]; a tensor that is not a float
    /// (an integer weight, [`Error::Checkpoint`]); a tensor holding NaN or
    /// ±Inf ([`Error::Checkpoint`]: a drafter's weights are an input, and
    /// non-finite ones make every draft meaningless, so τ would not measure
    /// the target).
    pub fn load_dir(dir: &Path) -> Result<Self> {
        let index = Arc::new(HeaderIndex::read_dir(dir)?);
        let weights = Weights::new(index.clone());
        let mut tensors = HashMap::new();
        for t in &index.tensors {
            let tensor = weights.load_native(&t.name).map_err(|e| match e {
                Error::Checkpoint(m) => Error::Checkpoint(format!("drafter: {m}")),
                other => other,
            })?;
            let (nan, inf) = weights.count_non_finite(&t.name)?;
            if nan + inf > 0 {
                return Err(Error::Checkpoint(format!(
                    "drafter {}: tensor {} holds {nan} NaN and {inf} Inf values: the drafts it makes \
                     would be meaningless, so τ would not measure the target",
                    index.shard_of(t).path.display(),
                    t.name
                )));
            }
            tensors.insert(t.name.clone(), tensor);
        }
        let files = index.shards.iter().map(|s| s.path.clone()).collect();
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

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|t| t.dims().to_vec())
    }
}
