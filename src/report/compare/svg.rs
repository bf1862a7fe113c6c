//! SVG rendering of the per-layer parity (`reports/<name>/parity.svg`, linked
//! from `report.md`), drawn with plotters' SVG backend.
//!
//! Per `hidden_states` index (x) and per path pair: `1 − cos_min` (solid line,
//! circles) and relative L2 (dashed line, triangles) on a log scale (y). The
//! background shades each index by layer type (Gated DeltaNet linear
//! attention, full attention, embeddings / final norm); dashed grey verticals
//! mark the drafter taps (tap L at `hidden_states[L+1]`); a red vertical marks
//! each pair's first divergent hidden state; thin grey horizontals are the
//! pass tolerances of the first pair.
//!
//! Renders only: every value comes from the [`crate::report::Report`]. The one display
//! transform is for the log axis: values ≤ [`FLOOR`] (bitwise-identical rows
//! give exactly 0) are drawn on the floor line labelled "bitwise identical",
//! and NaN/±Inf metrics (or rows with NaN/Inf values) are drawn as red crosses
//! on the top edge, labelled "NaN/Inf".
//!
//! Text is emitted as SVG `<text>` (font family `sans-serif`); plotters sizes
//! it with its built-in estimate, so no font files are read.

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::CompareReport;
use crate::capture::HiddenKind;
use crate::checkpoint::config::LayerType;
use crate::error::{Error, Result};
use crate::parity::{HiddenStateRow, PairReport};

/// Smallest value drawn on the log axis; 0 (bitwise identical) is drawn here.
pub const FLOOR: f64 = 1e-12;

/// Canvas size in pixels.
pub const SIZE: (u32, u32) = (960, 580);

const TITLE_H: u32 = 58;
const LEGEND_H: u32 = 112;
const FONT: &str = "sans-serif";

/// Line colours of successive pairs.
const PAIR_COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];
const DIVERGENT: RGBColor = RGBColor(214, 39, 40);
const TAP: RGBColor = RGBColor(90, 90, 90);
const GUIDE: RGBColor = RGBColor(150, 150, 150);
const PASS_GREEN: RGBColor = RGBColor(30, 130, 60);
const SHADE_LINEAR: RGBColor = RGBColor(226, 236, 250);
const SHADE_FULL: RGBColor = RGBColor(253, 231, 206);
const SHADE_OTHER: RGBColor = RGBColor(236, 236, 236);

type DrawResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The SVG document (UTF-8, `<svg …>` root, [`SIZE`] pixels).
///
/// Errors: [`Error::Format`] when plotters fails to draw (it writes to a
/// string, so only on an internal plotters error).
pub fn render(report: &CompareReport) -> Result<String> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, SIZE).into_drawing_area();
        draw(&root, report)
            .and_then(|()| root.present().map_err(Into::into))
            .map_err(|e| Error::Format(format!("drawing parity.svg: {e}")))?;
    }
    buf.push('\n');
    Ok(buf)
}

/// Shade of a `layer_type`, and its legend text.
fn shade(kind: HiddenKind) -> RGBColor {
    match kind {
        HiddenKind::Layer(LayerType::LinearAttention) => SHADE_LINEAR,
        HiddenKind::Layer(LayerType::FullAttention) => SHADE_FULL,
        _ => SHADE_OTHER,
    }
}

/// x-axis label of `hidden_states[index]`: `emb`, `L3` (output of layer 3).
fn x_label(index: usize) -> String {
    if index == 0 {
        "emb".into()
    } else {
        format!("L{}", index - 1)
    }
}

/// A row's two plotted metrics; `None` when not finite (NaN/±Inf).
fn metrics(row: &HiddenStateRow) -> [Option<f64>; 2] {
    let m = &row.metrics;
    let bad = m.nan_count + m.inf_count > 0;
    let v = |x: f64| (!bad && x.is_finite()).then_some(x);
    [v(1.0 - m.cos_min), v(m.rel_l2)]
}

/// Value as drawn on the log axis: at least [`FLOOR`], at most `top`.
fn on_axis(v: f64, top: f64) -> f64 {
    if v <= FLOOR {
        FLOOR
    } else {
        v.min(top)
    }
}

/// Top of the y axis: a power of ten above every finite value, at least 10.
fn y_top(pairs: &[PairReport]) -> f64 {
    let max = pairs
        .iter()
        .flat_map(|p| p.hidden_states.iter())
        .flat_map(metrics)
        .flatten()
        .fold(1.0f64, f64::max);
    10f64.powi(max.log10().ceil() as i32 + 1)
}

