//! `hsparity triage` on the toy pair: the suspects are ranked by the τ they
//! cost, reproducibly, and the ranking is the sensible one (misread taps and
//! a random lm_head cost far more than the delta-rule form).

mod common;

use common::same_len;
use hsparity::commands::triage::{self, TriageOptions};
use hsparity::drafter::eval::EndRule;
use hsparity::drafter::Replay;
use hsparity::report::TriageReport;
use hsparity::triage::TriageSettings;

fn run() -> TriageReport {
    let tmp = tempfile::tempdir().unwrap();
    // Five of the fifteen held-out prompts, 32 new tokens: enough rounds, quick.
    let lines: Vec<String> = std::fs::read_to_string("fixtures/toy-pair/prompts.jsonl")
        .unwrap()
        .lines()
        .step_by(3)
        .map(str::to_string)
        .collect();
    let f = tmp.path().join("p.jsonl");
    std::fs::write(&f, lines.join("\n")).unwrap();
    triage::run(&TriageOptions {
        target: common::target("fixtures/toy-pair/target", f.to_str()),
        settings: TriageSettings {
            drafter: "fixtures/toy-pair/drafter".into(),
            replay: Replay {
                max_new: 32,
                budget: 8,
                rule: EndRule::GithubMain,
            },
            observed_tau: Some(1.2),
            position_shift: 16,
            seed: 0,
            quiet: true,
            memory_budget: None,
            trajectories: None,
        },
        command_line: String::new(),
    })
    .unwrap()
}

#[test]
fn ranking_is_sensible_and_reproducible() {
    let r = run();
    let d = |name: &str| {
        r.variants
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| {
                panic!(
                    "variant {name} missing: {:?}",
                    r.variants.iter().map(|v| &v.name).collect::<Vec<_>>()
                )
            })
            .delta_tau
            .abs()
    };
    println!("{}", hsparity::report::triage::render(&r));
    assert!(r.baseline.tau_macro >= 3.0);
    let recurrent = d("gdn-recurrent");
    assert!(recurrent <= 0.1, "chunked vs recurrent costs {recurrent}");
    for costly in ["tap-offset-1", "tap-offset+1", "missing-lm_head"] {
        assert!(
            d(costly) > recurrent + 1.0,
            "{costly} costs only {}",
            d(costly)
        );
    }
    // Ranked by |Δτ|, largest first.
    assert!(r
        .variants
        .windows(2)
        .all(|w| w[0].delta_tau.abs() >= w[1].delta_tau.abs()));
    // Tap offsets misread the features (low cosine) but need no target forward.
    let off = r
        .variants
        .iter()
        .find(|v| v.name == "tap-offset+1")
        .unwrap();
    assert!(off.cos_min_at_taps < 0.9 && off.wall_s == 0.0);
    assert!(r
        .variants
        .iter()
        .filter(|v| v.consistent_with_observed == Some(true))
        .any(|v| v.name.starts_with("tap-offset") || v.name.starts_with("missing")));
    // Same inputs, same numbers.
    let again = run();
    same_len("variants", &r.variants, &again.variants);
    for (a, b) in r.variants.iter().zip(&again.variants) {
        assert_eq!(
            (&a.name, a.tau_macro, a.ddtree_tau_macro),
            (&b.name, b.tau_macro, b.ddtree_tau_macro)
        );
    }
}
