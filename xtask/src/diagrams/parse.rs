//! The text format (see the module above): lines into a [`Diagram`], or an
//! error naming the line.

use super::boxes::{Arrow, Boxes, Node};
use super::sequence::{Sequence, Step};
use super::table::Table;
use super::text::Text;

/// A diagram, ready to draw.
pub(crate) struct Diagram {
    pub(crate) title: String,
    pub(crate) body: Body,
}

pub(crate) enum Body {
    Boxes(Boxes),
    Sequence(Sequence),
    Table(Table),
}

impl Diagram {
    pub(crate) fn render(&self) -> String {
        match &self.body {
            Body::Boxes(b) => b.render(&self.title),
            Body::Sequence(s) => s.render(&self.title),
            Body::Table(t) => t.render(&self.title),
        }
    }
}

/// What is wrong, and on which line (1-based).
#[derive(Debug)]
pub(crate) struct ParseError {
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// A word of a statement: bare or quoted.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Quoted(String),
}

fn tokens(line: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '"' {
            chars.next();
            let mut text = String::new();
            loop {
                match chars.next() {
                    None => return Err("a quoted text is not closed".into()),
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some('n') => text.push('\n'),
                        Some('"') => text.push('"'),
                        Some('\\') => text.push('\\'),
                        other => {
                            return Err(format!(
                                "unknown escape \\{}: use \\n, \\\" or \\\\",
                                other.map(String::from).unwrap_or_default()
                            ))
                        }
                    },
                    Some(c) => text.push(c),
                }
            }
            out.push(Token::Quoted(text));
        } else if c == '#' && out.is_empty() {
            break;
        } else {
            let mut word = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                word.push(c);
                chars.next();
            }
            out.push(Token::Word(word));
        }
    }
    Ok(out)
}

/// A statement's arguments, taken in order.
struct Args {
    statement: String,
    rest: std::vec::IntoIter<Token>,
}

impl Args {
    fn word(&mut self, what: &str) -> Result<String, String> {
        match self.rest.next() {
            Some(Token::Word(w)) => Ok(w),
            Some(Token::Quoted(q)) => Err(format!(
                "`{}` takes {what} as a bare word here, not \"{q}\"",
                self.statement
            )),
            None => Err(format!("`{}` needs {what}", self.statement)),
        }
    }

    fn number(&mut self, what: &str) -> Result<f64, String> {
        let word = self.word(what)?;
        match word.parse::<f64>() {
            Ok(n) if n.is_finite() && n >= 0.0 => Ok(n),
            _ => Err(format!(
                "`{}` needs {what} as a number of 0 or more, not `{word}`",
                self.statement
            )),
        }
    }

