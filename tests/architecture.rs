//! The shape of `src/` (docs/architecture.md): modules import only from the
//! same or an earlier stage of the pipeline (through `crate::` paths, or
//! `super::` paths that reach the crate root; `super::super::` is refused),
//! no source file is over 600 lines, no function outside `#[cfg(test)]`
//! items over 120 lines (code after a test module is measured too, whatever
//! the function's visibility), and every citation names its source: an
//! upstream standard or project, or a document the repository holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Pipeline order of the top-level modules: a module may import from its own
/// stage or an earlier one, never a later one.
const STAGES: &[&[&str]] = &[
    &[
        "error",
        "kernels",
        "precision",
        "device",
        "sysinfo",
        "progress",
        "output",
        "input",
        "text",
        "width",
        "memory",
    ],
    &["checkpoint"],
    &["loading"],
    &["chat", "prompt_sets", "prompts"],
    &["models"],
    &["session"],
    &["capture", "dump", "import"],
    &["parity"],
    &["drafter"],
    &["triage"],
    &["report"],
    &["commands"],
    &["cli"],
];

const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 120;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn src_files() -> Vec<PathBuf> {
    let mut v = Vec::new();
    rust_files(&root().join("src"), &mut v);
    v.sort();
    v
}

fn stage(module: &str) -> Option<usize> {
    STAGES.iter().position(|s| s.contains(&module))
}

/// The top-level module a file belongs to (`src/report/diff.rs` → `report`).
fn module_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(root().join("src")).ok()?;
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    let m = first.trim_end_matches(".rs").to_string();
    (m != "lib" && m != "main").then_some(m)
}

