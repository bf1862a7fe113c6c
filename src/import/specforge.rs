//! SpecForge offline-capture records: one `torch.save` dict per sample,
//! `{out}/rows_{g}-{g+2000}/data_{idx}.ckpt` (or `.ckpt.gz` with `--compress`),
//! written by `scripts/prepare_hidden_states.py` (`HiddenStatesGenerator._save_tensor_sync`,
//! sgl-project/SpecForge).
//!
//! - DFlash (and Domino / DSpark) records: `input_ids` `[T]` int64, `loss_mask`
//!   `[T]` int64, `hidden_states` `[1, T, k·H]` = the `target_layer_ids` taps
//!   concatenated in order (`specforge/algorithms/dflash/providers.py`).
//! - EAGLE-3 records: `input_ids`, `loss_mask`, `aux_hidden_state` [1, T, 3H]
//!   (the aux layers concatenated) and `hidden_state` [1, T, H], the tensor fed
//!   to the LM head (final-normed).
//!
//! Tap L is what SGLang captures "before layer L+1" (`set_dflash_layers_to_capture`
//! stores `L + 1`), i.e. `hidden_states[L+1]`; a tap on the last layer is the
//! pre-norm [`StateIndex::LastLayerOutput`]. Records of a batch are right-padded
//! with id 0 / loss_mask 0 to the batch maximum and the padded row is what the
//! capture ran, so trailing rows with `input_ids == 0 && loss_mask == 0` are
//! trimmed (and reported); id 0 is a real token, so this is a heuristic that
//! [`ImportOptions::keep_padding`] turns off.

use std::path::{Path, PathBuf};

use super::torch_zip::{self, Record, StorageType};
use super::{
    as_2d, check_width, files_under, Format, ImportOptions, Imported, ImportedPrompt, IndexMapping,
    LayerMapping, StateIndex, Trim,
};
use crate::error::{Error, Result};

/// The sample index of `data_{i}.ckpt[.gz]`, for ordering a folder.
fn sample_index(p: &Path) -> Option<u64> {
    let n = p.file_name()?.to_str()?;
    let stem = n
        .strip_suffix(".ckpt.gz")
        .or_else(|| n.strip_suffix(".ckpt"))?;
    stem.strip_prefix("data_")?.parse().ok()
}

fn record_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = files_under(path, &|n| n.ends_with(".ckpt") || n.ends_with(".ckpt.gz"))?;
    if files.is_empty() {
        return Err(Error::Input(format!(
            "{}: no SpecForge records (data_*.ckpt, data_*.ckpt.gz) in this folder",
            path.display()
        )));
    }
    // data_2 before data_10; files without a sample index after them, by name
    files.sort_by_key(|p| (sample_index(p).unwrap_or(u64::MAX), p.clone()));
    Ok(files)
}

fn missing(file: &Path, key: &str, rec: &Record, hint: &str) -> Error {
    Error::Format(format!(
        "{}: no `{key}` key ({hint}); keys found: {:?}",
        file.display(),
        rec.keys()
    ))
}

/// The most decoder layers a target may have (`--num-layers`' range).
pub const MAX_LAYERS: usize = 4096;

fn tap_index(tap: usize, opts: &ImportOptions, file: &Path) -> Result<StateIndex> {
    match opts.num_layers {
        Some(n) if tap >= n => Err(Error::Input(format!(
            "{}: target layer {tap} does not exist in a {n}-layer target",
            file.display()
        ))),
        Some(n) if tap + 1 == n => Ok(StateIndex::LastLayerOutput),
        None if tap >= MAX_LAYERS => Err(Error::Input(format!(
            "{}: target layer {tap} is beyond any target (at most {MAX_LAYERS} layers, as --num-layers takes)",
            file.display()
        ))),
        _ => tap.checked_add(1).map(StateIndex::Hidden).ok_or_else(|| {
            Error::Input(format!(
                "{}: target layer {tap} is not a layer index",
                file.display()
            ))
        }),
    }
}

struct OneRecord {
    prompt: ImportedPrompt,
    layers: Vec<LayerMapping>,
    dtype: String,
    rows_in_file: usize,
    notes: Vec<String>,
}

