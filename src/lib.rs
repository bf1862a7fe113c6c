//! hsparity: do two ways of loading the same checkpoint produce the same hidden
//! states, and what does a difference cost the drafter that reads them?
//!
//! The stages, in the order data flows (a module imports only from its own
//! stage or an earlier one; `docs/architecture.md`):
//! foundation ([`error`], [`kernels`], [`precision`], [`device`], …) →
//! [`checkpoint`] → [`loading`] → prompts ([`chat`], [`prompt_sets`],
//! [`prompts`]) → [`models`] → [`session`] → [`capture`] (with [`dump`],
//! [`import`]) → [`parity`] → [`drafter`] → [`triage`] → [`report`] →
//! [`commands`] → [`cli`]; `src/main.rs` is the thin binary over [`cli`].

#![warn(missing_docs)]

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
pub mod kernels;
pub mod loading;
pub mod memory;
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
pub mod width;
