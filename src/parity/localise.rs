//! Where in the tokens two captures part: per prompt, the positions that
//! still agree and the first that departs, and the boundary the departure
//! coincides with (the end of the prompt, a prefill chunk, a run of pads, a
//! request boundary), with what that boundary means and how to confirm it.
//!
//! A row (one token of one prompt) agrees when it is bitwise equal or
//! passes the pair's tolerance on its own (its cosine and its relative L2).

use serde::Serialize;

use super::metrics::{PromptRows, RowStat};
use super::verdict::{Tolerance, Verdict};

/// What is known about one prompt's inputs besides the rows.
#[derive(Debug, Clone, Default)]
pub struct PromptInputs {
    /// The token ids, when the captures carry them.
    pub ids: Option<Vec<i64>>,
    /// The first position after the prompt (where a cached decode starts),
    /// when the capture says where its prompt ends.
    pub prompt_end: Option<usize>,
    /// `a`'s and `b`'s attention masks, when recorded (1 attended, 0 masked).
    pub masks: [Option<Vec<i64>>; 2],
}

/// One prompt's agreement at one hidden state (`hidden_states[].prompts[]`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptAgreement {
    /// Prompt index.
    pub prompt: usize,
    /// The prompt's own verdict (its rows judged together).
    pub verdict: Verdict,
    /// The prompt's smallest row cosine.
    pub cos_min: f64,
    /// The prompt's relative L2.
    pub rel_l2: f64,
    /// Token rows compared.
    pub positions: usize,
    /// The first position whose row does not agree (`None`: every row agrees).
    pub first_departing: Option<usize>,
    /// The positions whose rows agree, as inclusive `[first, last]` runs.
    pub agreeing: Vec<[usize; 2]>,
}

impl PromptAgreement {
    /// The agreement of one prompt's rows under `tol`.
    pub fn of(rows: &PromptRows, tol: &Tolerance) -> Self {
        let agreeing_positions: Vec<usize> = (0..rows.rows.len())
            .filter(|&t| row_agrees(&rows.rows[t], tol))
            .collect();
        let agreeing = super::verdict::runs(&agreeing_positions);
        let first_departing = rows.rows.iter().position(|r| !row_agrees(r, tol));
        let (cos_min, rel_l2) = (rows.cos_min(), rows.rel_l2());
        let non_finite = rows.rows.iter().any(|r| r.non_finite);
        let bitwise = rows.rows.iter().all(|r| r.bitwise);
        Self {
            prompt: rows.prompt,
            verdict: tol.judge_values(cos_min, rel_l2, bitwise, non_finite),
            cos_min,
            rel_l2,
            positions: rows.rows.len(),
            first_departing,
            agreeing,
        }
    }

    /// Rows that do not agree.
    pub fn departing_rows(&self) -> usize {
        let agreeing: usize = self.agreeing.iter().map(|[a, b]| b + 1 - a).sum();
        self.positions - agreeing
    }

    /// At least 90% of the rows from the first departure on depart.
    pub fn mostly_departs_after(&self) -> bool {
        let f = self.first_departing.unwrap_or(self.positions);
        let later = self.positions - f;
        later > 0 && self.departing_rows() * 10 >= later * 9
    }

    /// Every row before the first departure agrees and none after it does.
    pub fn clean_split(&self) -> bool {
        match self.first_departing {
            None => true,
            Some(0) => self.agreeing.is_empty(),
            Some(f) => self.agreeing == [[0, f - 1]],
        }
    }
}

/// Whether one row agrees under `tol`.
pub fn row_agrees(r: &RowStat, tol: &Tolerance) -> bool {
    r.bitwise
        || (!r.non_finite && r.cos as f64 >= tol.pass_cos && r.rel_l2 as f64 <= tol.pass_rel_l2)
}

/// The named boundary a departure coincides with.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Boundary {
    /// The departure starts at the first position after the prompt: the
    /// cached decode parts from the prefill.
    PromptEnd {
        /// The first position after the prompt.
        position: usize,
    },
    /// The departure starts right after a run of one repeated token (pads),
    /// or where one side masks positions the other attends.
    PadRun {
        /// First position of the run.
        start: usize,
        /// Last position of the run.
        end: usize,
        /// The repeated token id (`None` when the masks alone show the run).
        token: Option<i64>,
        /// `a` or `b`: the side whose attention mask masks the run while
        /// the other side attends it (`None`: no mask shows it).
        masked_by: Option<String>,
    },
    /// Every departing prompt departs at a multiple of `chunk` (a power of
    /// two ≥ 16) with all rows before agreeing and all after departing.
    PrefillChunk {
        /// The departure positions, one per departing prompt.
        positions: Vec<usize>,
        /// The largest power of two dividing every one of them.
        chunk: usize,
    },
    /// The first prompts agree in full and every later one departs from its
    /// first positions: state carried from one request into the next.
    RequestBoundary {
        /// Prompts that agree.
        clean: Vec<usize>,
        /// Prompts that depart.
        departing: Vec<usize>,
    },
}

