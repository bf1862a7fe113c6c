//! `hsparity` command line: parses the arguments ([`hsparity::cli`]), runs
//! them, and maps the outcome to the exit code: 0 parity holds, 1 a finding
//! (a tolerance exceeded, missing or non-finite tensors, a τ gap), 2 bad
//! input or usage (one line on stderr).

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches};
use hsparity::cli::{self, Cli};

/// Large blocks on transparent huge pages ([`hsparity::memory`]).
#[global_allocator]
static ALLOC: hsparity::memory::LargePages = hsparity::memory::LargePages;

fn main() -> ExitCode {
    elementwise_on_the_calling_thread();
    hsparity::memory::reuse_freed_buffers();
    let cli = match parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            // --help, --version: clap's own text on stdout.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // No command: the help as clap lays it out, on stderr.
            let _ = e.print();
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln_or_drop(one_line(&e.render().to_string()));
            return ExitCode::from(2);
        }
    };
    match cli::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln_or_drop(format_args!("error: {e}"));
            ExitCode::from(2)
        }
    }
}

/// The command line, every option that takes a value accepting one that
/// looks like a negative number, so that `--max-new-tokens -3` is refused by
/// the option's own range (clap would take `-3` for a flag and suggest `--`).
fn parse() -> Result<Cli, clap::Error> {
    fn negative_values(c: clap::Command) -> clap::Command {
        c.mut_args(|a| {
            let takes = a.get_action().takes_values();
            a.allow_negative_numbers(takes)
        })
        .mut_subcommands(negative_values)
    }
    let matches = negative_values(Cli::command()).try_get_matches()?;
    Cli::from_arg_matches(&matches)
}

/// candle splits each large elementwise op (the roundings, `silu`, products,
/// sums) over its barrier pool (`candle_core::utils::BarrierPool`), whose
/// worker spins for `CANDLE_BARRIER_POOL_SPIN_LIMIT` (25 000) `pause`s after
/// every op and whose caller spins until the worker is done: on few cores
/// the spinning competes with the GEMM's rayon threads for the same cores.
/// Those ops are memory-bound, so unless `CANDLE_NUM_THREADS` is set they run
/// on the calling thread (a pool of no workers); the GEMMs keep rayon's
/// threads (`RAYON_NUM_THREADS`). Elementwise results do not depend on the
/// split, so no value changes. Set before any candle op creates the pool.
fn elementwise_on_the_calling_thread() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}

/// A clap usage error on one line: the message, then its detail
/// (`[possible values: …]`, a tip), without the usage and help pointers.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The error line on stderr; a stderr whose reader has gone is ignored (an
/// `eprintln!` would panic and exit 101 instead of 2).
fn eprintln_or_drop(line: impl std::fmt::Display) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}
