//! Tensor data: the shards are memory-mapped once, lazily (on the first
//! tensor read from each shard), and shared through an `Arc` by every
//! loading path, so two paths reading the same checkpoint key read the same
//! pages.
//!
//! Loading copies the bytes into an owned CPU tensor (candle has no zero-copy
//! CPU storage), converting to f32 on the way when asked.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use candle_core::{DType, Device, Tensor};
use memmap2::Mmap;
use rayon::prelude::*;

use crate::checkpoint::headers::{HeaderIndex, TensorHeader};
use crate::error::{Error, Result};
use crate::precision::Precision;

mod decode;

use decode::Stored;

/// Shared, lazily mapped tensor data of one checkpoint.
#[derive(Debug)]
pub struct Weights {
    index: Arc<HeaderIndex>,
    maps: Vec<OnceLock<Mmap>>,
    /// While [`Self::hold_pairs`] is on, the bf16 pairs read, by key.
    held: std::sync::Mutex<Option<HashMap<String, Bf16Pairs>>>,
}

impl Weights {
    /// A handle over the shards described by `index`. Maps nothing yet.
    pub fn new(index: Arc<HeaderIndex>) -> Self {
        let maps = (0..index.shards.len()).map(|_| OnceLock::new()).collect();
        Weights {
            index,
            maps,
            held: Default::default(),
        }
    }

    /// From `hold` on until it is turned off, [`Self::load_bf16_pairs`]
    /// keeps what it reads and hands it out again: the models of one sweep
    /// (any loading path over these shards, any dtype) read a layer's bytes
    /// once. Turning it off drops what was kept.
    pub fn hold_pairs(&self, hold: bool) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        *held = hold.then(HashMap::new);
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
        let file = crate::input::open(&info.path)?;
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

    /// Tensor `name` as an f32 CPU tensor with its checkpoint shape, rounded
    /// to `prec` in the same pass. BF16, F16, F32 and F64 are converted exactly
    /// as `tensor.float()` would, so `Precision::F32` gives the stored values
    /// and `prec` gives bitwise `prec.round` of them (one copy instead of three).
    ///
    /// The conversion runs on every rayon thread, and the tensor's pages are
    /// released from this process's resident set afterwards (`MADV_DONTNEED`
    /// on a read-only file mapping: the page cache keeps them, a later read
    /// faults them back in), so streaming a checkpoint layer by layer keeps
    /// the peak RSS near one layer's converted weights.
    ///
    /// Errors: unknown name or a non-float dtype ([`Error::Checkpoint`]), an
    /// unreadable shard ([`Error::Io`]).
    pub fn load_f32_rounded(&self, name: &str, prec: Precision) -> Result<Tensor> {
        Ok(self.load_f32_rounded_counted(name, prec)?.0)
    }

    /// [`Self::load_f32_rounded`], with the NaN and ±Inf counts of the
    /// stored values ([`Self::count_non_finite`]'s), counted in the same
    /// pass as the conversion.
    ///
    /// Errors: as [`Self::load_f32_rounded`].
    pub fn load_f32_rounded_counted(
        &self,
        name: &str,
        prec: Precision,
    ) -> Result<(Tensor, (usize, usize))> {
        let t = self.header(name)?;
        let rows = t.shape.first().copied().unwrap_or(1);
        let (v, counts) = self.convert_rows_counted(t, 0, rows, Some(prec))?;
        Ok((Tensor::from_vec(v, t.shape.clone(), &Device::Cpu)?, counts))
    }

