//! SVG rendering of the per-layer parity (`reports/<name>/parity.svg`, linked
//! from `report.md`), drawn with plotters' SVG backend.
//!
//! Two panels share the x axis (one slot per `hidden_states` index, then the
//! logits as their own point): `1 − cos_min` above, relative L2 below, each
//! on a log scale over the pass / warn / fail bands of the tolerance that
//! judged the first pair (green, amber, red), so a row's verdict is where
//! its point sits. A strip under each panel gives the layer type of each
//! index (Gated DeltaNet linear attention, full attention, embeddings,
//! final norm); dashed grey verticals mark the drafter taps (tap L at
//! `hidden_states[L+1]`); a red vertical marks each pair's first divergent
//! hidden state; rows that read randomly initialised weights are boxed in
//! magenta and labelled RANDOM INIT; NaN/Inf rows are red crosses on the
//! top edge. The title carries the whole summary (wrapped), the legend the
//! drafter's τ per path when one ran.
//!
//! Renders only: every value comes from the [`crate::report::Report`]. The
//! one display transform is for the log axis: values ≤ [`FLOOR`]
//! (bitwise-identical rows give exactly 0) are drawn on the floor line
//! labelled "bitwise identical".
//!
//! Text is emitted as SVG `<text>` (font family `sans-serif`); plotters sizes
//! it with its built-in estimate, so no font files are read.

mod legend;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::CompareReport;
use crate::capture::HiddenKind;
use crate::checkpoint::config::LayerType;
use crate::error::{Error, Result};
use crate::parity::{HiddenStateRow, Metrics, PairReport, Verdict};

/// Smallest value drawn on the log axis; 0 (bitwise identical) is drawn here.
pub const FLOOR: f64 = 1e-12;

/// Canvas width in pixels (the height follows the title's lines: [`height`]).
pub const WIDTH: u32 = 960;

const PANEL_H: u32 = 250;
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
const RANDOM: RGBColor = RGBColor(200, 0, 160);
const BAND_PASS: RGBColor = RGBColor(226, 243, 228);
const BAND_WARN: RGBColor = RGBColor(253, 242, 208);
const BAND_FAIL: RGBColor = RGBColor(251, 224, 224);
const SHADE_LINEAR: RGBColor = RGBColor(120, 160, 220);
const SHADE_FULL: RGBColor = RGBColor(240, 160, 80);
const SHADE_EMBEDDING: RGBColor = RGBColor(170, 170, 170);
const SHADE_NORM: RGBColor = RGBColor(90, 90, 90);
const SHADE_LAYER: RGBColor = RGBColor(200, 200, 200);

type DrawResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The SVG document (UTF-8, `<svg …>` root, [`WIDTH`] × [`height`] pixels).
///
/// Errors: [`Error::Format`] when plotters fails to draw (it writes to a
/// string, so only on an internal plotters error).
pub fn render(report: &CompareReport) -> Result<String> {
    let mut buf = String::new();
    {
        let size = (WIDTH, height(report));
        let root = SVGBackend::with_string(&mut buf, size).into_drawing_area();
        draw(&root, report)
            .and_then(|()| root.present().map_err(Into::into))
            .map_err(|e| Error::Format(format!("drawing parity.svg: {e}")))?;
    }
    buf.push('\n');
    Ok(buf)
}

/// Canvas height: the title's lines, two panels, the legend's lines.
pub fn height(report: &CompareReport) -> u32 {
    legend::title_height(report) + 2 * PANEL_H + legend::legend_height(report)
}

/// Colour of a layer type in the strip, and its legend text.
fn shade(kind: HiddenKind) -> (RGBColor, &'static str) {
    match kind {
        HiddenKind::Layer(LayerType::LinearAttention) => {
            (SHADE_LINEAR, "linear attention (Gated DeltaNet)")
        }
        HiddenKind::Layer(LayerType::FullAttention) => (SHADE_FULL, "full attention"),
        HiddenKind::Embedding => (SHADE_EMBEDDING, "embeddings"),
        HiddenKind::FinalNorm => (SHADE_NORM, "last layer + final norm"),
        _ => (SHADE_LAYER, "decoder layer"),
    }
}

