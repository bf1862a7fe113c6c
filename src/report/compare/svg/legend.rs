//! The plot's title (the whole summary, wrapped) and legend (pairs, bands,
//! layer types, marks, the drafter's τ per path, the tap convention).

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{
    shade, DrawResult, BAND_FAIL, BAND_PASS, BAND_WARN, DIVERGENT, FONT, PAIR_COLORS, PASS_GREEN,
    RANDOM, TAP, WIDTH,
};
use crate::report::compare::CompareReport;

/// Characters per line: the bold 16 px title, the 12 px text.
const TITLE_CHARS: usize = 110;
const TEXT_CHARS: usize = 150;
const TITLE_LINE: u32 = 20;
const TEXT_LINE: u32 = 16;
const LEGEND_LINE: u32 = 20;

/// `s` in lines of at most `chars` characters, at word boundaries (never
/// at a hyphen: path names stay whole).
fn wrap(s: &str, chars: usize) -> Vec<String> {
    let opts = textwrap::Options::new(chars)
        .break_words(false)
        .word_splitter(textwrap::WordSplitter::NoHyphenation);
    textwrap::wrap(s, opts)
        .into_iter()
        .map(|l| l.into_owned())
        .collect()
}

fn title_text(report: &CompareReport) -> String {
    let pairs: Vec<String> = report
        .pairs
        .iter()
        .map(|p| format!("{} vs {}", p.a, p.b))
        .collect();
    format!(
        "hsparity per-layer parity: {} — {}",
        pairs.join(", "),
        report
            .environment
            .target
            .as_ref()
            .map_or("-", |t| t.checkpoint.as_str())
    )
}

/// Height of the title block: its lines and the summary's.
pub fn title_height(report: &CompareReport) -> u32 {
    let t = wrap(&title_text(report), TITLE_CHARS).len() as u32;
    let s = wrap(&report.summary, TEXT_CHARS).len() as u32;
    12 + t * TITLE_LINE + s * TEXT_LINE + 6
}

pub fn draw_title(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    report: &CompareReport,
) -> DrawResult<()> {
    let mut y = 10;
    for l in wrap(&title_text(report), TITLE_CHARS) {
        area.draw(&Text::new(
            l,
            (14, y),
            (FONT, 16).into_font().style(FontStyle::Bold),
        ))?;
        y += TITLE_LINE as i32;
    }
    let color = if report.exit_code == 0 {
        PASS_GREEN
    } else {
        DIVERGENT
    };
    for l in wrap(&report.summary, TEXT_CHARS) {
        area.draw(&Text::new(l, (14, y), (FONT, 12).into_font().color(&color)))?;
        y += TEXT_LINE as i32;
    }
    Ok(())
}

/// The drafter's τ per path and the signed gap, when a drafter ran.
fn drafter_line(report: &CompareReport) -> Option<String> {
    let d = report.drafter.as_ref()?;
    let taus: Vec<String> = d
        .paths
        .iter()
        .map(|p| format!("{} {:.2}", p.name, p.summary.tau_macro))
        .collect();
    let gap = d
        .tau_gap_interval
        .as_ref()
        .map(|g| format!("; {}", g.sentence()))
        .unwrap_or_default();
    Some(format!(
        "drafter τ (macro) {}{gap}; on {}",
        taus.join(" vs "),
        d.measured_on
    ))
}

/// The tap line: which taps, in which convention.
fn taps_line(report: &CompareReport) -> String {
    let taps = if report.taps.is_empty() {
        "no taps marked".to_string()
    } else {
        format!("taps {:?}", report.taps)
    };
    format!("{taps}; {}", report.tap_convention)
}

/// Height of the legend: pairs, bands, layer types, marks, then the
/// drafter's and the taps' wrapped lines.
pub fn legend_height(report: &CompareReport) -> u32 {
    let text = drafter_line(report)
        .map(|l| wrap(&l, TEXT_CHARS).len())
        .unwrap_or(0)
        + wrap(&taps_line(report), TEXT_CHARS).len();
    10 + (report.pairs.len() as u32 + 3) * LEGEND_LINE + text as u32 * TEXT_LINE + 8
}

