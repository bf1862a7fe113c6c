//! Terminal output laid out for the width it is printed on: at 80, 100 and
//! 200 columns every verb's output on the fixtures has no line wider than
//! the width (a prose line of one word longer than the width, a tensor name,
//! is the one exception: names are never split) and shows every word the
//! unbounded output shows; tables split into parts keep their key columns.
//! Also: progress bars end at the totals they counted through.

use std::collections::BTreeSet;
use std::path::Path;

use hsparity::report::Document;
use hsparity::width::Width;

use crate::common::{self, hsparity};

const WIDTHS: [usize; 3] = [80, 100, 200];

/// Characters that draw a table, not content.
fn is_border(c: char) -> bool {
    "│┆─═┌┐└┘├┤┬┴┼╞╡╪╭╮╰╯".contains(c)
}

fn is_table_line(l: &str) -> bool {
    l.chars().next().is_some_and(is_border)
}

/// Every word shown, tables and prose alike.
fn words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| c.is_whitespace() || is_border(c))
        .filter(|w| !w.is_empty())
        .map(String::from)
        .collect()
}

/// Characters a line takes on the terminal (no colour codes: not a TTY).
fn columns(l: &str) -> usize {
    l.chars().count()
}

/// `laid_out` (the output at `w` columns) fits `w` and shows what
/// `unbounded` shows.
fn assert_fits(what: &str, unbounded: &str, laid_out: &str, w: usize) {
    for l in laid_out.lines() {
        let single_word = !is_table_line(l) && !l.trim().contains(char::is_whitespace);
        assert!(
            columns(l) <= w || single_word,
            "{what} at {w} columns: a line of {}:\n{l}\n\n{laid_out}",
            columns(l)
        );
    }
    let (want, got) = (words(unbounded), words(laid_out));
    let lost: Vec<&String> = want.difference(&got).collect();
    assert!(
        lost.is_empty(),
        "{what} at {w} columns lost {lost:?}\n\n{laid_out}"
    );
}

