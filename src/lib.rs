//! hsparity: do two ways of loading the same checkpoint produce the same hidden
//! states, and what does a difference cost the drafter that reads them?
//!
//! Pipeline (one module each): [`checkpoint`] → [`loading`] → [`models`] →
//! [`capture`] → [`parity`] → [`report`]; [`dump`] reads and writes captures.

#![warn(missing_docs)]

/// `eprintln!` for the lines hsparity writes beside its result (the report's
/// location, the drafter's plan, the error line): a stderr whose reader has
/// gone (`2>&1 | head -1`) is ignored, where `eprintln!` would panic and turn
/// the verdict's exit code into 101.
#[macro_export]
macro_rules! stderr_line {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod capture;
pub mod chat;
pub mod checkpoint;
pub mod cli;
pub mod commands;
pub mod device;
pub mod drafter;
pub mod dump;
pub mod error;
pub mod import;
pub mod input;
pub mod loading;
pub mod models;
pub mod output;
pub mod parity;
pub mod precision;
pub mod progress;
pub mod prompt_sets;
pub mod prompts;
pub mod report;
pub mod session;
pub mod sysinfo;
pub mod text;
pub mod triage;