impl Boundary {
    /// The boundary in a few words, for a summary line: `at the end of the
    /// prompt (position 16): the cached decode departs`.
    pub fn label(&self) -> String {
        match self {
            Boundary::PromptEnd { position } => {
                format!("at the end of the prompt (position {position}): the cached decode departs")
            }
            Boundary::PadRun {
                start,
                end,
                masked_by,
                ..
            } => match masked_by.as_deref() {
                Some(side) => format!(
                    "at positions {start}–{end}, pads that {side} masks and {} attends without a mask",
                    if side == "a" { "b" } else { "a" }
                ),
                None => format!("right after positions {start}–{end}, a run of pads attended without a mask"),
            },
            Boundary::PrefillChunk { chunk, .. } => {
                format!("at a prefill chunk boundary (a multiple of {chunk}): a state lost between chunks")
            }
            Boundary::RequestBoundary { .. } => {
                "at a request boundary: state carried from one request into the next".into()
            }
        }
    }

    /// What the boundary means and how to confirm it, in one sentence.
    pub fn cause(&self) -> String {
        match self {
            Boundary::PromptEnd { position } => format!(
                "the prefill agrees and the cached decode departs from its first step (position {position}): the \
                 state the decode carries (KV cache, the Gated DeltaNet recurrent and conv states) is not what the \
                 prefill left; `hsparity compare` runs the same prefill-vs-incremental check on the reference, so \
                 the fault is in the engine's decode step"
            ),
            Boundary::PadRun {
                start,
                end,
                token,
                masked_by,
            } => {
                let what = match token {
                    Some(t) => format!("positions {start}–{end} are a run of token {t}"),
                    None => format!("positions {start}–{end} are masked"),
                };
                if let Some(side) = masked_by {
                    let other = if side == "a" { "b" } else { "a" };
                    format!(
                        "{what}, which {side}'s attention mask masks and {other}'s does not: {other} attended to \
                         the pads; pass the attention mask to {other}'s forward (or drop the pads)"
                    )
                } else {
                    format!(
                        "{what} and the departure starts right after it: pads attended without an attention mask \
                         (the reference masked them, or was run without them); pass the mask, or drop the pads"
                    )
                }
            }
            Boundary::PrefillChunk { chunk, .. } => format!(
                "rows before a multiple of {chunk} agree and rows from it on depart: a state lost at a prefill \
                 chunk boundary (the Gated DeltaNet state or the KV written by the previous chunk); rerun the \
                 engine with chunked prefill off or a chunk longer than the prompt (vLLM \
                 --max-num-batched-tokens, SGLang --chunked-prefill-size) and prefix caching off — if the \
                 departure moves with the chunk size, the chunk hand-over is the cause"
            ),
            Boundary::RequestBoundary { clean, departing } => format!(
                "{} agree{} and {} depart{}: state carried from one request into the next (a batch sharing a \
                 cache slot, a recurrent state not reset, a capture buffer not cleared); run each prompt alone with \
                 a fresh cache — the clean first request already shows the weights and kernels are right",
                prompt_runs(clean),
                if clean.len() == 1 { "s" } else { "" },
                prompt_runs(departing),
                if departing.len() == 1 { "s" } else { "" },
            ),
        }
    }
}

/// Where agreement ends at one hidden state, with its boundary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Localisation {
    /// The `hidden_states` index described (the pair's first divergent one).
    pub index: usize,
    /// Prompts whose own verdict passes.
    pub prompts_agreeing: Vec<usize>,
    /// Prompts whose own verdict does not pass.
    pub prompts_departing: Vec<usize>,
    /// The boundary the departure coincides with, when one does.
    pub boundary: Option<Boundary>,
    /// Where agreement ends, in one sentence.
    pub sentence: String,
    /// What the boundary means and how to confirm it ([`Boundary::cause`]).
    pub cause: Option<String>,
    /// Per prompt, the position profile of this hidden state.
    pub profile: Vec<PositionProfile>,
}

/// One prompt's rows at a glance: one character per run of
/// `positions_per_char` positions — `.` all agree, `#` all depart, `+` mixed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PositionProfile {
    /// Prompt index.
    pub prompt: usize,
    /// Positions each character stands for (1 up to 64 positions).
    pub positions_per_char: usize,
    /// The strip, at most 64 characters.
    pub strip: String,
}

