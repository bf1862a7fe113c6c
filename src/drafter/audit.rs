//! The drafter–target audit: every fact a DFlash drafter's `config.json`
//! records about the target it was trained on, checked against the target
//! it is about to read. dflash's `DFlashDraftModel` configs (z-lab/dflash
//! `dflash/model.py`, the config the training script saves) carry
//! `num_target_layers`, `vocab_size` (the drafter drafts through the
//! target's embeddings and LM head), `hidden_size` (its `fc` reads the
//! concatenated taps), `dflash_config.target_layer_ids` and
//! `dflash_config.mask_token_id`; vLLM's and SpecForge's add
//! `target_hidden_size` and `draft_vocab_size` (vLLM `qwen3_dflash.py`).
//! The block size is listed too (at least 2: the anchor and a draft slot).
//! Facts a run cannot start without (the
//! hidden size, a tap or the mask token outside the target) are refused
//! before this (`drafter::load_drafter`, exit 2); the ones a run survives but
//! that say the drafter was made for another target are findings here.

use serde::Serialize;

use crate::checkpoint::config::TextConfig;
use crate::models::dflash::DflashConfig;

/// One fact checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditCheck {
    /// The drafter config's field (`num_target_layers`, `vocab_size`,
    /// `draft_vocab_size`, `hidden_size`, `target_hidden_size`,
    /// `target_layer_ids`, `mask_token_id`, `block_size`).
    pub field: &'static str,
    /// What the drafter records.
    pub drafter: String,
    /// What the target has (for the ranges: `0..N`).
    pub target: String,
    /// The two agree.
    pub agrees: bool,
}

/// Every fact `cfg` records about its target, against `target`.
pub fn audit(cfg: &DflashConfig, target: &TextConfig) -> Vec<AuditCheck> {
    let n = target.num_hidden_layers;
    let mut out = Vec::new();
    let mut check = |field, drafter: String, target: String, agrees| {
        out.push(AuditCheck {
            field,
            drafter,
            target,
            agrees,
        })
    };
    if let Some(d) = cfg.num_target_layers {
        check("num_target_layers", d.to_string(), n.to_string(), d == n);
    }
    if let Some(v) = cfg.vocab_size {
        let t = target.vocab_size;
        check("vocab_size", v.to_string(), t.to_string(), v == t);
    }
    if let Some(v) = cfg.draft_vocab_size {
        let t = target.vocab_size;
        check("draft_vocab_size", v.to_string(), t.to_string(), v == t);
    }
    let h = target.hidden_size;
    check(
        "hidden_size",
        cfg.hidden_size.to_string(),
        h.to_string(),
        cfg.hidden_size == h,
    );
    if let Some(d) = cfg.target_hidden_size {
        check("target_hidden_size", d.to_string(), h.to_string(), d == h);
    }
    let taps_in = cfg.target_layer_ids.iter().all(|&l| l < n);
    check(
        "target_layer_ids",
        format!("{:?}", cfg.target_layer_ids),
        format!("0..{n}"),
        taps_in,
    );
    let mask_in = (cfg.mask_token_id as usize) < target.vocab_size;
    check(
        "mask_token_id",
        cfg.mask_token_id.to_string(),
        format!("0..{}", target.vocab_size),
        mask_in,
    );
    check(
        "block_size",
        cfg.block_size.to_string(),
        "2..".into(),
        cfg.block_size >= 2,
    );
    out
}

/// The disagreeing facts in one sentence naming both values (`the drafter
/// was made for another target: num_target_layers 4 (this target: 6),
/// vocab_size 40 (this target: 384)`); empty when every fact agrees.
pub fn mismatches(checks: &[AuditCheck]) -> Vec<String> {
    let bad: Vec<String> = checks
        .iter()
        .filter(|c| !c.agrees)
        .map(|c| {
            let range = c.target.contains("..");
            let inside = if range { "outside " } else { "" };
            format!(
                "{} {} (this target: {inside}{})",
                c.field, c.drafter, c.target
            )
        })
        .collect();
    if bad.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "the drafter was made for another target: {}",
        bad.join(", ")
    )]
}

/// The checks in one line: `num_target_layers 4 = 4, …, target_layer_ids
/// [1, 2] in 0..4, …`, a disagreement written `≠` (`not in` for a range).
pub fn describe(checks: &[AuditCheck]) -> String {
    checks
        .iter()
        .map(|c| {
            let range = c.target.contains("..");
            let rel = match (range, c.agrees) {
                (true, true) => "in",
                (true, false) => "not in",
                (false, true) => "=",
                (false, false) => "≠",
            };
            format!("{} {} {rel} {}", c.field, c.drafter, c.target)
        })
        .collect::<Vec<_>>()
        .join(", ")
}