/// The code of `text` with comments, string and char literals blanked (so
/// braces and paths in them do not count), line structure kept.
fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            while i + 1 < b.len() && !(b[i] == '*' && b[i + 1] == '/') {
                if b[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !prev_ident(&b, i) {
            // Raw string r"…" / r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while j < b.len() && b[j] == '#' {
                hashes += 1;
                j += 1;
            }
            if j < b.len() && b[j] == '"' {
                j += 1;
                loop {
                    if j >= b.len() {
                        break;
                    }
                    if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                        j += 1 + hashes;
                        break;
                    }
                    if b[j] == '\n' {
                        out.push('\n');
                    }
                    j += 1;
                }
                out.push_str("\"\"");
                i = j;
            } else {
                out.push(c);
                i += 1;
            }
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                } else if b[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && is_char_literal(&b, i) {
            i += 1;
            while i < b.len() && b[i] != '\'' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn prev_ident(b: &[char], i: usize) -> bool {
    i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_')
}

/// `'x'`, `'\n'`, `'\u{..}'` — not a lifetime `'a`.
fn is_char_literal(b: &[char], i: usize) -> bool {
    matches!(
        (b.get(i + 1), b.get(i + 2)),
        (Some('\\'), _) | (Some(_), Some('\''))
    )
}

/// The lines (0-based, inclusive ranges) of every item marked
/// `#[cfg(test)]`: from the attribute to the end of the item it marks (a
/// `mod tests { … }` block, a function, a `use`), so that code after a test
/// module is still measured.
fn test_items(lines: &[&str]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut n = 0;
    while n < lines.len() {
        if !lines[n].trim_start().starts_with("#[cfg(test)]") {
            n += 1;
            continue;
        }
        let end = item_end(lines, n + 1).map_or(lines.len() - 1, |(m, _)| m);
        out.push((n, end));
        n = end + 1;
    }
    out
}

/// Where the item starting at line `from` ends: `(line, true)` at the
/// brace closing its body, `(line, false)` at a `;` before any brace (a
/// declaration or a `use`); `None` when the text ends first.
fn item_end(lines: &[&str], from: usize) -> Option<(usize, bool)> {
    let (mut depth, mut opened) = (0i64, false);
    for (m, l) in lines.iter().enumerate().skip(from) {
        for c in l.chars() {
            match c {
                ';' if !opened && depth == 0 => return Some((m, false)),
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => {
                    depth -= 1;
                    if opened && depth == 0 {
                        return Some((m, true));
                    }
                }
                _ => {}
            }
        }
    }
    None
}

/// `t` without a leading visibility (`pub`, `pub(crate)`, `pub(super)`,
/// `pub(in path)`) and qualifiers (`const`, `async`, `unsafe`, `extern "…"`).
fn without_qualifiers(t: &str) -> &str {
    let mut t = t;
    if let Some(rest) = t.strip_prefix("pub(") {
        t = rest.split_once(')').map_or(rest, |(_, r)| r).trim_start();
    } else if let Some(rest) = t.strip_prefix("pub ") {
        t = rest;
    }
    loop {
        let before = t;
        for q in ["const ", "async ", "unsafe ", "extern \"C\" ", "extern "] {
            t = t.strip_prefix(q).unwrap_or(t);
        }
        if t == before {
            return t;
        }
    }
}

/// `(name, first line, line count)` of every `fn` item outside the items
/// marked `#[cfg(test)]`.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let tests = test_items(&lines);
    for (n, line) in lines.iter().enumerate() {
        if tests.iter().any(|&(a, b)| (a..=b).contains(&n)) {
            continue;
        }
        let t = without_qualifiers(line.trim_start());
        let Some(rest) = t.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The body's end; a `;` before any brace is a declaration.
        if let Some((m, true)) = item_end(&lines, n) {
            out.push((name.clone(), n + 1, m - n + 1));
        }
    }
    out
}

/// The first line (0-based) naming a module two levels up (`super::super::`).
fn reaches_up_twice(code: &str) -> Option<usize> {
    code.lines().position(|l| l.contains("super::super::"))
}

/// The top-level modules a file's code names: every `crate::m`, and every
/// `super::m` that reaches the crate root (from a top-level module's own
/// file, outside its `#[cfg(test)]` items, where `super` is the crate).
fn imported_modules(path: &Path, code: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut deps: Vec<String> = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + 7..];
        match rest.strip_prefix('{') {
            // `crate::{a, b::c, d::{e, f}}`: the names at the group's top level.
            Some(group) => {
                let mut depth = 0;
                let mut start = true;
                for (j, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => start = true,
                        c if start && depth == 0 && !c.is_whitespace() => {
                            deps.push(ident(&group[j..]));
                            start = false;
                        }
                        _ => {}
                    }
                }
            }
            None => deps.push(ident(rest)),
        }
    }
    let rel = path.strip_prefix(root().join("src")).unwrap();
    let top_level =
        rel.components().count() == 1 || rel.ends_with("mod.rs") && rel.components().count() == 2;
    if top_level {
        let lines: Vec<&str> = code.lines().collect();
        let tests = test_items(&lines);
        for (n, line) in lines.iter().enumerate() {
            if tests.iter().any(|&(a, b)| (a..=b).contains(&n)) {
                continue;
            }
            for (i, _) in line.match_indices("super::") {
                if !line[..i].ends_with("super::") {
                    deps.push(ident(&line[i + 7..]));
                }
            }
        }
    }
    deps.retain(|d| !d.is_empty());
    deps
}

#[test]
fn imports_follow_the_pipeline_order() {
    let mut bad = Vec::new();
    for f in src_files() {
        let Some(m) = module_of(&f) else { continue };
        let own = stage(&m).unwrap_or_else(|| panic!("{m}: add the module to STAGES"));
        let code = code_only(&std::fs::read_to_string(&f).unwrap());
        for dep in imported_modules(&f, &code) {
            let Some(s) = stage(&dep) else {
                bad.push(format!("{}: crate::{dep} is not in STAGES", f.display()));
                continue;
            };
            if s > own {
                bad.push(format!(
                    "{}: {m} (stage {own}) imports crate::{dep} (stage {s})",
                    f.strip_prefix(root()).unwrap().display()
                ));
            }
        }
        if let Some(n) = reaches_up_twice(&code) {
            bad.push(format!(
                "{}:{}: super::super:: (name the module with a crate:: path)",
                f.strip_prefix(root()).unwrap().display(),
                n + 1
            ));
        }
    }
    bad.sort();
    bad.dedup();
    assert!(
        bad.is_empty(),
        "imports against the pipeline order:\n{}",
        bad.join("\n")
    );
}