/// x-axis label of `hidden_states[index]`: `emb`, `L3` (output of layer 3),
/// `L5+norm` (the last layer, final-normed).
fn x_label(index: usize, kind: HiddenKind) -> String {
    match (index, kind) {
        (0, _) => "emb".into(),
        (i, HiddenKind::FinalNorm) => format!("L{}+norm", i - 1),
        (i, _) => format!("L{}", i - 1),
    }
}

/// Which of the two panels.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Panel {
    /// `1 − cos_min`.
    Cos,
    /// Relative L2.
    RelL2,
}

impl Panel {
    /// The panel's metric of `m`; `None` when not finite (NaN/±Inf).
    fn value(self, m: &Metrics) -> Option<f64> {
        if m.nan_count + m.inf_count > 0 {
            return None;
        }
        let v = match self {
            Panel::Cos => 1.0 - m.cos_min,
            Panel::RelL2 => m.rel_l2,
        };
        v.is_finite().then_some(v)
    }

    /// `(pass limit, warn limit)` of the panel's metric.
    fn limits(self, p: &PairReport) -> (f64, f64) {
        let t = &p.tolerance;
        match self {
            Panel::Cos => (1.0 - t.pass_cos, 1.0 - t.warn_cos),
            Panel::RelL2 => (t.pass_rel_l2, t.warn_rel_l2),
        }
    }

    fn title(self) -> &'static str {
        match self {
            Panel::Cos => "1 − cos_min (log)",
            Panel::RelL2 => "rel L2 = ‖a−b‖/‖b‖ (log)",
        }
    }
}

/// Value as drawn on the log axis: at least [`FLOOR`], at most `top`.
fn on_axis(v: f64, top: f64) -> f64 {
    if v <= FLOOR {
        FLOOR
    } else {
        v.min(top)
    }
}

/// One point of a pair: x slot and the row's metrics.
struct Point<'r> {
    x: f64,
    metrics: &'r Metrics,
    random_init: bool,
}

/// A pair's points: every hidden state, then the logits at slot `n`.
fn points(p: &PairReport, n: usize) -> Vec<Point<'_>> {
    let mut out: Vec<Point> = p
        .hidden_states
        .iter()
        .map(|r: &HiddenStateRow| Point {
            x: r.index as f64,
            metrics: &r.metrics,
            random_init: !r.random_init.is_empty(),
        })
        .collect();
    if let Some(l) = &p.logits {
        out.push(Point {
            x: n as f64,
            metrics: l,
            random_init: !p.logits_random_init.is_empty(),
        });
    }
    out
}

/// Top of a panel's axis: a power of ten above every finite value and the
/// warn limit, at least 10.
fn y_top(pairs: &[PairReport], panel: Panel, n: usize) -> f64 {
    let max = pairs
        .iter()
        .flat_map(|p| {
            let (_, warn) = panel.limits(p);
            points(p, n)
                .into_iter()
                .filter_map(move |q| panel.value(q.metrics))
                .chain([warn])
        })
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

/// The plot's coordinates: slot × log metric.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, LogCoord<f64>>>;

/// What a panel's parts share: the report, the rows, the slot count, the y
/// range and the metric.
struct Frame<'r> {
    report: &'r CompareReport,
    rows: &'r [HiddenStateRow],
    /// Hidden states (the logits slot is `n`).
    n: usize,
    /// Slots drawn: `n`, plus one for the logits.
    slots: usize,
    top: f64,
    bottom: f64,
    panel: Panel,
}

impl Frame<'_> {
    /// Top of the layer-type strip (the strip fills the bottom of the axis).
    fn strip_top(&self) -> f64 {
        self.bottom * 10f64.powf(0.45)
    }
}

