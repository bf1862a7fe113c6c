//! Parity: metrics over two captures of the same tensors, tolerances and
//! verdicts, and the per-layer table of a pair of loading paths. Shared by
//! `compare` (live paths) and by dump comparisons.

pub mod align;
pub mod conventions;
pub mod dumps;
pub mod incremental;
pub mod live;
pub mod localise;
pub mod metrics;
pub mod noise;
pub mod pairs;
pub mod routers;
pub mod verdict;

pub use incremental::{IncrementalCheck, IncrementalPlan};
pub use localise::{Localisation, PromptAgreement, PromptInputs};
pub use metrics::{Accumulator, Location, Metrics};
pub use pairs::{HiddenStateRow, PairObserver, PairReport, RouterAgreement};
pub use verdict::{Tolerance, Verdict};
