//! `torch.save` files (the zip format, pickle protocol 2) read with
//! [`candle_core::pickle`]: the top-level dict of a SpecForge record or of an
//! SGLang dumper file, every tensor with its *storage type* kept, so that a
//! bool or int32 tensor is refused by name instead of being skipped (candle's
//! `read_all` drops what it cannot convert with a message on stderr).
//!
//! `.gz` files (SpecForge `--compress`: `gzip.open(..)` + `torch.save`) are
//! gunzipped in memory with `flate2`; the zip is read from memory with the
//! `zip` crate candle itself uses. Only stored (uncompressed) zip entries and
//! little-endian payloads occur in `torch.save` output; anything else is
//! refused with the reason.

use std::io::{BufReader, Cursor, Read};
use std::path::Path;

use candle_core::pickle::{Object, Stack};
use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

/// The element type of a pickled tensor, from its storage class (`torch.BFloat16Storage` …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageType {
    /// `torch.DoubleStorage`.
    F64,
    /// `torch.FloatStorage`.
    F32,
    /// `torch.HalfStorage`.
    F16,
    /// `torch.BFloat16Storage`.
    BF16,
    /// `torch.LongStorage`.
    I64,
    /// `torch.IntStorage`.
    I32,
    /// `torch.ShortStorage`.
    I16,
    /// `torch.CharStorage`.
    I8,
    /// `torch.ByteStorage`.
    U8,
    /// `torch.BoolStorage`.
    Bool,
    /// A storage class hsparity does not know (complex, quantized, …).
    Other(String),
}

impl StorageType {
    fn from_class(name: &str) -> Self {
        match name {
            "DoubleStorage" => Self::F64,
            "FloatStorage" => Self::F32,
            "HalfStorage" => Self::F16,
            "BFloat16Storage" => Self::BF16,
            "LongStorage" => Self::I64,
            "IntStorage" => Self::I32,
            "ShortStorage" => Self::I16,
            "CharStorage" => Self::I8,
            "ByteStorage" => Self::U8,
            "BoolStorage" => Self::Bool,
            other => Self::Other(other.to_string()),
        }
    }

    /// Bytes per element (None for unknown storages).
    pub fn size(&self) -> Option<usize> {
        Some(match self {
            Self::F64 | Self::I64 => 8,
            Self::F32 | Self::I32 => 4,
            Self::F16 | Self::BF16 | Self::I16 => 2,
            Self::I8 | Self::U8 | Self::Bool => 1,
            Self::Other(_) => return None,
        })
    }

    /// torch's name of the dtype (`torch.bfloat16`, `torch.int32`, …).
    pub fn torch_name(&self) -> String {
        match self {
            Self::F64 => "torch.float64".into(),
            Self::F32 => "torch.float32".into(),
            Self::F16 => "torch.float16".into(),
            Self::BF16 => "torch.bfloat16".into(),
            Self::I64 => "torch.int64".into(),
            Self::I32 => "torch.int32".into(),
            Self::I16 => "torch.int16".into(),
            Self::I8 => "torch.int8".into(),
            Self::U8 => "torch.uint8".into(),
            Self::Bool => "torch.bool".into(),
            Self::Other(s) => format!("torch.{s}"),
        }
    }

    /// Short name as in hsparity dumps' metadata (`bf16`, `f32`, `f16`, `f64`), for floats.
    pub fn short_float_name(&self) -> Option<&'static str> {
        Some(match self {
            Self::F64 => "f64",
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            _ => return None,
        })
    }

    /// True for the floating-point storages hidden states may use.
    pub fn is_float(&self) -> bool {
        matches!(self, Self::F64 | Self::F32 | Self::F16 | Self::BF16)
    }
}

