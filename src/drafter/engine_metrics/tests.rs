use super::*;

fn write(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("metrics");
    std::fs::write(&p, text).unwrap();
    (d, p)
}

fn err(text: &str) -> String {
    let (_d, p) = write(text);
    EngineMetrics::read(&p).unwrap_err().to_string()
}

/// The shape `prometheus_client` gives vLLM's counters: `_total` samples,
/// `_created` gauges beside them, one label set per engine (summed).
const SCRAPE: &str = r#"# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="toy"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="toy"} 5.0
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="toy"} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="toy"} 20.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="toy"} 10.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="toy"} 12.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="toy"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="toy",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="toy",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="toy",position="0"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="toy",position="1"} 0.0
vllm:num_requests_running{engine="0",model_name="toy"} 0.0
"#;

#[test]
fn a_scrape_sums_the_engines_and_reads_past_created_gauges() {
    let (_d, p) = write(SCRAPE);
    let m = EngineMetrics::read(&p).unwrap();
    assert_eq!(m.format, MetricsFormat::Prometheus);
    assert_eq!(
        (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens),
        (15, 30, 15)
    );
    assert_eq!(m.accepted_per_position, vec![11, 4]);
    assert_eq!(m.drafts_per_round(), Some(2));
    assert_eq!(m.request_taus(), None);
    assert_eq!(m.rounds_within(&[10]), None);
}

#[test]
fn counters_without_the_total_suffix_read_the_same() {
    let bare = SCRAPE.replace("_total{", "{");
    let (_d, p) = write(&bare);
    let (_e, q) = write(SCRAPE);
    assert_eq!(
        EngineMetrics::read(&p).unwrap().accepted_per_position,
        EngineMetrics::read(&q).unwrap().accepted_per_position
    );
}