    /// Every remaining argument, each a quoted text.
    fn texts(&mut self, at_least: usize, what: &str) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        for token in self.rest.by_ref() {
            match token {
                Token::Quoted(q) => out.push(q),
                Token::Word(w) => {
                    return Err(format!(
                        "`{}` takes quoted texts here, not `{w}`",
                        self.statement
                    ))
                }
            }
        }
        if out.len() < at_least {
            return Err(format!("`{}` needs {what}", self.statement));
        }
        Ok(out)
    }

    fn end(mut self) -> Result<(), String> {
        match self.rest.next() {
            None => Ok(()),
            Some(extra) => Err(format!(
                "`{}` has one argument too many: {extra:?}",
                self.statement
            )),
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Boxes { rounded: bool },
    Sequence,
    Table,
}

pub(crate) fn parse(source: &str) -> Result<Diagram, ParseError> {
    let mut kind = None;
    let mut title = None;
    let mut boxes = Boxes::default();
    let mut sequence = Sequence::default();
    let mut table = Table::default();
    let mut last_line = 0;
    for (i, line) in source.lines().enumerate() {
        last_line = i + 1;
        let fail = |message: String| ParseError {
            line: i + 1,
            message,
        };
        let mut all = tokens(line).map_err(fail)?.into_iter();
        let Some(first) = all.next() else { continue };
        let Token::Word(statement) = first else {
            return Err(fail(
                "a line starts with a statement word, not a quoted text".into(),
            ));
        };
        let mut args = Args {
            statement: statement.clone(),
            rest: all,
        };
        let step = match (statement.as_str(), kind) {
            ("diagram", None) => {
                kind = Some(match args.word("a kind").map_err(fail)?.as_str() {
                    "boxes" => Kind::Boxes { rounded: false },
                    "states" => Kind::Boxes { rounded: true },
                    "sequence" => Kind::Sequence,
                    "table" => Kind::Table,
                    other => {
                        return Err(fail(format!(
                            "unknown diagram kind `{other}`: boxes, states, sequence or table"
                        )))
                    }
                });
                if let Some(Kind::Boxes { rounded }) = kind {
                    boxes.rounded = rounded;
                }
                args.end()
            }
            ("diagram", Some(_)) => Err("`diagram` is said once, on the first line".into()),
            (_, None) => Err(format!(
                "`{statement}` before `diagram`: the first statement says the kind"
            )),
            ("title", _) => args.texts(1, "a quoted title").and_then(|mut t| {
                if t.len() > 1 {
                    return Err("`title` takes one quoted text".into());
                }
                title = t.pop();
                Ok(())
            }),
            ("gap", Some(Kind::Boxes { .. })) => (|| {
                boxes.gap = (args.number("a column gap")?, args.number("a row gap")?);
                args.end()
            })(),
            ("box", Some(Kind::Boxes { .. })) => (|| {
                let id = args.word("an id")?;
                let col = args.number("a column")?;
                let row = args.number("a row")?;
                let texts = args.texts(1, "a quoted heading")?;
                boxes.add(Node {
                    id,
                    col,
                    row,
                    heading: Text::new(&texts[0]),
                    body: texts[1..].iter().map(|t| Text::new(t)).collect(),
                })
            })(),
            ("arrow", Some(Kind::Boxes { .. })) => (|| {
                let from = args.word("the box it leaves")?;
                let to = args.word("the box it reaches")?;
                let label = args.texts(0, "")?;
                if label.len() > 1 {
                    return Err("`arrow` takes at most one quoted label (\\n breaks it)".into());
                }
                boxes.connect(Arrow {
                    from,
                    to,
                    label: label.first().map(|l| Text::new(l)),
                })
            })(),
            ("actor", Some(Kind::Sequence)) => (|| {
                let id = args.word("an id")?;
                let name = args.texts(1, "a quoted name")?;
                sequence.actor(id, Text::new(&name[0]))
            })(),
            (word @ ("message" | "reply"), Some(Kind::Sequence)) => (|| {
                let from = args.word("the actor that sends")?;
                let to = args.word("the actor that receives")?;
                let label = args.texts(1, "a quoted label")?;
                sequence.step(Step::Message {
                    from,
                    to,
                    label: Text::new(&label[0]),
                    reply: word == "reply",
                })
            })(),
            ("note", Some(Kind::Sequence)) => (|| {
                let span = args.word("an actor (or FROM..TO)")?;
                let (from, to) = match span.split_once("..") {
                    Some((a, b)) => (a.to_string(), b.to_string()),
                    None => (span.clone(), span),
                };
                let text = args.texts(1, "a quoted text")?;
                sequence.step(Step::Note {
                    from,
                    to,
                    text: Text::new(&text[0]),
                })
            })(),
            ("divider", Some(Kind::Sequence)) => args
                .texts(1, "a quoted text")
                .and_then(|t| sequence.step(Step::Divider(Text::new(&t[0])))),
            ("header", Some(Kind::Table)) => args
                .texts(1, "quoted cells")
                .and_then(|cells| table.header(cells.iter().map(|c| Text::new(c)).collect())),
            ("row", Some(Kind::Table)) => args
                .texts(1, "quoted cells")
                .and_then(|cells| table.row(cells.iter().map(|c| Text::new(c)).collect())),
            (other, Some(_)) => Err(format!(
                "`{other}` is not a statement of this kind of diagram (see `cargo xtask diagrams` docs in xtask/src/diagrams/mod.rs)"
            )),
        };
        step.map_err(fail)?;
    }
    let at_end = |message: &str| ParseError {
        line: last_line,
        message: message.into(),
    };
    let kind = kind.ok_or_else(|| at_end("empty: the first statement is `diagram KIND`"))?;
    let title = title.ok_or_else(|| at_end("no `title`"))?;
    let body = match kind {
        Kind::Boxes { .. } => {
            boxes.finish().map_err(|m| at_end(&m))?;
            Body::Boxes(boxes)
        }
        Kind::Sequence => {
            sequence.finish().map_err(|m| at_end(&m))?;
            Body::Sequence(sequence)
        }
        Kind::Table => {
            table.finish().map_err(|m| at_end(&m))?;
            Body::Table(table)
        }
    };
    Ok(Diagram { title, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_split_words_and_quotes() {
        assert_eq!(
            tokens(r#"box a 1 2 "two\nlines" "say \"hi\"""#).unwrap(),
            vec![
                Token::Word("box".into()),
                Token::Word("a".into()),
                Token::Word("1".into()),
                Token::Word("2".into()),
                Token::Quoted("two\nlines".into()),
                Token::Quoted("say \"hi\"".into()),
            ]
        );
        assert!(tokens(r#"title "open"#).is_err());
        assert!(tokens("# a comment").unwrap().is_empty());
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse("diagram boxes\ntitle \"t\"\narrow a b\n")
            .err()
            .unwrap();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("no box `a`"), "{}", e.message);
        let e = parse("box a 0 0 \"x\"").err().unwrap();
        assert_eq!(e.line, 1);
        assert!(e.message.contains("before `diagram`"), "{}", e.message);
        let e = parse("diagram table\ntitle \"t\"\nheader \"a\" \"b\"\nrow \"1\"\n")
            .err()
            .unwrap();
        assert_eq!(e.line, 4);
        let e = parse("diagram sequence\ntitle \"t\"\nactor a \"A\"\nmessage a a \"self\"\n")
            .err()
            .unwrap();
        assert_eq!(e.line, 4);
    }

    #[test]
    fn a_diagram_draws_what_it_says() {
        let svg = parse(
            "diagram states\ntitle \"T\"\nbox a 0 0 \"ok: Alpha\"\nbox b 1 0 \"Beta\"\narrow a b \"go\"\narrow b a \"back\"\n",
        )
        .unwrap()
        .render();
        for needle in [
            ">Alpha<",
            ">Beta<",
            ">go<",
            ">back<",
            "marker-end",
            "#3d8b37",
        ] {
            assert!(svg.contains(needle), "{needle} missing in {svg}");
        }
        assert!(!svg.contains("ok: "));
    }
}
