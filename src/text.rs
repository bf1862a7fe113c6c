//! Text for messages and reports: short previews and one-line folding, so an
//! error stays on one line and a report cell stays readable.

/// The first 40 characters of `text`, with `…` when it is longer.
pub fn preview(text: &str) -> String {
    let mut s: String = text.chars().take(40).collect();
    if text.chars().count() > 40 {
        s.push('…');
    }
    s
}

/// `s` with line breaks and runs of whitespace folded to single spaces.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `1 tensor`, `3 tensors`: a count with its noun, plural by `-s` (or
/// `plural` when given, for `index`/`indices`).
pub fn counted(n: usize, noun: &str, plural: Option<&str>) -> String {
    match (n, plural) {
        (1, _) => format!("1 {noun}"),
        (_, Some(p)) => format!("{n} {p}"),
        (_, None) => format!("{n} {noun}s"),
    }
}

/// `s` with its first letter upper-case (a sentence that opens a Markdown line).
pub fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// A measured value to at most 4 decimals, trailing zeros dropped (`1.2`,
/// `7.7162`): an observed τ as given or as an engine's counters give it.
pub fn decimals4(x: f64) -> String {
    let s = format!("{x:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_take_their_noun() {
        assert_eq!(counted(1, "tensor", None), "1 tensor");
        assert_eq!(counted(0, "prompt", None), "0 prompts");
        assert_eq!(counted(2, "index", Some("indices")), "2 indices");
    }

    #[test]
    fn previews_and_folds() {
        assert_eq!(preview("short"), "short");
        assert_eq!(preview(&"x".repeat(41)), format!("{}…", "x".repeat(40)));
        assert_eq!(one_line("a\n  b\tc"), "a b c");
    }
}