#[test]
fn label_values_may_hold_quotes_commas_and_braces() {
    let text = SCRAPE.replace(r#"model_name="toy""#, r#"model_name="a \"b\", {c}""#);
    let (_d, p) = write(&text);
    assert_eq!(EngineMetrics::read(&p).unwrap().num_drafts, 15);
}

#[test]
fn bad_scrapes_are_refused_with_the_reason() {
    let two = SCRAPE.replacen(
        r#"engine="1",model_name="toy""#,
        r#"engine="1",model_name="other""#,
        1,
    );
    assert!(
        err(&two).contains("several models (other, toy)"),
        "{}",
        err(&two)
    );
    let none = "vllm:num_requests_running 0\n";
    assert!(err(none).contains("no vllm:spec_decode_num_drafts counter"));
    let frac = SCRAPE.replace("} 10.0", "} 10.5");
    assert!(err(&frac).contains("not a count"), "{}", err(&frac));
    let over = SCRAPE.replace(
        "accepted_tokens_total{engine=\"1\",model_name=\"toy\"} 3.0",
        "accepted_tokens_total{engine=\"1\",model_name=\"toy\"} 30.0",
    );
    assert!(
        err(&over).contains("accepted draft tokens of 30 proposed")
            || err(&over).contains("per position"),
        "{}",
        err(&over)
    );
    let unterminated = "vllm:spec_decode_num_drafts_total{engine=\"0 1\n";
    assert!(err(unterminated)
        .contains(":1: vllm:spec_decode_num_drafts_total: an unterminated label value"));
    let zero = SCRAPE.replace("} 10.0", "} 0.0").replace("} 5.0", "} 0.0");
    assert!(
        err(&zero).contains("no speculative round") || err(&zero).contains("accepted"),
        "{}",
        err(&zero)
    );
}

/// Two requests as vLLM's response bodies carry them (`metrics.speculative_decoding`
/// of a `detailed` run, and a bare `summary` object).
const REQUESTS: &str = r#"{"request_id": "0-abc", "metrics": {"speculative_decoding": {"mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.5, "acceptance_histogram": [0, 1, 1], "num_spec_steps": 2, "num_accepted_draft_tokens": 3, "num_draft_tokens": 4, "num_spec_tokens": 2, "per_step_accepted": [2, 1], "per_step_drafted": [2, 2]}}}
{"mean_acceptance_length": 1.0, "draft_acceptance_rate": 0.0, "acceptance_histogram": [3, 0, 0], "num_spec_steps": 3, "num_accepted_draft_tokens": 0, "num_draft_tokens": 6, "num_spec_tokens": 2}
"#;

#[test]
fn per_request_lines_give_the_pooled_and_the_macro_tau() {
    let (_d, p) = write(REQUESTS);
    let m = EngineMetrics::read(&p).unwrap();
    assert_eq!(m.format, MetricsFormat::VllmPerRequest);
    assert_eq!(
        (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens),
        (5, 10, 3)
    );
    // position 0 accepted in both steps of request 0 that accepted ≥ 1, position 1 in one
    assert_eq!(m.accepted_per_position, vec![2, 1]);
    assert_eq!(m.request_taus(), Some(vec![2.5, 1.0]));
    // The engine's rounds as hsparity records them (a + 1), cut to the
    // rounds that start before the outputs replayed: request 0's rounds
    // start at output 0 and 3, request 1's at 0, 1, 2.
    let lens = |r: Vec<crate::drafter::eval::PromptTau>| -> Vec<Vec<usize>> {
        r.into_iter().map(|p| p.acceptance_lengths).collect()
    };
    // Request 1 has no per-step list (the `summary` level): no cut.
    assert!(m.rounds_within(&[10, 10]).is_none());
    let detailed = REQUESTS.replace(
        r#""num_spec_tokens": 2}"#,
        r#""num_spec_tokens": 2, "per_step_accepted": [0, 0, 0]}"#,
    );
    let (_e, q) = write(&detailed);
    let m = EngineMetrics::read(&q).unwrap();
    assert_eq!(
        lens(m.rounds_within(&[10, 10]).unwrap()),
        vec![vec![3, 2], vec![1, 1, 1]]
    );
    assert_eq!(
        lens(m.rounds_within(&[3, 2]).unwrap()),
        vec![vec![3], vec![1, 1]]
    );
    let r = m.per_request.unwrap();
    assert_eq!(r[0].per_step_accepted, Some(vec![2, 1]));
    assert_eq!(r[1].per_step_accepted, Some(vec![0, 0, 0]));
}

#[test]
fn contradictory_request_lines_name_their_line() {
    let bad = REQUESTS.replace(
        r#""per_step_accepted": [2, 1]"#,
        r#""per_step_accepted": [2, 2]"#,
    );
    assert!(
        err(&bad).contains(":1: per_step_accepted does not count the steps"),
        "{}",
        err(&bad)
    );
    let hist = REQUESTS.replace("[3, 0, 0]", "[2, 0, 0]");
    assert!(
        err(&hist).contains(":2: acceptance_histogram counts 2 steps"),
        "{}",
        err(&hist)
    );
    let other = "{\"text\": \"hi\"}\n";
    assert!(err(other).contains(":1: no speculative_decoding metrics"));
    let broken = "{\"num_spec_steps\": 1\n";
    assert!(err(broken).contains(":1: not JSON"));
}

/// Counters one run cannot give are refused, with where they are.
#[test]
fn impossible_counters_are_refused() {
    let pos = |p: &str| SCRAPE.replace(r#"position="1"} 4.0"#, &format!(r#"position="{p}"}} 4.0"#));
    assert!(
        err(&pos("18446744073709551615")).contains("without a numeric position label")
            || err(&pos("18446744073709551615")).contains("past 1024"),
        "{}",
        err(&pos("18446744073709551615"))
    );
    assert!(err(&pos("99999999999")).contains("position 99999999999: a draft position past 1024"));
    let rising = SCRAPE
        .replace(r#"position="0"} 8.0"#, r#"position="0"} 2.0"#)
        .replace(r#"position="1"} 4.0"#, r#"position="1"} 10.0"#);
    assert!(
        err(&rising).contains("position 1 accepted in 10 rounds, more than 5"),
        "{}",
        err(&rising)
    );
    let twice =
        format!("{SCRAPE}vllm:spec_decode_num_drafts{{engine=\"0\",model_name=\"toy\"}} 10.0\n");
    assert!(
        err(&twice).contains("the series vllm:spec_decode_num_drafts"),
        "{}",
        err(&twice)
    );
    let negative = SCRAPE.replace("} 5.0", "} -5.0");
    assert!(
        err(&negative).contains("is -5, not a count"),
        "{}",
        err(&negative)
    );
    let no_comma = SCRAPE.replace(r#"engine="0",model_name"#, r#"engine="0" model_name"#);
    assert!(
        err(&no_comma).contains("labels not separated by commas"),
        "{}",
        err(&no_comma)
    );
    let label_twice = SCRAPE.replace(
        r#"model_name="toy",position="0""#,
        r#"position="3",position="0""#,
    );
    assert!(
        err(&label_twice).contains("the label position twice"),
        "{}",
        err(&label_twice)
    );
    // Per request: a step list that is not the histogram's, more accepted
    // than proposed, a histogram wider than any block.
    let steps = REQUESTS.replace(
        r#""per_step_accepted": [2, 1]"#,
        r#""per_step_accepted": [0, 3]"#,
    );
    assert!(
        err(&steps).contains("per_step_accepted holds 3, past the histogram's 2 drafts"),
        "{}",
        err(&steps)
    );
    let swapped = REQUESTS.replace(r#""acceptance_histogram": [0, 1, 1]"#, r#""acceptance_histogram": [1, 0, 1]"#).replace(r#""num_accepted_draft_tokens": 3, "num_draft_tokens": 4, "num_spec_tokens": 2, "per_step_accepted": [2, 1]"#, r#""num_accepted_draft_tokens": 2, "num_draft_tokens": 4, "num_spec_tokens": 2, "per_step_accepted": [1, 1]"#);
    assert!(
        err(&swapped).contains("does not count the steps"),
        "{}",
        err(&swapped)
    );
    let over = REQUESTS.replace(r#""num_draft_tokens": 4"#, r#""num_draft_tokens": 2"#);
    assert!(
        err(&over).contains("3 accepted draft tokens of 2 proposed"),
        "{}",
        err(&over)
    );
    let wide = format!("{{\"num_spec_steps\": 0, \"num_accepted_draft_tokens\": 0, \"num_draft_tokens\": 0, \"acceptance_histogram\": [{}]}}\n", vec!["0"; 2000].join(","));
    assert!(
        err(&wide).contains("an acceptance_histogram of 2000 entries"),
        "{}",
        err(&wide)
    );
    let null = REQUESTS.replace("[3, 0, 0]", "[3, null, 0]");
    assert!(
        err(&null).contains("acceptance_histogram[1] is null, not a count"),
        "{}",
        err(&null)
    );
}
