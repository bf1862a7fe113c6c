//! One row model for every table a report shows: a [`Table`] is built once
//! as data (columns + rows of [`Cell`]s) and sunk into comfy-table for the
//! terminal ([`Table::terminal`]) or into Markdown ([`Table::markdown`]).
//! The sinks only style: bold / colour, backticks around code spans, a
//! verdict upper- or lower-cased; they never compute.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Attribute, CellAlignment, Color};

use crate::parity::Verdict;

/// A piece of cell text.
#[derive(Debug, Clone, PartialEq)]
pub enum Span {
    /// Plain text.
    Plain(String),
    /// A name (path, class, tensor): `` `x` `` in Markdown, plain on the terminal.
    Code(String),
}

/// One table cell.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// Text made of spans.
    Text(Vec<Span>),
    /// A verdict (`PASS` coloured on the terminal, `pass` in Markdown) and
    /// text that follows it.
    Verdict(Verdict, String),
}

impl Cell {
    /// A plain-text cell.
    pub fn plain(s: impl Into<String>) -> Self {
        Cell::Text(vec![Span::Plain(s.into())])
    }

    /// A code-span cell (a name).
    pub fn code(s: impl Into<String>) -> Self {
        Cell::Text(vec![Span::Code(s.into())])
    }

    /// A verdict cell.
    pub fn verdict(v: Verdict) -> Self {
        Cell::Verdict(v, String::new())
    }

    fn text(&self, markdown: bool) -> String {
        match self {
            Cell::Text(spans) => spans
                .iter()
                .map(|s| match s {
                    Span::Plain(t) => t.clone(),
                    Span::Code(t) if markdown => format!("`{t}`"),
                    Span::Code(t) => t.clone(),
                })
                .collect(),
            Cell::Verdict(v, rest) if markdown => format!("{}{rest}", v.as_str()),
            Cell::Verdict(v, rest) => format!("{}{rest}", v.as_str().to_uppercase()),
        }
    }
}

impl From<String> for Cell {
    fn from(s: String) -> Self {
        Cell::plain(s)
    }
}

impl From<&str> for Cell {
    fn from(s: &str) -> Self {
        Cell::plain(s)
    }
}

/// Where a column is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sinks {
    /// Terminal and Markdown.
    Both,
    /// Terminal only (timings, wide detail columns).
    Terminal,
    /// Markdown only.
    Markdown,
}

/// One column: its title, alignment, where it shows, and whether a
/// highlighted row makes it strong (bold).
#[derive(Debug, Clone)]
pub struct Column {
    /// Header text.
    pub title: String,
    /// Right-aligned (numbers, indices).
    pub right: bool,
    /// Which sinks show it.
    pub sinks: Sinks,
    /// Bold (and red on the terminal) in a highlighted row.
    pub strong: bool,
}

impl Column {
    /// A left-aligned column shown everywhere.
    pub fn new(title: impl Into<String>) -> Self {
        Column {
            title: title.into(),
            right: false,
            sinks: Sinks::Both,
            strong: false,
        }
    }

    /// Right-aligned.
    pub fn right(mut self) -> Self {
        self.right = true;
        self
    }

    /// Shown only in `sinks`.
    pub fn only(mut self, sinks: Sinks) -> Self {
        self.sinks = sinks;
        self
    }

    /// Strong in highlighted rows.
    pub fn strong(mut self) -> Self {
        self.strong = true;
        self
    }
}

/// One row; `highlight` marks it (the first divergent hidden state).
#[derive(Debug, Clone)]
pub struct Row {
    /// One cell per column.
    pub cells: Vec<Cell>,
    /// Highlighted row.
    pub highlight: bool,
}

impl Row {
    /// A plain row.
    pub fn new(cells: Vec<Cell>) -> Self {
        Row {
            cells,
            highlight: false,
        }
    }
}

/// A table as data.
#[derive(Debug, Clone, Default)]
pub struct Table {
    /// Columns, in order.
    pub columns: Vec<Column>,
    /// Rows, each with one cell per column.
    pub rows: Vec<Row>,
}

impl Table {
    /// A table with these columns and no rows.
    pub fn new(columns: Vec<Column>) -> Self {
        Table {
            columns,
            rows: Vec::new(),
        }
    }