impl PositionProfile {
    /// The profile of `rows` under `tol`.
    pub fn of(rows: &PromptRows, tol: &Tolerance) -> Self {
        let n = rows.rows.len();
        let per = n.div_ceil(64).max(1);
        let strip = rows
            .rows
            .chunks(per)
            .map(|c| {
                let agree = c.iter().filter(|r| row_agrees(r, tol)).count();
                match agree {
                    a if a == c.len() => '.',
                    0 => '#',
                    _ => '+',
                }
            })
            .collect();
        Self {
            prompt: rows.prompt,
            positions_per_char: per,
            strip,
        }
    }
}

/// `p0`, `p1–3`, `p0, p2`.
pub fn prompt_runs(prompts: &[usize]) -> String {
    super::verdict::runs_text(&super::verdict::runs(prompts), "p")
}

/// The first position after a run of one repeated token ending just
/// before `f` (length ≥ 2), or the run where a masks and b attends.
fn pad_run(f: usize, inputs: &PromptInputs) -> Option<Boundary> {
    for (masked_by, other) in [(0, 1), (1, 0)] {
        let Some(m) = &inputs.masks[masked_by] else {
            continue;
        };
        let attended = |t: usize| {
            inputs.masks[other]
                .as_ref()
                .is_none_or(|o| o.get(t) != Some(&0))
        };
        let masked: Vec<usize> = (0..m.len()).filter(|&t| m[t] == 0 && attended(t)).collect();
        if let (Some(&start), Some(&end)) = (masked.first(), masked.last()) {
            if end + 1 == masked.len() + start && f <= end + 1 {
                // The run's token, when the masked positions hold one repeated token.
                let token = inputs.ids.as_ref().and_then(|ids| {
                    let run = ids.get(start..=end)?;
                    run.iter().all(|&t| t == run[0]).then_some(run[0])
                });
                return Some(Boundary::PadRun {
                    start,
                    end,
                    token,
                    masked_by: Some(if masked_by == 0 { "a" } else { "b" }.into()),
                });
            }
        }
    }
    let ids = inputs.ids.as_ref()?;
    let end = f.checked_sub(1)?;
    let token = *ids.get(end)?;
    let start = (0..=end).rev().take_while(|&t| ids[t] == token).last()?;
    (end > start).then_some(Boundary::PadRun {
        start,
        end,
        token: Some(token),
        masked_by: None,
    })
}

/// The largest power of two ≥ 16 dividing every position (none: `None`).
fn common_chunk(positions: &[usize]) -> Option<usize> {
    let z = positions
        .iter()
        .map(|&p| if p == 0 { 0 } else { p.trailing_zeros() })
        .min()?;
    (positions.iter().all(|&p| p > 0) && z >= 4).then(|| 1usize << z.min(20))
}

/// The boundary the departures of `departing` coincide with.
fn boundary(
    agreement: &[PromptAgreement],
    departing: &[&PromptAgreement],
    inputs: &[PromptInputs],
) -> Option<Boundary> {
    if departing.is_empty() {
        return None;
    }
    let firsts: Vec<usize> = departing
        .iter()
        .map(|p| p.first_departing.unwrap_or(0))
        .collect();
    let clean: Vec<usize> = agreement
        .iter()
        .filter(|p| p.verdict == Verdict::Pass)
        .map(|p| p.prompt)
        .collect();
    // A state lost at a boundary corrupts what follows: nearly every row from
    // the first departure on departs (noise departs here and there).
    let split = departing.iter().all(|p| p.mostly_departs_after());
    if split && firsts.iter().all(|&f| f > 0) {
        let at_end = departing
            .iter()
            .all(|p| inputs.get(p.prompt).and_then(|i| i.prompt_end) == p.first_departing);
        if at_end {
            return Some(Boundary::PromptEnd {
                position: firsts[0],
            });
        }
    }
    if let Some(b) = departing
        .iter()
        .find_map(|p| pad_run(p.first_departing.unwrap_or(0), inputs.get(p.prompt)?))
    {
        return Some(b);
    }
    if split {
        if let Some(chunk) = common_chunk(&firsts) {
            return Some(Boundary::PrefillChunk {
                positions: firsts,
                chunk,
            });
        }
    }
    let after = departing.iter().map(|p| p.prompt).min();
    match (clean.iter().max(), after) {
        (Some(&c), Some(d)) if clean.contains(&0) && d > c => Some(Boundary::RequestBoundary {
            clean,
            departing: departing.iter().map(|p| p.prompt).collect(),
        }),
        _ => None,
    }
}

