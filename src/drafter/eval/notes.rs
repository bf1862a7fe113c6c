//! What a drafter run says of the drafter itself: tensors its file holds
//! that the DFlash forward never reads, config flags it does not implement,
//! a window the config names but does not use.

use super::DrafterInfo;

impl DrafterInfo {
    /// The finding (a failure of the run) when the drafter's file holds
    /// tensors the DFlash forward never reads: the τ measured is not the
    /// trained drafter's. [`Self::unexpected_note`] says why at length.
    pub fn unexpected_finding(&self) -> Option<String> {
        unread_finding(&self.unexpected_tensors, &self.ignored_flags)
    }

    /// The line that says a window the config names is not used, when so.
    pub fn window_note(&self) -> Option<String> {
        self.sliding_window_unused.map(|w| {
            format!(
                "the drafter's config names sliding_window {w} for its sliding_attention layers but not \
                 use_sliding_window: true; transformers' Qwen3Config (which dflash loads drafters with) then \
                 sets sliding_window to None, so those layers attend causally within the block with no window, \
                 as in this run — a drafter trained with the window (SpecForge's create_dflash_block_mask) \
                 loses acceptance once the context passes {w} tokens: set use_sliding_window to true"
            )
        })
    }

    /// The line that names the tensors the forward never reads, when there are any.
    pub fn unexpected_note(&self) -> Option<String> {
        let n = self.unexpected_tensors.len();
        let (s, them) = if n == 1 { ("", "it") } else { ("s", "them") };
        (n > 0).then(|| {
            let shown: Vec<&str> = self.unexpected_tensors.iter().take(6).map(String::as_str).collect();
            let more = if n > shown.len() { ", …" } else { "" };
            format!(
                "the drafter's file holds {n} tensor{s} the DFlash forward never reads ({}{more}): dflash's \
                 from_pretrained lists {them} as UNEXPECTED and drops {them}, so τ here is the drafter without \
                 {them} — if it was trained with {them} (a norm before fc, an extra projection), this is not the \
                 drafter that was trained",
                shown.join(", ")
            )
        })
    }
}

/// The finding (a failure of a drafter run) when the drafter's file holds
/// tensors the DFlash forward never reads or its config asks for a forward
/// it does not have: the τ measured is not the trained drafter's.
pub fn unread_finding(unexpected: &[String], ignored_flags: &[String]) -> Option<String> {
    let n = unexpected.len();
    if n == 0 && !ignored_flags.is_empty() {
        return Some(format!(
                "the drafter's config sets {}, which the DFlash forward does not implement: τ is measured without it",
                ignored_flags.join(", ")
            ));
    }
    let flags = match ignored_flags.is_empty() {
        true => String::new(),
        false => format!(", and its config sets {}", ignored_flags.join(", ")),
    };
    (n > 0).then(|| {
            let shown: Vec<&str> = unexpected.iter().take(3).map(String::as_str).collect();
            format!(
                "the drafter holds {n} tensor{} the DFlash forward never reads ({}{}){flags}: τ is measured without {}",
                if n == 1 { "" } else { "s" },
                shown.join(", "),
                if n > shown.len() { ", …" } else { "" },
                if n == 1 && flags.is_empty() { "it" } else { "them" }
            )
        })
}