/// Consecutive runs of finite points (a NaN row breaks the line).
fn segments(points: &[(f64, Option<f64>)], top: f64) -> Vec<Vec<(f64, f64)>> {
    let mut out: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for &(x, y) in points {
        match y {
            Some(y) => out
                .last_mut()
                .expect("non-empty")
                .push((x, on_axis(y, top))),
            None => out.push(Vec::new()),
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// The plot's coordinates: `hidden_states` index × log metric.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, LogCoord<f64>>>;

/// What the plot's parts share: the rows drawn, their count, the y range.
struct Frame<'r> {
    report: &'r CompareReport,
    rows: &'r [HiddenStateRow],
    n: usize,
    top: f64,
    bottom: f64,
}

fn draw(root: &DrawingArea<SVGBackend<'_>, Shift>, report: &CompareReport) -> DrawResult<()> {
    root.fill(&WHITE)?;
    let (w, h) = SIZE;
    let (title, rest) = root.split_vertically(TITLE_H);
    let (plot, legend) = rest.split_vertically(h - TITLE_H - LEGEND_H);
    draw_title(&title, report, w)?;
    let rows: &[HiddenStateRow] = report
        .pairs
        .first()
        .map(|p| p.hidden_states.as_slice())
        .unwrap_or(&[]);
    let f = Frame {
        report,
        rows,
        n: rows.len().max(1),
        top: y_top(&report.pairs),
        bottom: FLOOR / 10.0,
    };
    let n = f.n;
    let x_range = -0.5f64..(n as f64 - 0.5);
    let mut chart = ChartBuilder::on(&plot)
        .margin_left(12)
        .margin_right(24)
        .margin_top(6)
        .x_label_area_size(46)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range, (f.bottom..f.top).log_scale())?;
    let every = n.div_ceil(32);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.08))
        .x_labels(n + 1)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n && (i as usize).is_multiple_of(every) {
                x_label(i as usize)
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{y:.0e}"))
        .x_desc("hidden_states index: emb = embeddings, Lk = output of decoder layer k (the last one final-normed)")
        .y_desc("1 − cos_min,  rel L2  (log)")
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()?;
    draw_shading(&mut chart, &f)?;
    draw_guides(&mut chart, &f)?;
    draw_taps(&mut chart, &f)?;
    draw_divergent(&mut chart, &f)?;
    draw_metrics(&mut chart, &f)?;
    draw_legend(&legend, report)?;
    Ok(())
}

/// Layer-type shading behind everything else.
fn draw_shading(chart: &mut Chart, f: &Frame) -> DrawResult<()> {
    let (bottom, top) = (f.bottom, f.top);
    chart.draw_series(f.rows.iter().map(|r| {
        let x = r.index as f64;
        Rectangle::new(
            [(x - 0.5, bottom), (x + 0.5, top)],
            shade(r.layer_type).mix(0.8).filled(),
        )
    }))?;

    Ok(())
}

/// The floor ("bitwise identical") and the pass tolerances.
fn draw_guides(chart: &mut Chart, f: &Frame) -> DrawResult<()> {
    let (n, top, report) = (f.n, f.top, f.report);
    let x_end = n as f64 - 0.5;
    let label = |text: String, at: (f64, f64), dy: i32, color: RGBColor| {
        EmptyElement::at(at) + Text::new(text, (4, dy), (FONT, 11).into_font().color(&color))
    };
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(-0.5, FLOOR), (x_end, FLOOR)],
        GUIDE.stroke_width(1),
    )))?;
    chart.draw_series(std::iter::once(label(
        format!("bitwise identical (0; values ≤ {FLOOR:.0e} drawn here)"),
        (-0.5, FLOOR),
        -14,
        TAP,
    )))?;
    if let Some(p) = report.pairs.first() {
        let t = &p.tolerance;
        for (v, text, dashed) in [
            (
                1.0 - t.pass_cos,
                format!("pass: 1 − cos_min ≤ {:.0e}", 1.0 - t.pass_cos),
                false,
            ),
            (
                t.pass_rel_l2,
                format!("pass: rel L2 ≤ {:.0e}", t.pass_rel_l2),
                true,
            ),
        ] {
            if v > FLOOR && v < top {
                if dashed {
                    chart.draw_series(DashedLineSeries::new(
                        [(-0.5, v), (x_end, v)],
                        5,
                        4,
                        GUIDE.stroke_width(1),
                    ))?;
                } else {
                    chart.draw_series(std::iter::once(PathElement::new(
                        vec![(-0.5, v), (x_end, v)],
                        GUIDE.stroke_width(1),
                    )))?;
                }
                let x = x_end - (n as f64 * 0.22).max(1.0);
                chart.draw_series(std::iter::once(label(text, (x, v), -14, TAP)))?;
            }
        }
    }

    Ok(())
}