fn draw(root: &DrawingArea<SVGBackend<'_>, Shift>, report: &CompareReport) -> DrawResult<()> {
    root.fill(&WHITE)?;
    let (title, rest) = root.split_vertically(legend::title_height(report));
    let (upper, rest) = rest.split_vertically(PANEL_H);
    let (lower, legend_area) = rest.split_vertically(PANEL_H);
    legend::draw_title(&title, report)?;
    let rows: &[HiddenStateRow] = report
        .pairs
        .first()
        .map(|p| p.hidden_states.as_slice())
        .unwrap_or(&[]);
    let n = rows.len().max(1);
    let logits = report
        .pairs
        .iter()
        .any(|p| p.logits.is_some() || !p.logits_random_init.is_empty());
    for (area, panel) in [(&upper, Panel::Cos), (&lower, Panel::RelL2)] {
        let f = Frame {
            report,
            rows,
            n,
            slots: n + usize::from(logits),
            top: y_top(&report.pairs, panel, n),
            bottom: FLOOR / 10.0,
            panel,
        };
        draw_panel(area, &f)?;
    }
    legend::draw_legend(&legend_area, report)?;
    Ok(())
}

fn draw_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, f: &Frame) -> DrawResult<()> {
    let x_range = -0.5f64..(f.slots as f64 - 0.5);
    let mut chart = ChartBuilder::on(area)
        .margin_left(12)
        .margin_right(24)
        .margin_top(8)
        .x_label_area_size(if f.panel == Panel::RelL2 { 44 } else { 22 })
        .y_label_area_size(70)
        .build_cartesian_2d(x_range, (f.bottom..f.top).log_scale())?;
    let every = f.slots.div_ceil(32);
    let (rows, n) = (f.rows, f.n);
    let label = |x: &f64| {
        let i = x.round();
        if (x - i).abs() > 1e-6 || i < 0.0 {
            return String::new();
        }
        let i = i as usize;
        match rows.get(i) {
            Some(r) if i.is_multiple_of(every) || i + 1 == n => x_label(r.index, r.layer_type),
            None if i == n => "logits".into(),
            _ => String::new(),
        }
    };
    let mut mesh = chart.configure_mesh();
    mesh.disable_x_mesh()
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.08))
        .x_labels(f.slots + 1)
        .x_label_formatter(&label)
        .y_label_formatter(&|y| format!("{y:.0e}"))
        .y_desc(f.panel.title())
        .label_style((FONT, 11))
        .axis_desc_style((FONT, 12));
    let desc = format!(
        "hidden_states index: emb = embeddings, Lk = output of decoder layer k, L(N−1)+norm = final-normed{}",
        if f.slots > f.n { "; then the logits" } else { "" }
    );
    if f.panel == Panel::RelL2 {
        mesh.x_desc(desc);
    }
    mesh.draw()?;
    draw_bands(&mut chart, f)?;
    draw_strip(&mut chart, f)?;
    draw_taps(&mut chart, f)?;
    draw_divergent(&mut chart, f)?;
    draw_random_init(&mut chart, f)?;
    draw_metrics(&mut chart, f)?;
    Ok(())
}

