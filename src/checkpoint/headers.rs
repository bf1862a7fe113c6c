//! Header-only reading of safetensors checkpoints: names, dtypes, shapes and
//! byte ranges of every tensor, without reading tensor data.
//!
//! A safetensors file is `u64 LE n` + `n` bytes of JSON header + data. The
//! header maps tensor names to `{dtype, shape, data_offsets: [begin, end]}`
//! (offsets relative to the start of the data, i.e. byte `8 + n`).
//!
//! Shards are found like transformers does (`modeling_utils.py::_get_resolved_checkpoint_files`,
//! `utils/hub.py::get_checkpoint_shard_files`): `model.safetensors.index.json`
//! (`weight_map`, shard files in sorted order), else `model.safetensors`,
//! else every `*.safetensors` file in the directory (sorted).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// Name of the shard index file.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Name of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Largest header accepted (the safetensors crate's own limit, 100 MB).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// One tensor as described by its shard's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorHeader {
    /// Checkpoint key, e.g. `model.language_model.layers.0.mlp.up_proj.weight`.
    pub name: String,
    /// safetensors dtype name as written in the header: `"BF16"`, `"F32"`, `"F16"`, ….
    pub dtype: String,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// `[begin, end)` byte range relative to the start of the shard's data section.
    pub data_offsets: (u64, u64),
    /// Index into [`HeaderIndex::shards`].
    pub shard: usize,
}

impl TensorHeader {
    /// Number of elements (product of the shape; 1 for a scalar).
    pub fn numel(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }

    /// Bytes on disk (`end - begin`).
    pub fn nbytes(&self) -> u64 {
        self.data_offsets.1 - self.data_offsets.0
    }

    /// True for floating dtypes (the ones `torch.is_floating_point` accepts,
    /// as used by `modeling_utils.py::get_state_dict_dtype`).
    pub fn is_floating(&self) -> bool {
        is_floating_dtype(&self.dtype)
    }
}

/// Bits per element of a safetensors dtype name, `None` when unknown.
pub fn dtype_bits(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" | "F8_E4M3FNUZ"
        | "F8_E5M2FNUZ" => 8,
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "I64" | "U64" | "F64" | "C64" => 64,
        _ => return None,
    })
}

/// True for floating safetensors dtypes.
pub fn is_floating_dtype(dtype: &str) -> bool {
    dtype.starts_with('F') || dtype == "BF16"
}

/// One shard file.
#[derive(Debug, Clone)]
pub struct ShardInfo {
    /// File name inside the checkpoint directory, e.g. `model-00001-of-00015.safetensors`.
    pub file_name: String,
    /// Full path.
    pub path: PathBuf,
    /// File size in bytes at the time the header was read.
    pub file_len: u64,
    /// Byte offset of the data section (`8 + header length`).
    pub data_start: u64,
    /// Indices into [`HeaderIndex::tensors`], in on-disk (data offset) order.
    pub tensors: Vec<usize>,
    /// The header's `__metadata__` (string map), if any.
    pub metadata: BTreeMap<String, String>,
}

/// Every tensor of a checkpoint, from the shard headers only.
#[derive(Debug, Clone)]
pub struct HeaderIndex {
    /// The shards, in the order transformers loads them (sorted file names).
    pub shards: Vec<ShardInfo>,
    /// All tensors: shard order, then on-disk order inside each shard.
    pub tensors: Vec<TensorHeader>,
    /// The index file, when the checkpoint is sharded through one.
    pub index_file: Option<PathBuf>,
    /// The index file's `metadata` object (e.g. `total_size`, sometimes `dtype`).
    pub index_metadata: serde_json::Map<String, Value>,
    by_name: HashMap<String, usize>,
}

#[derive(Deserialize)]
struct RawInfo {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: (u64, u64),
}

#[derive(Deserialize)]
struct RawIndex {
    #[serde(default)]
    metadata: Option<serde_json::Map<String, Value>>,
    weight_map: BTreeMap<String, String>,
}

