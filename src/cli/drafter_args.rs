//! The flags of a drafter evaluation (`drafter`, `compare --drafter`,
//! `triage`): what is replayed, the memory budget, supplied trajectories,
//! the τ-gap limit and the end rule, parsed once into
//! [`DrafterSettings`] and its parts.

use std::path::PathBuf;

use clap::builder::RangedU64ValueParser;
use clap::Args;

use crate::drafter::eval::EndRule;
use crate::drafter::trajectories::GivenFile;
use crate::drafter::{DrafterSettings, Replay};

/// What is replayed: tokens per prompt and the DDTree budget.
#[derive(Args)]
pub(super) struct ReplayArgs {
    /// Greedy tokens generated (and replayed) per prompt, 1..=65536 [default: 64]; with
    /// --trajectories, at most this many of each output are replayed (default: all the output allows).
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_NEW_TOKENS))]
    pub(super) max_new_tokens: Option<usize>,
    /// DDTree node budget (DDTree-N), 1..=1024.
    #[arg(long, default_value_t = 8, value_parser = RangedU64ValueParser::<usize>::new().range(1..=MAX_DDTREE_BUDGET))]
    pub(super) ddtree_budget: usize,
}

/// Upper bound of `--max-new-tokens` (a replay per prompt; longer runs are not a parity check).
pub(super) const MAX_NEW_TOKENS: u64 = 65_536;
/// Upper bound of `--ddtree-budget` (tree nodes verified per round; DDTree's own runs use tens).
pub(super) const MAX_DDTREE_BUDGET: u64 = 1024;

/// A number for a flag: finite, within `lo..=hi`, or the reason it is not.
pub(super) fn finite_in(s: &str, lo: f64, hi: f64) -> std::result::Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if !v.is_finite() || v < lo || v > hi {
        return Err(format!("{s:?}: expected a finite number in {lo}..={hi}"));
    }
    Ok(v)
}

/// `--max-tau-gap`: a finite τ difference, 0..=1024.
fn tau_gap(s: &str) -> std::result::Result<f64, String> {
    finite_in(s, 0.0, 1024.0)
}

/// Greedy tokens per prompt when `--max-new-tokens` is not given.
const DEFAULT_MAX_NEW: usize = 64;

/// Supplied greedy outputs to measure τ on (`--trajectories`).
#[derive(Args)]
pub(super) struct TrajectoryArgs {
    /// Measure τ on these greedy outputs (an engine's, at temperature 0) instead of generating:
    /// one JSON object per line, {"prompt_ids": [...], "output_ids": [...]} ("prompt"/"output"
    /// as text with a tokenizer). Their prompts are the run's unless prompt options are given,
    /// which they must then match.
    #[arg(long, value_name = "FILE.jsonl")]
    pub(super) trajectories: Option<PathBuf>,
}

impl TrajectoryArgs {
    pub(super) fn given(&self, replay: &ReplayArgs) -> Option<GivenFile> {
        self.trajectories.as_ref().map(|f| GivenFile {
            file: f.clone(),
            max_new: replay.max_new_tokens,
        })
    }
}

impl ReplayArgs {
    pub(super) fn replay(&self, rule: EndRule) -> Replay {
        Replay {
            max_new: self.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW),
            budget: self.ddtree_budget,
            rule,
        }
    }
}

/// A byte count: `123456`, `512M`, `16G`, `16GiB`, `1.5GiB` (K/M/G/T, binary).
pub(super) fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let shift = match unit
        .trim()
        .to_ascii_lowercase()
        .trim_end_matches("ib")
        .trim_end_matches('b')
    {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        u => {
            return Err(format!(
                "unknown unit {u:?}: use K, M, G or T (binary), e.g. 16G"
            ))
        }
    };
    let bad = || format!("{s:?} is not a size such as 16G or 17179869184");
    // Whole numbers exactly (a byte count may need all 64 bits).
    if let Ok(n) = num.parse::<u64>() {
        return match n.checked_mul(1u64 << shift) {
            Some(0) => Err(format!("{s:?}: expected a positive size")),
            Some(b) => Ok(b),
            None => Err(format!("{s:?}: expected a size below 16 EiB")),
        };
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let bytes = v * (1u64 << shift) as f64;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("{s:?}: expected a positive size below 16 EiB"));
    }
    Ok(bytes as u64)
}

/// Memory the target's stored weights may take to stay resident.
#[derive(Args)]
pub(super) struct BudgetArgs {
    /// Keep the target's weights resident (stored dtype) when they and the drafter fit this
    /// many bytes (e.g. 16G); else stream them layer by layer every sweep. Default: 75% of
    /// the available memory.
    #[arg(long, value_parser = parse_bytes)]
    pub(super) memory_budget: Option<u64>,
}

/// A drafter evaluation's flags (`drafter`, `compare --drafter`).
#[derive(Args)]
pub(super) struct DrafterEvalArgs {
    #[command(flatten)]
    pub(super) replay: ReplayArgs,
    #[command(flatten)]
    pub(super) budget: BudgetArgs,
    #[command(flatten)]
    pub(super) trajectories: TrajectoryArgs,
    /// Exit 1 when τ on two paths differs by more than this (a finite number, 0..=1024).
    #[arg(long, default_value_t = 0.05, value_parser = tau_gap)]
    pub(super) max_tau_gap: f64,
    #[command(flatten)]
    pub(super) end: EndRuleArgs,
    #[command(flatten)]
    pub(super) engine: EngineMetricsArgs,
}

/// `--engine-metrics` (`drafter`, `compare --drafter`, `triage`).
#[derive(Args)]
pub(super) struct EngineMetricsArgs {
    /// A serving engine's speculative-decoding counters on the same prompts, set beside τ: vLLM's
    /// /metrics text or its per-request metrics (JSON); docs/engines.md, "Engine metrics".
    #[arg(long, value_name = "FILE")]
    pub(super) engine_metrics: Option<PathBuf>,
}

/// `--end-rule` (`drafter`, `compare --drafter`, `triage`).
#[derive(Args)]
pub(super) struct EndRuleArgs {
    /// End-of-generation rule replayed: main (z-lab GitHub main) or wheel (the dflash 0.1.0 PyPI wheel).
    #[arg(long, value_enum, default_value = "main")]
    pub(super) end_rule: EndRule,
}

impl DrafterEvalArgs {
    pub(super) fn settings(&self, source: String) -> DrafterSettings {
        DrafterSettings {
            source,
            replay: self.replay.replay(self.end.end_rule),
            max_tau_gap: self.max_tau_gap,
            memory_budget: self.budget.memory_budget,
            trajectories: self.trajectories.given(&self.replay),
            engine_metrics: self.engine.engine_metrics.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn byte_counts_take_all_64_bits_and_units_scale_exactly() {
        assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_bytes("16G"), Ok(16 << 30));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert!(parse_bytes("16777216T").is_err(), "2^64 bytes");
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("12X").is_err());
    }
}
