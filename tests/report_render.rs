//! What a ticket reader sees: `report.md` and `parity.svg` as `compare`
//! writes them, and the committed examples under `reports/examples/`.
//!
//! - `parity.svg` is well-formed XML with an `<svg>` root (always), and
//!   renders in headless Chromium (only when `/usr/bin/chromium` exists; CI
//!   has none).
//! - `report.md` starts with the verdict, links the plot, says why and where
//!   the paths part, and ends with the command.
//! - The examples are current: each one is regenerated into a temporary
//!   folder and compared with the committed files after normalising the
//!   volatile parts (see [`normalise`] and docs/report-schema.md §Examples).
//!   Regenerate them with `tools/regen_examples.sh`
//!   (= `HSPARITY_REGEN_EXAMPLES=1 cargo test --release --test integration
//!   report_render::examples_are_current -- --exact`).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::BIN;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where the committed examples live, as it appears on their command lines.
const EXAMPLES: &str = "reports/examples";

/// The files of one report folder.
const FILES: [&str; 3] = ["report.md", "report.json", "parity.svg"];

/// Thread count the examples are generated with (`environment.threads`).
const THREADS: &str = "2";

/// One committed example: its folder name, `compare` arguments (without
/// `--report-dir/--name/--force`), and the exit code it must end with.
struct Example {
    name: &'static str,
    args: &'static [&'static str],
    exit: i32,
}

const EXAMPLE_RUNS: &[Example] = &[
    Example {
        name: "compare-pass",
        args: &[
            "compare",
            "fixtures/tiny-qwen3_5",
            "--taps",
            "1,4",
            "--quiet",
        ],
        exit: 0,
    },
    Example {
        name: "compare-fp16-vs-bf16",
        args: &[
            "compare",
            "fixtures/divergence/fp16-disk",
            "--prompts",
            "fixtures/divergence/fp16-disk/prompts.jsonl",
            "--taps",
            "1",
            "--quiet",
        ],
        exit: 1,
    },
    Example {
        name: "triage-toy-pair",
        args: &[
            "triage",
            "fixtures/toy-pair/target",
            "--drafter",
            "fixtures/toy-pair/drafter",
            "--prompts",
            "fixtures/toy-pair/prompts.jsonl",
            "--observed-tau",
            "1.2",
            "--quiet",
        ],
        exit: 0,
    },
];

