//! A small SVG chart writer: stacked panels sharing one time axis, bars,
//! step and straight lines, marks and horizontal guides. Text is left to
//! the viewer's generic `sans-serif` font (nothing is rasterized) and
//! numbers are printed with fixed decimals, so the output is the same
//! bytes on every machine.

use std::fmt::Write;

/// How a series is drawn.
pub enum Style {
    /// A bar per point, `width` in x units, shifted by `offset`.
    Bars { width: f64, offset: f64 },
    /// A staircase: each value holds until the next point.
    Step,
    /// Straight segments between points.
    Line,
    /// A cross at each point.
    Crosses,
    /// A dot at each point.
    Dots,
    /// Points taken two by two as horizontal segments with end ticks.
    Spans,
}

/// One named series of `(x, y)` points.
pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub style: Style,
    pub points: Vec<(f64, f64)>,
}

/// A horizontal guide line at `y`, dashed, with a label.
pub struct Guide {
    pub y: f64,
    pub label: String,
}

/// One chart of a figure.
pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub y_max: f64,
    pub series: Vec<Series>,
    pub guides: Vec<Guide>,
}

/// Panels stacked over one x axis.
pub struct Figure {
    pub title: String,
    pub x_label: String,
    pub x_max: f64,
    pub x_tick: f64,
    pub panels: Vec<Panel>,
}

const WIDTH: f64 = 760.0;
const PANEL: f64 = 150.0;
const GAP: f64 = 64.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 66.0;
const BOTTOM: f64 = 44.0;

impl Figure {
    pub fn render(&self) -> String {
        let n = self.panels.len() as f64;
        let height = TOP + n * PANEL + (n - 1.0) * GAP + BOTTOM;
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH:.0}" height="{height:.0}" viewBox="0 0 {WIDTH:.0} {height:.0}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            out,
            r#"<rect width="100%" height="100%" fill="white"/>
<text x="{:.1}" y="22" font-size="15" text-anchor="middle" font-weight="bold">{}</text>"#,
            WIDTH / 2.0,
            escape(&self.title)
        );
        for (i, panel) in self.panels.iter().enumerate() {
            let top = TOP + i as f64 * (PANEL + GAP);
            let last = i + 1 == self.panels.len();
            self.panel(&mut out, panel, top, last);
        }
        out.push_str("</svg>\n");
        out
    }

    fn panel(&self, out: &mut String, p: &Panel, top: f64, last: bool) {
        let plot_w = WIDTH - LEFT - RIGHT;
        let x = |v: f64| LEFT + v / self.x_max * plot_w;
        let y = |v: f64| top + PANEL - (v / p.y_max).clamp(0.0, 1.05) * PANEL;
        let _ = writeln!(
            out,
            r##"<text x="{LEFT:.1}" y="{:.1}" font-weight="bold">{}</text>"##,
            top - 26.0,
            escape(&p.title)
        );
        // Legend, right-aligned above the panel (a lone series is named by
        // the axis).
        let mut lx = WIDTH - RIGHT;
        let legend = if p.series.len() > 1 {
            &p.series[..]
        } else {
            &[]
        };
        for s in legend.iter().rev() {
            let w = 7.0 * s.name.chars().count() as f64 + 22.0;
            lx -= w;
            let _ = writeln!(
                out,
                r##"<rect x="{:.1}" y="{:.1}" width="12" height="8" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"##,
                lx,
                top - 16.0,
                s.color,
                lx + 16.0,
                top - 8.0,
                escape(&s.name)
            );
        }
        let _ = writeln!(
            out,
            r##"<rect x="{LEFT:.1}" y="{top:.1}" width="{plot_w:.1}" height="{PANEL:.1}" fill="none" stroke="#999"/>"##
        );
        // Y ticks: 0, half, max.
        for v in [0.0, p.y_max / 2.0, p.y_max] {
            let _ = writeln!(
                out,
                r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT,
                y(v),
                LEFT + plot_w,
                y(v),
                LEFT - 6.0,
                y(v) + 4.0,
                number(v)
            );
        }
        let _ = writeln!(
            out,
            r##"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
            top + PANEL / 2.0,
            escape(&p.y_label)
        );
        // X ticks.
        let mut t = 0.0;
        while t <= self.x_max + 1e-9 {
            let _ = writeln!(
                out,
                r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#999"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                x(t),
                top + PANEL,
                x(t),
                top + PANEL + 4.0,
                x(t),
                top + PANEL + 16.0,
                number(t)
            );
            t += self.x_tick;
        }
        if last {
            let _ = writeln!(
                out,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                LEFT + plot_w / 2.0,
                top + PANEL + 34.0,
                escape(&self.x_label)
            );
        }
        for s in &p.series {
            series(out, s, &x, &y, plot_w / self.x_max, top + PANEL);
        }
        for g in &p.guides {
            let _ = writeln!(
                out,
                r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#555" stroke-dasharray="5 4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{}</text>"##,
                LEFT,
                y(g.y),
                LEFT + plot_w,
                y(g.y),
                LEFT + plot_w - 4.0,
                y(g.y) - 4.0,
                escape(&g.label)
            );
        }
    }
}