/// One tensor of the record: storage type, shape and its bytes (contiguous, little endian).
#[derive(Debug, Clone)]
pub struct RawTensor {
    /// Element type.
    pub storage: StorageType,
    /// Shape.
    pub shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl RawTensor {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// A float tensor as f32 on the host. Refuses integer and bool storages
    /// (`what` names the file and key for the message).
    pub fn to_f32(&self, what: &str) -> Result<Tensor> {
        let dtype = match self.storage {
            StorageType::F64 => DType::F64,
            StorageType::F32 => DType::F32,
            StorageType::F16 => DType::F16,
            StorageType::BF16 => DType::BF16,
            _ => {
                return Err(Error::Format(format!(
                "{what} is a {} tensor: hidden states must be floating point (bf16, f16 or f32)",
                self.storage.torch_name()
            )))
            }
        };
        super::stored_to_f32(
            Tensor::from_raw_buffer(&self.bytes, dtype, &self.shape, &Device::Cpu)?,
            what,
        )
    }

    /// An integer (or bool) tensor flattened to i64. Refuses floating-point storages.
    pub fn to_i64(&self, what: &str) -> Result<Vec<i64>> {
        let b = &self.bytes;
        let v: Vec<i64> = match self.storage {
            StorageType::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
            StorageType::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64)
                .collect(),
            StorageType::I16 => b
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes(c.try_into().expect("2 bytes")) as i64)
                .collect(),
            StorageType::I8 => b.iter().map(|&x| x as i8 as i64).collect(),
            StorageType::U8 | StorageType::Bool => b.iter().map(|&x| x as i64).collect(),
            _ => {
                return Err(Error::Format(format!(
                    "{what} is a {} tensor: expected integer ids",
                    self.storage.torch_name()
                )))
            }
        };
        Ok(v)
    }

    /// Like [`Self::to_i64`], but also accepts float storages holding 0/1
    /// (some SpecForge scripts save `loss_mask` as float32).
    pub fn to_mask(&self, what: &str) -> Result<Vec<i64>> {
        if self.storage.is_float() {
            let v = self.to_f32(what)?.flatten_all()?.to_vec1::<f32>()?;
            return v
                .into_iter()
                .map(|x| {
                    if x == 0.0 || x == 1.0 {
                        Ok(x as i64)
                    } else {
                        Err(Error::Format(format!(
                            "{what} holds {x}: a loss mask holds 0 and 1"
                        )))
                    }
                })
                .collect();
        }
        let v = self.to_i64(what)?;
        match v.iter().find(|&&x| x != 0 && x != 1) {
            Some(x) => Err(Error::Format(format!(
                "{what} holds {x}: a loss mask holds 0 and 1"
            ))),
            None => Ok(v),
        }
    }
}

/// A value of the top-level dict.
#[derive(Debug, Clone)]
pub enum Value {
    /// A tensor.
    Tensor(RawTensor),
    /// Anything else (a dict, list, number, string …), by kind.
    Other(&'static str),
}

/// The top-level dict of a `torch.save` file, in file order.
#[derive(Debug, Clone)]
pub struct Record {
    /// `(key, value)` in file order.
    pub entries: Vec<(String, Value)>,
}

impl Record {
    /// The entry named `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The tensor named `key` (None when absent; an error when it is not a tensor).
    pub fn tensor(&self, key: &str, path: &Path) -> Result<Option<&RawTensor>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Tensor(t)) => Ok(Some(t)),
            Some(Value::Other(kind)) => Err(Error::Format(format!(
                "{}: key `{key}` is a {kind}, not a tensor",
                path.display()
            ))),
        }
    }

    /// The keys, for messages.
    pub fn keys(&self) -> Vec<&str> {
        self.entries.iter().map(|(k, _)| k.as_str()).collect()
    }
}

/// True when `bytes` start like a gzip stream.
pub fn is_gzip(bytes: &[u8]) -> bool {
    bytes.len() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b
}

/// True when `bytes` start like a zip archive (torch.save's format).
pub fn is_zip(bytes: &[u8]) -> bool {
    bytes.len() >= 4 && &bytes[..4] == b"PK\x03\x04"
}

