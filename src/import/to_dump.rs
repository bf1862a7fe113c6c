//! An import as an hsparity dump (`hsparity.dump.v1`, [`crate::dump`]): the
//! mapped `hidden_states` indices (a partial dump: only those the engine
//! stored), the pre-norm `last_layer_output` where an engine's last-layer
//! tap landed, the ids and loss mask, and the mapping stated in the
//! metadata (`source_format`, `layer_mapping`, `convention`,
//! `hidden_states_indices`, `trimmed`, …).

use std::collections::BTreeMap;

use super::{Imported, StateIndex};
use crate::dump::{Dump, DumpPrompt, FORMAT};

/// The dtype a dump built from the engine's `stored` dtype is marked with
/// (`diff` judges dtype noise by it): bf16 / f16 / f32 as stored, f32 for the rest.
fn dump_dtype(stored: &str) -> &'static str {
    match stored {
        "bf16" => "bf16",
        "f16" => "f16",
        _ => "f32",
    }
}

impl Imported {
    /// The import as a dump (tensors shared, not copied).
    pub fn to_dump(&self) -> Dump {
        let prompts = self
            .prompts
            .iter()
            .map(|p| DumpPrompt {
                input_ids: Some(p.input_ids.clone()),
                loss_mask: p.loss_mask.clone(),
                hidden_states: p.hidden_states.clone(),
                last_layer_output: p.last_layer_output.clone(),
                position_ids: p.position_ids.clone(),
                prompt_length: p.prompt_length,
                logits: None,
                ..Default::default()
            })
            .collect();
        Dump {
            metadata: self.metadata(),
            prompts,
        }
    }

    /// The metadata of [`Self::to_dump`]: what was read, how it was mapped, what was done to it.
    pub fn metadata(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            m.insert(k.to_string(), v);
        };
        put("format", FORMAT.into());
        put("source_format", self.format.name().into());
        put("source", self.path.display().to_string());
        put("dtype", dump_dtype(&self.stored_dtype).into());
        put("stored_dtype", self.stored_dtype.clone());
        if let Some(n) = self.num_layers {
            put("num_layers", n.to_string());
        }
        put("hidden_size", self.hidden_size.to_string());
        put(
            "hidden_states_indices",
            self.hidden_indices()
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
        put(
            "last_layer_output",
            self.indices()
                .contains(&StateIndex::LastLayerOutput)
                .to_string(),
        );
        put("convention", self.mapping.convention.clone());
        put(
            "layer_mapping",
            serde_json::to_string(&self.mapping.layers).expect("plain data"),
        );
        if !self.trimmed.is_empty() {
            put(
                "trimmed",
                serde_json::to_string(&self.trimmed).expect("plain data"),
            );
        }
        put(
            "tool_version",
            format!("hsparity {}", env!("CARGO_PKG_VERSION")),
        );
        m
    }
}