impl HeaderIndex {
    /// Reads the headers of every shard of the checkpoint in `dir` (see the
    /// module doc for how shards are found). Reads `8 + n` bytes per shard and
    /// never the tensor data.
    ///
    /// Errors ([`Error::Checkpoint`], naming the file and tensor): no
    /// safetensors file; an index listing a shard that does not exist; a
    /// truncated or invalid header (shorter than 8 bytes, header length beyond
    /// the file size, not JSON, unknown dtype); `data_offsets` inconsistent
    /// with dtype × shape, overlapping, or past the end of the file (truncated
    /// download); a tensor listed in the index but absent from its shard; the
    /// same tensor in two shards. Unreadable files give [`Error::Io`].
    pub fn read_dir(dir: &Path) -> Result<Self> {
        let index_path = dir.join(INDEX_FILE);
        let mut index_metadata = serde_json::Map::new();
        let (files, weight_map, index_file) = if index_path.is_file() {
            let bytes = std::fs::read(&index_path).map_err(|e| Error::io(&index_path, e))?;
            let raw: RawIndex = serde_json::from_slice(&bytes).map_err(|e| {
                Error::Checkpoint(format!(
                    "{}: not a valid shard index (expected {{\"weight_map\": {{tensor: file}}}}): {e}",
                    index_path.display()
                ))
            })?;
            index_metadata = raw.metadata.unwrap_or_default();
            let mut files: Vec<String> = raw.weight_map.values().cloned().collect();
            files.sort();
            files.dedup();
            for f in &files {
                if !dir.join(f).is_file() {
                    return Err(Error::Checkpoint(format!(
                        "{}: shard {f} listed in {INDEX_FILE} is missing (incomplete download?)",
                        dir.display()
                    )));
                }
            }
            (files, Some(raw.weight_map), Some(index_path))
        } else if dir.join(SINGLE_FILE).is_file() {
            (vec![SINGLE_FILE.to_string()], None, None)
        } else {
            let mut files: Vec<String> = std::fs::read_dir(dir)
                .map_err(|e| Error::io(dir, e))?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".safetensors"))
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(Error::Checkpoint(format!(
                    "{}: no {INDEX_FILE}, {SINGLE_FILE} or *.safetensors file",
                    dir.display()
                )));
            }
            (files, None, None)
        };

        let mut shards: Vec<ShardInfo> = Vec::with_capacity(files.len());
        let mut tensors: Vec<TensorHeader> = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for (si, file_name) in files.iter().enumerate() {
            let path = dir.join(file_name);
            let (file_len, data_start, metadata, mut list) = read_shard_header(&path)?;
            list.sort_by_key(|(_, info)| info.data_offsets);
            let mut idxs = Vec::with_capacity(list.len());
            for (name, info) in list {
                if let Some(&prev) = by_name.get(&name) {
                    return Err(Error::Checkpoint(format!(
                        "tensor {name} is in both {} and {}",
                        shards[tensors[prev].shard].file_name, file_name
                    )));
                }
                by_name.insert(name.clone(), tensors.len());
                idxs.push(tensors.len());
                tensors.push(TensorHeader {
                    name,
                    dtype: info.dtype,
                    shape: info.shape,
                    data_offsets: info.data_offsets,
                    shard: si,
                });
            }
            shards.push(ShardInfo {
                file_name: file_name.clone(),
                path,
                file_len,
                data_start,
                tensors: idxs,
                metadata,
            });
        }

        if let Some(wm) = &weight_map {
            for (name, file) in wm {
                let present = by_name
                    .get(name)
                    .map(|&i| &shards[tensors[i].shard].file_name);
                match present {
                    Some(f) if f == file => {}
                    Some(f) => {
                        return Err(Error::Checkpoint(format!(
                            "tensor {name}: {INDEX_FILE} says {file}, but it is in {f}"
                        )))
                    }
                    None => {
                        return Err(Error::Checkpoint(format!(
                            "tensor {name} is listed in {INDEX_FILE} for {file} but absent from that shard's header"
                        )))
                    }
                }
            }
        }

        Ok(HeaderIndex {
            shards,
            tensors,
            index_file,
            index_metadata,
            by_name,
        })
    }

    /// The tensor named `name`, if present.
    pub fn get(&self, name: &str) -> Option<&TensorHeader> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// True when `name` is a tensor of this checkpoint.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when the checkpoint has no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Total parameters (sum of element counts).
    pub fn total_params(&self) -> u64 {
        self.tensors.iter().map(TensorHeader::numel).sum()
    }

    /// The shard holding `t`.
    pub fn shard_of(&self, t: &TensorHeader) -> &ShardInfo {
        &self.shards[t.shard]
    }

    /// The first floating tensor of the first shard, in on-disk order: what
    /// `modeling_utils.py::_get_dtype` falls back to (via
    /// `get_state_dict_dtype` on the first checkpoint file) when the config
    /// has no dtype. `None` when the first shard has no floating tensor.
    pub fn first_floating(&self) -> Option<&TensorHeader> {
        let first = self.shards.first()?;
        first
            .tensors
            .iter()
            .map(|&i| &self.tensors[i])
            .find(|t| t.is_floating())
    }
}

