//! The width terminal output is laid out for, resolved once per run
//! ([`Width::detect`]), and the last step of every terminal rendering
//! ([`fill`]): prose lines longer than the width wrap at word boundaries with
//! a hanging indent. Tables lay themselves out for the same width
//! ([`crate::report::tabular::Table::render`]).

use std::io::IsTerminal;

/// Columns terminal output may use; `None` = unbounded (output piped to a
/// file or another program with no `COLUMNS` set: nothing is wrapped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Width(pub Option<usize>);

/// Narrowest layout: below it the width is taken as this.
pub const MIN_COLUMNS: usize = 40;

impl Width {
    /// Unbounded (every line as long as its content).
    pub const UNBOUNDED: Width = Width(None);

    /// `COLUMNS` when it holds a positive number (whether or not stdout is a
    /// terminal, as `ls` and `git` do); otherwise the terminal's width when
    /// stdout is one; otherwise unbounded.
    pub fn detect() -> Width {
        let from_env = std::env::var("COLUMNS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0);
        let w = from_env.or_else(|| {
            std::io::stdout()
                .is_terminal()
                .then(|| comfy_table::Table::new().width())
                .flatten()
                .map(usize::from)
                .filter(|&n| n > 0)
        });
        Width(w.map(|n| n.max(MIN_COLUMNS)))
    }

    /// The width for lines written to stderr beside the result (the
    /// drafter's plan): `COLUMNS`, else stderr's terminal width, else
    /// unbounded.
    pub fn for_stderr() -> Width {
        if std::env::var_os("COLUMNS").is_some() {
            return Width::detect();
        }
        if !std::io::stderr().is_terminal() {
            return Width::UNBOUNDED;
        }
        Width(
            comfy_table::Table::new()
                .width()
                .map(|n| usize::from(n).max(MIN_COLUMNS)),
        )
    }

    /// The width, when bounded.
    pub fn columns(self) -> Option<usize> {
        self.0
    }
}

/// True for a line that belongs to a table (a comfy-table border or row):
/// tables are laid out by [`crate::report::tabular::Table::render`], never re-wrapped.
fn is_table_line(line: &str) -> bool {
    matches!(
        line.chars().next(),
        Some('┌' | '│' | '╞' | '├' | '└' | '╭' | '╰')
    )
}

/// `text` with every prose line longer than `width` wrapped at word
/// boundaries; continuation lines are indented two spaces past the line's
/// own indent. Words longer than the width are kept whole (a path or a
/// tensor name is never split), table lines are left as they are.
pub fn fill(text: &str, width: Width) -> String {
    let Some(w) = width.columns() else {
        return text.to_string();
    };
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, nl) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        if is_table_line(body) || textwrap::core::display_width(body) <= w {
            out.push_str(line);
            continue;
        }
        let content = body.trim_start();
        let indent = &body[..body.len() - content.len()];
        let hanging = format!("{indent}  ");
        let opts = textwrap::Options::new(w)
            .initial_indent(indent)
            .subsequent_indent(&hanging)
            .break_words(false)
            // Never at a hyphen: `missing-lm_head`, `--max-new-tokens` and
            // paths stay whole.
            .word_splitter(textwrap::WordSplitter::NoHyphenation);
        out.push_str(&textwrap::fill(content, opts));
        out.push_str(nl);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_prose_wraps_with_a_hanging_indent() {
        let text = "  causal-lm dtype bf16 (text_config.dtype), computed in bf16\nshort\n";
        let got = fill(text, Width(Some(40)));
        assert_eq!(
            got,
            "  causal-lm dtype bf16\n    (text_config.dtype), computed in\n    bf16\nshort\n"
        );
        for l in got.lines() {
            assert!(l.chars().count() <= 40, "{l}");
        }
    }

    #[test]
    fn tables_and_unbounded_output_are_left_alone() {
        let row = format!("│ {} │\n", "x".repeat(100));
        assert_eq!(fill(&row, Width(Some(40))), row);
        let long = format!("{}\n", "word ".repeat(50));
        assert_eq!(fill(&long, Width::UNBOUNDED), long);
    }

    #[test]
    fn words_longer_than_the_width_stay_whole() {
        let name = "model.language_model.layers.0.linear_attn.conv1d.weight";
        let got = fill(&format!("MISSING {name} here\n"), Width(Some(40)));
        assert!(got.lines().any(|l| l.trim() == name), "{got}");
    }
}
