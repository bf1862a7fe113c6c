//! The shape of `src/` (docs/architecture.md): modules import only from the
//! same or an earlier stage of the pipeline, no source file is over 600
//! lines, no function outside tests over 120 lines, and nothing in the
//! repository cites documents that are not in it.

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

/// `(name, first line, line count)` of every `fn` item outside `#[cfg(test)]`.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let test_start = lines
        .iter()
        .position(|l| l.trim_start().starts_with("#[cfg(test)]"))
        .unwrap_or(lines.len());
    for (n, line) in lines.iter().enumerate().take(test_start) {
        let t = line.trim_start();
        let t = t
            .strip_prefix("pub(crate) ")
            .or_else(|| t.strip_prefix("pub "))
            .unwrap_or(t);
        let t = t.strip_prefix("const ").unwrap_or(t);
        let t = t.strip_prefix("unsafe ").unwrap_or(t);
        let Some(rest) = t.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // Find the body's opening brace (or a `;`: a declaration), then its end.
        let (mut depth, mut opened) = (0i64, false);
        'scan: for (m, l) in lines.iter().enumerate().skip(n) {
            for c in l.chars() {
                match c {
                    ';' if !opened && depth == 0 => break 'scan,
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => {
                        depth -= 1;
                        if opened && depth == 0 {
                            out.push((name.clone(), n + 1, m - n + 1));
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

#[test]
fn imports_follow_the_pipeline_order() {
    let mut bad = Vec::new();
    for f in src_files() {
        let Some(m) = module_of(&f) else { continue };
        let own = stage(&m).unwrap_or_else(|| panic!("{m}: add the module to STAGES"));
        let code = code_only(&std::fs::read_to_string(&f).unwrap());
        for (i, _) in code.match_indices("crate::") {
            let dep: String = code[i + 7..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
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
