//! hsparity's integration tests, one binary (`cargo test --release`). Each
//! module is one subject; put a new test beside the tests of its subject,
//! and start a module only for a new one. Helpers shared by several modules
//! live in `common` (fixtures, sparse checkpoints, the `hsparity` command,
//! the named closeness tiers); expected numbers come from the generators in
//! `tools/`, never typed in.

mod common;

// Fidelity against transformers 5.23.0: hidden states, logits and load
// reports of each loading path on the fixtures' goldens, the incremental
// check (and when compare runs it). A new family, layout or loading rule
// gets its golden test here, and its fixture a line in `families`.
mod diagnosis;
mod divergence;
mod gdn_kernels;
mod golden_tiny;
mod incremental;
mod inventory_27b;
mod inventory_tiny;
mod moe_block;
mod moe_conversion;
mod moe_golden;
mod moe_inventory;
mod moe_router;
mod noise_floor;
mod qwen3;
mod router_dumps;

// hsparity's own kernels and bitwise refactors of the forward: every fast
// path against candle's product (or the slow path it replaces), bit for bit.
// A new kernel or a new way to batch the forward is tested here.
mod amx_kernel;
mod batched_forward;
mod decode_steps;
mod kernels;
mod streamed;

// The drafter: τ and DDTree against the dflash package, its three modes
// (resident, streamed, supplied trajectories), triage, the harness and engine
// faults it emulates, the bootstrap.
mod bootstrap;
mod drafter;
mod drafter_audit;
mod faults;
mod harness;
mod moe_drafter;
mod resume;
mod trajectories;
mod triage;

// Other engines' captures and dumps (generated, and real engines' own files in
// engine_runs): import, diff, align, engine metrics.
mod align;
mod diff;
mod engine_runs;
mod engines;
mod import;

// Prompts: chat templates, benchmark sets, the prompt options.
mod chat_templates;
mod prompt_options;
mod prompt_sets;

// The command line and what it writes: exit codes, reports, the JSON schema,
// every command the README and docs/ show, the terminal's layout and progress.
mod cli;
mod docs_commands;
mod failure_corpus;
mod report_render;
mod report_schema;
mod terminal_layout;

// Inputs that must be refused with a clear error: bad checkpoints, the Hub
// cache, the bad-input and hostile-input corpora, bounded property tests of
// the parsers. A new way to refuse input is tested here.
mod bad_inputs;
mod checkpoint_errors;
mod checkpoint_resolve;
mod checkpoint_resolve_env;
mod fuzz_headers;
mod fuzz_inputs;
mod hostile_inputs;

// The shape of the repository: the import graph, sizes, citations; each
// model family's tensor names against its loader and its state dict.
mod architecture;
mod families;
