//! `compare`'s summary sentence: the verdict of every pair (bitwise,
//! within tolerance, where they part — or the NaN/Inf both hold and the
//! weight it enters through), the MISSING and NaN/Inf weights of each path.

use super::{hidden_state_label, PathRun};
use crate::parity::{PairReport, Verdict};

/// `: it enters through layer 1's mlp.up_proj.weight, which holds NaN/Inf`:
/// the first weight with NaN/Inf a path reads in the layer whose output is
/// `hidden_states[index]` (the embedding for index 0), named by its
/// sub-layer; nothing when no such weight is known.
fn non_finite_source(paths: &[PathRun], index: usize) -> String {
    let layer = index.checked_sub(1).map(|l| format!("layers.{l}."));
    let name = paths
        .iter()
        .flat_map(|p| p.non_finite_weights.keys())
        .find(|n| match &layer {
            Some(l) => n.contains(l.as_str()),
            None => n.contains("embed_tokens"),
        });
    match (name, &layer) {
        (Some(n), Some(l)) => {
            let sub = &n[n.find(l.as_str()).map_or(0, |i| i + l.len())..];
            format!(
                ": it enters through layer {}'s {sub}, which holds NaN/Inf in the checkpoint",
                index - 1
            )
        }
        (Some(n), None) => format!(": {n} holds NaN/Inf in the checkpoint"),
        _ => String::new(),
    }
}

/// The verdict and the body of its sentence (`causal-lm and vlm agree bitwise
/// at all 7 hidden states`, …); `Report::new` puts `PASS:` / `FAIL:` before it
/// once every check of the run has added its part.
pub fn summarize(pairs: &[PairReport], paths: &[PathRun]) -> (Verdict, String) {
    let missing: Vec<String> = paths
        .iter()
        .filter(|p| p.missing > 0)
        .map(|p| {
            format!(
                "{} has {} missing (randomly initialised) tensor{}",
                p.name,
                p.missing,
                if p.missing == 1 { "" } else { "s" }
            )
        })
        .collect();
    let mut parts = Vec::new();
    let mut verdict = if missing.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail
    };
    for p in pairs {
        let n = p.hidden_states.len();
        let v = p.verdict();
        let dtypes = if p.dtype_a != p.dtype_b {
            format!("; dtype {} vs {}", p.dtype_a, p.dtype_b)
        } else {
            String::new()
        };
        if v != Verdict::Pass {
            verdict = Verdict::Fail;
        }
        parts.push(match (v, p.first_non_bitwise, p.first_divergent) {
            (Verdict::Pass, None, _) => {
                format!("{} and {} agree bitwise at all {n} hidden states", p.a, p.b)
            }
            (Verdict::Pass, Some(i), _) => format!(
                "{} and {} agree {} at all {n} hidden states (not bitwise from hidden_states[{i}])",
                p.a,
                p.b,
                p.agreement()
            ),
            (_, _, Some(i)) => {
                let row = &p.hidden_states.iter().find(|r| r.index == i);
                let (at, detail) = row
                    .map(|r| {
                        let m = &r.metrics;
                        let d = if m.nan_count + m.inf_count > 0 {
                            format!("; {} NaN, {} Inf values", m.nan_count, m.inf_count)
                        } else {
                            format!(
                                "; cos_min {:.6}, rel L2 {:.3e}, max_abs {:.3e}",
                                m.cos_min, m.rel_l2, m.max_abs
                            )
                        };
                        (hidden_state_label(r.index, r.layer_type), d)
                    })
                    .unwrap_or_default();
                let both = row.is_some_and(|r| {
                    r.metrics.bitwise && r.metrics.nan_count + r.metrics.inf_count > 0
                });
                if both {
                    // Bitwise: both sides hold the same values, so each
                    // holds half the counted NaN/Inf.
                    let detail = row
                        .map(|r| {
                            format!(
                                "; {} NaN, {} Inf values in each",
                                r.metrics.nan_count / 2,
                                r.metrics.inf_count / 2
                            )
                        })
                        .unwrap_or_default();
                    // NaN/Inf that both paths hold bit for bit: the weights
                    // (or the input), not the loading paths.
                    format!(
                        "{} and {} agree bitwise, but both hold NaN/Inf from hidden_states[{i}] ({at}{detail}){}",
                        p.a,
                        p.b,
                        non_finite_source(paths, i)
                    )
                } else {
                    format!(
                        "{} and {} diverge from hidden_states[{i}] ({at}{dtypes}{detail}){}",
                        p.a,
                        p.b,
                        router_flips(p)
                    )
                }
            }
            (_, _, None) => {
                let why = if dtypes.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", &dtypes[2..])
                };
                format!("{} and {} differ in the logits{why}", p.a, p.b)
            }
        });
        if let Some(policy) = p.policy() {
            parts.push(policy);
        }
    }
    parts.extend(missing);
    for p in paths {
        if let Some((name, nf)) = p.non_finite_weights.iter().next() {
            verdict = Verdict::Fail;
            parts.push(format!(
                "{} reads {} with NaN/Inf (first: {name}: {} NaN, {} Inf)",
                p.name,
                crate::text::counted(p.non_finite_weights.len(), "weight tensor", None),
                nf.nan,
                nf.inf
            ));
        }
    }
    (verdict, parts.join("; "))
}

/// `; router choices differ from layer 3 (5 of 456 token×slot choices)` for a
/// pair whose MoE routers flip somewhere, else empty.
fn router_flips(pair: &PairReport) -> String {
    let flips: Vec<_> = pair
        .hidden_states
        .iter()
        .filter_map(|r| {
            r.router
                .filter(|a| a.slots_differing > 0)
                .map(|a| (r.index, a))
        })
        .collect();
    match flips.first() {
        Some((i, _)) => {
            let n: usize = flips.iter().map(|(_, a)| a.slots_differing).sum();
            let total: usize = pair
                .hidden_states
                .iter()
                .filter_map(|r| r.router)
                .map(|a| a.slots)
                .sum();
            format!(
                "; router choices differ from layer {} ({n} of {total} token×slot choices)",
                i - 1
            )
        }
        None => String::new(),
    }
}
