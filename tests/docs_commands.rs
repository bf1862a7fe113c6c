//! Every `hsparity …` command the README and the `docs/` pages show on the
//! shipped fixtures (or on files an earlier command shown wrote under
//! `target/`) still runs as written: it parses, runs, and ends in a
//! verdict (exit 0 or 1, never a usage error or a crash), and where its
//! comment says `exit N` it exits N. Report folders are not written
//! (`--no-report` is added where the command would write one), and output
//! files named under `target/` go to a temporary folder instead.

use std::path::Path;

use crate::common;

/// One shown command: where it is, its words (after `hsparity`), and the
/// exit code its comment states, if any.
struct Shown {
    place: String,
    words: Vec<String>,
    exit: Option<i32>,
}

/// Words of a shell command line: blanks split, `'…'` and `"…"` quote.
pub fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut cur, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (None, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        words.push(cur);
    }
    words
}

/// The commands of `file`'s code blocks that run on `fixtures/`.
fn shown_in(file: &Path) -> Vec<Shown> {
    let text = std::fs::read_to_string(file).unwrap();
    let rel = file
        .strip_prefix(common::repo_root())
        .unwrap()
        .display()
        .to_string();
    let mut out = Vec::new();
    let mut in_block = false;
    let lines: Vec<&str> = text.lines().collect();
    let mut n = 0;
    while n < lines.len() {
        let at = n;
        let mut line = lines[n].to_string();
        // A command continued on the next lines (`\` at the end).
        while line.trim_end().ends_with('\\') && n + 1 < lines.len() {
            line = line.trim_end().trim_end_matches('\\').to_string() + " " + lines[n + 1].trim();
            n += 1;
        }
        n += 1;
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        let t = line.trim();
        let t = t.strip_prefix("$ ").unwrap_or(t);
        let Some(cmd) = t.strip_prefix("hsparity ") else {
            continue;
        };
        if !in_block || !(cmd.contains("fixtures/") || cmd.contains("target/")) {
            continue;
        }
        let (cmd, comment) = cmd.split_once(" #").unwrap_or((cmd, ""));
        let cmd = cmd.split(" | ").next().unwrap_or(cmd);
        let exit = comment
            .split_once("exit ")
            .and_then(|(_, r)| r.chars().next())
            .and_then(|c| c.to_digit(10))
            .map(|d| d as i32);
        out.push(Shown {
            place: format!("{rel}:{}", at + 1),
            words: shell_words(cmd),
            exit,
        });
    }
    out
}

#[test]
fn every_command_the_docs_show_on_the_fixtures_runs() {
    let root = common::repo_root();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let tmp = tempfile::tempdir().unwrap();
    let mut bad = Vec::new();
    let mut ran = 0;
    for shown in files.iter().flat_map(|f| shown_in(f)) {
        let mut words = shown.words.clone();
        // Files under `target/` go to the temporary folder; a command reading
        // one that no earlier command shown wrote (a shell step made it) is
        // not run here.
        let mut missing_input = false;
        for k in 0..words.len() {
            if let Some(rest) = words[k].strip_prefix("target/") {
                let p = tmp.path().join(rest);
                let is_output = k > 0 && words[k - 1] == "--out";
                missing_input |= !is_output && !p.exists();
                words[k] = p.display().to_string();
            }
        }
        if missing_input {
            continue;
        }
        let writes_report = ["compare", "diff", "triage"].contains(&words[0].as_str());
        if writes_report
            && !words
                .iter()
                .any(|w| w == "--no-report" || w == "--report-dir")
        {
            words.push("--no-report".into());
        }
        let has_quiet = ["compare", "drafter", "triage", "dump"].contains(&words[0].as_str());
        if has_quiet && !words.iter().any(|w| w == "--quiet" || w == "-q") {
            words.push("--quiet".into());
        }
        let out = common::hsparity().args(&words).output().unwrap();
        let code = out.status.code().unwrap_or(-1);
        let ok = match shown.exit {
            Some(want) => code == want,
            None => code == 0 || code == 1,
        };
        if !ok {
            bad.push(format!(
                "{}: hsparity {} exited {code} (stated {:?}): {}",
                shown.place,
                shown.words.join(" "),
                shown.exit,
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ));
        }
        ran += 1;
    }
    assert!(
        ran >= 20,
        "only {ran} commands found in the README and docs/"
    );
    assert!(
        bad.is_empty(),
        "commands the docs show that do not run as written:\n{}",
        bad.join("\n")
    );
}

#[test]
fn shell_words_split_as_a_shell_does() {
    assert_eq!(
        shell_words(r#"dump x --prompt "The hidden state." --system 'a b' ''"#),
        [
            "dump",
            "x",
            "--prompt",
            "The hidden state.",
            "--system",
            "a b",
            ""
        ]
    );
}

/// Every `hsparity drafter …` command an example report's next check prints
/// gives the τ the sentence quotes, run as printed.
#[test]
fn the_example_reports_next_checks_give_the_tau_they_quote() {
    let dir = common::repo_root().join("reports/examples");
    let mut checked = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path().join("report.json");
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let Some(next) = v["next_check"].as_str() else {
            continue;
        };
        let Some((_, rest)) = next.split_once("`hsparity drafter ") else {
            continue;
        };
        let (cmd, after) = rest.split_once('`').unwrap();
        let quoted = after
            .split_once("gives τ ")
            .map(|(_, t)| t.split_whitespace().next().unwrap().to_string())
            .unwrap_or_else(|| panic!("{}: no quoted τ in {next}", p.display()));
        let mut words = vec!["drafter".to_string()];
        words.extend(shell_words(cmd));
        words.extend(["--json".into(), "--quiet".into()]);
        let out = common::hsparity().args(&words).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let tau = r["paths"][0]["tau_macro"].as_f64().unwrap();
        assert_eq!(
            format!("{tau:.2}"),
            quoted,
            "{}: `hsparity drafter {cmd}`",
            p.display()
        );
        checked += 1;
    }
    assert!(
        checked >= 1,
        "no example report prints a next check with a drafter command"
    );
}

/// The README's main example prints what the README quotes: each quoted line
/// of the output block (`…` marks what is left out) is a line of stdout, in
/// order.
#[test]
fn the_readme_main_example_prints_what_it_quotes() {
    let readme = std::fs::read_to_string(common::repo_root().join("README.md")).unwrap();
    let (_, after) = readme
        .split_once("```sh\nhsparity compare fixtures/toy-pair/target")
        .expect("the main example");
    let (args, rest) = after.split_once("\n```").unwrap();
    let (_, quoted) = rest
        .split_once("output on stdout")
        .and_then(|(a, b)| Some((a, b.split_once("```\n")?.1)))
        .expect("the quoted output");
    let quoted = quoted.split("\n```").next().unwrap();
    let mut words = vec!["compare".to_string(), "fixtures/toy-pair/target".into()];
    words.extend(shell_words(args));
    words.extend(["--no-report".into(), "--quiet".into()]);
    let out = common::hsparity().args(&words).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    let mut checked = 0;
    for want in quoted.lines().filter(|l| l.trim() != "…") {
        assert!(
            lines.any(|l| l == want),
            "README line not printed (in order): {want:?}\n--- stdout:\n{stdout}"
        );
        checked += 1;
    }
    assert!(checked > 10, "{checked} lines checked");
}
