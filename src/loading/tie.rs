//! Step 5 of resolving a loading path: the tie of `lm_head.weight` and the
//! embedding, as `modeling_utils.py::tie_weights` does it during
//! `from_pretrained` (symmetric, with missing keys), and why a MISSING
//! `lm_head.weight` was not tied when the config's other flag says to.

use std::collections::HashMap;

use crate::checkpoint::ModelConfig;
use crate::loading::paths::ModelClass;
use crate::loading::resolve::ModelKey;

/// The tie decision of one path.
pub(super) struct Tie {
    /// Model key index → the checkpoint tensor it takes its values from.
    pub(super) tied: HashMap<usize, usize>,
    /// `lm_head.weight` and the embedding share values.
    pub(super) tied_lm_head: bool,
    /// Why a MISSING `lm_head.weight` was not tied ([`untied_missing_head`]).
    pub(super) untied_lm_head: Option<String>,
}

/// The cause of a MISSING `lm_head.weight` on a class that does not tie
/// it while the config's other tie flag says to (a VLM's top-level
/// `tie_word_embeddings` does not reach `AutoModelForCausalLM`, which reads
/// `text_config.tie_word_embeddings`; and the reverse): a note naming both
/// flags and the fix, which the inventory notes and `compare` gives as the
/// cause. `None` when that is not why it is missing (or it is not).
fn untied_missing_head(
    cfg: &ModelConfig,
    class: ModelClass,
    model: &[ModelKey],
    source: &[Option<usize>],
) -> Option<String> {
    let head_absent = model
        .iter()
        .position(|m| m.key == "lm_head.weight")
        .is_some_and(|li| source[li].is_none());
    if !(head_absent && cfg.is_vlm()) {
        return None;
    }
    let (own, other, other_value) = if class.uses_text_config() {
        (
            "text_config.tie_word_embeddings",
            "tie_word_embeddings",
            cfg.tie_word_embeddings,
        )
    } else {
        (
            "tie_word_embeddings",
            "text_config.tie_word_embeddings",
            cfg.text.tie_word_embeddings,
        )
    };
    (other_value == Some(true)).then(|| {
        format!(
            "lm_head.weight MISSING because it is not tied: the checkpoint has no lm_head.weight \
             and {} ties by {own}, which is not true here; {other} = true ties other classes \
             only. Fix: set {own} to true, or save lm_head.weight",
            class.name()
        )
    })
}

/// Step 5: `modeling_utils.py::tie_weights` with missing keys (symmetric):
/// the VLM classes tie by the top-level `tie_word_embeddings`, the
/// text-config classes by the text config's.
pub(super) fn tie(
    cfg: &ModelConfig,
    class: ModelClass,
    model: &[ModelKey],
    source: &[Option<usize>],
    rules: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> Tie {
    let mut out = Tie {
        tied: HashMap::new(),
        tied_lm_head: false,
        untied_lm_head: None,
    };
    let tie = if class.uses_text_config() {
        cfg.text.tie_word_embeddings.unwrap_or(false)
    } else {
        cfg.tie_word_embeddings.unwrap_or(false)
    };
    if class.has_lm_head() && !tie {
        out.untied_lm_head = untied_missing_head(cfg, class, model, source);
        notes.extend(out.untied_lm_head.clone());
    }
    if !(class.has_lm_head() && tie) {
        return out;
    }
    let field = if class.uses_text_config() && cfg.is_vlm() {
        "text_config.tie_word_embeddings"
    } else {
        "tie_word_embeddings"
    };
    let embed_key = format!("{}embed_tokens.weight", class.text_prefix());
    let at = |k: &str| model.iter().position(|m| m.key == k);
    let (Some(ei), Some(li)) = (at(&embed_key), at("lm_head.weight")) else {
        return out;
    };
    match (source[ei], source[li]) {
        (Some(e), None) => {
            out.tied.insert(li, e);
            out.tied_lm_head = true;
            rules.push(format!("tie lm_head.weight -> {embed_key} ({field})"));
        }
        (None, Some(l)) => {
            out.tied.insert(ei, l);
            out.tied_lm_head = true;
            rules.push(format!(
                "tie {embed_key} -> lm_head.weight ({field}; embedding absent)"
            ));
        }
        (Some(_), Some(_)) => notes.push(format!(
            "{field} is true but both lm_head.weight and {embed_key} are on disk: transformers ties \
             them only if their values are equal, so the on-disk lm_head.weight is used (same values either way)"
        )),
        (None, None) => {}
    }
    out
}