/// Drafter taps: tap L = hidden_states[L + 1].
fn draw_taps(chart: &mut Chart, f: &Frame) -> DrawResult<()> {
    let (n, top, bottom) = (f.n, f.top, f.bottom);
    for &tap in &f.report.taps {
        let x = (tap + 1) as f64;
        if tap + 1 >= n {
            continue;
        }
        chart.draw_series(DashedLineSeries::new(
            [(x, bottom), (x, top)],
            4,
            3,
            TAP.stroke_width(1),
        ))?;
        chart.draw_series(std::iter::once(
            EmptyElement::at((x, top))
                + Text::new(
                    format!("tap {tap}"),
                    (3, 4),
                    (FONT, 11).into_font().color(&TAP),
                ),
        ))?;
    }

    Ok(())
}

/// The first divergent hidden state of each pair.
fn draw_divergent(chart: &mut Chart, f: &Frame) -> DrawResult<()> {
    let (n, top, bottom) = (f.n, f.top, f.bottom);
    for (j, p) in f.report.pairs.iter().enumerate() {
        if let Some(i) = p.first_divergent {
            let x = i as f64;
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x, bottom), (x, top)],
                DIVERGENT.stroke_width(2),
            )))?;
            let text = format!(
                "first divergent: hidden_states[{i}] ({}) — {} vs {}",
                x_label(i),
                p.a,
                p.b
            );
            // Keep the label inside the plot: right of the line in the left
            // half, left of it (estimated width) in the right half.
            let dx = if i * 2 < n {
                5
            } else {
                -5 - (text.chars().count() as i32 * 6)
            };
            chart.draw_series(std::iter::once(
                EmptyElement::at((x, top))
                    + Text::new(
                        text,
                        (dx, 20 + 15 * j as i32),
                        (FONT, 12)
                            .into_font()
                            .style(FontStyle::Bold)
                            .color(&DIVERGENT),
                    ),
            ))?;
        }
    }

    Ok(())
}

/// The metrics of each pair: 1 − cos_min (solid) and rel L2 (dashed), NaN/Inf marked.
fn draw_metrics(chart: &mut Chart, f: &Frame) -> DrawResult<()> {
    let top = f.top;
    for (j, p) in f.report.pairs.iter().enumerate() {
        let color = PAIR_COLORS[j % PAIR_COLORS.len()];
        for (k, dashed) in [(0usize, false), (1usize, true)] {
            let points: Vec<(f64, Option<f64>)> = p
                .hidden_states
                .iter()
                .map(|r| (r.index as f64, metrics(r)[k]))
                .collect();
            for seg in segments(&points, top) {
                if dashed {
                    chart.draw_series(DashedLineSeries::new(
                        seg.clone(),
                        7,
                        4,
                        color.stroke_width(2),
                    ))?;
                    chart.draw_series(
                        seg.iter()
                            .map(|&c| TriangleMarker::new(c, 5, color.filled())),
                    )?;
                } else {
                    chart.draw_series(LineSeries::new(seg.clone(), color.stroke_width(2)))?;
                    chart.draw_series(seg.iter().map(|&c| Circle::new(c, 4, color.filled())))?;
                }
            }
            let bad: Vec<f64> = points
                .iter()
                .filter(|(_, y)| y.is_none())
                .map(|(x, _)| *x)
                .collect();
            chart.draw_series(
                bad.iter()
                    .map(|&x| Cross::new((x, top), 6, DIVERGENT.stroke_width(2))),
            )?;
            if k == 0 {
                chart.draw_series(bad.iter().map(|&x| {
                    EmptyElement::at((x, top))
                        + Text::new("NaN/Inf", (6, 6), (FONT, 11).into_font().color(&DIVERGENT))
                }))?;
            }
        }
    }

    Ok(())
}