#[test]
fn files_and_functions_stay_short() {
    let mut bad = Vec::new();
    for f in src_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let rel = f.strip_prefix(root()).unwrap().display().to_string();
        let n = text.lines().count();
        if n > MAX_FILE_LINES {
            bad.push(format!("{rel}: {n} lines (limit {MAX_FILE_LINES})"));
        }
        for (name, line, len) in functions(&code_only(&text)) {
            if len > MAX_FN_LINES {
                bad.push(format!(
                    "{rel}:{line}: fn {name} has {len} lines (limit {MAX_FN_LINES})"
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_scanner_counts_what_it_should() {
    let code = code_only(
        "fn a() {\n    let s = \"}}\"; // {\n    let c = '}';\n}\nfn b<'x>(v: &'x str) -> &'x str { v }\n#[cfg(test)]\nfn c() {}\n",
    );
    let f = functions(&code);
    assert_eq!(f, vec![("a".to_string(), 1, 4), ("b".to_string(), 5, 1)]);
    // Code after a test module is measured; any visibility counts.
    let code = code_only(
        "#[cfg(test)]\nmod tests {\n    fn t() {\n    }\n}\npub(super) fn d() {\n}\npub(in crate::x) const unsafe fn e() {}\n#[cfg(test)]\nuse std::fmt;\nasync fn g() {}\n",
    );
    let f = functions(&code);
    let names: Vec<&str> = f.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(names, ["d", "e", "g"]);
}

/// `super::` paths that reach the crate root count as imports, and
/// `super::super::` is caught.
#[test]
fn the_import_scanner_sees_super_paths() {
    let top = root().join("src/session.rs");
    let code = "use super::report::Report;\nuse crate::parity::Verdict;\n#[cfg(test)]\nmod tests {\n    use super::Session;\n}\n";
    assert_eq!(imported_modules(&top, code), ["parity", "report"]);
    let grouped = "use crate::{error::Result, report::{self, Kind},\n    triage};\n";
    assert_eq!(
        imported_modules(&top, grouped),
        ["error", "report", "triage"]
    );
    let nested = root().join("src/report/compare/mod.rs");
    assert_eq!(
        imported_modules(&nested, "use super::format::cos;\n"),
        Vec::<String>::new()
    );
    assert_eq!(
        reaches_up_twice("use a;\nuse super::super::drafter;\n"),
        Some(1)
    );
    assert_eq!(reaches_up_twice("use super::drafter;\n"), None);
}

/// Documents the repository must not cite: they are not in it. Each name is
/// written with a `|` inside (removed before matching), so that this list is
/// not itself a citation and the file is scanned like every other.
const FOREIGN: &[&str] = &[
    "DESI|GN §",
    "DESI|GN.md",
    "DESIGN |section",
    "the |brief",
    "bri|ef §",
    "researc|h brief",
    "shared |research",
    "../s|hared",
    "resear|ch/qwen",
    "researc|h/dflash",
    "researc|h/candle",
    "research|/captures",
    "resear|ch/chat",
    "cand|le.md",
    "ancho|rs.md",
    "bug|-log",
    "captu|res.md",
    "chat_tem|plates.md",
    "qwen3|_5.md",
    "qwen3_5|_moe.md",
    "dfla|sh.md",
];

#[test]
fn nothing_cites_documents_outside_the_repository() {
    let mut files = src_files();
    for dir in ["tests", "tools", "bench", "docs", ".ci"] {
        let mut v = Vec::new();
        collect(&root().join(dir), &mut v);
        files.extend(v);
    }
    files.push(root().join("README.md"));
    files.push(root().join("Cargo.toml"));
    files.push(root().join("reports/examples/README.md"));
    let foreign: Vec<String> = FOREIGN.iter().map(|w| w.replace('|', "")).collect();
    let mut hits: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for w in &foreign {
                if line.contains(w.as_str()) {
                    hits.entry(format!(
                        "{}:{}",
                        f.strip_prefix(root()).unwrap().display(),
                        n + 1
                    ))
                    .or_default()
                    .push(w.to_string());
                }
            }
        }
    }
    assert!(
        hits.is_empty(),
        "references to documents outside the repository:\n{}",
        hits.iter()
            .map(|(k, v)| format!("{k}: {}", v.join(", ")))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd {
        let p = e.unwrap().path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|x| {
            ["rs", "py", "md", "sh", "json", "txt"].contains(&x.to_str().unwrap_or(""))
        }) || p.file_name().is_some_and(|n| n == "run")
        {
            out.push(p);
        }
    }
}

/// Upstream projects a line may cite an issue of.
const UPSTREAM: &[&str] = &[
    "z-lab",
    "dflash",
    "vllm",
    "sglang",
    "specforge",
    "transformers",
    "candle",
    "huggingface",
    "pytorch",
    "torch",
    "gemm",
    "ddtree",
    "eagle",
];

/// The `.md` files a line names that exist in the repository (relative to
/// the root, to `docs/`, or to the file's own folder).
fn names_a_repository_document(line: &str, file: &Path) -> bool {
    line.split(|c: char| !(c.is_alphanumeric() || "._-/".contains(c)))
        .filter(|w| w.ends_with(".md"))
        .any(|w| {
            let w = w.trim_start_matches("./");
            [
                root(),
                root().join("docs"),
                file.parent().unwrap().to_path_buf(),
            ]
            .iter()
            .any(|d| d.join(w).is_file())
        })
}

/// A line's citations (`§` sections, `issue N`) that name no source: not an
/// upstream standard or project, not a document of the repository, and
/// (for `§` in the repository's own Markdown pages) not a section of the
/// page itself.
fn unsourced_citations(line: &str, file: &Path) -> Vec<&'static str> {
    let mut out = Vec::new();
    let own_page = file.extension().is_some_and(|x| x == "md")
        && (file.starts_with(root().join("docs")) || file.parent() == Some(root().as_path()));
    if line.contains('§')
        && !line.contains("RFC ")
        && !own_page
        && !names_a_repository_document(line, file)
    {
        out.push("§ of a document the repository does not hold");
    }
    let lower = line.to_lowercase();
    let issue_no = lower.match_indices("issue").any(|(i, _)| {
        let rest = lower[i + 5..].trim_start_matches('s').trim_start();
        rest.trim_start_matches('#')
            .starts_with(|c: char| c.is_ascii_digit())
    });
    if issue_no && !UPSTREAM.iter().any(|u| lower.contains(u)) {
        out.push("an issue number of no upstream project");
    }
    out
}

#[test]
fn citations_name_their_source() {
    let mut files = src_files();
    for dir in ["tests", "tools", "bench", "docs", ".ci"] {
        let mut v = Vec::new();
        collect(&root().join(dir), &mut v);
        files.extend(v);
    }
    for f in [
        "README.md",
        "CHANGELOG.md",
        "Cargo.toml",
        "reports/examples/README.md",
    ] {
        files.push(root().join(f));
    }
    let mut bad = Vec::new();
    // This file holds the patterns themselves (checked by the test below).
    files.retain(|f| !f.ends_with("tests/architecture.rs"));
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for why in unsourced_citations(line, &f) {
                let rel = f.strip_prefix(root()).unwrap().display().to_string();
                bad.push(format!("{rel}:{}: {why}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "citations without a source:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_citation_check_tells_sources_from_none() {
    let rs = root().join("tests/architecture.rs");
    let md = root().join("docs/architecture.md");
    let cases = [
        ("qwen3_5_text config (resear\u{63}h §2)", &rs, 1),
        ("see docs/report-schema.md §2.3", &rs, 0),
        ("JSON forbids it (RFC 8259 §8.1)", &rs, 0),
        ("as §4 says", &md, 0),
        ("Goals (issue 16): faster", &rs, 1),
        ("z-lab/dflash issue #133", &rs, 0),
        ("an issue of the reader's", &rs, 0),
    ];
    for (line, file, want) in cases {
        assert_eq!(unsourced_citations(line, file).len(), want, "{line}");
    }
}
