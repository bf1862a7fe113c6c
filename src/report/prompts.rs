//! The `prompts` report ([`Listing`]): every prompt exactly as a run would
//! feed it to the model (the text tokenised, after the chat template, and
//! the token ids), with what a run would refuse.

use crate::width::Width;
use serde::Serialize;

use super::tabular::{Cell, Column, Row, Table};
use super::{Body, Environment, Kind, PromptFacts, Report};
use crate::parity::Verdict;
use crate::prompts::Prompt;

/// `prompts`'s report: the envelope around [`Listing`].
pub type PromptsReport = Report<Listing>;

/// The members `prompts`'s report adds to the envelope.
#[derive(Debug, Clone, Serialize)]
pub struct Listing {
    /// Every prompt, in the order a run feeds them.
    pub prompts: Vec<PromptShown>,
    /// What a run would refuse (a prompt over `max_position_embeddings`, a
    /// token id over `vocab_size`, an empty prompt), one line each.
    pub refused: Vec<String>,
}

/// One prompt as the model would see it.
#[derive(Debug, Clone, Serialize)]
pub struct PromptShown {
    /// Index, source, origin, token count and sha256 of the text.
    #[serde(flatten)]
    pub facts: PromptFacts,
    /// The text tokenised, verbatim (the chat template's rendering, else the
    /// text as given); `null` for token ids.
    pub text: Option<String>,
    /// The token ids fed to the model.
    pub ids: Vec<u32>,
}

impl PromptShown {
    /// Prompt `k` as shown.
    pub fn of(k: usize, p: &Prompt) -> Self {
        PromptShown {
            facts: PromptFacts::of(k, p),
            text: p.fed_text().map(str::to_owned),
            ids: p.ids.clone(),
        }
    }
}

/// The report of `prompts` with `refused` (from
/// [`crate::prompts::violations`]): `fail` when a run would refuse a prompt.
pub fn build(
    prompts: &[Prompt],
    refused: Vec<String>,
    environment: Environment,
    command: String,
) -> PromptsReport {
    let tokens: usize = prompts.iter().map(|p| p.ids.len()).sum();
    let target = environment.target.as_ref();
    let how = target
        .and_then(|t| t.rendering_line())
        .unwrap_or_else(|| "no chat template (text tokenised as given)".into());
    let (verdict, summary) = if refused.is_empty() {
        (
            Verdict::Pass,
            format!(
                "{} prompt{}, {tokens} tokens, every one within the model's vocabulary and positions; {how}",
                prompts.len(),
                if prompts.len() == 1 { "" } else { "s" }
            ),
        )
    } else {
        (
            Verdict::Fail,
            format!(
                "a run would refuse {} of {} prompts ({}); {how}",
                refused.len(),
                prompts.len(),
                refused[0]
            ),
        )
    };
    let body = Listing {
        prompts: prompts
            .iter()
            .enumerate()
            .map(|(k, p)| PromptShown::of(k, p))
            .collect(),
        refused,
    };
    Report::new(
        Kind::Prompts,
        verdict,
        &summary,
        environment,
        command,
        Vec::new(),
        body,
    )
}

/// One row per prompt: index, source, origin, tokens, sha256 of the text.
pub fn table(l: &Listing) -> Table {
    let mut t = Table::new(vec![
        Column::new("k"),
        Column::new("source"),
        Column::new("origin"),
        Column::new("chat template"),
        Column::new("tokens"),
        Column::new("text sha256"),
    ]);
    for p in &l.prompts {
        let f = &p.facts;
        t.push(Row::new(vec![
            f.index.to_string().into(),
            f.source.into(),
            Cell::code(&f.origin),
            if f.chat { "yes" } else { "no" }.into(),
            f.tokens.to_string().into(),
            f.rendered_sha256
                .as_deref()
                .map(|s| s[..16].to_string())
                .unwrap_or_else(|| "-".into())
                .into(),
        ]));
    }
    t
}

/// The terminal rendering: the summary, the table, then each prompt's text
/// between `⟦` and `⟧` (verbatim, so trailing spaces and newlines show) and
/// its ids as a Python list.
pub fn render(r: &PromptsReport, width: Width) -> String {
    let mut out = format!("{}\n", r.summary);
    out.push_str(&table(r).render(width));
    out.push('\n');
    for p in &r.prompts {
        let f = &p.facts;
        out.push_str(&format!(
            "\nprompt {} · {} · {} tokens{}\n",
            f.index,
            f.origin,
            f.tokens,
            f.rendered_sha256
                .as_deref()
                .map(|s| format!(" · text sha256 {s}"))
                .unwrap_or_default()
        ));
        match &p.text {
            Some(t) => out.push_str(&format!("⟦{t}⟧\n")),
            None => out.push_str("(token ids given, no text)\n"),
        }
        let ids: Vec<String> = p.ids.iter().map(u32::to_string).collect();
        out.push_str(&format!("ids: [{}]\n", ids.join(", ")));
    }
    for line in &r.refused {
        out.push_str(&format!("refused: {line}\n"));
    }
    out
}

impl Body for Listing {
    fn terminal(report: &Report<Self>, width: Width) -> String {
        render(report, width)
    }
}