fn draw_title(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    report: &CompareReport,
    w: u32,
) -> DrawResult<()> {
    let pairs: Vec<String> = report
        .pairs
        .iter()
        .map(|p| format!("{} vs {}", p.a, p.b))
        .collect();
    area.draw(&Text::new(
        format!(
            "hsparity per-layer parity: {} — {}",
            pairs.join(", "),
            report
                .environment
                .target
                .as_ref()
                .map_or("-", |t| t.checkpoint.as_str())
        ),
        (14, 8),
        (FONT, 16).into_font().style(FontStyle::Bold),
    ))?;
    // About 7 px per character at size 13: keep the sentence on one line.
    let max_chars = (w as usize - 28) / 7;
    let mut summary = report.summary.clone();
    if summary.chars().count() > max_chars {
        summary = summary.chars().take(max_chars - 1).collect::<String>() + "…";
    }
    let color = if report.exit_code == 0 {
        PASS_GREEN
    } else {
        DIVERGENT
    };
    area.draw(&Text::new(
        summary,
        (14, 32),
        (FONT, 13).into_font().color(&color),
    ))?;
    Ok(())
}

fn draw_legend(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    report: &CompareReport,
) -> DrawResult<()> {
    let font = (FONT, 12).into_font();
    let text = |s: String, x: i32, y: i32| Text::new(s, (x + 38, y - 5), font.clone());
    let dashed = |x: i32, y: i32, style: ShapeStyle| -> DrawResult<()> {
        for k in 0..3 {
            area.draw(&PathElement::new(
                vec![(x + k * 11, y), (x + k * 11 + 7, y)],
                style,
            ))?;
        }
        Ok(())
    };
    let (x0, col) = (24, 460);
    let mut y = 14;
    for (j, p) in report.pairs.iter().enumerate() {
        let color = PAIR_COLORS[j % PAIR_COLORS.len()];
        area.draw(&PathElement::new(
            vec![(x0, y), (x0 + 30, y)],
            color.stroke_width(2),
        ))?;
        area.draw(&Circle::new((x0 + 15, y), 4, color.filled()))?;
        area.draw(&text(format!("{} vs {}: 1 − cos_min", p.a, p.b), x0, y))?;
        dashed(x0 + col, y, color.stroke_width(2))?;
        area.draw(&TriangleMarker::new((x0 + col + 15, y), 5, color.filled()))?;
        area.draw(&text(
            format!("{} vs {}: rel L2 = ‖a−b‖/‖b‖", p.a, p.b),
            x0 + col,
            y,
        ))?;
        y += 20;
    }
    let swatch =
        |x: i32, y: i32, c: RGBColor| Rectangle::new([(x, y - 7), (x + 30, y + 7)], c.filled());
    let items = [
        (SHADE_LINEAR, "linear attention (Gated DeltaNet)"),
        (SHADE_FULL, "full attention"),
        (SHADE_OTHER, "embeddings / final norm"),
    ];
    for (k, (c, s)) in items.iter().enumerate() {
        let x = x0 + k as i32 * 300;
        area.draw(&swatch(x, y, *c))?;
        area.draw(&text(s.to_string(), x, y))?;
    }
    y += 22;
    dashed(x0, y, TAP.stroke_width(1))?;
    area.draw(&text("drafter tap".into(), x0, y))?;
    area.draw(&PathElement::new(
        vec![(x0 + 300, y), (x0 + 330, y)],
        DIVERGENT.stroke_width(2),
    ))?;
    area.draw(&text("first divergent hidden state".into(), x0 + 300, y))?;
    area.draw(&Cross::new((x0 + 615, y), 6, DIVERGENT.stroke_width(2)))?;
    area.draw(&text("NaN/Inf".into(), x0 + 600, y))?;
    y += 20;
    let taps = if report.taps.is_empty() {
        "no taps marked".to_string()
    } else {
        format!("taps {:?}", report.taps)
    };
    area.draw(&Text::new(
        format!("{taps}; {}", report.tap_convention),
        (x0, y - 5),
        (FONT, 11).into_font().color(&TAP),
    ))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_and_huge_values_stay_on_the_axis() {
        assert_eq!(on_axis(0.0, 10.0), FLOOR);
        assert_eq!(on_axis(-1e-17, 10.0), FLOOR);
        assert_eq!(on_axis(1e-3, 10.0), 1e-3);
        assert_eq!(on_axis(1e9, 10.0), 10.0);
    }

    #[test]
    fn a_nan_row_breaks_the_line() {
        let s = segments(
            &[
                (0.0, Some(0.0)),
                (1.0, None),
                (2.0, Some(1e-3)),
                (3.0, Some(2e-3)),
            ],
            10.0,
        );
        assert_eq!(s, vec![vec![(0.0, FLOOR)], vec![(2.0, 1e-3), (3.0, 2e-3)]]);
    }

    #[test]
    fn labels() {
        assert_eq!(x_label(0), "emb");
        assert_eq!(x_label(4), "L3");
    }
}
