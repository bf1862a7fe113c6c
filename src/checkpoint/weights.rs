//! Tensor data: the shards are memory-mapped once, lazily (on the first
//! tensor read from each shard), and shared through an `Arc` by every
//! loading path, so two paths reading the same checkpoint key read the same
//! pages.
//!
//! Loading copies the bytes into an owned CPU tensor (candle has no zero-copy
//! CPU storage), converting to f32 on the way when asked.

use std::sync::{Arc, OnceLock};

use candle_core::{DType, Device, Tensor};
use memmap2::Mmap;

use crate::checkpoint::headers::{HeaderIndex, TensorHeader};
use crate::error::{Error, Result};

/// Shared, lazily mapped tensor data of one checkpoint.
#[derive(Debug)]
pub struct Weights {
    index: Arc<HeaderIndex>,
    maps: Vec<OnceLock<Mmap>>,
}

impl Weights {
    /// A handle over the shards described by `index`. Maps nothing yet.
    pub fn new(index: Arc<HeaderIndex>) -> Self {
        let maps = (0..index.shards.len()).map(|_| OnceLock::new()).collect();
        Weights { index, maps }
    }

    /// The header index these weights follow.
    pub fn index(&self) -> &HeaderIndex {
        &self.index
    }

    /// Number of shards mapped so far (for tests and diagnostics).
    pub fn mapped_shards(&self) -> usize {
        self.maps.iter().filter(|m| m.get().is_some()).count()
    }

    fn mmap(&self, shard: usize) -> Result<&Mmap> {
        if let Some(m) = self.maps[shard].get() {
            return Ok(m);
        }
        let info = &self.index.shards[shard];
        let file = std::fs::File::open(&info.path).map_err(|e| Error::io(&info.path, e))?;
        let len = file.metadata().map_err(|e| Error::io(&info.path, e))?.len();
        if len != info.file_len {
            return Err(Error::Checkpoint(format!(
                "{}: file size changed from {} to {len} bytes since its header was read",
                info.path.display(),
                info.file_len
            )));
        }
        // SAFETY: the file is opened read-only; hsparity never writes to a
        // checkpoint. A concurrent external truncation would be undefined
        // behaviour, as with every mmap-based safetensors reader.
        let m = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&info.path, e))?;
        let _ = self.maps[shard].set(m);
        Ok(self.maps[shard].get().expect("set above"))
    }

    fn header(&self, name: &str) -> Result<&TensorHeader> {
        self.index
            .get(name)
            .ok_or_else(|| Error::Checkpoint(format!("tensor {name} is not in the checkpoint")))
    }

    /// The raw little-endian bytes of tensor `name` (a slice of the mmap).
    ///
    /// Errors: unknown name ([`Error::Checkpoint`]), shard not mappable ([`Error::Io`]).
    pub fn bytes(&self, name: &str) -> Result<&[u8]> {
        let t = self.header(name)?;
        let shard = &self.index.shards[t.shard];
        let m = self.mmap(t.shard)?;
        let range = |o: u64| usize::try_from(shard.data_start.checked_add(o)?).ok();
        range(t.data_offsets.0)
            .zip(range(t.data_offsets.1))
            .and_then(|(b, e)| m.get(b..e))
            .ok_or_else(|| {
                Error::Checkpoint(format!(
                    "{}: tensor {name}: data_offsets [{}, {}] lie outside the file",
                    shard.path.display(),
                    t.data_offsets.0,
                    t.data_offsets.1
                ))
            })
    }

    fn not_float(&self, t: &TensorHeader) -> Error {
        Error::Checkpoint(format!(
            "{}: tensor {}: dtype {} is not a floating-point weight (expected BF16, F16, F32 or F64)",
            self.index.shards[t.shard].path.display(),
            t.name,
            t.dtype
        ))
    }

    /// Tensor `name` as an f32 CPU tensor with its checkpoint shape. BF16, F16,
    /// F32 and F64 are converted exactly as `tensor.float()` would.
    ///
    /// Errors: unknown name or a non-float dtype ([`Error::Checkpoint`]), an
    /// unreadable shard ([`Error::Io`]).
    pub fn load_f32(&self, name: &str) -> Result<Tensor> {
        let t = self.header(name)?;
        let bytes = self.bytes(name)?;
        let v: Vec<f32> = match t.dtype.as_str() {
            "F32" => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            "BF16" => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            "F16" => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            "F64" => bytes
                .chunks_exact(8)
                .map(|c| {
                    f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32
                })
                .collect(),
            _ => return Err(self.not_float(t)),
        };
        Ok(Tensor::from_vec(v, t.shape.clone(), &Device::Cpu)?)
    }

    /// Tensor `name` in its stored dtype (BF16, F16, F32 or F64) on the CPU,
    /// for callers that reproduce a low-precision path without an f32 round trip.
    ///
    /// Errors: as [`Self::load_f32`].
    pub fn load_native(&self, name: &str) -> Result<Tensor> {
        let t = self.header(name)?;
        let dtype = match t.dtype.as_str() {
            "BF16" => DType::BF16,
            "F16" => DType::F16,
            "F32" => DType::F32,
            "F64" => DType::F64,
            _ => return Err(self.not_float(t)),
        };
        let bytes = self.bytes(name)?;
        Ok(Tensor::from_raw_buffer(
            bytes,
            dtype,
            &t.shape,
            &Device::Cpu,
        )?)
    }
}