/// The output of `args` with `COLUMNS` set to `w` (`None`: unset, as when
/// piped), without the peak-RSS line (it measures the process).
fn stdout_at(args: &[&str], w: Option<usize>) -> String {
    let mut c = hsparity();
    c.args(args);
    if let Some(w) = w {
        c.env("COLUMNS", w.to_string());
    }
    let out = c.output().unwrap();
    assert_ne!(
        out.status.code(),
        Some(2),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("peak RSS"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The output ends with its verdict, as it begins with it.
fn assert_ends_with_verdict(what: &str, text: &str) {
    let last = text.trim_end().lines().last().unwrap_or("");
    assert!(
        last.starts_with("verdict: PASS (exit 0)")
            || last.starts_with("verdict: FAIL (exit 1)")
            || last.starts_with("ranked (exit 0)"),
        "{what}: ends with {last:?}"
    );
}

fn check_verb(args: &[&str]) {
    let unbounded = stdout_at(args, None);
    assert_ends_with_verdict(&args.join(" "), &unbounded);
    assert!(
        unbounded.lines().any(|l| columns(l) > 100),
        "{args:?}: too narrow to test wrapping"
    );
    for w in WIDTHS {
        assert_fits(&args.join(" "), &unbounded, &stdout_at(args, Some(w)), w);
    }
}

#[test]
fn compare_fits_the_terminal() {
    check_verb(&[
        "compare",
        "fixtures/divergence/fp16-disk",
        "--prompts",
        "fixtures/divergence/fp16-disk/prompts.jsonl",
        "--taps",
        "1",
        "--no-report",
        "-q",
    ]);
    check_verb(&[
        "compare",
        "fixtures/divergence/tied-top-level",
        "--no-report",
        "-q",
    ]);
}

#[test]
fn inventory_and_prompts_fit_the_terminal() {
    check_verb(&["inventory", "fixtures/divergence/nested-prefix"]);
    check_verb(&["inventory", "fixtures/tiny-qwen3_5"]);
    check_verb(&["prompts", "fixtures/toy-pair/target"]);
}

#[test]
fn diff_and_import_fit_the_terminal() {
    let tmp = tempfile::tempdir().unwrap();
    let dump = |path: &str, dtype: &str, name: &str| {
        let out = tmp.path().join(name);
        let o = hsparity()
            .args([
                "dump",
                "fixtures/tiny-qwen3_5",
                "--path",
                path,
                "--dtype",
                dtype,
            ])
            .args(["--quiet", "--out", out.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        out
    };
    let (a, b) = (
        dump("causal-lm", "f32", "a.safetensors"),
        dump("vlm", "bf16", "b.safetensors"),
    );
    check_verb(&[
        "diff",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--no-report",
    ]);
    let out = tmp.path().join("v.safetensors");
    check_verb(&[
        "import",
        "fixtures/engine-captures/vllm",
        "--layer-ids",
        "0,2,4,6",
        "--num-layers",
        "6",
        "--out",
        out.to_str().unwrap(),
        "--force",
    ]);
}

/// Five held-out prompts, 16 new tokens: the drafter's report rendered at
/// each width from one run (its memory line is measured, so two runs would
/// differ).
#[test]
fn drafter_fits_the_terminal() {
    let tmp = tempfile::tempdir().unwrap();
    let f = common::five_prompts(tmp.path());
    let opts = common::drafter_options(
        common::target("fixtures/toy-pair/target", f.to_str()),
        &[
            hsparity::loading::LoadingPath::CausalLm,
            hsparity::loading::LoadingPath::Vlm,
        ],
        "fixtures/toy-pair/drafter",
        16,
    );
    let r = hsparity::commands::drafter::run(&opts).unwrap();
    let unbounded = r.terminal(Width::UNBOUNDED);
    assert_ends_with_verdict("drafter", &unbounded);
    assert!(unbounded.lines().any(|l| columns(l) > 100), "{unbounded}");
    for w in WIDTHS {
        assert_fits("drafter", &unbounded, &r.terminal(Width(Some(w))), w);
    }
}

/// A triage report at each width: the variants' descriptions are footnotes
/// under the table on the terminal (and a column in the Markdown).
pub fn assert_triage_fits(r: &hsparity::report::TriageReport) {
    let unbounded = r.terminal(Width::UNBOUNDED);
    assert_ends_with_verdict("triage", &unbounded);
    for w in WIDTHS {
        assert_fits("triage", &unbounded, &r.terminal(Width(Some(w))), w);
    }
    let table = unbounded.lines().find(|l| l.contains("rank")).unwrap();
    assert!(!table.contains("what it emulates"), "{table}");
    for v in &r.variants {
        assert!(
            unbounded.contains(&format!("  {}: {}", v.name, v.description)),
            "{}: no footnote\n{unbounded}",
            v.name
        );
    }
    let md = hsparity::report::triage::markdown(r);
    assert!(md.contains("| what it emulates |"), "{md}");
}

/// `HSPARITY_PROGRESS_LOG` lines of one run: `(unit, position, length)`.
fn bars_of(args: &[&str], log: &Path) -> Vec<(String, u64, u64)> {
    let _ = std::fs::remove_file(log);
    let o = hsparity()
        .args(args)
        .env("HSPARITY_PROGRESS_LOG", log)
        .output()
        .unwrap();
    assert_ne!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let (unit, counts) = l.rsplit_once(' ').unwrap();
            let (pos, len) = counts.split_once('/').unwrap();
            (unit.to_string(), pos.parse().unwrap(), len.parse().unwrap())
        })
        .collect()
}

/// Every bar ends where its total is, and the totals are the work: the
/// weights bar counts the bytes the checkpoint stores (bf16 here, not the
/// f32 they widen to; each shared copy once), the drafter's counts prompts × (max new + block size) new tokens
/// of the one distinct path, the layers bar the decoder layers.
#[test]
fn progress_bars_end_at_the_work_they_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("bars.log");
    let bars = bars_of(
        &["compare", "fixtures/tiny-qwen3_5", "--no-report", "-q"],
        &log,
    );
    let stored: u64 = std::fs::read_dir("fixtures/tiny-qwen3_5")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            let h = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + h]).unwrap();
            header
                .as_object()
                .unwrap()
                .iter()
                // What the bar counts: the decoder layers, the final norm and
                // the head (the embeddings are gathered rows, not read whole).
                .filter(|(k, _)| {
                    k.starts_with("model.language_model.layers.")
                        || *k == "model.language_model.norm.weight"
                        || *k == "lm_head.weight"
                })
                .map(|(_, v)| {
                    let o = &v["data_offsets"];
                    o[1].as_u64().unwrap() - o[0].as_u64().unwrap()
                })
                .sum::<u64>()
        })
        .sum();
    assert!(!bars.is_empty(), "no bar logged");
    for (unit, pos, len) in &bars {
        assert_eq!(pos, len, "{unit}: ended at {pos} of {len}");
    }
    let weights = bars
        .iter()
        .find(|b| b.0.starts_with("weights read"))
        .unwrap();
    // Both paths read the same bytes: counted once.
    assert_eq!(weights.2, stored, "weights bar against the stored bytes");
    let layers = bars.iter().find(|b| b.0 == "layers").unwrap();
    assert_eq!(layers.2, 6);

    let bars = bars_of(
        &[
            "drafter",
            "fixtures/toy-pair/target",
            "--drafter",
            "fixtures/toy-pair/drafter",
            "--prompts",
            "fixtures/toy-pair/prompts.jsonl",
            "--max-new-tokens",
            "16",
            "-q",
        ],
        &log,
    );
    for (unit, pos, len) in &bars {
        assert_eq!(pos, len, "{unit}: ended at {pos} of {len}");
    }
    let generated = bars.iter().find(|b| b.0 == "new tokens generated").unwrap();
    // The block size of the toy drafter is 8; vlm reads causal-lm's weights
    // and is computed once.
    assert_eq!(generated.2, 15 * (16 + 8), "{bars:?}");
}
