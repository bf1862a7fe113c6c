//! Header-only reading of safetensors checkpoints: names, dtypes, shapes and
//! byte ranges of every tensor, without reading tensor data.
//!
//! A safetensors file is `u64 LE n` + `n` bytes of JSON header + data. The
//! header maps tensor names to `{dtype, shape, data_offsets: [begin, end]}`
//! (offsets relative to the start of the data, i.e. byte `8 + n`).
//!
//! Shards are found as transformers finds them for a local directory
//! (`modeling_utils.py::_get_resolved_checkpoint_files`,
//! `utils/hub.py::get_checkpoint_shard_files`): `model.safetensors`, else
//! `model.safetensors.index.json` (`weight_map`, shard files in sorted
//! order), else nothing (transformers raises "no file named
//! model.safetensors"); other `*.safetensors` files beside them are never read.
//! Every file is opened through [`crate::input`] (regular files only).

use std::collections::{BTreeMap, HashMap};
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
    /// Number of elements (product of the shape; 1 for a scalar). Headers
    /// read by [`HeaderIndex::read_dir`] never overflow (checked when read);
    /// for a hand-built header an overflowing product saturates at `u64::MAX`.
    pub fn numel(&self) -> u64 {
        checked_numel(&self.shape).unwrap_or(u64::MAX)
    }

    /// Bytes on disk (`end - begin`).
    pub fn nbytes(&self) -> u64 {
        self.data_offsets.1.saturating_sub(self.data_offsets.0)
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

/// Product of `shape` in checked arithmetic; `None` on overflow.
pub fn checked_numel(shape: &[usize]) -> Option<u64> {
    shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))
}

