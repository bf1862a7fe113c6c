//! A loading path's weights held resident in their stored dtype (bf16, f16
//! or f32, on the run's device) and widened to f32 — rounded to the compute
//! dtype — only when a layer asks for them: the "resident" mode of a drafter
//! evaluation's memory plan. A 2-D bf16 weight on the CPU is held as the
//! bf16 pairs the kernels read ([`Pairs`], the same bytes), made once from
//! the mapped bytes, so every sweep's layers take them as they are.
//! Numerically the same as reading the mapped checkpoint each time
//! ([`TensorView`]); the whole model is never widened.

use std::collections::HashMap;

use candle_core::{DType, Tensor};

use crate::error::Result;
use crate::kernels::{Pairs, Words};
use crate::loading::{check_ids, select_rows, PairWords, TensorView, WeightSource};
use crate::precision::Precision;

/// One tensor held: in its stored dtype, or a 2-D bf16 CPU weight as its
/// pairs' words.
#[derive(Clone)]
enum Held {
    Stored(Tensor),
    Pairs([usize; 2], Words),
}

impl Held {
    fn bytes(&self) -> u64 {
        match self {
            Held::Stored(t) => (t.elem_count() * t.dtype().size_in_bytes()) as u64,
            Held::Pairs(_, w) => (w.len() * 4) as u64,
        }
    }
}

/// The stored-dtype tensors of one view, loaded once.
pub struct Resident {
    view: TensorView,
    stored: HashMap<String, Held>,
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
        let shared: HashMap<String, &Held> = share
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
            // A bf16 weight's pairs straight from the mapped bytes.
            let held = match view.bf16_pairs(n)? {
                Some((dims, words)) => Some(Held::Pairs(dims, words)),
                None => view.stored(n)?.map(Held::Stored),
            };
            if let Some(h) = held {
                bytes += h.bytes();
                stored.insert(n.clone(), h);
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

    /// Rows `rows` of a weight held as pairs, widened to f32 (exact: the
    /// values are bf16) and rounded to `prec` as a bf16 tensor would be.
    fn widen_pairs(
        dims: [usize; 2],
        words: &Words,
        rows: &[usize],
        prec: Precision,
    ) -> Result<Tensor> {
        let v = Pairs::from_words(dims, words.clone())?.widen_rows(rows);
        let w = Tensor::from_vec(v, (rows.len(), dims[1]), &candle_core::Device::Cpu)?;
        Self::rounded(w, "BF16", prec)
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
        Self::rounded(t.to_dtype(DType::F32)?, stored, prec)
    }

    /// `w`, values of the `stored` dtype widened to f32, rounded to `prec`
    /// unless that is the identity on them.
    fn rounded(w: Tensor, stored: &str, prec: Precision) -> Result<Tensor> {
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
            Some(Held::Stored(t)) => Self::widen(t, prec),
            Some(Held::Pairs(d, w)) => {
                Self::widen_pairs(*d, w, &(0..d[0]).collect::<Vec<_>>(), prec)
            }
            None => self.view.tensor_in(name, prec),
        }
    }

    fn rows(&self, name: &str, ids: &[u32], prec: Precision) -> Result<Tensor> {
        match self.stored.get(name) {
            Some(Held::Stored(t)) => Self::widen(&select_rows(t, name, ids)?, prec),
            Some(Held::Pairs(d, w)) => {
                check_ids(name, ids, d[0])?;
                let rows: Vec<usize> = ids.iter().map(|&i| i as usize).collect();
                Self::widen_pairs(*d, w, &rows, prec)
            }
            None => self.view.rows(name, ids, prec),
        }
    }

    fn row_range(&self, name: &str, start: usize, len: usize, prec: Precision) -> Result<Tensor> {
        match self.stored.get(name) {
            Some(Held::Stored(t)) => Self::widen(&t.narrow(0, start, len)?, prec),
            Some(Held::Pairs(d, w)) => {
                crate::checkpoint::weights::check_rows(name, (start, len), d[0])?;
                Self::widen_pairs(*d, w, &(start..start + len).collect::<Vec<_>>(), prec)
            }
            None => self.view.row_range(name, start, len, prec),
        }
    }

    /// A 2-D weight held in bf16 on the CPU: the words made when it was
    /// read (shared, not copied; the NaN/Inf scan was made then, by this
    /// view or the one it shares with). Anything else, MISSING tensors
    /// included: `None`.
    fn bf16_pairs(&self, name: &str) -> Result<PairWords> {
        match self.stored.get(name) {
            Some(Held::Pairs(dims, words)) => Ok(Some((*dims, words.clone()))),
            _ => Ok(None),
        }
    }

    /// Rows `start .. start+len` of a 2-D weight held in bf16 on the CPU as
    /// [`Self::bf16_pairs`] gives the whole (their words copied).
    fn bf16_pair_rows(&self, name: &str, start: usize, len: usize) -> Result<PairWords> {
        match self.stored.get(name) {
            Some(Held::Pairs([n, k], words)) => {
                crate::checkpoint::weights::check_rows(name, (start, len), *n)?;
                let per = k.div_ceil(2);
                let part = words[start * per..(start + len) * per].to_vec();
                Ok(Some(([len, *k], std::sync::Arc::new(part))))
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