    /// The 2-D tensor `name` stored in bf16, `[N, K]`, as its bf16 pairs
    /// straight from the mapped bytes (no f32 copy): per row,
    /// `w[2p] << 16 | w[2p + 1]` (the last `w[K−1] << 16` when K is odd),
    /// rows in parallel; the layout `kernels::Pairs`
    /// holds; with the counts of its NaN and Inf values (counted in the same
    /// pass). `None` when it is not a 2-D bf16 tensor.
    ///
    /// Errors: as [`Self::load_f32_rounded`].
    pub fn load_bf16_pairs(&self, name: &str) -> Result<Option<Bf16Pairs>> {
        let t = self.header(name)?;
        let [n, _] = t.shape[..] else {
            return Ok(None);
        };
        let kept = |h: &Option<HashMap<String, Bf16Pairs>>| h.as_ref()?.get(name).cloned();
        if let Some(p) = kept(&self.held.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(Some(p));
        }
        let p = self.load_bf16_pair_rows(name, 0, n)?;
        if let (Some(p), Some(h)) = (
            &p,
            self.held.lock().unwrap_or_else(|e| e.into_inner()).as_mut(),
        ) {
            h.insert(name.to_string(), p.clone());
        }
        Ok(p)
    }

    /// Rows `start .. start+len` of the 2-D bf16 tensor `name` as
    /// [`Self::load_bf16_pairs`] gives them (`dims` `[len, K]`, the NaN and
    /// Inf counts of those rows): an LM head's vocabulary chunk.
    ///
    /// Errors: as [`Self::load_f32_rounded`]; a range past the last row.
    pub fn load_bf16_pair_rows(
        &self,
        name: &str,
        start: usize,
        len: usize,
    ) -> Result<Option<Bf16Pairs>> {
        use rayon::prelude::*;
        let t = self.header(name)?;
        let (&[rows, k], Some(Stored::Bf16)) = (&t.shape[..], Stored::of(&t.dtype)) else {
            return Ok(None);
        };
        check_rows(name, (start, len), rows)?;
        let (n, b) = (len, start * k * 2);
        let src = self.span(t, b, b + n * k * 2)?;
        let pairs = k.div_ceil(2);
        let mut words = vec![0u32; n * pairs];
        let (nan, inf) = words
            .par_chunks_mut(pairs.max(1))
            .zip(src.par_chunks(2 * k.max(1)))
            .map(|(out, row)| crate::kernels::words_from_bytes(out, row))
            .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        self.release(t, b, n * k * 2);
        Ok(Some(Bf16Pairs {
            dims: [n, k],
            words: Arc::new(words),
            nan,
            inf,
        }))
    }

    /// Rows `start .. start+len` of the 2-D (or higher) tensor `name`, as f32
    /// `[len, ..]`, rounded to `prec` (`None`: not rounded). Reads only those
    /// rows' bytes (the LM head is applied in vocabulary chunks this way).
    ///
    /// Errors: as [`Self::load_f32_rounded`]; a 0-D tensor or a range past the last row.
    pub fn load_row_range(
        &self,
        name: &str,
        start: usize,
        len: usize,
        prec: Option<Precision>,
    ) -> Result<Tensor> {
        let t = self.header(name)?;
        let rows = *t
            .shape
            .first()
            .ok_or_else(|| Error::Checkpoint(format!("tensor {name}: a scalar has no rows")))?;
        check_rows(name, (start, len), rows)?;
        let v = self.convert_rows(t, start, len, prec)?;
        let mut shape = t.shape.clone();
        shape[0] = len;
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
    }

    /// Rows `ids` of the 2-D tensor `name` (an embedding gather straight from
    /// the mapped file), as f32 `[ids.len(), cols]` rounded to `prec`
    /// (`None`: not rounded). Bitwise equal to `index_select` on the fully
    /// loaded (and rounded) tensor.
    ///
    /// Errors: as [`Self::load_f32_rounded`]; a tensor that is not 2-D, an id out of range.
    pub fn load_rows(&self, name: &str, ids: &[u32], prec: Option<Precision>) -> Result<Tensor> {
        let t = self.header(name)?;
        let [rows, cols] = t.shape[..] else {
            return Err(Error::Checkpoint(format!(
                "tensor {name}: expected 2 dimensions for a row gather, found {:?}",
                t.shape
            )));
        };
        let mut out = Vec::with_capacity(ids.len() * cols);
        for &id in ids {
            if id as usize >= rows {
                return Err(Error::Input(format!(
                    "token id {id} is out of range for {name} with {rows} rows"
                )));
            }
            out.extend(self.convert_rows(t, id as usize, 1, prec)?);
        }
        Ok(Tensor::from_vec(out, (ids.len(), cols), &Device::Cpu)?)
    }

