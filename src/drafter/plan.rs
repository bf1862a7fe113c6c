//! The memory plan of a drafter evaluation: keep each loading path's
//! weights *resident* in their stored dtype (read once), or *stream* them
//! from the mapped checkpoint layer by layer every sweep, as `compare` does.
//! Either way no layer is widened to f32 before it runs and none stays
//! widened after; the plan decides only whether the stored bytes stay in
//! memory.

use serde::Serialize;

use crate::models::dflash::Drafter;
use crate::session::Session;

/// Where the target's weights live between sweeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Residency {
    /// Read once into memory in their stored dtype.
    Resident,
    /// Read from the mapped checkpoint every sweep, one layer at a time.
    Streamed,
}

/// The memory plan of evaluating `drafter` on `session`'s paths.
pub fn plan_for(session: &Session, drafter: &Drafter, budget: Option<u64>) -> MemoryPlan {
    let target = session
        .paths
        .iter()
        .map(|p| p.view.stored_bytes())
        .max()
        .unwrap_or(0);
    MemoryPlan::new(target, drafter.stored_bytes(), budget)
}

/// Fraction of the available memory the default budget takes.
pub const DEFAULT_BUDGET_FRACTION: f64 = 0.75;

/// The default budget where the OS does not say what is available.
pub const FALLBACK_BUDGET: u64 = 8 << 30;

/// The plan of one run (the report's `plan`).
#[derive(Debug, Clone, Serialize)]
pub struct MemoryPlan {
    /// Resident or streamed.
    pub mode: Residency,
    /// The budget the stored weights had to fit, bytes.
    pub budget_bytes: u64,
    /// Where the budget came from (`--memory-budget`, or the share of the
    /// available memory).
    pub budget_source: String,
    /// Stored bytes of the largest loading path's text model and lm_head.
    pub target_bytes: u64,
    /// Stored bytes of the drafter (always held: it is small next to the target).
    pub drafter_bytes: u64,
}

impl MemoryPlan {
    /// Resident when the target's stored weights plus the drafter's fit the
    /// budget: `budget` (`--memory-budget`), else
    /// [`DEFAULT_BUDGET_FRACTION`] of the available memory.
    pub fn new(target_bytes: u64, drafter_bytes: u64, budget: Option<u64>) -> Self {
        let (budget_bytes, budget_source) = match budget {
            Some(b) => (b, "--memory-budget".to_string()),
            None => match crate::sysinfo::available_memory_bytes() {
                Some(avail) => (
                    (avail as f64 * DEFAULT_BUDGET_FRACTION) as u64,
                    format!(
                        "{:.0}% of the available memory ({:.1} GiB)",
                        DEFAULT_BUDGET_FRACTION * 100.0,
                        avail as f64 / (1u64 << 30) as f64
                    ),
                ),
                None => (
                    FALLBACK_BUDGET,
                    "default (the OS does not report available memory)".to_string(),
                ),
            },
        };
        let mode = if target_bytes.saturating_add(drafter_bytes) <= budget_bytes {
            Residency::Resident
        } else {
            Residency::Streamed
        };
        Self {
            mode,
            budget_bytes,
            budget_source,
            target_bytes,
            drafter_bytes,
        }
    }

    /// One line for the terminal and the report.
    pub fn describe(&self) -> String {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        format!(
            "{}: target {:.2} GiB + drafter {:.2} GiB stored, budget {:.2} GiB ({})",
            match self.mode {
                Residency::Resident => "resident (weights held in their stored dtype)",
                Residency::Streamed =>
                    "streamed (layer by layer from the mapped checkpoint, every sweep)",
            },
            gib(self.target_bytes),
            gib(self.drafter_bytes),
            gib(self.budget_bytes),
            self.budget_source
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_when_it_fits() {
        let p = MemoryPlan::new(10, 5, Some(15));
        assert_eq!(p.mode, Residency::Resident);
        let p = MemoryPlan::new(10, 6, Some(15));
        assert_eq!(p.mode, Residency::Streamed);
        assert!(p.describe().contains("--memory-budget"));
    }
}
