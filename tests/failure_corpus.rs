//! `docs/failure-corpus.md`: every public failure report the page says
//! hsparity catches is reproduced by the command of its row, on a shipped
//! fixture. Each command runs as written; its exit code is the row's, and
//! its output (stdout or stderr, unwrapped) contains the row's quoted
//! phrase, which names the cause. The page is the one list: a row added
//! there is tested here.

use crate::common;
use crate::docs_commands::shell_words;

/// One row of the page's first table.
struct Row {
    entry: String,
    words: Vec<String>,
    exit: i32,
    says: String,
}

/// The text between the first pair of backticks of `cell`.
fn quoted(cell: &str) -> Option<&str> {
    let start = cell.find('`')? + 1;
    let len = cell[start..].find('`')?;
    Some(&cell[start..start + len])
}

/// The rows of the table whose header is `| # | report | mechanism | …`.
fn rows(text: &str) -> Vec<Row> {
    let mut out = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.starts_with("| # | report | mechanism |") {
            in_table = true;
            continue;
        }
        if !in_table || line.starts_with("|---") {
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line
            .split(" | ")
            .map(|c| c.trim_matches(['|', ' ']))
            .collect();
        assert_eq!(cells.len(), 7, "a row of 7 cells: {line}");
        let command = quoted(cells[4]).unwrap_or_else(|| panic!("no command in {line}"));
        let words = shell_words(
            command
                .strip_prefix("hsparity ")
                .expect("an hsparity command"),
        );
        out.push(Row {
            entry: cells[0].to_string(),
            words,
            exit: cells[5]
                .parse()
                .unwrap_or_else(|_| panic!("exit of {line}")),
            says: quoted(cells[6])
                .unwrap_or_else(|| panic!("no phrase in {line}"))
                .to_string(),
        });
    }
    out
}

#[test]
fn every_reproduced_report_is_caught_with_its_cause_named() {
    let page = common::repo_root().join("docs/failure-corpus.md");
    let rows = rows(&std::fs::read_to_string(page).unwrap());
    assert!(rows.len() >= 15, "only {} rows", rows.len());
    let mut bad = Vec::new();
    for r in &rows {
        let reads_fixtures = r.words.iter().any(|w| w.starts_with("fixtures/"));
        let writes = r.words.iter().any(|w| w == "--out")
            || (["compare", "diff", "triage"].contains(&r.words[0].as_str())
                && !r.words.iter().any(|w| w == "--no-report"));
        if !reads_fixtures || writes {
            bad.push(format!(
                "#{}: runs on fixtures/ and writes nothing",
                r.entry
            ));
            continue;
        }
        let out = common::hsparity().args(&r.words).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.code() != Some(r.exit) {
            bad.push(format!(
                "#{}: exit {:?}, the page says {}",
                r.entry,
                out.status.code(),
                r.exit
            ));
        }
        if !text.contains(&r.says) {
            bad.push(format!(
                "#{}: {:?} not in the output:\n{text}",
                r.entry, r.says
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