/// Reads the file at `path` (gunzipping it first when it is gzip) and parses its top-level dict.
pub fn read_record(path: &Path) -> Result<Record> {
    let raw = crate::input::read(path)?;
    let bytes = if is_gzip(&raw) {
        crate::input::gunzip_bounded(&raw, MAX_RECORD_BYTES, path, "a capture record")?
    } else {
        raw
    };
    parse_record(bytes, path)
}

/// The most a gzipped record may decompress to: a SpecForge record of a 27B
/// target (2048 tokens, three 5120-wide taps in f32) is about 130 MB.
pub const MAX_RECORD_BYTES: u64 = 4 << 30;

/// The most a record's `data.pkl` may hold (the tensors' data is stored beside it).
pub const MAX_PICKLE_BYTES: u64 = 64 << 20;

/// Parses a `torch.save` zip held in memory (`path` is for messages only).
pub fn parse_record(bytes: Vec<u8>, path: &Path) -> Result<Record> {
    let bad = |m: String| Error::Format(format!("{}: {m}", path.display()));
    if !is_zip(&bytes) {
        return Err(bad(
            "not a torch zip pickle (torch.save since 1.6 writes a zip; a legacy-format file must be \
             re-saved with torch.save)"
                .into(),
        ));
    }
    // torch.save never prepends data to the archive. The zip crate's automatic archive-offset
    // detection (ZipArchive::new, which candle's PthTensors uses) rejects some valid torch.save
    // files with "Invalid Central Directory header" (zip 9.8.2; fixtures/engine-captures/bad/
    // specforge-indivisible.ckpt is one), so the offset is given as 0.
    let config = zip::read::Config {
        archive_offset: zip::read::ArchiveOffset::Known(0),
    };
    let mut zip = zip::ZipArchive::with_config(config, Cursor::new(bytes))
        .map_err(|e| bad(format!("unreadable zip: {e}")))?;
    let names: Vec<String> = zip
        .file_names()
        .map(|n| n.map(|s| s.into_owned()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| bad(format!("unreadable zip directory: {e}")))?;
    let pkl = names
        .iter()
        .find(|n| n.ends_with("data.pkl"))
        .ok_or_else(|| bad("no data.pkl in the zip: not written by torch.save".into()))?
        .clone();
    let prefix = pkl.strip_suffix("data.pkl").unwrap_or("").to_string();
    if let Some(bo) = names.iter().find(|n| **n == format!("{prefix}byteorder")) {
        let mut s = String::new();
        zip.by_name(bo)
            .map_err(|e| bad(format!("{bo}: {e}")))?
            .read_to_string(&mut s)
            .map_err(|e| bad(format!("{bo}: {e}")))?;
        if s.trim() != "little" {
            return Err(bad(format!(
                "byteorder is {:?}: only little-endian files are read",
                s.trim()
            )));
        }
    }
    let obj = {
        let f = zip.by_name(&pkl).map_err(|e| bad(format!("{pkl}: {e}")))?;
        let mut pickle = Vec::new();
        f.take(MAX_PICKLE_BYTES + 1)
            .read_to_end(&mut pickle)
            .map_err(|e| bad(format!("{pkl}: {e}")))?;
        if pickle.len() as u64 > MAX_PICKLE_BYTES {
            return Err(bad(format!(
                "{pkl} is over {} MiB: a dict of tensors pickles into a few KiB",
                MAX_PICKLE_BYTES >> 20
            )));
        }
        super::pickle_bounds::check(&pickle).map_err(|m| bad(format!("{pkl}: {m}")))?;
        let mut reader = BufReader::new(Cursor::new(pickle));
        let mut stack = Stack::empty();
        stack.read_loop(&mut reader).map_err(|e| {
            bad(format!(
                "unreadable pickle: {}",
                crate::error::candle_message(&e)
            ))
        })?;
        stack.finalize().map_err(|e| {
            bad(format!(
                "unreadable pickle: {}",
                crate::error::candle_message(&e)
            ))
        })?
    };
    let pairs = match obj {
        Object::Dict(pairs) => pairs,
        other => {
            return Err(bad(format!(
                "the saved object is a {}, not a dict of tensors",
                kind(&other)
            )))
        }
    };
    let mut entries = Vec::new();
    for (k, v) in pairs {
        let key = match k {
            Object::Unicode(s) => s,
            other => {
                return Err(bad(format!(
                    "a dict key is a {}, not a string",
                    kind(&other)
                )))
            }
        };
        let value = match tensor_spec(v) {
            Ok(Ok(spec)) => Value::Tensor(read_tensor(&mut zip, &prefix, spec, &key, path)?),
            Ok(Err(why)) => return Err(bad(format!("key `{key}`: a malformed tensor: {why}"))),
            Err(other) => Value::Other(kind(&other)),
        };
        entries.push((key, value));
    }
    // SETITEMS pushes pairs in reverse; give them back in the order torch wrote them.
    entries.reverse();
    Ok(Record { entries })
}

fn kind(o: &Object) -> &'static str {
    match o {
        Object::Dict(_) => "dict",
        Object::List(_) => "list",
        Object::Tuple(_) => "tuple",
        Object::Int(_) | Object::Long(_) => "int",
        Object::Float(_) => "float",
        Object::Unicode(_) => "str",
        Object::Bool(_) => "bool",
        Object::None => "None",
        _ => "Python object",
    }
}

