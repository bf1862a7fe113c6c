//! A drafter's tensors, held in their stored dtype (bf16 for the published
//! drafters) and widened to f32 only when a layer is used.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

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
    /// Bytes held (stored dtype).
    pub fn bytes(&self) -> u64 {
        self.tensors
            .values()
            .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
            .sum()
    }

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

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|t| t.dims().to_vec())
    }
}
