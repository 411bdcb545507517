//! Boxes on a grid joined by arrows: flows (`diagram boxes`) and state
//! machines (`diagram states`, rounded). Every box has the size of the
//! largest, so the grid stays regular; arrows run centre to centre,
//! clipped at the box edges, and a pair of opposite arrows is drawn apart.

use std::fmt::Write;

use super::text::{self, Text, LINE};
use crate::plots::svg::escape;

pub(crate) struct Node {
    pub(crate) id: String,
    pub(crate) col: f64,
    pub(crate) row: f64,
    pub(crate) heading: Text,
    pub(crate) body: Vec<Text>,
}

pub(crate) struct Arrow {
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) label: Option<Text>,
}

pub(crate) struct Boxes {
    pub(crate) rounded: bool,
    /// Between grid columns, between grid rows.
    pub(crate) gap: (f64, f64),
    nodes: Vec<Node>,
    arrows: Vec<Arrow>,
}

impl Default for Boxes {
    fn default() -> Self {
        Boxes {
            rounded: false,
            gap: (60.0, 40.0),
            nodes: Vec::new(),
            arrows: Vec::new(),
        }
    }
}

const MARGIN: f64 = 20.0;
const TOP: f64 = 44.0;
const PAD: f64 = 12.0;
/// How far apart a pair of opposite arrows runs.
const APART: f64 = 7.0;

impl Boxes {
    pub(crate) fn add(&mut self, node: Node) -> Result<(), String> {
        if self.nodes.iter().any(|n| n.id == node.id) {
            return Err(format!("box `{}` is defined twice", node.id));
        }
        if let Some(other) = self
            .nodes
            .iter()
            .find(|n| n.col == node.col && n.row == node.row)
        {
            return Err(format!(
                "box `{}` takes the place of box `{}` (column {}, row {})",
                node.id, other.id, node.col, node.row
            ));
        }
        self.nodes.push(node);
        Ok(())
    }

    pub(crate) fn connect(&mut self, arrow: Arrow) -> Result<(), String> {
        for id in [&arrow.from, &arrow.to] {
            if !self.nodes.iter().any(|n| &n.id == id) {
                return Err(format!(
                    "no box `{id}` (define it with `box` before the arrow)"
                ));
            }
        }
        if arrow.from == arrow.to {
            return Err(format!(
                "an arrow from box `{}` to itself: say it in the box",
                arrow.from
            ));
        }
        self.arrows.push(arrow);
        Ok(())
    }

    pub(crate) fn finish(&self) -> Result<(), String> {
        if self.nodes.is_empty() {
            return Err("no `box`".into());
        }
        Ok(())
    }

    /// The size every box gets.
    fn box_size(&self) -> (f64, f64) {
        let w = self
            .nodes
            .iter()
            .map(|n| {
                n.body
                    .iter()
                    .map(|t| t.width(false))
                    .fold(n.heading.width(true), f64::max)
            })
            .fold(0.0, f64::max);
        let lines = self
            .nodes
            .iter()
            .map(|n| n.heading.lines.len() + n.body.iter().map(|t| t.lines.len()).sum::<usize>())
            .max()
            .unwrap_or(1);
        (w + 2.0 * PAD, lines as f64 * LINE + 2.0 * PAD)
    }