struct Spec {
    storage: StorageType,
    storage_key: String,
    offset: usize,
    shape: Vec<usize>,
    stride: Vec<usize>,
}

/// `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, …)` (also under
/// `_rebuild_from_type_v2` / `_rebuild_parameter`), or the object back when it is not a tensor;
/// `Ok(Err(why))` for a tensor whose arguments are malformed.
#[allow(clippy::type_complexity)]
fn tensor_spec(o: Object) -> std::result::Result<std::result::Result<Spec, String>, Object> {
    let (callable, args) = match o {
        Object::Reduce { callable, args } => (*callable, *args),
        other => return Err(other),
    };
    let (callable, args) = match (&callable, args) {
        (
            Object::Class {
                module_name,
                class_name,
            },
            Object::Tuple(mut a),
        ) if module_name == "torch._tensor"
            && class_name == "_rebuild_from_type_v2"
            && a.len() >= 3 =>
        {
            let inner_args = a.remove(2);
            (a.remove(0), inner_args)
        }
        (
            Object::Class {
                module_name,
                class_name,
            },
            Object::Tuple(mut a),
        ) if module_name == "torch._utils"
            && class_name == "_rebuild_parameter"
            && !a.is_empty() =>
        {
            match a.remove(0) {
                Object::Reduce { callable, args } => (*callable, *args),
                other => return Err(other),
            }
        }
        (_, args) => (callable, args),
    };
    match &callable {
        Object::Class {
            module_name,
            class_name,
        } if module_name == "torch._utils" && class_name == "_rebuild_tensor_v2" => {}
        _ => {
            return Err(Object::Reduce {
                callable: Box::new(callable),
                args: Box::new(args),
            })
        }
    }
    let mut a = match args {
        Object::Tuple(a) if a.len() >= 4 => a,
        _ => {
            return Ok(Err(
                "_rebuild_tensor_v2 takes (storage, offset, size, stride, …)".into(),
            ))
        }
    };
    let ints = |o: Object| -> Option<Vec<usize>> {
        match o {
            Object::Tuple(v) => v
                .into_iter()
                .map(|x| match x {
                    Object::Int(i) if i >= 0 => Some(i as usize),
                    Object::Long(i) if i >= 0 => Some(i as usize),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    };
    let Some(stride) = ints(a.remove(3)) else {
        return Ok(Err(
            "its stride is not a tuple of non-negative integers".into()
        ));
    };
    let Some(shape) = ints(a.remove(2)) else {
        return Ok(Err(
            "its shape is not a tuple of non-negative integers (a negative dimension?)".into(),
        ));
    };
    let offset = match a.remove(1) {
        Object::Int(i) if i >= 0 => i as usize,
        Object::Long(i) if i >= 0 => i as usize,
        _ => {
            return Ok(Err(
                "its storage offset is not a non-negative integer".into()
            ))
        }
    };
    let fail = || "its storage is not a persistent-load tuple (storage class, key)".to_string();
    let storage = match a.remove(0) {
        Object::PersistentLoad(p) => match *p {
            Object::Tuple(mut s) if s.len() >= 3 => {
                let key = match s.remove(2) {
                    Object::Unicode(k) => k,
                    _ => return Ok(Err(fail())),
                };
                let class = match s.remove(1) {
                    Object::Class { class_name, .. } => class_name,
                    _ => return Ok(Err(fail())),
                };
                (StorageType::from_class(&class), key)
            }
            _ => return Ok(Err(fail())),
        },
        _ => return Ok(Err(fail())),
    };
    if shape.len() != stride.len() {
        return Ok(Err(format!(
            "shape {shape:?} and stride {stride:?} have different ranks"
        )));
    }
    Ok(Ok(Spec {
        storage: storage.0,
        storage_key: storage.1,
        offset,
        shape,
        stride,
    }))
}

fn read_tensor(
    zip: &mut zip::ZipArchive<Cursor<Vec<u8>>>,
    prefix: &str,
    spec: Spec,
    key: &str,
    path: &Path,
) -> Result<RawTensor> {
    let bad = |m: String| Error::Format(format!("{}: key `{key}`: {m}", path.display()));
    let Some(elem) = spec.storage.size() else {
        return Err(bad(format!(
            "storage type {} is not read by hsparity",
            spec.storage.torch_name()
        )));
    };
    let numel = spec
        .shape
        .iter()
        .try_fold(1usize, |acc, &n| acc.checked_mul(n))
        .ok_or_else(|| {
            bad(format!(
                "shape {:?} holds more elements than memory can",
                spec.shape
            ))
        })?;
    // Row-major contiguity (strides of size-1 dimensions do not matter; an
    // empty tensor is contiguous, as torch says).
    let mut expect = 1usize;
    for (d, (&n, &s)) in spec.shape.iter().zip(&spec.stride).enumerate().rev() {
        if numel > 0 && n != 1 && s != expect {
            return Err(bad(format!(
                "non-contiguous tensor (shape {:?}, stride {:?}, dim {d}): save a .contiguous() copy",
                spec.shape, spec.stride
            )));
        }
        expect = expect.saturating_mul(n);
    }
    let name = format!("{prefix}data/{}", spec.storage_key);
    let mut f = zip
        .by_name(&name)
        .map_err(|e| bad(format!("storage {name} missing from the zip: {e}")))?;
    let mut all = Vec::new();
    f.read_to_end(&mut all)
        .map_err(|e| bad(format!("storage {name} unreadable: {e}")))?;
    let span = spec
        .offset
        .checked_mul(elem)
        .and_then(|start| Some((start, start.checked_add(numel.checked_mul(elem)?)?)));
    let Some((start, end)) = span.filter(|&(_, end)| end <= all.len()) else {
        return Err(bad(format!(
            "shape {:?} at offset {} needs more bytes than the storage's {}",
            spec.shape,
            spec.offset,
            all.len()
        )));
    };
    if end > all.len() {
        return Err(bad(format!(
            "shape {:?} at offset {} needs {end} bytes, the storage has {}",
            spec.shape,
            spec.offset,
            all.len()
        )));
    }
    let bytes = if start == 0 && end == all.len() {
        all
    } else {
        all[start..end].to_vec()
    };
    Ok(RawTensor {
        storage: spec.storage,
        shape: spec.shape,
        bytes,
    })
}