type ShardHeader = (u64, u64, BTreeMap<String, String>, Vec<(String, RawInfo)>);

/// Reads and validates one shard header. Returns (file length, data start,
/// `__metadata__`, tensors in arbitrary order).
fn read_shard_header(path: &Path) -> Result<ShardHeader> {
    let bad = |m: String| Error::Checkpoint(format!("{}: {m}", path.display()));
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    if file_len < 8 {
        return Err(bad(format!(
            "truncated safetensors header: file is {file_len} bytes, shorter than the 8-byte header length"
        )));
    }
    let mut len_buf = [0u8; 8];
    f.read_exact(&mut len_buf).map_err(|e| Error::io(path, e))?;
    let n = u64::from_le_bytes(len_buf);
    if n > file_len - 8 {
        return Err(bad(format!(
            "invalid safetensors header: header length {n} goes beyond the file size {file_len} (truncated file?)"
        )));
    }
    if n > MAX_HEADER_LEN {
        return Err(bad(format!(
            "invalid safetensors header: header length {n} exceeds {MAX_HEADER_LEN} bytes"
        )));
    }
    let mut buf = vec![0u8; n as usize];
    f.read_exact(&mut buf).map_err(|e| Error::io(path, e))?;
    let raw: BTreeMap<String, Value> = serde_json::from_slice(&buf).map_err(|e| {
        bad(format!(
            "invalid safetensors header: not a JSON object: {e}"
        ))
    })?;
    let data_start = 8 + n;
    let data_len = file_len - data_start;
    let mut metadata = BTreeMap::new();
    let mut list = Vec::with_capacity(raw.len());
    for (name, v) in raw {
        if name == "__metadata__" {
            if let Value::Object(m) = v {
                for (k, v) in m {
                    if let Value::String(s) = v {
                        metadata.insert(k, s);
                    }
                }
            }
            continue;
        }
        let info: RawInfo = serde_json::from_value(v)
            .map_err(|e| bad(format!("tensor {name}: invalid header entry: {e}")))?;
        let bits = dtype_bits(&info.dtype)
            .ok_or_else(|| bad(format!("tensor {name}: unknown dtype {:?}", info.dtype)))?;
        let numel: u64 = info.shape.iter().map(|&d| d as u64).product();
        let (b, e) = info.data_offsets;
        let want_bits = numel * bits;
        if e < b || want_bits % 8 != 0 || e - b != want_bits / 8 {
            return Err(bad(format!(
                "tensor {name}: data_offsets [{b}, {e}] span {} bytes, but {} x {:?} needs {} bytes",
                e.saturating_sub(b),
                info.dtype,
                info.shape,
                want_bits as f64 / 8.0
            )));
        }
        if e > data_len {
            return Err(bad(format!(
                "tensor {name}: data ends at byte {} but the file is only {file_len} bytes (truncated download?)",
                data_start + e
            )));
        }
        list.push((name, info));
    }
    // Overlap check on the sorted ranges.
    let mut ranges: Vec<(u64, u64, &str)> = list
        .iter()
        .map(|(n, i)| (i.data_offsets.0, i.data_offsets.1, n.as_str()))
        .collect();
    ranges.sort();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 && w[1].1 > w[1].0 {
            return Err(bad(format!(
                "tensors {} and {} have overlapping data_offsets",
                w[0].2, w[1].2
            )));
        }
    }
    Ok((file_len, data_start, metadata, list))
}
