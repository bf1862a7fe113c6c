//! Progress on stderr (indicatif), drawn only when stderr is a terminal and
//! `--quiet` is not given; reports and tables go to stdout untouched.
//!
//! A streaming run shows three bars at once ([`RunProgress`]): weights
//! loaded (bytes converted to the compute dtype, with throughput), decoder
//! layers done, and prompts done within the current layer.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A group of bars drawn together (one [`MultiProgress`]); hidden when quiet
/// or when stderr is not a terminal (indicatif's own check).
pub struct Bars {
    multi: MultiProgress,
}

impl Bars {
    /// An empty group; `quiet` hides everything it will hold.
    pub fn new(quiet: bool) -> Self {
        Bars {
            multi: MultiProgress::with_draw_target(target(quiet)),
        }
    }

    /// Adds a bar over `len` steps counted in `unit` (`layers`, `prompts`, …).
    pub fn count(&self, len: u64, unit: &str) -> ProgressBar {
        styled(self.multi.add(ProgressBar::new(len)), &count_template(unit))
    }

    /// Adds a bar over `len` bytes (`{bytes}/{total_bytes}` and throughput).
    pub fn bytes(&self, len: u64, what: &str) -> ProgressBar {
        let t = format!(
            "{{spinner}} [{{elapsed_precise}}] {{bar:30}} {{bytes}}/{{total_bytes}} {what} ({{binary_bytes_per_sec}}) {{msg}}"
        );
        styled(self.multi.add(ProgressBar::new(len)), &t)
    }

    /// Removes every bar from the terminal (finish them first).
    pub fn clear(&self) {
        let _ = self.multi.clear();
    }
}

/// The bars of a lock-step capture ([`crate::capture::run`]).
pub struct RunProgress {
    bars: Bars,
    /// Weight bytes materialised (f32, each shared copy counted once).
    pub loading: ProgressBar,
    /// Decoder layers done (all paths, all prompts).
    pub layers: ProgressBar,
    /// Prompts done in the current layer; the message names the path.
    pub prompts: ProgressBar,
}

impl RunProgress {
    /// Bars for `layers` decoder layers over `prompts` prompts; the loading
    /// bar's length is set by the capture once it knows what it will load.
    pub fn new(layers: usize, prompts: usize, quiet: bool) -> Self {
        let bars = Bars::new(quiet);
        let loading = bars.bytes(0, "weights loaded");
        let layers = bars.count(layers as u64, "layers");
        let prompts = bars.count(prompts as u64, "prompts");
        RunProgress {
            bars,
            loading,
            layers,
            prompts,
        }
    }

    /// Removes the bars (before the report is printed).
    pub fn finish(&self) {
        for pb in [&self.loading, &self.layers, &self.prompts] {
            pb.finish_and_clear();
        }
        self.bars.clear();
    }
}

/// One bar over `len` steps of `unit` on its own (the `drafter` and `triage`
/// verbs); hidden as [`Bars`] are.
pub fn single(len: u64, unit: &str, quiet: bool) -> ProgressBar {
    styled(
        ProgressBar::with_draw_target(Some(len), target(quiet)),
        &count_template(unit),
    )
}

fn target(quiet: bool) -> ProgressDrawTarget {
    if quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    }
}

fn count_template(unit: &str) -> String {
    format!("{{spinner}} [{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} {unit} {{msg}}")
}

fn styled(pb: ProgressBar, template: &str) -> ProgressBar {
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style);
    }
    pb
}

/// `eprintln!` for the lines hsparity writes beside its result (the report's
/// location, the drafter's plan, the error line): a stderr whose reader has
/// gone (`2>&1 | head -1`) is ignored, where `eprintln!` would panic and turn
/// the verdict's exit code into 101.
macro_rules! stderr_line {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
pub(crate) use stderr_line;
