//! One row model for every table a report shows: a [`Table`] is built once
//! as data (columns + rows of [`Cell`]s) and sunk into comfy-table for the
//! terminal ([`Table::render`]) or into Markdown ([`Table::markdown`]).
//! The sinks only style: bold / colour, backticks around code spans, a
//! verdict upper- or lower-cased; they never compute.
//!
//! On a bounded terminal ([`Width`]) a table that is wider than the width
//! wraps its cells at word boundaries (comfy-table's dynamic arrangement,
//! no word split); when even unsplit words do not fit, its columns are
//! shown in parts, each repeating the key columns (the row's name).

use comfy_table::{
    presets::UTF8_FULL_CONDENSED, Attribute, CellAlignment, Color, ColumnConstraint,
    ContentArrangement,
};

use crate::width::Width;

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
    /// Names the row: repeated in every part of a table split to fit the
    /// terminal (the first column when no column is a key).
    pub key: bool,
}

impl Column {
    /// A left-aligned column shown everywhere.
    pub fn new(title: impl Into<String>) -> Self {
        Column {
            title: title.into(),
            right: false,
            sinks: Sinks::Both,
            strong: false,
            key: false,
        }
    }

    /// A key column (see [`Column::key`]).
    pub fn key(mut self) -> Self {
        self.key = true;
        self
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

    /// The terminal table (comfy-table, condensed UTF-8 borders), laid out
    /// for `width`: as wide as its content when that fits (or the width is
    /// unbounded); otherwise cells wrap at word boundaries; otherwise the
    /// columns are shown in parts that fit, each led by the key columns.
    pub fn render(&self, width: Width) -> String {
        let cols = self.shown(false);
        let Some(w) = width.columns() else {
            return self.comfy(&cols, None).to_string();
        };
        let natural: Vec<usize> = cols.iter().map(|&i| self.natural_width(i)).collect();
        if table_width(&natural) <= w {
            return self.comfy(&cols, None).to_string();
        }
        self.parts(&cols, w)
            .iter()
            .map(|part| self.comfy(part, Some(w)).to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The shown columns `cols` grouped into parts that fit `w` unwrapped
    /// (a part whose one column is too wide for it wraps), the key columns
    /// leading every part, the others in order.
    fn parts(&self, cols: &[usize], w: usize) -> Vec<Vec<usize>> {
        let mut keys: Vec<usize> = cols
            .iter()
            .copied()
            .filter(|&i| self.columns[i].key)
            .collect();
        if keys.is_empty() {
            keys.extend(cols.first());
        }
        let fits = |part: &[usize], of: &dyn Fn(usize) -> usize| {
            let widths: Vec<usize> = part.iter().map(|&i| of(i)).collect();
            table_width(&widths) <= w
        };
        let mut parts: Vec<Vec<usize>> = Vec::new();
        let mut part = keys.clone();
        for &i in cols.iter().filter(|i| !keys.contains(i)) {
            part.push(i);
            if !fits(&part, &|i| self.packed_width(i)) && part.len() > keys.len() + 1 {
                part.pop();
                parts.push(std::mem::replace(&mut part, keys.clone()));
                part.push(i);
            }
        }
        if part.len() > keys.len() || parts.is_empty() {
            parts.push(part);
        }
        parts
    }

    /// Display width of column `i`'s widest cell (or title), unwrapped.
    fn natural_width(&self, i: usize) -> usize {
        self.texts(i)
            .flat_map(|t| t.lines().map(display_width).collect::<Vec<_>>())
            .max()
            .unwrap_or(0)
    }

    /// Width column `i` is packed at: its natural width, but a column of
    /// prose wider than [`PROSE_WRAP`] counts as wrapped to that (or to its
    /// widest word); numbers and names are never wrapped to fit more columns.
    /// Key columns are never wrapped: they name the rows of every part.
    fn packed_width(&self, i: usize) -> usize {
        if self.columns[i].key {
            return self.natural_width(i);
        }
        self.natural_width(i)
            .min(PROSE_WRAP.max(self.word_width(i)))
    }

    /// Display width of column `i`'s widest word: the narrowest it can be
    /// without splitting one.
    fn word_width(&self, i: usize) -> usize {
        self.texts(i)
            .flat_map(|t| t.split_whitespace().map(display_width).collect::<Vec<_>>())
            .max()
            .unwrap_or(0)
    }

    /// Column `i`'s title and terminal cell texts.
    fn texts(&self, i: usize) -> impl Iterator<Item = String> + '_ {
        std::iter::once(self.columns[i].title.clone())
            .chain(self.rows.iter().map(move |r| r.cells[i].text(false)))
    }

    /// The comfy-table of columns `cols`; with `width`, dynamically arranged
    /// to it, no column narrower than its widest word (where that fits).
    fn comfy(&self, cols: &[usize], width: Option<usize>) -> comfy_table::Table {
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
        if let Some(w) = width {
            t.set_content_arrangement(ContentArrangement::Dynamic);
            t.set_width(u16::try_from(w).unwrap_or(u16::MAX));
            let words: Vec<usize> = cols.iter().map(|&i| self.word_width(i)).collect();
            if table_width(&words) <= w {
                for (k, &least) in words.iter().enumerate() {
                    // comfy-table's fixed widths count the padding (a space
                    // either side).
                    let least = least + 2;
                    if let Some(c) = t.column_mut(k) {
                        c.set_constraint(ColumnConstraint::LowerBoundary(
                            comfy_table::Width::Fixed(u16::try_from(least).unwrap_or(u16::MAX)),
                        ));
                    }
                }
            }
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

/// Width a prose column may be wrapped to so that more columns share a part.
const PROSE_WRAP: usize = 24;

/// Width of a condensed UTF-8 table whose columns hold `content` columns
/// of text: each column adds one space either side and a border.
fn table_width(content: &[usize]) -> usize {
    content.iter().sum::<usize>() + 3 * content.len() + 1
}

fn display_width(s: &str) -> usize {
    textwrap::core::display_width(s)
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
        let term = t.render(Width::UNBOUNDED);
        assert!(
            term.contains("seconds") && term.contains("FAIL ← first"),
            "{term}"
        );
        assert!(!term.contains('`'), "{term}");
    }

    fn wide() -> Table {
        let mut t = Table::new(vec![
            Column::new("variant").key(),
            Column::new("cos min").right(),
            Column::new("max abs diff"),
            Column::new("what it emulates"),
        ]);
        t.push(Row::new(vec![
            "gdn-recurrent".into(),
            "0.99917612".into(),
            "1.030e-1 @p1 t10 f28".into(),
            "the Gated DeltaNet run token by token, as a cached decode does".into(),
        ]));
        t
    }

    fn words(t: &Table) -> Vec<String> {
        t.rows
            .iter()
            .flat_map(|r| r.cells.iter().map(|c| c.text(false)))
            .chain(t.columns.iter().map(|c| c.title.clone()))
            .flat_map(|s| s.split_whitespace().map(String::from).collect::<Vec<_>>())
            .collect()
    }

    /// At each width every line fits and every word of every cell is shown
    /// whole; unbounded, the table is one line per row.
    #[test]
    fn a_table_fits_the_width_it_is_given() {
        let t = wide();
        let one = t.render(Width::UNBOUNDED);
        assert_eq!(one.lines().count(), 5, "{one}");
        for w in [40, 60, 80, 100] {
            let out = t.render(Width(Some(w)));
            for l in out.lines() {
                assert!(display_width(l) <= w, "width {w}: {l}\n{out}");
            }
            for word in words(&t) {
                assert!(out.contains(&word), "width {w}: {word} lost\n{out}");
            }
        }
        // 40 columns cannot hold every column side by side: the key column
        // leads each part.
        let narrow = t.render(Width(Some(40)));
        assert!(narrow.matches("gdn-recurrent").count() >= 2, "{narrow}");
    }
}