/// `input_ids` `[T]` and the optional `loss_mask` `[T]` of a record.
fn ids_and_mask(rec: &Record, file: &Path) -> Result<(Vec<i64>, Option<Vec<i64>>)> {
    let what = |k: &str| format!("{}: key `{k}`", file.display());
    let ids_t = rec.tensor("input_ids", file)?.ok_or_else(|| {
        missing(
            file,
            "input_ids",
            rec,
            "every SpecForge record holds input_ids",
        )
    })?;
    if ids_t.storage == StorageType::Bool {
        return Err(Error::Format(format!(
            "{} is a bool tensor: token ids are integers",
            what("input_ids")
        )));
    }
    let input_ids = ids_t.to_i64(&what("input_ids"))?;
    let t = input_ids.len();
    if ids_t.shape.iter().filter(|&&d| d != 1).count() > 1 {
        return Err(Error::Format(format!(
            "{} has shape {:?}, expected [T]",
            what("input_ids"),
            ids_t.shape
        )));
    }
    let loss_mask = match rec.tensor("loss_mask", file)? {
        None => None,
        Some(m) => {
            let v = m.to_mask(&what("loss_mask"))?;
            if v.len() != t {
                return Err(Error::Format(format!(
                    "{} has {} entries, input_ids {t}",
                    what("loss_mask"),
                    v.len()
                )));
            }
            Some(v)
        }
    };
    Ok((input_ids, loss_mask))
}

/// The key holding the concatenated taps, the tap list, and whether the record is EAGLE-3's.
fn taps_key(
    rec: &Record,
    opts: &ImportOptions,
    file: &Path,
) -> Result<(&'static str, Vec<usize>, bool)> {
    let (key, taps, is_eagle3) = if rec.get("hidden_states").is_some() {
        let taps = opts.target_layer_ids.clone().ok_or_else(|| {
            Error::Input(format!(
                "{}: a SpecForge DFlash record concatenates the target_layer_ids taps in `hidden_states`; \
                 pass them (--target-layer-ids, or --drafter DIR for its config)",
                file.display()
            ))
        })?;
        ("hidden_states", taps, false)
    } else if rec.get("aux_hidden_state").is_some() {
        let taps = opts.target_layer_ids.clone().ok_or_else(|| {
            Error::Input(format!(
                "{}: a SpecForge EAGLE-3 record concatenates its aux layers in `aux_hidden_state`; pass them \
                 (--target-layer-ids, the --aux-hidden-states-layers of the capture; SpecForge's default is \
                 [1, N/2-1, N-4])",
                file.display()
            ))
        })?;
        ("aux_hidden_state", taps, true)
    } else {
        return Err(missing(
            file,
            "hidden_states",
            rec,
            "a DFlash record holds hidden_states, an EAGLE-3 record aux_hidden_state",
        ));
    };
    if taps.is_empty() {
        return Err(Error::Input(format!(
            "{}: the target layer id list is empty",
            file.display()
        )));
    }
    Ok((key, taps, is_eagle3))
}

/// Splits `key` (`[1, T, k·H]`) into its taps; returns the stored dtype.
fn split_taps(
    rec: &Record,
    (key, taps): (&str, &[usize]),
    opts: &ImportOptions,
    (file, width): (&Path, &mut Option<usize>),
    out: (&mut ImportedPrompt, &mut Vec<LayerMapping>),
) -> Result<String> {
    let what = |k: &str| format!("{}: key `{k}`", file.display());
    let t = out.0.input_ids.len();
    let raw = rec.tensor(key, file)?.expect("present");
    let dtype = raw
        .storage
        .short_float_name()
        .map(str::to_string)
        .unwrap_or_else(|| raw.storage.torch_name());
    let cat = as_2d(raw.to_f32(&what(key))?, &what(key))?;
    let (rows, x) = cat.dims2()?;
    if rows != t {
        return Err(Error::Format(format!(
            "{} has {rows} rows, input_ids {t}",
            what(key)
        )));
    }
    let k = taps.len();
    if x % k != 0 {
        return Err(Error::Format(format!(
            "{} has last dim {x}, which does not divide by the {k} target layer ids {taps:?}",
            what(key)
        )));
    }
    let h = x / k;
    check_width(
        h,
        opts,
        width,
        &format!("{} (per layer: {x} / {k})", what(key)),
    )?;
    for (j, &tap) in taps.iter().enumerate() {
        let index = tap_index(tap, opts, file)?;
        out.0.insert(index, cat.narrow(1, j * h, h)?.contiguous()?);
        out.1.push(LayerMapping {
            stored_as: format!("{key}[..., {}:{}]", j * h, (j + 1) * h),
            engine_id: Some(tap),
            index,
        });
    }
    Ok(dtype)
}

