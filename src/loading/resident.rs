//! A loading path's weights held resident in their stored dtype (bf16, f16
//! or f32, on the run's device) and widened to f32 — rounded to the compute
//! dtype — only when a layer asks for them, or handed out as bf16 pairs for
//! the kernels that read them: the "resident" mode of a drafter
//! evaluation's memory plan. Numerically the same as reading the mapped
//! checkpoint each time ([`TensorView`]); the whole model is never widened.

use std::collections::HashMap;

use candle_core::{DType, Tensor};

use crate::error::Result;
use crate::kernels::Pairs;
use crate::loading::{select_rows, PairWords, TensorView, WeightSource};
use crate::precision::Precision;

/// The stored-dtype tensors of one view, loaded once.
pub struct Resident {
    view: TensorView,
    stored: HashMap<String, Tensor>,
    bytes: u64,
}

impl Resident {
    /// Loads every tensor of `names` that the checkpoint holds (MISSING ones
    /// stay generated on demand by the view).
    ///
    /// Errors: shard I/O, an unknown name, a non-float dtype.
    pub fn load(view: &TensorView, names: &[String]) -> Result<Self> {
        Self::load_sharing(view, names, None)
    }

    /// As [`Resident::load`], but a tensor `share` already holds (the same
    /// checkpoint key: [`WeightSource::identity`]) is shared, not read again
    /// (candle tensors share their storage): another loading path of the
    /// same checkpoint costs only the tensors it reads differently.
    /// [`Resident::bytes`] counts what this one added.
    ///
    /// Errors: as [`Resident::load`].
    pub fn load_sharing(
        view: &TensorView,
        names: &[String],
        share: Option<&Resident>,
    ) -> Result<Self> {
        let shared: HashMap<String, &Tensor> = share
            .map(|r| {
                r.stored
                    .iter()
                    .map(|(n, t)| (r.view.identity(n), t))
                    .collect()
            })
            .unwrap_or_default();
        let mut stored = HashMap::new();
        let mut bytes = 0u64;
        for n in names {
            if stored.contains_key(n) {
                continue;
            }
            if let Some(t) = shared.get(&view.identity(n)) {
                stored.insert(n.clone(), (*t).clone());
                continue;
            }
            if let Some(t) = view.stored(n)? {
                bytes += (t.elem_count() * t.dtype().size_in_bytes()) as u64;
                stored.insert(n.clone(), t);
            }
        }
        Ok(Self {
            view: view.clone(),
            stored,
            bytes,
        })
    }

    /// Bytes held (stored dtype).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The pairs of `t` when it is a 2-D bf16 tensor on the CPU.
    fn pairs_of(t: &Tensor) -> Result<PairWords> {
        let (&[n, k], DType::BF16, true) = (t.dims(), t.dtype(), t.device().is_cpu()) else {
            return Ok(None);
        };
        let t = t.contiguous()?;
        let (storage, layout) = t.storage_and_layout();
        let (candle_core::Storage::Cpu(candle_core::CpuStorage::BF16(v)), Some((s, e))) =
            (&*storage, layout.contiguous_offsets())
        else {
            return Ok(None);
        };
        Ok(Some(([n, k], Pairs::words_of_bf16(&v[s..e], [n, k])?)))
    }

    /// `t` (stored dtype) as f32 rounded to `prec`: exact widening, then the
    /// rounding `Precision::round` does unless it is the identity.
    fn widen(t: &Tensor, prec: Precision) -> Result<Tensor> {
        let stored = match t.dtype() {
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::F32 => "F32",
            _ => "F64",
        };
        let w = t.to_dtype(DType::F32)?;
        if prec.is_exact_for(stored) {
            Ok(w)
        } else {
            prec.round(&w)
        }
    }
}

impl WeightSource for Resident {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        self.tensor_in(name, Precision::F32)
    }

    fn tensor_in(&self, name: &str, prec: Precision) -> Result<Tensor> {
        match self.stored.get(name) {
            Some(t) => Self::widen(t, prec),
            None => self.view.tensor_in(name, prec),
        }
    }

    fn rows(&self, name: &str, ids: &[u32], prec: Precision) -> Result<Tensor> {
        match self.stored.get(name) {
            Some(t) => Self::widen(&select_rows(t, name, ids)?, prec),
            None => self.view.rows(name, ids, prec),
        }
    }

    fn row_range(&self, name: &str, start: usize, len: usize, prec: Precision) -> Result<Tensor> {
        match self.stored.get(name) {
            Some(t) => Self::widen(&t.narrow(0, start, len)?, prec),
            None => self.view.row_range(name, start, len, prec),
        }
    }

    /// A 2-D weight held in bf16 on the CPU: its pairs made from the held
    /// values (no widening; the NaN/Inf scan was made when the checkpoint was
    /// read, by this view or the one it shares with). Anything else, MISSING
    /// tensors included: `None`.
    fn bf16_pairs(&self, name: &str) -> Result<PairWords> {
        match self.stored.get(name) {
            Some(t) => Self::pairs_of(t),
            None => Ok(None),
        }
    }

    /// Rows `start .. start+len` of a 2-D weight held in bf16 on the CPU as
    /// [`Self::bf16_pairs`] gives the whole.
    fn bf16_pair_rows(&self, name: &str, start: usize, len: usize) -> Result<PairWords> {
        match self.stored.get(name) {
            Some(t) if t.dims().len() == 2 => {
                crate::checkpoint::weights::check_rows(name, (start, len), t.dim(0)?)?;
                Self::pairs_of(&t.narrow(0, start, len)?)
            }
            _ => Ok(None),
        }
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.view.shape(name)
    }

    fn stored_bytes(&self, name: &str) -> Option<u64> {
        WeightSource::stored_bytes(&self.view, name)
    }

    fn identity(&self, name: &str) -> String {
        self.view.identity(name)
    }
}
