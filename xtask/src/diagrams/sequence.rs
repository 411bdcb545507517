//! A sequence diagram: actors across the top, their lifelines down, and
//! the steps in order — calls (solid), answers (dashed), notes on one or
//! several lifelines, and dividers that name a phase.

use std::fmt::Write;

use super::text::{self, Text, LINE};

pub(crate) enum Step {
    Message {
        from: String,
        to: String,
        label: Text,
        reply: bool,
    },
    Note {
        from: String,
        to: String,
        text: Text,
    },
    Divider(Text),
}

#[derive(Default)]
pub(crate) struct Sequence {
    actors: Vec<(String, Text)>,
    steps: Vec<Step>,
}

const MARGIN: f64 = 20.0;
const TOP: f64 = 44.0;
const PAD: f64 = 10.0;

impl Sequence {
    pub(crate) fn actor(&mut self, id: String, name: Text) -> Result<(), String> {
        if self.actors.iter().any(|(a, _)| *a == id) {
            return Err(format!("actor `{id}` is defined twice"));
        }
        if !self.steps.is_empty() {
            return Err("actors come before the first step".into());
        }
        self.actors.push((id, name));
        Ok(())
    }

    fn index(&self, id: &str) -> Result<usize, String> {
        self.actors
            .iter()
            .position(|(a, _)| a == id)
            .ok_or_else(|| format!("no actor `{id}` (define it with `actor` first)"))
    }

    pub(crate) fn step(&mut self, step: Step) -> Result<(), String> {
        match &step {
            Step::Message { from, to, .. } => {
                if self.index(from)? == self.index(to)? {
                    return Err(format!(
                        "a message from `{from}` to itself: use a `note` on its lifeline"
                    ));
                }
            }
            Step::Note { from, to, .. } => {
                if self.index(from)? > self.index(to)? {
                    return Err(format!("note {from}..{to}: name the left actor first"));
                }
            }
            Step::Divider(_) => {}
        }
        self.steps.push(step);
        Ok(())
    }

    pub(crate) fn finish(&self) -> Result<(), String> {
        if self.actors.len() < 2 {
            return Err("a sequence needs two `actor`s or more".into());
        }
        if self.steps.is_empty() {
            return Err("no step: `message`, `reply`, `note` or `divider`".into());
        }
        Ok(())
    }

    /// The distance between neighbouring lifelines: wide enough for every
    /// actor's name and every label between the lifelines it spans.
    fn spacing(&self) -> f64 {
        let mut spacing = self
            .actors
            .iter()
            .map(|(_, name)| name.width(true) + 2.0 * PAD + 20.0)
            .fold(120.0, f64::max);
        for step in &self.steps {
            if let Step::Message {
                from, to, label, ..
            } = step
            {
                let (a, b) = (self.index(from).unwrap_or(0), self.index(to).unwrap_or(0));
                let span = a.abs_diff(b).max(1) as f64;
                spacing = spacing.max((label.width(false) + 24.0) / span);
            }
        }
        spacing.ceil()
    }

    fn step_height(step: &Step) -> f64 {
        match step {
            Step::Message { label, .. } => label.height() + 16.0,
            Step::Note { text, .. } => text.height() + 2.0 * PAD + 10.0,
            Step::Divider(text) => text.height() + 22.0,
        }
    }

    pub(crate) fn render(&self, title: &str) -> String {
        let spacing = self.spacing();
        let head_h = self
            .actors
            .iter()
            .map(|(_, n)| n.height())
            .fold(0.0, f64::max)
            + 2.0 * PAD;
        let lifeline = |i: usize| MARGIN + spacing / 2.0 + i as f64 * spacing;
        let width = 2.0 * MARGIN + spacing * self.actors.len() as f64;
        let body_top = TOP + head_h + 16.0;
        let body_h: f64 = self.steps.iter().map(Self::step_height).sum();
        let height = body_top + body_h + MARGIN;
        let mut out = String::new();
        text::open(&mut out, width, height, title);
        for (i, (_, name)) in self.actors.iter().enumerate() {
            let x = lifeline(i);
            let w = spacing - 20.0;
            let (fill, stroke) = name.tone.colors();
            let _ = writeln!(
                out,
                r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#999" stroke-dasharray="4 4"/>
<rect x="{:.1}" y="{TOP:.1}" width="{w:.1}" height="{head_h:.1}" rx="4" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>"##,
                TOP + head_h,
                height - MARGIN,
                x - w / 2.0
            );
            text::lines(
                &mut out,
                x,
                TOP + PAD + LINE * 0.75,
                "middle",
                &name.lines,
                true,
            );
        }
        let mut y = body_top;
        for step in &self.steps {
            let h = Self::step_height(step);
            match step {
                Step::Message {
                    from,
                    to,
                    label,
                    reply,
                } => {
                    let (a, b) = (
                        lifeline(self.index(from).expect("checked")),
                        lifeline(self.index(to).expect("checked")),
                    );
                    let line_y = y + label.height() + 4.0;
                    let dash = if *reply {
                        r#" stroke-dasharray="6 4""#
                    } else {
                        ""
                    };
                    let _ = writeln!(
                        out,
                        r##"<line x1="{a:.1}" y1="{line_y:.1}" x2="{:.1}" y2="{line_y:.1}" stroke="#333" stroke-width="1.5"{dash} marker-end="url(#head)"/>"##,
                        if b > a { b - 2.0 } else { b + 2.0 }
                    );
                    text::lines(
                        &mut out,
                        (a + b) / 2.0,
                        y + LINE * 0.75,
                        "middle",
                        &label.lines,
                        false,
                    );
                }
                Step::Note { from, to, text } => {
                    let (a, b) = (
                        lifeline(self.index(from).expect("checked")),
                        lifeline(self.index(to).expect("checked")),
                    );
                    let w = (b - a + spacing - 30.0).max(text.width(false) + 2.0 * PAD);
                    let (fill, stroke) = match text.tone {
                        text::Tone::Plain => ("#fffbe6", "#c9b458"),
                        tone => tone.colors(),
                    };
                    let _ = writeln!(
                        out,
                        r#"<rect x="{:.1}" y="{:.1}" width="{w:.1}" height="{:.1}" fill="{fill}" stroke="{stroke}"/>"#,
                        (a + b) / 2.0 - w / 2.0,
                        y + 5.0,
                        text.height() + 2.0 * PAD
                    );
                    text::lines(
                        &mut out,
                        (a + b) / 2.0,
                        y + 5.0 + PAD + LINE * 0.75,
                        "middle",
                        &text.lines,
                        false,
                    );
                }
                Step::Divider(text) => {
                    let _ = writeln!(
                        out,
                        r##"<rect x="{MARGIN:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#eef1f5"/>"##,
                        y + 6.0,
                        width - 2.0 * MARGIN,
                        text.height() + 10.0
                    );
                    let mut italic = String::new();
                    text::lines(
                        &mut italic,
                        width / 2.0,
                        y + 11.0 + LINE * 0.75,
                        "middle",
                        &text.lines,
                        true,
                    );
                    out.push_str(&italic);
                }
            }
            y += h;
        }
        out.push_str("</svg>\n");
        out
    }
}
