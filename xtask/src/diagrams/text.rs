//! Text in SVG without a font: widths are estimated (the viewer's generic
//! `sans-serif` draws them), so layouts leave a margin, and every number is
//! printed with fixed decimals so the output is the same bytes everywhere.

use std::fmt::Write;

use crate::plots::svg::escape;

/// Height of one line of 12 px text.
pub(crate) const LINE: f64 = 15.0;

/// The colour a text asks for with its `ok: `, `no: ` or `mid: ` prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tone {
    Plain,
    Ok,
    No,
    Mid,
}

impl Tone {
    /// Fill and stroke.
    pub(crate) fn colors(self) -> (&'static str, &'static str) {
        match self {
            Tone::Plain => ("#f4f7fb", "#5b7083"),
            Tone::Ok => ("#e3f4e1", "#3d8b37"),
            Tone::No => ("#fbe3e1", "#c0392b"),
            Tone::Mid => ("#fdf1d8", "#c98a0b"),
        }
    }
}

/// A text of one or more lines, with its tone.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Text {
    pub(crate) lines: Vec<String>,
    pub(crate) tone: Tone,
}

impl Text {
    /// Splits on `\n` and takes the tone prefix off.
    pub(crate) fn new(raw: &str) -> Text {
        let (tone, rest) = [("ok: ", Tone::Ok), ("no: ", Tone::No), ("mid: ", Tone::Mid)]
            .into_iter()
            .find_map(|(prefix, tone)| raw.strip_prefix(prefix).map(|rest| (tone, rest)))
            .unwrap_or((Tone::Plain, raw));
        Text {
            lines: rest.split('\n').map(str::to_string).collect(),
            tone,
        }
    }

    /// The widest line's estimated width at 12 px (`bold` for headings).
    pub(crate) fn width(&self, bold: bool) -> f64 {
        self.lines
            .iter()
            .map(|l| width(l, bold))
            .fold(0.0, f64::max)
    }

    pub(crate) fn height(&self) -> f64 {
        self.lines.len() as f64 * LINE
    }
}

/// Estimated width of `line` in 12 px sans-serif (a generous average, so
/// boxes hold their text in every common font).
pub(crate) fn width(line: &str, bold: bool) -> f64 {
    line.chars().count() as f64 * if bold { 7.4 } else { 6.7 }
}

/// Lines centred on `x`, the first baseline at `y`.
pub(crate) fn lines(out: &mut String, x: f64, y: f64, anchor: &str, lines: &[String], bold: bool) {
    for (i, line) in lines.iter().enumerate() {
        let weight = if bold { r#" font-weight="bold""# } else { "" };
        let _ = writeln!(
            out,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="{anchor}"{weight}>{}</text>"#,
            y + i as f64 * LINE,
            escape(line)
        );
    }
}

/// The opening of a diagram's SVG, with its title and the arrowheads.
pub(crate) fn open(out: &mut String, width: f64, height: f64, title: &str) {
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="12">
<defs><marker id="head" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse"><path d="M0 0 L10 5 L0 10 z" fill="#333"/></marker></defs>
<rect width="100%" height="100%" fill="white"/>
<text x="{:.1}" y="24" font-size="15" text-anchor="middle" font-weight="bold">{}</text>"##,
        width / 2.0,
        escape(title)
    );
}