    /// NaN and ±Inf counts of tensor `name`, read from the mapped bytes
    /// without materialising the tensor (pages released as with [`Self::load_f32_rounded`]).
    ///
    /// Errors: as [`Self::load_f32_rounded`].
    pub fn count_non_finite(&self, name: &str) -> Result<(usize, usize)> {
        let t = self.header(name)?;
        let dtype = Stored::of(&t.dtype).ok_or_else(|| self.not_float(t))?;
        let width = dtype.width();
        let bytes = self.bytes(name)?;
        // 16 MiB pieces: each piece is counted in parallel, then released.
        let piece = (16 << 20) / width * width;
        let count = |c: &[u8]| match dtype {
            Stored::Bf16 => bf16_non_finite(c),
            Stored::F16 => non_finite_bits(c, |b: [u8; 2]| u32::from(u16::from_le_bytes(b)), 10, 5),
            Stored::F32 => non_finite_bits(c, u32::from_le_bytes, 23, 8),
            // As loaded: the cast to f32 turns a finite f64 past f32's
            // range into Inf.
            Stored::F64 => c.chunks_exact(8).fold((0, 0), |n, e| {
                let x = f64::from_le_bytes(e.try_into().expect("chunks_exact(8)")) as f32;
                (n.0 + x.is_nan() as usize, n.1 + x.is_infinite() as usize)
            }),
        };
        let mut total = (0usize, 0usize);
        for (k, chunk) in bytes.chunks(piece.max(width)).enumerate() {
            let (nan, inf) = chunk
                .par_chunks(width * 4096)
                .map(count)
                .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
            total.0 += nan;
            total.1 += inf;
            self.release(t, k * piece, chunk.len());
        }
        Ok(total)
    }

    /// Converts rows `start .. start+len` of `t` to f32 (in parallel),
    /// rounding to `prec`, then releases those pages.
    fn convert_rows(
        &self,
        t: &TensorHeader,
        start: usize,
        len: usize,
        prec: Option<Precision>,
    ) -> Result<Vec<f32>> {
        Ok(self.convert_rows_counted(t, start, len, prec)?.0)
    }

    /// [`Self::convert_rows`], with those rows' NaN and ±Inf counts as
    /// stored ([`decode::convert`]).
    fn convert_rows_counted(
        &self,
        t: &TensorHeader,
        start: usize,
        len: usize,
        prec: Option<Precision>,
    ) -> Result<(Vec<f32>, (usize, usize))> {
        let dtype = Stored::of(&t.dtype).ok_or_else(|| self.not_float(t))?;
        let width = dtype.width();
        let row_elems: usize = t.shape.iter().skip(1).product();
        let (b, e) = (start * row_elems * width, (start + len) * row_elems * width);
        let src = self.span(t, b, e)?;
        // A value that is already exact in the compute dtype needs no rounding.
        let prec = prec.filter(|p| !p.is_exact_for(&t.dtype));
        let v = decode::convert(src, dtype, prec);
        self.release(t, b, e - b);
        Ok(v)
    }

    /// Bytes `b .. e` of tensor `t`'s data.
    ///
    /// Errors: the file holds fewer bytes than its shape and dtype need.
    fn span(&self, t: &TensorHeader, b: usize, e: usize) -> Result<&[u8]> {
        let bytes = self.bytes(&t.name)?;
        bytes.get(b..e).ok_or_else(|| {
            Error::Checkpoint(format!(
                "tensor {}: {} bytes do not hold shape {:?} in {}",
                t.name,
                bytes.len(),
                t.shape,
                t.dtype
            ))
        })
    }

