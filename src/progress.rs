//! Progress on stderr (indicatif), drawn only when stderr is a terminal and
//! `--quiet` is not given; reports and tables go to stdout untouched.
//!
//! Every bar counts the unit its work is in and shows an ETA:
//! - a streaming run ([`RunProgress`]): weights read (bytes as stored on
//!   disk, with throughput), decoder layers done, prompts done within the
//!   current layer;
//! - `drafter`: new tokens generated (prompts × (max new tokens + block
//!   size) per path, what the DFlash loop commits before it stops), and the
//!   drafter replays (each path's own, then its run on the first path's
//!   tokens); a path that reads the same weights as an earlier one is
//!   computed once and counted once (the totals are known up front);
//! - `triage`: variants run (the tap variants reuse the baseline's forward
//!   and are not counted), and the new tokens of the batch running now.
//!
//! With `HSPARITY_PROGRESS_LOG=<file>` every bar appends `<unit>
//! <position>/<length>` to that file when its group is cleared, drawn or
//! not (how the tests check that no bar ends at a total it did not count
//! through).

use std::sync::Mutex;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A group of bars drawn together (one [`MultiProgress`]); hidden when quiet
/// or when stderr is not a terminal (indicatif's own check).
pub struct Bars {
    multi: MultiProgress,
    /// Each bar with its unit, for `HSPARITY_PROGRESS_LOG`.
    made: Mutex<Vec<(ProgressBar, String)>>,
}

impl Bars {
    /// An empty group; `quiet` hides everything it will hold.
    pub fn new(quiet: bool) -> Self {
        Bars {
            multi: MultiProgress::with_draw_target(target(quiet)),
            made: Mutex::new(Vec::new()),
        }
    }

    fn add(&self, pb: ProgressBar, unit: &str, template: &str) -> ProgressBar {
        let pb = styled(self.multi.add(pb), template);
        if let Ok(mut made) = self.made.lock() {
            made.push((pb.clone(), unit.to_string()));
        }
        pb
    }

    /// Adds a bar over `len` steps counted in `unit` (`layers`, `prompts`, …).
    pub fn count(&self, len: u64, unit: &str) -> ProgressBar {
        self.add(ProgressBar::new(len), unit, &count_template(unit))
    }

    /// Adds a bar over `len` bytes (`{bytes}/{total_bytes}` and throughput).
    pub fn bytes(&self, len: u64, what: &str) -> ProgressBar {
        let t = format!(
            "{{spinner}} [{{elapsed_precise}}] {{bar:30}} {{bytes}}/{{total_bytes}} {what} ({{binary_bytes_per_sec}}, ETA {{eta}}) {{wide_msg}}"
        );
        self.add(ProgressBar::new(len), what, &t)
    }

    /// Removes every bar from the terminal (finish them first), and logs
    /// them where `HSPARITY_PROGRESS_LOG` asks.
    pub fn clear(&self) {
        let _ = self.multi.clear();
        let Some(path) = std::env::var_os("HSPARITY_PROGRESS_LOG") else {
            return;
        };
        let Ok(made) = self.made.lock() else {
            return;
        };
        let lines: String = made
            .iter()
            .map(|(pb, unit)| format!("{unit} {}/{}\n", pb.position(), pb.length().unwrap_or(0)))
            .collect();
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(lines.as_bytes());
        }
    }
}

/// The bars of a lock-step capture ([`crate::capture::run`]).
pub struct RunProgress {
    bars: Bars,
    /// Weight bytes read, as stored on disk (each shared copy counted once).
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
        let loading = bars.bytes(0, "weights read (stored bytes)");
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

fn target(quiet: bool) -> ProgressDrawTarget {
    if quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    }
}

fn count_template(unit: &str) -> String {
    format!(
        "{{spinner}} [{{elapsed_precise}}] {{bar:30}} {{pos}}/{{len}} {unit} (ETA {{eta}}) {{msg}}"
    )
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