    /// Appends a row.
    pub fn push(&mut self, row: Row) {
        debug_assert_eq!(row.cells.len(), self.columns.len());
        self.rows.push(row);
    }

    fn shown(&self, markdown: bool) -> Vec<usize> {
        let skip = if markdown {
            Sinks::Terminal
        } else {
            Sinks::Markdown
        };
        (0..self.columns.len())
            .filter(|&i| self.columns[i].sinks != skip)
            .collect()
    }

    /// The terminal table (comfy-table, condensed UTF-8 borders).
    pub fn terminal(&self) -> comfy_table::Table {
        let cols = self.shown(false);
        let mut t = comfy_table::Table::new();
        t.load_style(UTF8_FULL_CONDENSED);
        t.set_header(cols.iter().map(|&i| self.columns[i].title.clone()));
        for row in &self.rows {
            t.add_row(cols.iter().map(|&i| {
                let (col, cell) = (&self.columns[i], &row.cells[i]);
                let mut c = comfy_table::Cell::new(cell.text(false));
                if col.right {
                    c = c.set_alignment(CellAlignment::Right);
                }
                if let Cell::Verdict(v, _) = cell {
                    c = match v {
                        Verdict::Pass => c.fg(Color::Green),
                        Verdict::Warn => c.fg(Color::Yellow).add_attribute(Attribute::Bold),
                        Verdict::Fail => c.fg(Color::Red).add_attribute(Attribute::Bold),
                    };
                } else if row.highlight && col.strong {
                    c = c.add_attribute(Attribute::Bold).fg(Color::Red);
                }
                c
            }));
        }
        t
    }

    /// The Markdown table: header, alignment row, one line per row.
    pub fn markdown(&self) -> String {
        let cols = self.shown(true);
        let mut md = String::from("|");
        for &i in &cols {
            match self.columns[i].title.as_str() {
                "" => md.push_str(" |"),
                title => md.push_str(&format!(" {} |", md_cell(title))),
            }
        }
        md.push_str("\n|");
        for &i in &cols {
            md.push_str(if self.columns[i].right {
                "---:|"
            } else {
                "---|"
            });
        }
        md.push('\n');
        for row in &self.rows {
            md.push('|');
            for &i in &cols {
                let text = md_cell(&row.cells[i].text(true));
                if row.highlight && self.columns[i].strong {
                    md.push_str(&format!(" **{text}** |"));
                } else {
                    md.push_str(&format!(" {text} |"));
                }
            }
            md.push('\n');
        }
        md
    }
}

/// A cell's text as a Markdown table holds it: `|` escaped (it would end
/// the cell), line breaks as `<br>` (they would end the row).
pub fn md_cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', "<br>")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `|` in a cell or a title would end the cell, a line break the row.
    #[test]
    fn markdown_cells_escape_what_would_break_the_table() {
        let mut t = Table::new(vec![Column::new("a|b"), Column::new("c")]);
        t.push(Row::new(vec!["x | y".into(), "two\nlines".into()]));
        assert_eq!(
            t.markdown(),
            "| a\\|b | c |\n|---|---|\n| x \\| y | two<br>lines |\n"
        );
    }

    #[test]
    fn one_table_two_sinks() {
        let mut t = Table::new(vec![
            Column::new("hs").right().strong(),
            Column::new("path"),
            Column::new("seconds").only(Sinks::Terminal),
            Column::new("verdict").strong(),
        ]);
        t.push(Row::new(vec![
            "0".into(),
            Cell::code("causal-lm"),
            "1.25".into(),
            Cell::verdict(Verdict::Pass),
        ]));
        t.push(Row {
            cells: vec![
                "1".into(),
                Cell::Text(vec![Span::Code("vlm".into()), Span::Plain(" path".into())]),
                "0.50".into(),
                Cell::Verdict(Verdict::Fail, " ← first".into()),
            ],
            highlight: true,
        });
        assert_eq!(
            t.markdown(),
            "| hs | path | verdict |\n|---:|---|---|\n| 0 | `causal-lm` | pass |\n| **1** | `vlm` path | **fail ← first** |\n"
        );
        let term = t.terminal().to_string();
        assert!(
            term.contains("seconds") && term.contains("FAIL ← first"),
            "{term}"
        );
        assert!(!term.contains('`'), "{term}");
    }
}
