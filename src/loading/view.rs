//! The tensor view of one loading path: text-model-relative names
//! (`embed_tokens.weight`, `layers.{i}.…`, `norm.weight`, `lm_head.weight`)
//! mapped to where their values come from.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use candle_core::{Device, Tensor};
use serde::Serialize;

use crate::checkpoint::Weights;
use crate::error::{Error, Result};
use crate::loading::experts::{self, FusedParam};
use crate::loading::init::{init_tensor, init_tensor_in};
use crate::loading::spec::InitRule;
use crate::loading::{PairWords, WeightSource};
use crate::precision::Precision;

/// Where a model parameter's values come from on one loading path.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WeightOrigin {
    /// Read from checkpoint key `key`.
    Checkpoint {
        /// Checkpoint key.
        key: String,
    },
    /// Tied: shares the values of checkpoint key `key` (e.g. `lm_head.weight`
    /// tied to `model.language_model.embed_tokens.weight`).
    Tied {
        /// Checkpoint key whose values it shares.
        key: String,
    },
    /// Fused at load time from per-expert checkpoint keys (the expert
    /// conversion of an MoE checkpoint, [`crate::loading::experts`]).
    Converted {
        /// The fused parameter: its name in checkpoint naming, rule, sources
        /// in fusion order, shape.
        param: FusedParam,
    },
    /// Absent from the checkpoint: transformers initialises it with `init`.
    Missing {
        /// The init transformers uses.
        init: InitRule,
        /// Shape from the config.
        shape: Vec<usize>,
    },
}

/// Text-model tensors of one resolved loading path. Implements
/// [`WeightSource`]: f32 tensors read from the shared mmap.
#[derive(Debug, Clone)]
pub struct TensorView {
    weights: Arc<Weights>,
    names: Vec<String>,
    entries: HashMap<String, WeightOrigin>,
    seed: Option<u64>,
    /// Where returned tensors are placed (read and converted on the host first).
    device: Device,
    /// NaN/Inf counts of every checkpoint tensor scanned so far, by key (shared
    /// by clones): each key is scanned once, however often it is read.
    non_finite: Arc<Mutex<BTreeMap<String, NonFinite>>>,
    /// Randomly initialised MISSING tensors, generated once per compute
    /// dtype and held in it (what transformers holds), shared by clones: the
    /// LM head's vocabulary chunks and embedding rows read them.
    made: Arc<Mutex<MadeTensors>>,
}

/// MISSING tensors as generated, by name and compute dtype.
type MadeTensors = HashMap<(String, Precision), Tensor>;

impl TensorView {
    /// A view over `weights` with `(name, origin)` entries in state-dict order.
    pub fn new(weights: Arc<Weights>, entries: Vec<(String, WeightOrigin)>) -> Self {
        let names = entries.iter().map(|(n, _)| n.clone()).collect();
        TensorView {
            weights,
            names,
            entries: entries.into_iter().collect(),
            seed: None,
            device: Device::Cpu,
            non_finite: Arc::default(),
            made: Arc::default(),
        }
    }

