//! A lane edit's prompt, faults and row alignment, by hand.

use super::*;

#[test]
fn left_pads_shift_the_prompt_the_reset_and_the_compared_rows() {
    let e = LaneEdit {
        reset: Some(ResetAt::Middle),
        prompt: PromptEdit::LeftPad { pad: 0, count: 3 },
        ..LaneEdit::default()
    };
    assert_eq!(e.prompt(0, &[7, 8, 9, 10]), [0, 0, 0, 7, 8, 9, 10]);
    // The middle of the 4-token prompt is its token 2, position 5 after 3 pads.
    assert_eq!(e.faults(4).gdn_reset_at, Some(5));
    let f = e.forcing(0, &[7, 8, 9, 10, 11, 12], 4);
    assert_eq!(f.tokens, [0, 0, 0, 7, 8, 9, 10, 11, 12]);
    assert_eq!((f.prompt_len, f.skip, f.base_skip), (7, 3, 0));
    assert!(e.same_conversation_text());
}

#[test]
fn another_rendering_compares_the_continuation_only() {
    let e = LaneEdit {
        prompt: PromptEdit::Replaced(vec![vec![1, 2], vec![3, 4, 5, 6, 7]]),
        ..LaneEdit::default()
    };
    assert_eq!(e.prompt(1, &[9, 9, 9]), [3, 4, 5, 6, 7]);
    let f = e.forcing(1, &[9, 9, 9, 20, 21], 3);
    assert_eq!(f.tokens, [3, 4, 5, 6, 7, 20, 21]);
    assert_eq!((f.prompt_len, f.skip, f.base_skip), (5, 5, 3));
    assert!(!e.same_conversation_text());
}

#[test]
fn own_trajectory_feeds_its_own_tokens_without_faults() {
    let e = LaneEdit {
        faults: Faults {
            crop: crate::models::CacheCrop::ConvOnly,
            ..Faults::default()
        },
        own_trajectory: true,
        ..LaneEdit::default()
    };
    let f = forcing_for(&e, 0, &[1, 2, 3, 4], 2, &[1, 2, 5, 6, 7]);
    assert_eq!(f.tokens, [1, 2, 5, 6, 7]);
    assert!(f.faults.is_none());
    assert_eq!(f.prompt_len, 2);
    // The loop's faults stay on its lanes.
    assert_eq!(e.faults(2).crop, crate::models::CacheCrop::ConvOnly);
    // A reset at an absolute K stays at K.
    let r = LaneEdit {
        reset: Some(ResetAt::At(6)),
        ..LaneEdit::default()
    };
    assert_eq!(r.faults(40).gdn_reset_at, Some(6));
}