fn run_compare(args: &[&str], report_dir: &Path, name: &str) -> i32 {
    // candle's sums on every CPU: the AMX kernel's bf16 sums are the tile
    // unit's own (docs/performance.md, "Kernels"), so examples written with
    // it would hold on AMX machines only.
    let out = common::hsparity()
        .env("RAYON_NUM_THREADS", THREADS)
        .env("HSPARITY_NO_AMX", "1")
        .args(args)
        .args([
            "--report-dir",
            report_dir.to_str().unwrap(),
            "--name",
            name,
            "--force",
        ])
        .output()
        .expect("runs hsparity");
    assert!(
        out.status.code() != Some(2),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.status.code().unwrap_or(-1)
}

/// The volatile parts of a freshly written report, made canonical:
/// - the binary's path on the command line (argv[0]) → `hsparity`;
/// - the temporary report folder on the command line → `reports/examples`.
///
/// `environment.threads` is fixed by running with `RAYON_NUM_THREADS=2`.
/// Numbers are compared with a tolerance by [`same_up_to_rounding`] (gemm
/// kernels are chosen per CPU, so the last bits of f32 sums may differ).
/// - wall-clock timings (`"wall_s"`, `"wall_time_s"` lines of triage JSON) → 0.
fn normalise(text: &str, report_dir: &Path) -> String {
    let t = text
        .replace(BIN, "hsparity")
        .replace(report_dir.to_str().unwrap(), EXAMPLES);
    canonical_kernels(&t)
        .lines()
        .map(|l| {
            // Peak RSS is machine-dependent: `peak RSS 0.01 GiB` / `"peak_rss_bytes": 123`.
            if let Some((head, _)) = l.split_once("peak RSS ") {
                let tail = l.split_once(" GiB").map(|x| x.1).unwrap_or("");
                return format!("{head}peak RSS 0 GiB{tail}");
            }
            if let Some((indent, _)) = l.split_once("\"peak_rss_bytes\"") {
                let comma = if l.trim_end().ends_with(',') { "," } else { "" };
                return format!("{indent}\"peak_rss_bytes\": 0{comma}");
            }
            l.to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
        .lines()
        .map(|l| match l.split_once("\"wall_") {
            Some((indent, rest)) if rest.contains("\": ") => {
                let key = rest.split('"').next().unwrap_or("");
                let comma = if l.trim_end().ends_with(',') { "," } else { "" };
                format!("{indent}\"wall_{key}\": 0{comma}")
            }
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + if t.ends_with('\n') { "\n" } else { "" }
}

/// `environment.kernels` (which kernels this CPU has and ran: machine-
/// dependent, and with `HSPARITY_NO_AMX` set changing speed only) with
/// every list emptied.
fn canonical_kernels(text: &str) -> String {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        let Some((indent, _)) = l.split_once("\"kernels\": {") else {
            out.push(l.to_string());
            continue;
        };
        for inner in lines.by_ref() {
            if inner.trim_start().starts_with('}')
                && inner.len() - inner.trim_start().len() == indent.len()
            {
                let comma = if inner.trim_end().ends_with(',') {
                    ","
                } else {
                    ""
                };
                out.push(format!("{indent}\"kernels\": {{"));
                let lists = ["cpu_features", "disabled_by", "available", "ran"];
                for (i, key) in lists.iter().enumerate() {
                    let sep = if i + 1 < lists.len() { "," } else { "" };
                    out.push(format!("{indent}  \"{key}\": []{sep}"));
                }
                out.push(format!("{indent}}}{comma}"));
                break;
            }
        }
    }
    out.join("\n") + if text.ends_with('\n') { "\n" } else { "" }
}

/// Splits into maximal runs of number characters and of everything else.
fn tokens(s: &str) -> Vec<(bool, &str)> {
    let is_num = |c: char| c.is_ascii_digit() || c == '.';
    let mut out: Vec<(bool, &str)> = Vec::new();
    let mut start = 0;
    let mut prev: Option<bool> = None;
    for (i, c) in s.char_indices() {
        let k = is_num(c);
        if prev.is_some_and(|p| p != k) {
            out.push((prev.unwrap(), &s[start..i]));
            start = i;
        }
        prev = Some(k);
    }
    if let Some(p) = prev {
        out.push((p, &s[start..]));
    }
    out
}

/// Equal text, numbers within `rel` relative (plus `abs`) of each other.
/// Returns the first difference with some context.
fn same_up_to_rounding(a: &str, b: &str, rel: f64, abs: f64) -> Result<(), String> {
    let (ta, tb) = (tokens(a), tokens(b));
    let mut offset = 0;
    for (k, (x, y)) in ta.iter().zip(&tb).enumerate() {
        let same = match (x, y) {
            ((true, x), (true, y)) => match (x.parse::<f64>(), y.parse::<f64>()) {
                (Ok(p), Ok(q)) => (p - q).abs() <= rel * p.abs().max(q.abs()) + abs,
                _ => x == y,
            },
            (x, y) => x == y,
        };
        if !same {
            let ctx: String = ta[k.saturating_sub(6)..(k + 6).min(ta.len())]
                .iter()
                .map(|t| t.1)
                .collect();
            return Err(format!(
                "at byte {offset}: {:?} vs {:?} (committed context: {ctx:?})",
                x.1, y.1
            ));
        }
        offset += x.1.len();
    }
    if ta.len() != tb.len() {
        return Err(format!(
            "lengths differ after byte {offset}: {} vs {} tokens",
            ta.len(),
            tb.len()
        ));
    }
    Ok(())
}

fn check_svg(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("{}: not well-formed XML: {e}", path.display()));
    let svg = doc.root_element();
    assert_eq!(svg.tag_name().name(), "svg", "{}", path.display());
    assert_eq!(
        svg.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    let texts: String = doc
        .descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .collect();
    for needle in [
        "bitwise identical",
        "1 − cos_min",
        "rel L2",
        "full attention",
        "FAIL above",
        "PASS to",
    ] {
        assert!(texts.contains(needle), "{}: no {needle:?}", path.display());
    }
    assert!(!texts.contains('…'), "{}: text cut short", path.display());
    let height = svg.attribute("height").expect("an SVG height");
    let chromium = Path::new("/usr/bin/chromium");
    if chromium.exists() {
        let shots = tempfile::tempdir().unwrap();
        let png = shots.path().join("parity.png");
        let out = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                &format!("--window-size=960,{height}"),
                &format!("--screenshot={}", png.display()),
                &format!("file://{}", path.display()),
            ])
            .output()
            .expect("runs chromium");
        assert!(
            out.status.success(),
            "chromium: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bytes = std::fs::read(&png).expect("chromium wrote a screenshot");
        assert!(bytes.starts_with(b"\x89PNG"), "screenshot is a PNG");
        assert!(
            bytes.len() > 10_000,
            "screenshot is not blank: {} bytes",
            bytes.len()
        );
    } else {
        eprintln!("no /usr/bin/chromium: parity.svg checked as XML only");
    }
}

#[test]
fn failing_report_says_where_why_and_links_the_plot() {
    let tmp = tempfile::tempdir().unwrap();
    let ex = &EXAMPLE_RUNS[1];
    assert_eq!(run_compare(ex.args, tmp.path(), "r"), ex.exit);
    let dir = tmp.path().join("r");
    for f in FILES {
        assert!(dir.join(f).exists(), "{f} written");
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    let first = md.lines().next().unwrap();
    assert!(
        first.starts_with(
            "FAIL: causal-lm and vlm diverge from hidden_states[0] (embeddings; dtype bf16 vs f16"
        ),
        "{first}"
    );
    assert!(md.contains("](parity.svg)"), "links the plot");
    assert!(
        md.contains("- dtype: causal-lm computes in bf16 (text_config.dtype), vlm in f16 (first weight on disk"),
        "says why"
    );
    assert!(md.contains("← first divergent"), "highlights the row");
    assert!(md.contains("| ◆ 1 |"), "marks the tap");
    assert!(
        md.contains("rule `ignore ^model.visual.*`: drops 21"),
        "rule lines"
    );
    assert!(md.contains("unexpected (dropped, reported): 1: `lm_head.weight`"));
    assert!(md.trim_end().ends_with("```"), "ends with the command");
    check_svg(&dir.join("parity.svg"));
    let svg = std::fs::read_to_string(dir.join("parity.svg")).unwrap();
    assert!(svg.contains("first divergent: hidden_states[0]"));
    assert!(svg.contains("tap 1"));
}

#[test]
fn passing_report_plots_zeros_on_the_floor() {
    let tmp = tempfile::tempdir().unwrap();
    let ex = &EXAMPLE_RUNS[0];
    assert_eq!(run_compare(ex.args, tmp.path(), "r"), ex.exit);
    let dir = tmp.path().join("r");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.starts_with("PASS: causal-lm and vlm agree bitwise at all 7 hidden states\n"));
    assert!(md.contains("bitwise identical throughout"));
    assert!(!md.contains("Loading differences"), "nothing to explain");
    check_svg(&dir.join("parity.svg"));
    let svg = std::fs::read_to_string(dir.join("parity.svg")).unwrap();
    assert!(!svg.contains("first divergent: hidden_states"));
}

/// The text elements of `svg`, trimmed, in order.
fn svg_texts(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).unwrap();
    doc.descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect()
}

/// The words of `svg`'s text elements, in order.
fn svg_words(svg: &str) -> Vec<String> {
    svg_texts(svg)
        .iter()
        .flat_map(|t| t.split_whitespace().map(String::from).collect::<Vec<_>>())
        .collect()
}

/// The plot shows the verdict: the whole summary in its title, the bands
/// of the tolerance that applied, RANDOM INIT where weights are MISSING (the
/// lm_head too, when the logits cannot be compared), the logits as their
/// own point, and the drafter's τ per path.
#[test]
fn the_plot_shows_the_verdict() {
    let tmp = tempfile::tempdir().unwrap();
    // RANDOM INIT in the plot, besides its legend entry.
    let marked = |svg: &str| svg.matches("RANDOM INIT").count() > 1;
    let plot = |name: &str, args: &[&str]| {
        run_compare(args, tmp.path(), name);
        let dir = tmp.path().join(name);
        check_svg(&dir.join("parity.svg"));
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap())
                .unwrap();
        let svg = std::fs::read_to_string(dir.join("parity.svg")).unwrap();
        let words = svg_words(&svg);
        let summary: Vec<&str> = report["summary"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .collect();
        let at = words
            .iter()
            .position(|w| w == summary[0])
            .expect("the summary starts");
        assert_eq!(
            words[at..at + summary.len()]
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            summary,
            "{name}: the title holds the whole summary"
        );
        (report, svg)
    };
    let (_, svg) = plot(
        "tied",
        &["compare", "fixtures/divergence/tied-top-level", "-q"],
    );
    let texts = svg_texts(&svg);
    assert!(
        marked(&svg) && texts.iter().any(|t| t == "logits"),
        "lm_head marked in a logits slot"
    );
    assert!(
        svg.contains("not compared"),
        "the logits slot says why it is empty"
    );
    assert!(
        svg.contains("L3+norm"),
        "the last index is the final-normed one"
    );
    let (_, svg) = plot(
        "nested",
        &["compare", "fixtures/divergence/nested-prefix", "-q"],
    );
    assert!(marked(&svg));
    let (r, svg) = plot(
        "logits",
        &[
            "compare",
            "fixtures/divergence/bf16-auto",
            "--paths",
            "causal-lm,image-text-to-text",
            "-q",
        ],
    );
    assert!(r["pairs"][0]["logits"].is_object());
    assert!(svg.contains("image-text-to-text: logits") && !marked(&svg));
    assert!(
        svg.contains("bf16 tolerance"),
        "the bands say which tolerance"
    );
    let (r, svg) = plot(
        "drafter",
        &[
            "compare",
            "fixtures/toy-pair/target",
            "--drafter",
            "fixtures/toy-pair/drafter",
            "--prompts",
            "fixtures/toy-pair/prompts.jsonl",
            "--max-new-tokens",
            "16",
            "-q",
        ],
    );
    for p in r["drafter"]["paths"].as_array().unwrap() {
        let tau = format!(
            "{} {:.2}",
            p["name"].as_str().unwrap(),
            p["tau_macro"].as_f64().unwrap()
        );
        assert!(
            svg.contains("drafter τ (macro) ") && svg.contains(&tau),
            "{tau}"
        );
    }
    assert!(svg.contains("tap 1") && svg.contains("tap 2"));
}

#[test]
fn token_comparison_tolerates_rounding_only() {
    assert!(same_up_to_rounding("cos 0.99999745 x", "cos 0.99999746 x", 1e-3, 0.0).is_ok());
    assert!(same_up_to_rounding("cos 0.9 x", "cos 0.8 x", 1e-3, 0.0).is_err());
    assert!(same_up_to_rounding("pass", "fail", 1e-3, 0.0).is_err());
    assert!(same_up_to_rounding("a 1", "a 1 b", 1e-3, 0.0).is_err());
    assert!(same_up_to_rounding("x=\"120\"", "x=\"121\"", 0.0, 1.5).is_ok());
}

/// The committed examples are what the current code writes. With
/// `HSPARITY_REGEN_EXAMPLES=1` this rewrites them instead.
#[test]
fn examples_are_current() {
    let regen = std::env::var_os("HSPARITY_REGEN_EXAMPLES").is_some_and(|v| v == "1");
    let tmp = tempfile::tempdir().unwrap();
    let mut stale = Vec::new();
    for ex in EXAMPLE_RUNS {
        assert_eq!(
            run_compare(ex.args, tmp.path(), ex.name),
            ex.exit,
            "{}: exit code",
            ex.name
        );
        let fresh_dir = tmp.path().join(ex.name);
        let committed_dir = root().join(EXAMPLES).join(ex.name);
        if regen {
            std::fs::create_dir_all(&committed_dir).unwrap();
        }
        for f in FILES {
            let committed_path = committed_dir.join(f);
            let Ok(fresh) = std::fs::read_to_string(fresh_dir.join(f)) else {
                // A verb without this file (triage writes no plot).
                assert!(
                    !committed_path.exists() || regen,
                    "{}/{f}: committed but no longer written",
                    ex.name
                );
                continue;
            };
            let fresh = normalise(&fresh, tmp.path());
            if regen {
                std::fs::write(&committed_path, &fresh).unwrap();
                continue;
            }
            let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
            // SVG coordinates are whole pixels: allow one pixel of rounding.
            let (rel, abs) = if f.ends_with(".svg") {
                (1e-3, 1.5)
            } else {
                (1e-3, 1e-12)
            };
            if let Err(e) = same_up_to_rounding(&committed, &fresh, rel, abs) {
                stale.push(format!("{}/{f}: {e}", ex.name));
            }
        }
        if !regen && committed_dir.join("parity.svg").exists() {
            check_svg(&committed_dir.join("parity.svg"));
        }
    }
    assert!(
        stale.is_empty(),
        "reports/examples is out of date; regenerate with tools/regen_examples.sh:\n{}",
        stale.join("\n")
    );
}

/// Each committed example's "Reproduce" block is the command that wrote it:
/// the arguments `examples_are_current` runs (and checks the files of, byte
/// for byte) with the report folder and name, so running the block as
/// printed gives the report.
#[test]
fn each_example_reproduce_block_is_the_command_that_wrote_it() {
    for ex in EXAMPLE_RUNS {
        let md =
            std::fs::read_to_string(root().join(EXAMPLES).join(ex.name).join("report.md")).unwrap();
        let (_, block) = md
            .split_once("## Reproduce\n\n```\n")
            .unwrap_or_else(|| panic!("{}: no Reproduce block", ex.name));
        let printed = block.lines().next().unwrap();
        let want = format!(
            "hsparity {} --report-dir {EXAMPLES} --name {} --force",
            ex.args.join(" "),
            ex.name
        );
        assert_eq!(printed, want, "{}", ex.name);
    }
}