    /// Drops the pages of bytes `off .. off+len` of tensor `t` from this
    /// process's resident set (best effort; errors are ignored).
    fn release(&self, t: &TensorHeader, off: usize, len: usize) {
        let shard = &self.index.shards[t.shard];
        let Some(m) = self.maps[t.shard].get() else {
            return;
        };
        let Some(begin) = usize::try_from(shard.data_start + t.data_offsets.0)
            .ok()
            .map(|b| b + off)
        else {
            return;
        };
        const PAGE: usize = 4096;
        let lo = begin / PAGE * PAGE;
        let hi = (begin + len).div_ceil(PAGE) * PAGE;
        let hi = hi.min(m.len());
        if hi > lo {
            // SAFETY: the mapping is a read-only view of a file; MADV_DONTNEED
            // only unmaps the pages, and the next access reads them back from
            // the page cache or the file with the same contents.
            let _ = unsafe {
                m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo)
            };
        }
    }

    /// Tensor `name` in its stored dtype (BF16, F16, F32 or F64) on the CPU,
    /// for callers that reproduce a low-precision path without an f32 round trip.
    ///
    /// Errors: as [`Self::load_f32_rounded`].
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

/// Refuses rows `start .. start+len` of tensor `name` when it has fewer
/// than their end (the end computed without overflow).
///
/// Errors ([`Error::Checkpoint`]): naming the tensor, the range and its rows.
pub(crate) fn check_rows(name: &str, (start, len): (usize, usize), rows: usize) -> Result<()> {
    if start.checked_add(len).is_none_or(|end| end > rows) {
        return Err(Error::Checkpoint(format!(
            "tensor {name}: rows {start}..{} requested, it has {rows}",
            start.saturating_add(len)
        )));
    }
    Ok(())
}

/// A bf16 tensor as pairs ([`Weights::load_bf16_pairs`]).
#[derive(Debug, Clone)]
pub struct Bf16Pairs {
    /// `[N, K]`.
    pub dims: [usize; 2],
    /// Per row, `w[2p] << 16 | w[2p + 1]` (`w[K−1] << 16` last when K is odd).
    pub words: crate::kernels::Words,
    /// NaN values in the tensor.
    pub nan: usize,
    /// Inf values in the tensor.
    pub inf: usize,
}

/// NaN and Inf counts of little-endian bf16 values, read through their
/// pairs ([`crate::kernels::words_from_bytes`]) a few KiB at a time.
fn bf16_non_finite(bytes: &[u8]) -> (usize, usize) {
    let mut words = [0u32; 1024];
    bytes.chunks(4 * words.len()).fold((0, 0), |n, c| {
        let (nan, inf) = crate::kernels::words_from_bytes(&mut words[..c.len().div_ceil(4)], c);
        (n.0 + nan, n.1 + inf)
    })
}

/// NaN and Inf counts of little-endian IEEE values of `N` bytes with
/// `frac` fraction bits and `exp` exponent bits (f16, f32), from their bits:
/// NaN has the exponent all ones and a fraction, Inf all ones and none.
/// Widening keeps both classes (an f16 NaN or Inf stays one in f32).
fn non_finite_bits<const N: usize>(
    bytes: &[u8],
    bits: impl Fn([u8; N]) -> u32,
    frac: u32,
    exp: u32,
) -> (usize, usize) {
    let frac_mask = (1u32 << frac) - 1;
    let exp_mask = ((1u32 << exp) - 1) << frac;
    bytes.chunks_exact(N).fold((0, 0), |n, e| {
        let v = bits(e.try_into().expect("chunks_exact(N)"));
        let ones = usize::from(v & exp_mask == exp_mask);
        let some = usize::from(v & frac_mask != 0);
        (n.0 + (ones & some), n.1 + (ones & (1 - some)))
    })
}