/// EAGLE-3's `hidden_state` (final-normed) at `hidden_states[N]`, or a note why not.
fn eagle3_final(
    rec: &Record,
    opts: &ImportOptions,
    (file, width): (&Path, &mut Option<usize>),
    out: (&mut ImportedPrompt, &mut Vec<LayerMapping>),
    notes: &mut Vec<String>,
) -> Result<()> {
    let what = |k: &str| format!("{}: key `{k}`", file.display());
    let t = out.0.input_ids.len();
    let Some(last) = rec.tensor("hidden_state", file)? else {
        notes.push(format!(
            "{}: no `hidden_state` (the final-normed state) in this EAGLE-3 record",
            file.display()
        ));
        return Ok(());
    };
    let s = as_2d(last.to_f32(&what("hidden_state"))?, &what("hidden_state"))?;
    let (r, w) = s.dims2()?;
    if r != t {
        return Err(Error::Format(format!(
            "{} has {r} rows, input_ids {t}",
            what("hidden_state")
        )));
    }
    check_width(w, opts, width, &what("hidden_state"))?;
    match opts.num_layers {
        Some(n) => {
            out.0.insert(StateIndex::Hidden(n), s);
            out.1.push(LayerMapping {
                stored_as: "hidden_state".into(),
                engine_id: None,
                index: StateIndex::Hidden(n),
            });
        }
        None => notes.push(format!(
            "{}: `hidden_state` (final-normed, hidden_states[N]) skipped: the number of layers N is \
             not known (pass --num-layers)",
            file.display()
        )),
    }
    Ok(())
}

fn read_one(file: &Path, opts: &ImportOptions, width: &mut Option<usize>) -> Result<OneRecord> {
    let rec = torch_zip::read_record(file)?;
    let (input_ids, loss_mask) = ids_and_mask(&rec, file)?;
    let t = input_ids.len();
    let mut prompt = ImportedPrompt {
        source: file.to_path_buf(),
        input_ids,
        loss_mask,
        hidden_states: Default::default(),
        last_layer_output: None,
        position_ids: None,
        prompt_length: None,
    };
    let mut layers = Vec::new();
    let mut notes = Vec::new();
    let (key, taps, is_eagle3) = taps_key(&rec, opts, file)?;
    let dtype = split_taps(
        &rec,
        (key, &taps),
        opts,
        (file, width),
        (&mut prompt, &mut layers),
    )?;
    if is_eagle3 {
        eagle3_final(
            &rec,
            opts,
            (file, width),
            (&mut prompt, &mut layers),
            &mut notes,
        )?;
    }
    let known = [
        "input_ids",
        "loss_mask",
        "hidden_states",
        "aux_hidden_state",
        "hidden_state",
    ];
    let other: Vec<&str> = rec
        .keys()
        .into_iter()
        .filter(|k| !known.contains(k))
        .collect();
    if !other.is_empty() {
        notes.push(format!("{}: keys not imported: {other:?}", file.display()));
    }
    Ok(OneRecord {
        prompt,
        layers,
        dtype,
        rows_in_file: t,
        notes,
    })
}

/// Trailing rows that are right-padding: `input_ids == 0 && loss_mask == 0`.
fn padding_rows(p: &ImportedPrompt) -> usize {
    let Some(mask) = &p.loss_mask else { return 0 };
    p.input_ids
        .iter()
        .zip(mask)
        .rev()
        .take_while(|(&id, &m)| id == 0 && m == 0)
        .count()
}

