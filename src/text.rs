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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previews_and_folds() {
        assert_eq!(preview("short"), "short");
        assert_eq!(preview(&"x".repeat(41)), format!("{}…", "x".repeat(40)));
        assert_eq!(one_line("a\n  b\tc"), "a b c");
    }
}
