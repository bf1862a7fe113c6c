//! What runs when no option names prompts, and how a run's prompts are
//! named in its reports: the built-in parity prompts for `compare`, `dump`
//! and `prompts`; for a drafter evaluation, a slice of the built-in
//! benchmark sets as z-lab/dflash `benchmark.py` selects them
//! ([`DRAFTER_DEFAULT_SET`], docs/prompts.md).

use super::jsonl::Tokenizer;
use super::{Prompt, PromptKind, PromptLimits, PromptSetRun, PromptSource, Rendering};
use crate::chat::Conversation;
use crate::error::{Error, Result};
use crate::prompt_sets::{self, PromptSetSpec};

/// What a run feeds when no option names prompts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DefaultPrompts {
    /// The built-in parity prompts ([`BUILTIN_TEXTS`], or token ids without
    /// a tokenizer): `compare`, `dump`, `prompts`.
    #[default]
    Parity,
    /// A drafter evaluation's: [`DRAFTER_DEFAULT_SET`] rendered with the
    /// checkpoint's chat template (`enable_thinking` false unless given), as
    /// raw text without one; the parity token ids without a tokenizer.
    /// Records longer than half the target's `max_position_embeddings` are
    /// passed over for the next in z-lab's order (the other half is the
    /// run's: new tokens, blocks), so the default depends on the checkpoint
    /// alone: every drafter verb, whatever its flags, runs the same prompts.
    Drafter,
}

/// The drafter evaluations' default prompts: two records of each built-in
/// benchmark set, as z-lab/dflash `benchmark.py --max-samples 2` selects
/// them, in its `DATASETS` order (10 prompts).
pub const DRAFTER_DEFAULT_SET: PromptSetSpec = PromptSetSpec {
    name: prompt_sets::MIX,
    n: Some(2),
};

/// Which prompts a run fed, as its reports name them (`environment.prompt_basis`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromptBasis {
    /// Named by the prompt options.
    #[default]
    Given,
    /// The built-in parity prompts: two texts (or token ids), not a τ benchmark.
    ParityBuiltin,
    /// A drafter run's default benchmark slice ([`DRAFTER_DEFAULT_SET`]).
    DrafterDefault,
    /// A drafter run without a tokenizer: the parity token ids, not text.
    BuiltinIds,
    /// The prompts of supplied trajectories (`--trajectories`).
    Trajectories,
    /// The sequences of a features file (`drafter --features`).
    Features,
}

