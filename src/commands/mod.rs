//! The verbs of the CLI as library functions: typed options in, a report
//! value out. Each is a few named steps over the pipeline modules;
//! [`crate::cli`] parses the flags into these options and prints the result.

pub mod compare;
pub mod diff;
pub mod drafter;
pub mod dump;
pub mod features;
pub mod import;
pub mod inventory;
pub mod prompts;
pub mod triage;
