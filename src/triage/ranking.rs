//! The ranking of triage's variants: what the inputs show first
//! ([`super::evidence`]), then what each costs in τ; the top suspect the next
//! check follows; the summary sentence.

use super::{Baseline, Presence, VariantResult};

/// Ranks `variants`: present, possible, hypothetical; in each, the ones
/// that lower τ before the others (a suspect that raises τ or leaves it
/// does not explain a regression), each by |Δτ|, largest first.
pub fn rank(variants: &mut [VariantResult]) {
    variants.sort_by(|a, b| {
        (a.evidence.presence.cmp(&b.evidence.presence))
            .then((a.delta_tau >= 0.0).cmp(&(b.delta_tau >= 0.0)))
            .then(b.delta_tau.abs().total_cmp(&a.delta_tau.abs()))
    });
}

/// The top suspect: among the suspects present in the inputs, else among
/// all, the costliest that lowers τ with an interval that excludes 0, else
/// the costliest that lowers τ.
pub fn top_suspect(variants: &[VariantResult]) -> Option<&VariantResult> {
    let among = |present: bool| {
        let lowers = || {
            variants.iter().filter(move |v| {
                v.delta_tau < 0.0 && (!present || v.evidence.presence == Presence::Present)
            })
        };
        lowers()
            .find(|v| v.delta_tau_interval.is_some_and(|i| !i.contains_zero))
            .or_else(|| lowers().next())
    };
    among(true).or_else(|| among(false))
}

/// The summary sentence: the baseline τ, the suspects present in the
/// inputs, the costliest of the others with their intervals, and those
/// consistent with the observed τ.
pub fn summarize(baseline: &Baseline, variants: &[VariantResult], observed: Option<f64>) -> String {
    let cell = |v: &VariantResult| match v.delta_tau_interval {
        Some(i) => format!("{} (Δτ {:+.2}, 95% {})", v.name, v.delta_tau, i.describe()),
        None => format!("{} (Δτ {:+.2})", v.name, v.delta_tau),
    };
    let present: Vec<String> = variants
        .iter()
        .filter(|v| v.evidence.presence == Presence::Present)
        .map(cell)
        .collect();
    let top: Vec<String> = variants
        .iter()
        .filter(|v| v.evidence.presence != Presence::Present && v.delta_tau < 0.0)
        .take(3)
        .map(cell)
        .collect();
    let mut summary = format!("baseline causal-lm τ {:.2}; ", baseline.tau_macro);
    if !present.is_empty() {
        summary.push_str(&format!("present in the inputs: {}; ", present.join(", ")));
    }
    let others = if present.is_empty() { "" } else { "other " };
    summary.push_str(&if top.is_empty() {
        format!("no {others}suspect lowers τ")
    } else {
        format!("costliest {others}suspects: {}", top.join(", "))
    });
    if let Some(o) = observed {
        let ok: Vec<&str> = variants
            .iter()
            .filter(|v| v.consistent_with_observed == Some(true))
            .map(|v| v.name.as_str())
            .collect();
        summary.push_str(&format!(
            "; consistent with observed τ {}: {}",
            crate::text::decimals4(o),
            if ok.is_empty() {
                "none".to_string()
            } else {
                ok.join(", ")
            }
        ));
    }
    summary
}