/// The drafter default's prompts: of each set of [`DRAFTER_DEFAULT_SET`],
/// the first N records in z-lab/dflash `benchmark.py`'s order (seed 0)
/// whose rendering is at most half of `max_tokens` (on a real target that
/// is z-lab's first N; the other half is the run's).
///
/// Errors ([`Error::Input`]): a record does not render; no record fits.
pub(super) fn default_set(
    max_tokens: usize,
    render: &dyn Fn(Conversation, &'static str) -> Result<Prompt>,
) -> Result<(Vec<Prompt>, PromptSetRun)> {
    let room = max_tokens / 2;
    let want = DRAFTER_DEFAULT_SET.n.unwrap_or(usize::MAX);
    let mut chosen = Vec::new();
    let mut sets = Vec::new();
    let mut skipped = Vec::new();
    for name in prompt_sets::MIX_ORDER {
        let all = prompt_sets::load(name, None)?;
        let order = prompt_sets::zlab_permutation(name, 0)?;
        let mut taken = 0;
        let mut passed_over = Vec::new();
        for &row in &order {
            if taken == want {
                break;
            }
            let p = render(all.conversations[row].clone(), all.spec.name)?;
            if p.ids.len() <= room {
                chosen.push(p);
                taken += 1;
            } else {
                passed_over.push(row);
            }
        }
        let mut selection = format!(
            "the first {taken} of {} records after random.seed(0); random.shuffle (z-lab/dflash benchmark.py --max-samples {want})",
            all.source.records
        );
        if !passed_over.is_empty() {
            selection.push_str(&format!(
                "; rows {passed_over:?} passed over: longer than {room} tokens, half the target's max_position_embeddings = {max_tokens}"
            ));
        }
        skipped.extend(passed_over.iter().map(|r| format!("{name} {r}")));
        sets.push((all.source, selection));
    }
    if chosen.is_empty() {
        return Err(Error::Input(format!(
            "no benchmark prompt of the drafter default fits in {room} tokens (half the target's max_position_embeddings = {max_tokens}): pass prompts with --prompt, --prompts or --prompt-ids"
        )));
    }
    Ok((
        chosen,
        PromptSetRun {
            spec: DRAFTER_DEFAULT_SET,
            sets,
            passed_over: skipped,
        },
    ))
}

/// The prompts of a run in words, as every τ names what it was measured
/// on: count, where they came from (the set), templated or raw, the
/// thinking flag.
pub fn describe(prompts: &[Prompt], rendering: &Rendering) -> String {
    let n = prompts.len();
    let plural = if n == 1 { "" } else { "s" };
    let rendered = if prompts.iter().any(|p| p.chat.is_some()) {
        format!(
            "rendered with the chat template, enable_thinking {}",
            crate::chat::thinking_label(rendering.enable_thinking)
        )
    } else if prompts.iter().any(|p| p.fed_text().is_some()) {
        "raw text".to_string()
    } else {
        "token ids as given".to_string()
    };
    let set = rendering.prompt_set.as_ref().map(|s| s.spec.to_string());
    match rendering.basis {
        PromptBasis::DrafterDefault => format!(
            "{n} prompt{plural}: the drafter default {} (as z-lab/dflash benchmark.py --max-samples {} picks each set{}), {}",
            set.unwrap_or_default(),
            DRAFTER_DEFAULT_SET.n.unwrap_or(0),
            match rendering.prompt_set.as_ref().map(|s| s.passed_over.len()) {
                Some(k) if k > 0 => format!(
                    "; {k} record{} longer than half the target's positions passed over",
                    if k == 1 { "" } else { "s" }
                ),
                _ => String::new(),
            },
            if prompts.iter().any(|p| p.chat.is_some()) {
                rendered
            } else {
                "raw text (the checkpoint has no chat template)".into()
            }
        ),
        PromptBasis::ParityBuiltin => format!(
            "{n} built-in parity prompt{plural} ({rendered}): a parity check, not a τ benchmark"
        ),
        PromptBasis::BuiltinIds => format!(
            "{n} built-in token-id prompt{plural} (no tokenizer.json to encode text with): not a τ benchmark"
        ),
        PromptBasis::Trajectories => {
            format!("the {n} prompt{plural} of the supplied trajectories")
        }
        PromptBasis::Features => format!("the {n} sequence{plural} of the features file"),
        PromptBasis::Given => {
            let mut kinds: Vec<(PromptKind, usize)> = Vec::new();
            for p in prompts {
                let k = p.source_kind();
                match kinds.iter_mut().find(|(x, _)| *x == k) {
                    Some((_, c)) => *c += 1,
                    None => kinds.push((k, 1)),
                }
            }
            let kinds: Vec<String> = kinds
                .iter()
                .map(|(k, c)| match (k, &set) {
                    (PromptKind::PromptSet, Some(s)) => format!("{c} of prompt set {s}"),
                    _ => format!("{c} {}", k.name()),
                })
                .collect();
            format!("{n} given prompt{plural} ({}), {rendered}", kinds.join(", "))
        }
    }
}

/// A benchmark record's user turn fed as raw text (a drafter run's default
/// on a checkpoint without a chat template).
pub(super) fn raw_turn(conv: Conversation, set: &'static str, tok: &Tokenizer) -> Result<Prompt> {
    let text = conv
        .messages
        .first()
        .and_then(|m| m.content())
        .and_then(|c| c.as_str())
        .unwrap_or_default()
        .to_string();
    Ok(Prompt {
        ids: tok.encode(&text, &conv.origin)?,
        source: PromptSource::PromptSet(set, Some(text)),
        origin: format!("{} (raw text: no chat template)", conv.origin),
        chat: None,
    })
}

/// Built-in text prompts: a short one, and one longer than the Gated DeltaNet
/// chunk (64 tokens) and not a multiple of it for byte-level tokenizers.
pub const BUILTIN_TEXTS: &[&str] = &[
    "The capital of France is",
    "Speculative decoding drafts several tokens with a small model and verifies them with the target in one forward pass. \
     The drafter reads the target's hidden states at a few tap layers, so when two ways of loading the target disagree, \
     acceptance falls even though both models look healthy in isolation.",
];

/// Built-in token-id prompts (16 and 100 tokens) for checkpoints without a
/// tokenizer: a fixed linear-congruential sequence reduced modulo the vocabulary.
pub fn builtin_ids(vocab_size: usize) -> Vec<Vec<u32>> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    [16usize, 100]
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((x >> 33) % vocab_size as u64) as u32
                })
                .collect()
        })
        .collect()
}

/// The built-in set: text prompts (made by `text`) with a tokenizer, token
/// ids otherwise; each cut to `limits.max_tokens` (the set is ours: fit it to
/// small models instead of refusing).
pub(super) fn builtin_prompts(
    has_tokenizer: bool,
    limits: PromptLimits,
    text: impl Fn(String, String) -> Result<Prompt>,
) -> Result<Vec<Prompt>> {
    let mut prompts: Vec<Prompt> = if has_tokenizer {
        BUILTIN_TEXTS
            .iter()
            .enumerate()
            .map(|(i, t)| text(t.to_string(), format!("built-in prompt #{}", i + 1)))
            .collect::<Result<_>>()?
    } else {
        builtin_ids(limits.vocab_size)
            .into_iter()
            .enumerate()
            .map(|(i, ids)| Prompt {
                source: PromptSource::Builtin(None),
                ids,
                origin: format!("built-in prompt #{}", i + 1),
                chat: None,
            })
            .collect()
    };
    for p in prompts.iter_mut() {
        if p.ids.len() > limits.max_tokens {
            p.ids.truncate(limits.max_tokens);
            p.origin.push_str(&format!(
                ", cut to max_position_embeddings = {}",
                limits.max_tokens
            ));
        }
    }
    Ok(prompts)
}