    /// Enables deterministic init of missing tensors from `seed` and the
    /// tensor name (transformers' random init cannot be reproduced bit for
    /// bit; this only follows its distribution).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Places every tensor this view returns on `device` (weights are still
    /// read, converted and scanned on the host, one tensor at a time).
    pub fn with_device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// The seed for missing tensors, if set.
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }

    /// Text-model-relative names, in state-dict order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Where `name` comes from, `None` if this view has no such tensor.
    pub fn origin(&self, name: &str) -> Option<&WeightOrigin> {
        self.entries.get(name)
    }

    /// True when the view has `lm_head.weight` (the class has an LM head).
    pub fn has_lm_head(&self) -> bool {
        self.entries.contains_key("lm_head.weight")
    }

    /// The shared weights handle.
    pub fn weights(&self) -> &Arc<Weights> {
        &self.weights
    }

    /// Bytes of the checkpoint tensors this view reads, in their stored
    /// dtypes (each checkpoint key once, a converted parameter's sources
    /// included; MISSING tensors take none).
    pub fn stored_bytes(&self) -> u64 {
        let mut keys: Vec<&str> = self
            .entries
            .values()
            .flat_map(|o| match o {
                WeightOrigin::Checkpoint { key } | WeightOrigin::Tied { key } => vec![key.as_str()],
                WeightOrigin::Converted { param } => {
                    param.sources.iter().map(String::as_str).collect()
                }
                WeightOrigin::Missing { .. } => Vec::new(),
            })
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.iter()
            .filter_map(|k| self.weights.index().get(k))
            .map(|t| t.nbytes())
            .sum()
    }

    /// The device the view places tensors on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// `name` in its stored dtype (BF16, F16, F32 or F64), on the view's
    /// device, for a source that keeps the model resident without widening
    /// it; its NaN/Inf counts are recorded as when it is read widened.
    /// `None` for a MISSING (initialised) tensor.
    ///
    /// Errors: unknown name, shard I/O, a non-float dtype.
    pub fn stored(&self, name: &str) -> Result<Option<Tensor>> {
        match self.key(name)? {
            Some(key) => {
                self.scan_key_bytes(key)?;
                Ok(Some(self.place(self.weights.load_native(key)?)?))
            }
            None => Ok(None),
        }
    }
}

/// NaN and ±Inf counts of one checkpoint tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NonFinite {
    /// NaN elements.
    pub nan: usize,
    /// ±Inf elements.
    pub inf: usize,
}