/// True when `name` names a file directly inside a directory: not empty, no
/// path separator, not `.` or `..`, no NUL.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
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
    /// Errors ([`Error::Checkpoint`], naming the file and tensor): neither
    /// `model.safetensors` nor an index; a file that is not a regular file
    /// ([`Error::Input`]); an index listing a shard that does not exist; a
    /// truncated or invalid header (shorter than 8 bytes, header length beyond
    /// the file size, not JSON, unknown dtype); `data_offsets` inconsistent
    /// with dtype × shape, overlapping, or past the end of the file (truncated
    /// download); a tensor listed in the index but absent from its shard; the
    /// same tensor in two shards. Unreadable files give [`Error::Io`].
    pub fn read_dir(dir: &Path) -> Result<Self> {
        let index_path = dir.join(INDEX_FILE);
        let mut index_metadata = serde_json::Map::new();
        let present = |p: &Path| std::fs::symlink_metadata(p).is_ok();
        let (files, weight_map, index_file) = if present(&dir.join(SINGLE_FILE)) {
            (vec![SINGLE_FILE.to_string()], None, None)
        } else if present(&index_path) {
            let bytes = crate::input::read(&index_path)?;
            if let Some(m) = crate::input::bom_message(&bytes) {
                return Err(Error::Checkpoint(format!("{}: {m}", index_path.display())));
            }
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
            if files.is_empty() {
                return Err(Error::Checkpoint(format!(
                    "{}: weight_map is empty (no tensor is mapped to a shard)",
                    index_path.display()
                )));
            }
            for f in &files {
                if !is_plain_file_name(f) {
                    return Err(Error::Checkpoint(format!(
                        "{}: shard name {f:?} is not a file name inside the checkpoint directory",
                        index_path.display()
                    )));
                }
                if !present(&dir.join(f)) {
                    return Err(Error::Checkpoint(format!(
                        "{}: shard {f} listed in {INDEX_FILE} is missing (incomplete download?)",
                        dir.display()
                    )));
                }
            }
            (files, Some(raw.weight_map), Some(index_path))
        } else {
            return Err(Error::Checkpoint(format!(
                "{}: no {SINGLE_FILE} or {INDEX_FILE} (transformers reads only these, \
                 modeling_utils.py::_get_resolved_checkpoint_files)",
                dir.display()
            )));
        };

        let mut shards: Vec<ShardInfo> = Vec::with_capacity(files.len());
        let mut tensors: Vec<TensorHeader> = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for (si, file_name) in files.iter().enumerate() {
            let path = dir.join(file_name);
            let (file_len, parsed) = read_header_file(&path)?;
            let mut idxs = Vec::with_capacity(parsed.tensors.len());
            for mut t in parsed.tensors {
                if let Some(&prev) = by_name.get(&t.name) {
                    return Err(Error::Checkpoint(format!(
                        "{}: tensor {} is in both {} and {}",
                        dir.display(),
                        t.name,
                        shards[tensors[prev].shard].file_name,
                        file_name
                    )));
                }
                t.shard = si;
                by_name.insert(t.name.clone(), tensors.len());
                idxs.push(tensors.len());
                tensors.push(t);
            }
            shards.push(ShardInfo {
                file_name: file_name.clone(),
                path,
                file_len,
                data_start: parsed.data_start,
                tensors: idxs,
                metadata: parsed.metadata,
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
                            "{}: tensor {name} is mapped to {file}, but it is in {f}",
                            dir.join(INDEX_FILE).display()
                        )))
                    }
                    None => {
                        return Err(Error::Checkpoint(format!(
                            "{}: tensor {name} is listed for {file} but absent from that shard's header",
                            dir.join(INDEX_FILE).display()
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

    /// Total parameters (sum of element counts; saturating, though the
    /// element counts of a read checkpoint are bounded by its file sizes).
    pub fn total_params(&self) -> u64 {
        self.tensors
            .iter()
            .map(TensorHeader::numel)
            .fold(0u64, u64::saturating_add)
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

/// One shard header, parsed and checked against the file's length.
#[derive(Debug, Clone)]
pub struct ParsedHeader {
    /// Byte offset of the data section (`8 + header length`).
    pub data_start: u64,
    /// The header's `__metadata__` (string values only).
    pub metadata: BTreeMap<String, String>,
    /// The tensors, sorted by data offset, with `shard` set to 0. Every
    /// `data_offsets` range lies inside the file's data section, matches
    /// dtype × shape, and overlaps no other tensor's range.
    pub tensors: Vec<TensorHeader>,
}

/// Reads and validates the header of the safetensors file at `path`
/// (`8 + n` bytes, never the data). Returns the file length and the header.
///
/// Errors: as [`parse_header`]; an unreadable file gives [`Error::Io`].
pub fn read_header_file(path: &Path) -> Result<(u64, ParsedHeader)> {
    let mut f = crate::input::open(path)?;
    let file_len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut prefix = Vec::new();
    if file_len >= 8 {
        let mut len_buf = [0u8; 8];
        f.read_exact(&mut len_buf).map_err(|e| Error::io(path, e))?;
        prefix.extend_from_slice(&len_buf);
        let n = u64::from_le_bytes(len_buf);
        if n <= file_len - 8 && n <= MAX_HEADER_LEN {
            let mut buf = vec![0u8; n as usize];
            f.read_exact(&mut buf).map_err(|e| Error::io(path, e))?;
            prefix.extend_from_slice(&buf);
        }
    }
    Ok((file_len, parse_header(path, &prefix, file_len)?))
}

/// Parses and validates a safetensors header from `bytes`, the start of a
/// file of `file_len` bytes (`bytes` holds at least the 8-byte length and the
/// header, or the whole file when shorter). Reads nothing else and never panics.
///
/// Errors ([`Error::Checkpoint`], naming `path` and the tensor): a file shorter
/// than 8 bytes; a header length beyond the file or over [`MAX_HEADER_LEN`];
/// a header that is not a JSON object; an entry without `dtype`, `shape` or
/// `data_offsets`; an unknown dtype; an element count that overflows;
/// `data_offsets` reversed, inconsistent with dtype × shape, past the end of
/// the file, or overlapping another tensor's bytes.
pub fn parse_header(path: &Path, bytes: &[u8], file_len: u64) -> Result<ParsedHeader> {
    let bad = |m: String| Error::Checkpoint(format!("{}: {m}", path.display()));
    if file_len < 8 || bytes.len() < 8 {
        return Err(bad(format!(
            "truncated safetensors header: file is {file_len} bytes, shorter than the 8-byte header length"
        )));
    }
    let mut len_buf = [0u8; 8];
    len_buf.copy_from_slice(&bytes[..8]);
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
    let data_start = 8 + n;
    let Some(header) = bytes.get(8..data_start as usize) else {
        return Err(bad(format!(
            "truncated safetensors header: header length {n}, but only {} bytes could be read",
            bytes.len().saturating_sub(8)
        )));
    };
    let raw: Entries = serde_json::from_slice(header).map_err(|e| {
        bad(format!(
            "invalid safetensors header: not a JSON object of tensors: {e}"
        ))
    })?;
    let mut metadata = BTreeMap::new();
    let mut list: Vec<TensorHeader> = Vec::with_capacity(raw.0.len());
    for (name, v) in raw.0 {
        if name == "__metadata__" {
            metadata = check_metadata(v).map_err(bad)?;
            continue;
        }
        list.push(check_entry(name, v, data_start, file_len).map_err(bad)?);
    }
    check_no_overlap(&mut list).map_err(bad)?;
    Ok(ParsedHeader {
        data_start,
        metadata,
        tensors: list,
    })
}

/// A header's entries in file order, every name once: a name written twice
/// is refused (Python's `safetensors` keeps the last of two entries, so the
/// file means something other than what its first entry says; it refuses
/// the file when the entries' bytes then leave a gap, `invalid offset`).
struct Entries(Vec<(String, Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object of tensors")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<Entries, A::Error> {
                let mut seen = std::collections::HashSet::new();
                let mut v = Vec::new();
                while let Some((k, val)) = m.next_entry::<String, Value>()? {
                    if !seen.insert(k.clone()) {
                        return Err(serde::de::Error::custom(format!(
                            "{k:?} is named twice (the entries would disagree on which bytes it is)"
                        )));
                    }
                    v.push((k, val));
                }
                Ok(Entries(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// `__metadata__`: an object of strings, as Python's `safetensors` requires
/// (`HashMap<String, String>` in its `Metadata`; anything else is "invalid
/// JSON in header").
fn check_metadata(v: Value) -> std::result::Result<BTreeMap<String, String>, String> {
    let Value::Object(m) = v else {
        return Err(format!(
            "invalid safetensors header: __metadata__ must be an object of strings, found {}",
            crate::text::preview(&v.to_string())
        ));
    };
    m.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            other => Err(format!(
                "invalid safetensors header: __metadata__.{k} is {}, not a string (Python's safetensors refuses the file too)",
                crate::text::preview(&other.to_string())
            )),
        })
        .collect()
}

/// One tensor's header entry, checked: known dtype, element count that fits,
/// `data_offsets` in order, matching dtype × shape and inside the data
/// section (which starts at `data_start` of a `file_len`-byte file).
fn check_entry(
    name: String,
    v: Value,
    data_start: u64,
    file_len: u64,
) -> std::result::Result<TensorHeader, String> {
    let data_len = file_len - data_start;
    let info: RawInfo = serde_json::from_value(v).map_err(|e| {
        format!(
            "tensor {name}: invalid header entry (expected {{\"dtype\", \"shape\", \"data_offsets\"}}): {e}"
        )
    })?;
    let bits = dtype_bits(&info.dtype)
        .ok_or_else(|| format!("tensor {name}: unknown dtype {:?}", info.dtype))?;
    let (b, e) = info.data_offsets;
    if e < b {
        return Err(format!(
            "tensor {name}: data_offsets [{b}, {e}] end before they begin"
        ));
    }
    let want_bits = checked_numel(&info.shape)
        .and_then(|n| n.checked_mul(bits))
        .ok_or_else(|| {
            format!(
                "tensor {name}: shape {:?} x {} has more elements than can be addressed (element count overflows)",
                info.shape, info.dtype
            )
        })?;
    if want_bits % 8 != 0 || e - b != want_bits / 8 {
        return Err(format!(
            "tensor {name}: data_offsets [{b}, {e}] span {} bytes, but {} x {:?} needs {} bytes",
            e - b,
            info.dtype,
            info.shape,
            want_bits as f64 / 8.0
        ));
    }
    if e > data_len {
        return Err(format!(
            "tensor {name}: data ends at byte {} but the file is only {file_len} bytes (truncated download?)",
            data_start.saturating_add(e)
        ));
    }
    Ok(TensorHeader {
        name,
        dtype: info.dtype,
        shape: info.shape,
        data_offsets: info.data_offsets,
        shard: 0,
    })
}

/// Sorts `list` into on-disk order and checks that no tensor starts before
/// the furthest end seen so far (empty tensors occupy no bytes).
fn check_no_overlap(list: &mut [TensorHeader]) -> std::result::Result<(), String> {
    // On-disk order; then no tensor may start before the furthest end seen so
    // far (empty tensors occupy no bytes and never overlap).
    list.sort_by(|a, b| {
        a.data_offsets
            .cmp(&b.data_offsets)
            .then(a.name.cmp(&b.name))
    });
    let mut furthest: Option<(u64, &str)> = None;
    for t in list.iter() {
        let (b, e) = t.data_offsets;
        if b == e {
            continue;
        }
        if let Some((end, prev)) = furthest {
            if b < end {
                return Err(format!(
                    "tensors {prev} and {} have overlapping data_offsets (they share bytes {b}..{})",
                    t.name,
                    end.min(e)
                ));
            }
        }
        if furthest.is_none_or(|(end, _)| e > end) {
            furthest = Some((e, &t.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