fn series(
    out: &mut String,
    s: &Series,
    x: &dyn Fn(f64) -> f64,
    y: &dyn Fn(f64) -> f64,
    x_scale: f64,
    base: f64,
) {
    match s.style {
        Style::Bars { width, offset } => {
            for &(px, py) in &s.points {
                if py <= 0.0 {
                    continue;
                }
                let _ = writeln!(
                    out,
                    r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"/>"#,
                    x(px + offset),
                    y(py),
                    width * x_scale,
                    base - y(py),
                    s.color
                );
            }
        }
        Style::Step | Style::Line => {
            let mut d = String::new();
            let mut previous: Option<(f64, f64)> = None;
            for &(px, py) in &s.points {
                match previous {
                    None => {
                        let _ = write!(d, "M{:.1} {:.1}", x(px), y(py));
                    }
                    Some((_, last_y)) if matches!(s.style, Style::Step) => {
                        let _ = write!(d, " H{:.1} V{:.1}", x(px), y(py));
                        let _ = last_y;
                    }
                    Some(_) => {
                        let _ = write!(d, " L{:.1} {:.1}", x(px), y(py));
                    }
                }
                previous = Some((px, py));
            }
            let _ = writeln!(
                out,
                r#"<path d="{d}" fill="none" stroke="{}" stroke-width="2"/>"#,
                s.color
            );
        }
        Style::Crosses => {
            for &(px, py) in &s.points {
                let (cx, cy) = (x(px), y(py));
                let _ = writeln!(
                    out,
                    r#"<path d="M{:.1} {:.1} L{:.1} {:.1} M{:.1} {:.1} L{:.1} {:.1}" stroke="{}" stroke-width="2"/>"#,
                    cx - 4.0,
                    cy - 4.0,
                    cx + 4.0,
                    cy + 4.0,
                    cx - 4.0,
                    cy + 4.0,
                    cx + 4.0,
                    cy - 4.0,
                    s.color
                );
            }
        }
        Style::Dots => {
            for &(px, py) in &s.points {
                let _ = writeln!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                    x(px),
                    y(py),
                    s.color
                );
            }
        }
        Style::Spans => {
            for pair in s.points.chunks(2) {
                if let [(x0, y0), (x1, _)] = pair {
                    let (a, b, h) = (x(*x0), x(*x1), y(*y0));
                    let _ = writeln!(
                        out,
                        r#"<path d="M{a:.1} {:.1} V{:.1} M{a:.1} {h:.1} H{b:.1} M{b:.1} {:.1} V{:.1}" stroke="{}" stroke-width="2" fill="none"/>"#,
                        h - 5.0,
                        h + 5.0,
                        h - 5.0,
                        h + 5.0,
                        s.color
                    );
                }
            }
        }
    }
}

/// A tick label: whole numbers without decimals, others with one.
fn number(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.1}")
    }
}

pub(crate) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
