//! What no engine writes, refused for every format in one place before a
//! dump is made.

use std::path::Path;

use super::{Format, ImportOptions, Imported, StateIndex};
use crate::error::{Error, Result};

/// What no engine writes, refused for every format before a dump is made:
/// states 0 wide, a prompt of 0 tokens, a negative token id, two stored
/// layers on one index, and (with N known) an index beyond `hidden_states[N]`.
///
/// Errors ([`Error::Format`]): naming the file, the prompt and the key.
pub(super) fn check_imported(imp: &Imported) -> Result<()> {
    let file = imp.path.display();
    if imp.hidden_size == 0 {
        return Err(Error::Format(format!(
            "{file}: the states are 0 wide (H = 0): there is nothing to compare"
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    for l in &imp.mapping.layers {
        if !seen.insert(l.index) {
            return Err(Error::Format(format!(
                "{file}: two stored layers map to {} (the second: {}): each index is one layer's state",
                l.index, l.stored_as
            )));
        }
        if let (StateIndex::Hidden(i), Some(n)) = (l.index, imp.num_layers) {
            if i > n {
                return Err(Error::Format(format!(
                    "{file}: {} maps to hidden_states[{i}], beyond a {n}-layer target's hidden_states 0..={n} (check --num-layers)",
                    l.stored_as
                )));
            }
        }
    }
    for (k, p) in imp.prompts.iter().enumerate() {
        let at = p.source.display();
        if p.input_ids.is_empty() {
            return Err(Error::Format(format!(
                "{at}: prompt p{k} holds 0 tokens: there is nothing to compare"
            )));
        }
        if let Some((pos, id)) = p.input_ids.iter().enumerate().find(|(_, &id)| id < 0) {
            return Err(Error::Format(format!(
                "{at}: prompt p{k}'s token id at position {pos} is {id}: token ids are never negative"
            )));
        }
        if let Some((pos, id)) = p
            .input_ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id > u32::MAX as i64)
        {
            return Err(Error::Format(format!(
                "{at}: prompt p{k}'s token id at position {pos} is {id}: beyond any vocabulary (token ids fit 32 bits)"
            )));
        }
    }
    Ok(())
}

/// The options as they apply to `format`: a layer id given twice, or a
/// flag of another format (ignoring it would import something else than
/// the user asked).
///
/// Errors ([`Error::Input`]): naming the flag.
pub(super) fn check_options(path: &Path, format: Format, opts: &ImportOptions) -> Result<()> {
    for (flag, ids) in [
        ("--target-layer-ids", &opts.target_layer_ids),
        ("--layer-ids", &opts.layer_ids),
    ] {
        let mut seen = std::collections::BTreeSet::new();
        if let Some(l) = ids.iter().flatten().find(|&&l| !seen.insert(l)) {
            return Err(Error::Input(format!(
                "{flag} names layer {l} twice: each stored block is one layer"
            )));
        }
    }
    let only = [
        (
            "--target-layer-ids",
            opts.target_layer_ids.is_some(),
            Format::Specforge,
        ),
        ("--keep-padding", opts.keep_padding, Format::Specforge),
        ("--layer-ids", opts.layer_ids.is_some(), Format::Vllm),
        ("--rank", opts.rank.is_some(), Format::SglangDump),
        (
            "--prompt-ids",
            opts.prompt_ids.is_some(),
            Format::SglangJson,
        ),
    ];
    if let Some((flag, _, f)) = only.iter().find(|(_, given, f)| *given && *f != format) {
        return Err(Error::Input(format!(
            "{flag} applies to {f} captures, and {} is a {format} one",
            path.display()
        )));
    }
    Ok(())
}