impl TensorView {
    /// Checkpoint tensors read so far that hold NaN or ±Inf, by checkpoint key.
    pub fn non_finite(&self) -> BTreeMap<String, NonFinite> {
        self.non_finite
            .lock()
            .map(|m| {
                m.iter()
                    .filter(|(_, n)| n.nan + n.inf > 0)
                    .map(|(k, n)| (k.clone(), *n))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// True when `key`'s NaN/Inf counts were already recorded (from its
    /// conversion or a scan of its bytes).
    fn scanned(&self, key: &str) -> bool {
        self.non_finite
            .lock()
            .map(|m| m.contains_key(key))
            .unwrap_or(false)
    }

    fn record_non_finite(&self, key: &str, nan: usize, inf: usize) {
        if let Ok(mut m) = self.non_finite.lock() {
            m.insert(key.to_string(), NonFinite { nan, inf });
        }
    }

    /// Moves a host tensor to the view's device (free on the CPU).
    fn place(&self, t: Tensor) -> Result<Tensor> {
        Ok(if self.device.is_cpu() {
            t
        } else {
            t.to_device(&self.device)?
        })
    }

    /// The checkpoint key behind `name`, `None` for a missing (initialised)
    /// or converted (fused at load) tensor.
    fn key(&self, name: &str) -> Result<Option<&str>> {
        match self.entries.get(name) {
            None => Err(Error::Checkpoint(format!(
                "tensor {name} is not part of this loading path's model"
            ))),
            Some(WeightOrigin::Checkpoint { key }) | Some(WeightOrigin::Tied { key }) => {
                Ok(Some(key))
            }
            Some(WeightOrigin::Missing { .. }) | Some(WeightOrigin::Converted { .. }) => Ok(None),
        }
    }

    /// MISSING tensor `name` initialised ([`init_tensor`]) and rounded to
    /// `prec`, held in `prec`'s dtype (exact: the rounded values are
    /// representable) on the view's device; generated on first use.
    ///
    /// Errors: as [`init_tensor`].
    fn made(&self, name: &str, prec: Precision) -> Result<Tensor> {
        let key = (name.to_string(), prec);
        if let Some(t) = self.made.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(t);
        }
        let t = match self.entries.get(name) {
            Some(WeightOrigin::Missing { init, shape }) => {
                self.place(init_tensor_in(name, *init, shape, self.seed, prec)?)?
            }
            // A converted parameter: its rounded values, cast exactly.
            _ => prec.round(&self.tensor(name)?)?.to_dtype(prec.dtype())?,
        };
        if let Ok(mut m) = self.made.lock() {
            m.insert(key, t.clone());
        }
        Ok(t)
    }

    /// The fused parameter behind `name`, when it is converted at load time.
    fn converted(&self, name: &str) -> Option<&FusedParam> {
        match self.entries.get(name) {
            Some(WeightOrigin::Converted { param }) => Some(param),
            _ => None,
        }
    }

    /// Scans every source key of a converted parameter (once each).
    fn scan_sources(&self, p: &FusedParam) -> Result<()> {
        p.sources.iter().try_for_each(|k| self.scan_key_bytes(k))
    }

    /// Counts NaN/Inf of the whole tensor `key` from the mapped bytes (used when
    /// only part of it is materialised: embedding rows, LM-head chunks).
    fn scan_key_bytes(&self, key: &str) -> Result<()> {
        if self.scanned(key) {
            return Ok(());
        }
        let (nan, inf) = self.weights.count_non_finite(key)?;
        self.record_non_finite(key, nan, inf);
        Ok(())
    }
}

impl WeightSource for TensorView {
    /// Errors: unknown name ([`Error::Checkpoint`]); a missing tensor that
    /// needs random init while no seed is set ([`Error::Checkpoint`]); shard
    /// I/O ([`Error::Io`]).
    fn tensor(&self, name: &str) -> Result<Tensor> {
        match self.entries.get(name) {
            Some(WeightOrigin::Missing { init, shape }) => {
                self.place(init_tensor(name, *init, shape, self.seed)?)
            }
            Some(WeightOrigin::Converted { param }) => {
                self.scan_sources(param)?;
                self.place(experts::materialize(&self.weights, param, Precision::F32)?)
            }
            // The stored values: f32 rounding is the identity.
            _ => self.tensor_in(name, Precision::F32),
        }
    }

    fn tensor_in(&self, name: &str, prec: Precision) -> Result<Tensor> {
        match self.key(name)? {
            Some(key) => {
                let (t, (nan, inf)) = self.weights.load_f32_rounded_counted(key, prec)?;
                // The stored values' counts (a rounding may overflow a
                // finite value; what is stored is what is reported).
                if !self.scanned(key) {
                    self.record_non_finite(key, nan, inf);
                }
                self.place(t)
            }
            None => match self.converted(name) {
                Some(p) => {
                    self.scan_sources(p)?;
                    self.place(experts::materialize(&self.weights, p, prec)?)
                }
                None => prec.round(&self.tensor(name)?),
            },
        }
    }

    /// A bf16 checkpoint key on a CPU view: its pairs from the mapped bytes,
    /// the key's bytes scanned for NaN/Inf (the stored values' counts, as
    /// `tensor_in` records them); while [`WeightSource::hold_pairs`] is on, the
    /// words read before (by any view over the same shards) instead of a
    /// new read. Missing, converted or non-bf16 tensors: `None`.
    fn bf16_pairs(&self, name: &str) -> Result<PairWords> {
        if !self.device.is_cpu() {
            return Ok(None);
        }
        let Some(key) = self.key(name)? else {
            return Ok(None);
        };
        let stored_bf16 = self
            .weights
            .index()
            .get(key)
            .is_some_and(|h| h.dtype == "BF16");
        if !stored_bf16 {
            return Ok(None);
        }
        let Some(p) = self.weights.load_bf16_pairs(key)? else {
            return Ok(None);
        };
        if !self.scanned(key) {
            self.record_non_finite(key, p.nan, p.inf);
        }
        Ok(Some((p.dims, p.words)))
    }

    /// Rows of a bf16 checkpoint key on a CPU view as pairs from the mapped
    /// bytes; the whole key is scanned for NaN/Inf from its bytes on the
    /// first chunk, as [`WeightSource::row_range`] does.
    fn bf16_pair_rows(&self, name: &str, start: usize, len: usize) -> Result<PairWords> {
        if !self.device.is_cpu() {
            return Ok(None);
        }
        let Some(key) = self.key(name)? else {
            return Ok(None);
        };
        let Some(p) = self.weights.load_bf16_pair_rows(key, start, len)? else {
            return Ok(None);
        };
        if start == 0 {
            self.scan_key_bytes(key)?;
        }
        Ok(Some((p.dims, p.words)))
    }

    fn hold_pairs(&self, hold: bool) {
        self.weights.hold_pairs(hold);
    }

    /// Reads only expert `e`'s bytes: a row of a fused tensor on disk, or the
    /// expert's per-expert keys of a converted parameter. The whole parameter
    /// is scanned for NaN/Inf on its first expert read (from its bytes).
    fn expert(&self, name: &str, e: usize, prec: Precision) -> Result<Tensor> {
        if let Some(p) = self.converted(name) {
            self.scan_sources(p)?;
            return self.place(experts::materialize_expert(&self.weights, p, e, prec)?);
        }
        match self.key(name)? {
            Some(key) => {
                self.scan_key_bytes(key)?;
                self.place(experts::fused_expert(&self.weights, key, e, prec)?)
            }
            None => Ok(self.tensor_in(name, prec)?.get(e)?),
        }
    }

    fn share(&self) -> Option<std::sync::Arc<dyn WeightSource + Send + Sync>> {
        Some(std::sync::Arc::new(self.clone()))
    }

    /// The rows are gathered from the mapped file; the whole table is still
    /// scanned for NaN/Inf (from its bytes, without materialising it).
    fn rows(&self, name: &str, ids: &[u32], prec: Precision) -> Result<Tensor> {
        match self.key(name)? {
            Some(key) => {
                self.scan_key_bytes(key)?;
                self.place(self.weights.load_rows(key, ids, Some(prec))?)
            }
            None => Ok(
                crate::loading::select_rows(&self.made(name, prec)?, name, ids)?
                    .to_dtype(candle_core::DType::F32)?,
            ),
        }
    }

    /// Reads only the chunk's rows; the first chunk (`start == 0`) scans the
    /// whole tensor's bytes for NaN/Inf.
    fn row_range(&self, name: &str, start: usize, len: usize, prec: Precision) -> Result<Tensor> {
        match self.key(name)? {
            Some(key) => {
                if start == 0 {
                    self.scan_key_bytes(key)?;
                }
                self.place(self.weights.load_row_range(key, start, len, Some(prec))?)
            }
            None => Ok(self
                .made(name, prec)?
                .narrow(0, start, len)?
                .to_dtype(candle_core::DType::F32)?),
        }
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        match self.entries.get(name)? {
            WeightOrigin::Checkpoint { key } | WeightOrigin::Tied { key } => {
                self.weights.index().get(key).map(|t| t.shape.clone())
            }
            WeightOrigin::Converted { param } => Some(param.shape.clone()),
            WeightOrigin::Missing { shape, .. } => Some(shape.clone()),
        }
    }

    fn stored_bytes(&self, name: &str) -> Option<u64> {
        let index = self.weights.index();
        match self.entries.get(name)? {
            WeightOrigin::Checkpoint { key } | WeightOrigin::Tied { key } => {
                index.get(key).map(|t| t.nbytes())
            }
            WeightOrigin::Converted { param } => param
                .sources
                .iter()
                .map(|k| index.get(k).map(|t| t.nbytes()))
                .sum(),
            // Made, not read.
            WeightOrigin::Missing { .. } => Some(0),
        }
    }

    fn identity(&self, name: &str) -> String {
        match self.entries.get(name) {
            None => format!("unknown:{name}"),
            Some(WeightOrigin::Checkpoint { key }) | Some(WeightOrigin::Tied { key }) => {
                format!("ckpt:{key}")
            }
            Some(WeightOrigin::Converted { param }) => format!("fused:{}", param.name),
            Some(WeightOrigin::Missing { init, shape }) => match init {
                InitRule::Zeros | InitRule::Ones => format!("init:{init}:{shape:?}"),
                _ => format!(
                    "init:{init}:seed={}:{name}",
                    self.seed
                        .map(|s| s.to_string())
                        .unwrap_or_else(|| "none".into())
                ),
            },
        }
    }
}