/// Where agreement ends at `index`, from its per-prompt agreement.
pub fn localise(
    index: usize,
    agreement: &[PromptAgreement],
    inputs: &[PromptInputs],
    profile: Vec<PositionProfile>,
) -> Localisation {
    let departing: Vec<&PromptAgreement> = agreement
        .iter()
        .filter(|p| p.verdict != Verdict::Pass)
        .collect();
    let ids = |v: &[&PromptAgreement]| v.iter().map(|p| p.prompt).collect::<Vec<_>>();
    let agreeing: Vec<usize> = agreement
        .iter()
        .filter(|p| p.verdict == Verdict::Pass)
        .map(|p| p.prompt)
        .collect();
    let boundary = boundary(agreement, &departing, inputs);
    let mut cause = boundary.as_ref().map(Boundary::cause);
    // A departure at a multiple of a power of two is also where a cached
    // decode would start after a prompt of that length: without the prompt
    // lengths the two cannot be told apart.
    if let (Some(Boundary::PrefillChunk { positions, .. }), Some(c)) = (&boundary, &mut cause) {
        let known = departing
            .iter()
            .all(|p| inputs.get(p.prompt).is_some_and(|i| i.prompt_end.is_some()));
        if !known {
            c.push_str(&format!(
                "; or, if the prompt ends at position {} — the captures do not say (a dump's p{{k}}.prompt_length does) — the cached decode departs from its first step",
                positions.first().copied().unwrap_or(0)
            ));
        }
    }
    Localisation {
        index,
        sentence: sentence(index, agreement, &departing, boundary.is_some()),
        cause,
        boundary,
        prompts_agreeing: agreeing,
        prompts_departing: ids(&departing),
        profile,
    }
}

/// Where agreement ends at `index` when the cause is known (no guess at it
/// in the sentence), with the boundary's label when one is found: what
/// triage says of a suspect's taps.
pub fn where_known(index: usize, agreement: &[PromptAgreement], inputs: &[PromptInputs]) -> String {
    let departing: Vec<&PromptAgreement> = agreement
        .iter()
        .filter(|p| p.verdict != Verdict::Pass)
        .collect();
    let s = sentence(index, agreement, &departing, true);
    match boundary(agreement, &departing, inputs) {
        Some(b) => format!("{s}; {}", b.label()),
        None => s,
    }
}

/// `hidden_states[3]: positions 0–39 agree in every prompt, departure from position 40 on`.
/// `named`: a boundary explains the departure (no guess at its cause).
fn sentence(
    index: usize,
    all: &[PromptAgreement],
    departing: &[&PromptAgreement],
    named: bool,
) -> String {
    let head = format!("hidden_states[{index}]");
    if departing.is_empty() {
        return format!(
            "{head}: every prompt agrees row by row (the difference is in the aggregate)"
        );
    }
    let firsts: Vec<usize> = departing
        .iter()
        .map(|p| p.first_departing.unwrap_or(0))
        .collect();
    let same = firsts.iter().all(|&f| f == firsts[0]);
    let split = departing.iter().all(|p| p.clean_split());
    let clean: Vec<usize> = all
        .iter()
        .filter(|p| p.verdict == Verdict::Pass)
        .map(|p| p.prompt)
        .collect();
    let (which, plural) = if departing.len() == all.len() {
        if all.len() == 1 {
            ("the prompt".to_string(), false)
        } else {
            let which = match all.len() {
                2 => "both prompts".to_string(),
                n => format!("all {n} prompts"),
            };
            (which, true)
        }
    } else {
        let ids: Vec<usize> = departing.iter().map(|p| p.prompt).collect();
        (prompt_runs(&ids), ids.len() > 1)
    };
    let s = if plural { "" } else { "s" };
    let agreeing = if clean.is_empty() {
        String::new()
    } else {
        format!(
            " ({} agree{})",
            prompt_runs(&clean),
            if clean.len() == 1 { "s" } else { "" }
        )
    };
    let departing_rows: usize = departing.iter().map(|p| p.departing_rows()).sum();
    let later_rows: usize = departing
        .iter()
        .map(|p| p.positions - p.first_departing.unwrap_or(0))
        .sum();
    let tail = if split {
        ", every row from there on departs".to_string()
    } else {
        format!(" ({departing_rows} of the {later_rows} rows from there on depart)")
    };
    match (same, firsts[0]) {
        (true, 0) if split && clean.is_empty() && !named => format!(
            "{head}: {which} depart{s} at every position (every token differs from the first on: not a state \
             lost along the sequence, but something every position sees — the inputs, the weights, the dtype, a \
             kernel, or which tensor was captured)"
        ),
        (true, 0) if split => format!("{head}: {which} depart{s} at every position{agreeing}"),
        (true, 0) => format!("{head}: {which} depart{s} from the first position{tail}{agreeing}"),
        (true, f) => format!(
            "{head}: positions 0–{} agree in {which}; departure starts at position {f}{tail}{agreeing}",
            f - 1
        ),
        (false, _) => {
            let parts: Vec<String> = departing
                .iter()
                .map(|p| format!("p{} at {}", p.prompt, p.first_departing.unwrap_or(0)))
                .collect();
            format!(
                "{head}: {which} depart{s}, first at {}{tail}{agreeing}",
                parts.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests;