/// The pass / warn / fail bands of the first pair's tolerance, the floor
/// ("bitwise identical"), and a gap before the logits slot.
fn draw_bands(chart: &mut Chart, f: &Frame) -> DrawResult<()> {
    let (x0, x1) = (-0.5, f.slots as f64 - 0.5);
    let Some(p) = f.report.pairs.first() else {
        return Ok(());
    };
    let (pass, warn) = f.panel.limits(p);
    let (pass, warn) = (pass.clamp(f.bottom, f.top), warn.clamp(f.bottom, f.top));
    for (lo, hi, c) in [
        (f.bottom, pass, BAND_PASS),
        (pass, warn, BAND_WARN),
        (warn, f.top, BAND_FAIL),
    ] {
        if hi > lo {
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x0, lo), (x1, hi)],
                c.filled(),
            )))?;
        }
    }
    // Each label inside its band, under the band's upper edge.
    // Each label inside its band, under the band's upper edge, staggered
    // so that narrow bands do not overlap their labels.
    let text = |s: String, y: f64, dx: i32, c: RGBColor| {
        EmptyElement::at((x1, y)) + Text::new(s, (dx, 3), (FONT, 11).into_font().color(&c))
    };
    chart.draw_series([
        text(format!("FAIL above {warn:.0e}"), f.top, -100, DIVERGENT),
        text(
            format!("WARN to {warn:.0e}"),
            warn,
            -190,
            RGBColor(150, 110, 0),
        ),
        text(format!("PASS to {pass:.0e}"), pass, -280, PASS_GREEN),
    ])?;
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(x0, FLOOR), (x1, FLOOR)],
        GUIDE.stroke_width(1),
    )))?;
    chart.draw_series(std::iter::once(
        EmptyElement::at((x0, FLOOR))
            + Text::new(
                format!("bitwise identical (0; values ≤ {FLOOR:.0e} drawn here)"),
                (4, -13),
                (FONT, 11).into_font().color(&TAP),
            ),
    ))?;
    if f.slots > f.n {
        let x = f.n as f64 - 0.5;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(x, f.bottom), (x, f.top)],
            BLACK.mix(0.4).stroke_width(1),
        )))?;
    }
    Ok(())
}

/// The layer type of each index, as a strip along the bottom of the axis.
fn draw_strip(chart: &mut Chart, f: &Frame) -> DrawResult<()> {
    let top = f.strip_top();
    chart.draw_series(f.rows.iter().map(|r| {
        let x = r.index as f64;
        Rectangle::new(
            [(x - 0.45, f.bottom), (x + 0.45, top)],
            shade(r.layer_type).0.filled(),
        )
    }))?;
    Ok(())
}

/// Drafter taps: tap L = hidden_states[L + 1] (labelled in the upper panel).
fn draw_taps(chart: &mut Chart, f: &Frame) -> DrawResult<()> {
    for &tap in &f.report.taps {
        let x = (tap + 1) as f64;
        if tap + 1 >= f.n {
            continue;
        }
        chart.draw_series(DashedLineSeries::new(
            [(x, f.strip_top()), (x, f.top)],
            4,
            3,
            TAP.stroke_width(1),
        ))?;
        if f.panel == Panel::Cos {
            chart.draw_series(std::iter::once(
                EmptyElement::at((x, f.top))
                    + Text::new(
                        format!("tap {tap}"),
                        (3, 2),
                        (FONT, 11).into_font().color(&TAP),
                    ),
            ))?;
        }
    }
    Ok(())
}

/// The first divergent hidden state of each pair (or its logits, when only
/// they do not pass), labelled in the upper panel.
fn draw_divergent(chart: &mut Chart, f: &Frame) -> DrawResult<()> {
    for (j, p) in f.report.pairs.iter().enumerate() {
        let logits_only =
            p.first_divergent.is_none() && p.logits_verdict.is_some_and(|v| v != Verdict::Pass);
        let (x, what) = match (p.first_divergent, logits_only) {
            (Some(i), _) => {
                let kind = f
                    .rows
                    .get(i)
                    .map_or(HiddenKind::DecoderLayer, |r| r.layer_type);
                (i, format!("hidden_states[{i}] ({})", x_label(i, kind)))
            }
            (None, true) => (f.n, "the logits (every hidden state passes)".into()),
            (None, false) => continue,
        };
        let xf = x as f64;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(xf, f.strip_top()), (xf, f.top)],
            DIVERGENT.stroke_width(2),
        )))?;
        if f.panel != Panel::Cos {
            continue;
        }
        let text = format!("first divergent: {what} — {} vs {}", p.a, p.b);
        // Inside the plot: right of the line in the left half, left of it
        // (estimated width) in the right half.
        let dx = if x * 2 < f.slots {
            5
        } else {
            -5 - (text.chars().count() as i32 * 6)
        };
        chart.draw_series(std::iter::once(
            EmptyElement::at((xf, f.top))
                + Text::new(
                    text,
                    (dx, 16 + 14 * j as i32),
                    (FONT, 12)
                        .into_font()
                        .style(FontStyle::Bold)
                        .color(&DIVERGENT),
                ),
        ))?;
    }
    Ok(())
}