    pub(crate) fn render(&self, title: &str) -> String {
        let (bw, bh) = self.box_size();
        let (gx, gy) = self.gap;
        let centre = |n: &Node| {
            (
                MARGIN + bw / 2.0 + n.col * (bw + gx),
                TOP + bh / 2.0 + n.row * (bh + gy),
            )
        };
        let cols = self.nodes.iter().map(|n| n.col).fold(0.0, f64::max);
        let rows = self.nodes.iter().map(|n| n.row).fold(0.0, f64::max);
        let title_w = text::width(title, true) * 1.25 + 2.0 * MARGIN;
        let width = (2.0 * MARGIN + (cols + 1.0) * bw + cols * gx).max(title_w);
        let height = TOP + (rows + 1.0) * bh + rows * gy + MARGIN;
        let mut out = String::new();
        text::open(&mut out, width, height, title);
        let radius = if self.rounded {
            bh.min(36.0) / 2.0
        } else {
            4.0
        };
        for n in &self.nodes {
            let (cx, cy) = centre(n);
            let (fill, stroke) = n.heading.tone.colors();
            let _ = writeln!(
                out,
                r#"<rect x="{:.1}" y="{:.1}" width="{bw:.1}" height="{bh:.1}" rx="{radius:.1}" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>"#,
                cx - bw / 2.0,
                cy - bh / 2.0
            );
            let count = n.heading.lines.len() + n.body.iter().map(|t| t.lines.len()).sum::<usize>();
            let mut y = cy - count as f64 * LINE / 2.0 + LINE * 0.75;
            text::lines(&mut out, cx, y, "middle", &n.heading.lines, true);
            y += n.heading.height();
            for t in &n.body {
                text::lines(&mut out, cx, y, "middle", &t.lines, false);
                y += t.height();
            }
        }
        for a in &self.arrows {
            let find = |id: &str| {
                self.nodes
                    .iter()
                    .find(|n| n.id == id)
                    .expect("arrows join defined boxes")
            };
            let (from, to) = (centre(find(&a.from)), centre(find(&a.to)));
            let paired = self.arrows.iter().any(|b| b.from == a.to && b.to == a.from);
            self.arrow(&mut out, from, to, paired, a.label.as_ref(), (bw, bh));
        }
        out.push_str("</svg>\n");
        out
    }

    fn arrow(
        &self,
        out: &mut String,
        from: (f64, f64),
        to: (f64, f64),
        paired: bool,
        label: Option<&Text>,
        (bw, bh): (f64, f64),
    ) {
        let (dx, dy) = (to.0 - from.0, to.1 - from.1);
        let len = (dx * dx + dy * dy).sqrt();
        let (ux, uy) = (dx / len, dy / len);
        // The normal on the arrow's right: a pair of opposite arrows has
        // opposite normals, so each runs on its own side.
        let (nx, ny) = (-uy, ux);
        let shift = if paired { APART } else { 0.0 };
        let (fx, fy) = (from.0 + nx * shift, from.1 + ny * shift);
        let (tx, ty) = (to.0 + nx * shift, to.1 + ny * shift);
        // Leave each box where the line crosses its edge.
        let edge = |ux: f64, uy: f64| {
            let sx = if ux.abs() > 1e-9 {
                bw / 2.0 / ux.abs()
            } else {
                f64::INFINITY
            };
            let sy = if uy.abs() > 1e-9 {
                bh / 2.0 / uy.abs()
            } else {
                f64::INFINITY
            };
            sx.min(sy) + 3.0
        };
        let (a, b) = (edge(ux, uy), edge(ux, uy));
        let (x1, y1) = (fx + ux * a, fy + uy * a);
        let (x2, y2) = (tx - ux * b, ty - uy * b);
        let _ = writeln!(
            out,
            r##"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="#333" stroke-width="1.5" marker-end="url(#head)"/>"##
        );
        let Some(label) = label else { return };
        // The label sits beside the line's middle: on the pair's own side,
        // else above a level line and right of a steep one.
        let (sx, sy) = if paired {
            (nx, ny)
        } else if ux.abs() >= uy.abs() {
            (0.0, -1.0)
        } else {
            (1.0, 0.0)
        };
        let (mx, my) = ((x1 + x2) / 2.0 + sx * 8.0, (y1 + y2) / 2.0 + sy * 8.0);
        let h = label.height();
        let w = label.width(false);
        let (anchor, left, first) = if sy.abs() >= sx.abs() {
            let first = if sy < 0.0 {
                my - h + LINE * 0.75
            } else {
                my + LINE * 0.75
            };
            ("middle", mx - w / 2.0, first)
        } else if sx > 0.0 {
            ("start", mx, my - h / 2.0 + LINE * 0.75)
        } else {
            ("end", mx - w, my - h / 2.0 + LINE * 0.75)
        };
        let top = first - LINE * 0.75;
        let _ = writeln!(
            out,
            r#"<rect x="{:.1}" y="{top:.1}" width="{:.1}" height="{h:.1}" fill="white" fill-opacity="0.85"/>"#,
            left - 2.0,
            w + 4.0
        );
        for (i, line) in label.lines.iter().enumerate() {
            let _ = writeln!(
                out,
                r##"<text x="{mx:.1}" y="{:.1}" text-anchor="{anchor}" fill="#333">{}</text>"##,
                first + i as f64 * LINE,
                escape(line)
            );
        }
    }
}