pub fn draw_legend(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    report: &CompareReport,
) -> DrawResult<()> {
    let font = (FONT, 12).into_font();
    let text = |s: String, x: i32, y: i32| Text::new(s, (x + 38, y - 6), font.clone());
    let swatch =
        |x: i32, y: i32, c: RGBColor| Rectangle::new([(x, y - 7), (x + 30, y + 7)], c.filled());
    let (x0, col) = (24, (WIDTH as i32 - 48) / 4);
    let mut y = 18;
    for (j, p) in report.pairs.iter().enumerate() {
        let color = PAIR_COLORS[j % PAIR_COLORS.len()];
        area.draw(&PathElement::new(
            vec![(x0, y), (x0 + 30, y)],
            color.stroke_width(2),
        ))?;
        area.draw(&Circle::new((x0 + 15, y), 4, color.filled()))?;
        area.draw(&text(format!("{} vs {}: hidden states", p.a, p.b), x0, y))?;
        if p.logits.is_some() {
            area.draw(&TriangleMarker::new(
                (x0 + 2 * col + 15, y),
                7,
                color.filled(),
            ))?;
            area.draw(&text(
                format!("{} vs {}: logits", p.a, p.b),
                x0 + 2 * col,
                y,
            ))?;
        }
        y += LEGEND_LINE as i32;
    }
    let rule = report
        .pairs
        .first()
        .map(|p| p.tolerance_rule.clone())
        .unwrap_or_default();
    for (k, (c, s)) in [
        (BAND_PASS, "PASS".to_string()),
        (BAND_WARN, "WARN".to_string()),
        (BAND_FAIL, format!("FAIL (bands: {rule})")),
    ]
    .into_iter()
    .enumerate()
    {
        let x = x0 + k as i32 * col / 2;
        area.draw(&swatch(x, y, c))?;
        area.draw(&text(s, x, y))?;
    }
    y += LEGEND_LINE as i32;
    let mut kinds: Vec<_> = Vec::new();
    for r in report
        .pairs
        .first()
        .map_or(&[][..], |p| &p.hidden_states[..])
    {
        let s = shade(r.layer_type);
        if !kinds.contains(&s) {
            kinds.push(s);
        }
    }
    for (k, (c, s)) in kinds.iter().enumerate() {
        let x = x0 + k as i32 * col;
        area.draw(&swatch(x, y, *c))?;
        area.draw(&text(format!("strip: {s}"), x, y))?;
    }
    y += LEGEND_LINE as i32;
    for k in 0..3 {
        area.draw(&PathElement::new(
            vec![(x0 + k * 11, y), (x0 + k * 11 + 7, y)],
            TAP.stroke_width(1),
        ))?;
    }
    area.draw(&text("drafter tap".into(), x0, y))?;
    area.draw(&PathElement::new(
        vec![(x0 + col, y), (x0 + col + 30, y)],
        DIVERGENT.stroke_width(2),
    ))?;
    area.draw(&text("first divergent".into(), x0 + col, y))?;
    area.draw(&Cross::new(
        (x0 + 2 * col + 15, y),
        6,
        DIVERGENT.stroke_width(2),
    ))?;
    area.draw(&text("NaN/Inf".into(), x0 + 2 * col, y))?;
    area.draw(&Rectangle::new(
        [(x0 + 3 * col, y - 7), (x0 + 3 * col + 30, y + 7)],
        RANDOM.stroke_width(2),
    ))?;
    area.draw(&text(
        "RANDOM INIT (MISSING weights)".into(),
        x0 + 3 * col,
        y,
    ))?;
    y += LEGEND_LINE as i32 - 4;
    let lines = drafter_line(report)
        .map(|l| wrap(&l, TEXT_CHARS))
        .unwrap_or_default()
        .into_iter()
        .chain(wrap(&taps_line(report), TEXT_CHARS));
    for l in lines {
        area.draw(&Text::new(l, (x0, y), (FONT, 11).into_font().color(&TAP)))?;
        y += TEXT_LINE as i32;
    }
    Ok(())
}