fn trim(p: &mut ImportedPrompt, keep: usize) -> Result<()> {
    p.input_ids.truncate(keep);
    if let Some(m) = &mut p.loss_mask {
        m.truncate(keep);
    }
    for t in p.hidden_states.values_mut() {
        *t = t.narrow(0, 0, keep)?;
    }
    if let Some(t) = &mut p.last_layer_output {
        *t = t.narrow(0, 0, keep)?;
    }
    Ok(())
}

/// Reads one record or every record under a folder (prompts `p0..` in sample order).
pub fn read(path: &Path, opts: &ImportOptions) -> Result<Imported> {
    let files = record_files(path)?;
    let mut width = None;
    let mut prompts = Vec::new();
    let mut mapping: Option<Vec<LayerMapping>> = None;
    let mut dtype = String::new();
    let mut trimmed = Vec::new();
    let mut notes = Vec::new();
    if let (None, Some(last)) = (
        opts.num_layers,
        opts.target_layer_ids.as_ref().and_then(|t| t.iter().max()),
    ) {
        // Without N the last tap cannot be told from the last layer, whose
        // output is pre-norm and has no hidden_states index.
        notes.push(format!(
            "tap {last} is mapped to hidden_states[{}] because N is not known; if the target has {} layers it is the last layer's raw output (last_layer_output, pre-norm), not hidden_states[N]: pass --num-layers N",
            last.saturating_add(1),
            last.saturating_add(1)
        ));
    }
    let mut without_mask = 0usize;
    for file in &files {
        let mut one = read_one(file, opts, &mut width)?;
        match &mapping {
            None => {
                mapping = Some(one.layers.clone());
                dtype = one.dtype.clone();
            }
            Some(_) if one.dtype != dtype => {
                return Err(Error::Format(format!(
                    "{}: stores {}, {} stores {dtype}: records of one capture share a dtype (a dump records one)",
                    file.display(),
                    one.dtype,
                    files[0].display()
                )))
            }
            Some(m) if *m != one.layers => {
                return Err(Error::Format(format!(
                    "{}: holds other layers than {} ({:?} vs {:?}): records of one capture hold the same taps",
                    file.display(),
                    files[0].display(),
                    one.layers.iter().map(|l| l.stored_as.clone()).collect::<Vec<_>>(),
                    m.iter().map(|l| l.stored_as.clone()).collect::<Vec<_>>()
                )))
            }
            Some(_) => {}
        }
        notes.append(&mut one.notes);
        if one.prompt.loss_mask.is_none() {
            without_mask += 1;
        }
        if !opts.keep_padding {
            let pad = padding_rows(&one.prompt);
            if pad == one.rows_in_file {
                return Err(Error::Format(format!(
                    "{}: every row has input_ids 0 and loss_mask 0 (all padding)",
                    file.display()
                )));
            }
            if pad > 0 {
                let keep = one.rows_in_file - pad;
                trim(&mut one.prompt, keep)?;
                trimmed.push(Trim {
                    prompt: prompts.len(),
                    source: file.clone(),
                    rows_in_file: one.rows_in_file,
                    rows_kept: keep,
                    reason: "trailing input_ids == 0 and loss_mask == 0 (right-padding to the batch maximum)".into(),
                });
            }
        }
        prompts.push(one.prompt);
    }
    if without_mask > 0 {
        notes.push(format!(
            "{without_mask} record(s) without loss_mask: trailing padding cannot be told apart and was kept"
        ));
    }
    if opts.keep_padding {
        notes.push("trailing padding kept (keep_padding)".into());
    }
    Ok(Imported {
        format: Format::Specforge,
        path: path.to_path_buf(),
        mapping: IndexMapping {
            format: Format::Specforge,
            convention: Format::Specforge.convention().into(),
            layers: mapping.unwrap_or_default(),
        },
        prompts,
        hidden_size: width.unwrap_or(0),
        num_layers: opts.num_layers,
        stored_dtype: dtype,
        trimmed,
        notes,
    })
}
