//! A table: a header row and rows of cells, each cell coloured by its tone,
//! columns as wide as their widest cell.

use std::fmt::Write;

use super::text::{self, Text, LINE};

#[derive(Default)]
pub(crate) struct Table {
    header: Vec<Text>,
    rows: Vec<Vec<Text>>,
}

const MARGIN: f64 = 20.0;
const TOP: f64 = 44.0;
const PAD: f64 = 8.0;

impl Table {
    pub(crate) fn header(&mut self, cells: Vec<Text>) -> Result<(), String> {
        if !self.header.is_empty() {
            return Err("`header` is said once".into());
        }
        if !self.rows.is_empty() {
            return Err("`header` comes before the rows".into());
        }
        self.header = cells;
        Ok(())
    }

    pub(crate) fn row(&mut self, cells: Vec<Text>) -> Result<(), String> {
        if self.header.is_empty() {
            return Err("a `row` before the `header`".into());
        }
        if cells.len() != self.header.len() {
            return Err(format!(
                "this row has {} cells and the header {}",
                cells.len(),
                self.header.len()
            ));
        }
        self.rows.push(cells);
        Ok(())
    }

    pub(crate) fn finish(&self) -> Result<(), String> {
        if self.rows.is_empty() {
            return Err("a table needs a `header` and a `row` at least".into());
        }
        Ok(())
    }

    pub(crate) fn render(&self, title: &str) -> String {
        let columns: Vec<f64> = (0..self.header.len())
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].width(c == 0))
                    .fold(self.header[c].width(true), f64::max)
                    + 2.0 * PAD
            })
            .collect();
        let row_h = |cells: &[Text]| cells.iter().map(Text::height).fold(0.0, f64::max) + 2.0 * PAD;
        let table_w: f64 = columns.iter().sum();
        let width = (2.0 * MARGIN + table_w).max(text::width(title, true) * 1.25 + 2.0 * MARGIN);
        let height =
            TOP + row_h(&self.header) + self.rows.iter().map(|r| row_h(r)).sum::<f64>() + MARGIN;
        let mut out = String::new();
        text::open(&mut out, width, height, title);
        let left = (width - table_w) / 2.0;
        let mut y = TOP;
        for (r, cells) in std::iter::once(&self.header).chain(&self.rows).enumerate() {
            let h = row_h(cells);
            let mut x = left;
            for (c, cell) in cells.iter().enumerate() {
                let fill = match (r, cell.tone) {
                    (0, _) => "#dde3ea",
                    (_, text::Tone::Plain) if c == 0 => "#f4f7fb",
                    (_, text::Tone::Plain) => "white",
                    (_, tone) => tone.colors().0,
                };
                let _ = writeln!(
                    out,
                    r##"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{h:.1}" fill="{fill}" stroke="#9aa5b1"/>"##,
                    columns[c]
                );
                text::lines(
                    &mut out,
                    x + PAD,
                    y + PAD + LINE * 0.75,
                    "start",
                    &cell.lines,
                    r == 0 || c == 0,
                );
                x += columns[c];
            }
            y += h;
        }
        out.push_str("</svg>\n");
        out
    }
}
