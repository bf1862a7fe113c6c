//! Boundaries named from per-prompt agreement.

use super::*;
use crate::parity::metrics::Accumulator;
use crate::precision::Precision;

/// Prompt rows of width 2: rows from `from` on are rotated away from b.
fn rows(prompt: usize, t: usize, from: Option<usize>) -> PromptRows {
    let b: Vec<f32> = (0..t).flat_map(|i| [1.0 + i as f32, 1.0]).collect();
    let mut a = b.clone();
    if let Some(f) = from {
        for i in f..t {
            a[2 * i] = -a[2 * i];
        }
    }
    let mut acc = Accumulator::default();
    acc.add_rows(prompt, &a, &b, 2);
    acc.finish().profile.remove(0)
}

fn agreement(specs: &[(usize, Option<usize>)]) -> Vec<PromptAgreement> {
    let tol = Tolerance::for_precision(Precision::F32);
    specs
        .iter()
        .enumerate()
        .map(|(k, &(t, f))| PromptAgreement::of(&rows(k, t, f), &tol))
        .collect()
}

#[test]
fn a_departure_at_a_multiple_of_64_is_a_prefill_chunk() {
    let a = agreement(&[(100, Some(64)), (130, Some(128))]);
    assert_eq!(a[0].first_departing, Some(64));
    assert_eq!(a[0].agreeing, vec![[0, 63]]);
    let l = localise(3, &a, &[], Vec::new());
    assert_eq!(
        l.boundary,
        Some(Boundary::PrefillChunk {
            positions: vec![64, 128],
            chunk: 64
        })
    );
}

#[test]
fn a_chunk_without_prompt_lengths_names_the_decode_too() {
    let a = agreement(&[(24, Some(16))]);
    let l = localise(1, &a, &[], Vec::new());
    let cause = l.cause.unwrap();
    assert!(cause.contains("a multiple of 16"), "{cause}");
    assert!(
        cause.contains("if the prompt ends at position 16"),
        "{cause}"
    );
    let inputs = [PromptInputs {
        prompt_end: Some(10),
        ..Default::default()
    }];
    let cause = localise(1, &a, &inputs, Vec::new()).cause.unwrap();
    assert!(!cause.contains("if the prompt ends"), "{cause}");
}

#[test]
fn a_departure_at_the_prompt_end_is_the_decode() {
    let a = agreement(&[(48, Some(40))]);
    let inputs = [PromptInputs {
        prompt_end: Some(40),
        ..Default::default()
    }];
    let l = localise(2, &a, &inputs, Vec::new());
    assert_eq!(l.boundary, Some(Boundary::PromptEnd { position: 40 }));
    assert!(
        l.sentence.contains("positions 0–39 agree"),
        "{}",
        l.sentence
    );
}

#[test]
fn clean_first_prompts_and_departing_later_ones_are_a_request_boundary() {
    let a = agreement(&[(10, None), (10, Some(0)), (12, Some(0))]);
    let l = localise(1, &a, &[], Vec::new());
    assert_eq!(
        l.boundary,
        Some(Boundary::RequestBoundary {
            clean: vec![0],
            departing: vec![1, 2]
        })
    );
}

#[test]
fn a_run_of_pads_before_the_departure_is_named() {
    let a = agreement(&[(10, Some(4))]);
    let inputs = [PromptInputs {
        ids: Some(vec![7, 7, 7, 7, 1, 2, 3, 4, 5, 6]),
        ..Default::default()
    }];
    let l = localise(1, &a, &inputs, Vec::new());
    assert_eq!(
        l.boundary,
        Some(Boundary::PadRun {
            start: 0,
            end: 3,
            token: Some(7),
            masked_by: None
        })
    );
}

#[test]
fn a_masked_run_of_several_tokens_names_no_token() {
    let a = agreement(&[(10, Some(0))]);
    let inputs = [PromptInputs {
        ids: Some(vec![7, 7, 3, 4, 1, 2, 3, 4, 5, 6]),
        masks: [Some(vec![0, 0, 0, 0, 1, 1, 1, 1, 1, 1]), None],
        ..Default::default()
    }];
    let l = localise(1, &a, &inputs, Vec::new());
    assert_eq!(
        l.boundary,
        Some(Boundary::PadRun {
            start: 0,
            end: 3,
            token: None,
            masked_by: Some("a".into())
        })
    );
}

#[test]
fn an_odd_position_names_no_boundary() {
    let a = agreement(&[(50, Some(37))]);
    let l = localise(1, &a, &[], Vec::new());
    assert_eq!(l.boundary, None);
    assert!(l.sentence.contains("departure starts at position 37"));
}