/// Runs of slots whose weights are randomly initialised, boxed and labelled.
fn draw_random_init(chart: &mut Chart, f: &Frame) -> DrawResult<()> {
    let Some(p) = f.report.pairs.first() else {
        return Ok(());
    };
    let mut xs: Vec<usize> = points(p, f.n)
        .iter()
        .filter(|q| q.random_init && (q.x as usize) < f.n)
        .map(|q| q.x as usize)
        .collect();
    // A random lm_head marks the logits slot, compared or not.
    if !p.logits_random_init.is_empty() {
        xs.push(f.n);
    }
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for x in xs {
        match runs.last_mut() {
            Some((_, hi)) if *hi + 1 == x => *hi = x,
            _ => runs.push((x, x)),
        }
    }
    let top = f.top / 10f64.powf(0.35);
    for (lo, hi) in runs {
        let (x0, x1) = (lo as f64 - 0.48, hi as f64 + 0.48);
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x0, f.strip_top()), (x1, top)],
            RANDOM.stroke_width(2),
        )))?;
        chart.draw_series(std::iter::once(
            EmptyElement::at((x0, f.strip_top()))
                + Text::new(
                    "RANDOM INIT",
                    (4, -28),
                    (FONT, 11).into_font().style(FontStyle::Bold).color(&RANDOM),
                ),
        ))?;
    }
    Ok(())
}

/// Each pair's metric for the panel (solid line, circles), NaN/Inf marked.
fn draw_metrics(chart: &mut Chart, f: &Frame) -> DrawResult<()> {
    for (j, p) in f.report.pairs.iter().enumerate() {
        let color = PAIR_COLORS[j % PAIR_COLORS.len()];
        let all = points(p, f.n);
        let rows: Vec<(f64, Option<f64>)> = all
            .iter()
            .filter(|q| (q.x as usize) < f.n)
            .map(|q| (q.x, f.panel.value(q.metrics)))
            .collect();
        for seg in segments(&rows, f.top) {
            chart.draw_series(LineSeries::new(seg.clone(), color.stroke_width(2)))?;
            chart.draw_series(seg.iter().map(|&c| Circle::new(c, 4, color.filled())))?;
        }
        if p.logits.is_none() && f.slots > f.n && j == 0 && f.panel == Panel::Cos {
            chart.draw_series(std::iter::once(
                EmptyElement::at((f.n as f64 - 0.45, f.strip_top() * 100.0))
                    + Text::new("not compared", (0, 0), (FONT, 11).into_font().color(&TAP)),
            ))?;
        }
        // The logits: their own point (a filled triangle), not joined to
        // the hidden states.
        for q in all.iter().filter(|q| q.x as usize == f.n) {
            if let Some(v) = f.panel.value(q.metrics) {
                chart.draw_series(std::iter::once(TriangleMarker::new(
                    (q.x, on_axis(v, f.top)),
                    7,
                    color.filled(),
                )))?;
            }
        }
        let bad: Vec<f64> = all
            .iter()
            .filter(|q| f.panel.value(q.metrics).is_none())
            .map(|q| q.x)
            .collect();
        chart.draw_series(
            bad.iter()
                .map(|&x| Cross::new((x, f.top), 6, DIVERGENT.stroke_width(2))),
        )?;
        chart.draw_series(bad.iter().map(|&x| {
            EmptyElement::at((x, f.top))
                + Text::new("NaN/Inf", (6, 6), (FONT, 11).into_font().color(&DIVERGENT))
        }))?;
    }
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
        assert_eq!(x_label(0, HiddenKind::Embedding), "emb");
        assert_eq!(
            x_label(4, HiddenKind::Layer(LayerType::FullAttention)),
            "L3"
        );
        assert_eq!(x_label(6, HiddenKind::FinalNorm), "L5+norm");
    }
}
