//! `cargo xtask doc-sentences`: every guide (the README and each file
//! under docs/) reads in plain sentences: at most [`MAX_AVERAGE`] words
//! per sentence on average. Only running prose counts: code blocks,
//! tables, headings, list items, block quotes and HTML are left out;
//! inline code counts as one word and a link as its text.

use std::path::Path;

use crate::doc_links::guides;
use crate::Result;

/// The longest average sentence a guide may have, in words.
pub(crate) const MAX_AVERAGE: f64 = 22.0;

/// A guide's running prose, measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Measure {
    pub(crate) sentences: usize,
    pub(crate) words: usize,
}

impl Measure {
    pub(crate) fn average(self) -> f64 {
        if self.sentences == 0 {
            return 0.0;
        }
        self.words as f64 / self.sentences as f64
    }
}

pub fn doc_sentences(root: &Path) -> Result {
    let mut problems = Vec::new();
    let mut report = Vec::new();
    for (shown, text) in guides(root)? {
        let measure = measure(&text);
        let line = format!(
            "{shown}: {:.1} words per sentence ({} sentences)",
            measure.average(),
            measure.sentences
        );
        if measure.average() > MAX_AVERAGE {
            problems.push(line);
        } else {
            report.push(line);
        }
    }
    for line in &report {
        println!("doc-sentences: {line}");
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(format!(
        "guides averaging more than {MAX_AVERAGE} words per sentence (split the long sentences):\n{}",
        problems.join("\n")
    ))
}

/// Sentences and words of `text`'s running prose.
pub(crate) fn measure(text: &str) -> Measure {
    let mut total = Measure {
        sentences: 0,
        words: 0,
    };
    for paragraph in paragraphs(text) {
        for sentence in sentences(&plain(&paragraph)) {
            total.sentences += 1;
            total.words += sentence;
        }
    }
    total
}

/// The paragraphs of running prose: lines between blank lines, outside
/// code fences, that are not tables, headings, list items, quotes, HTML
/// or images (any of those ends a paragraph).
fn paragraphs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut fenced = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            fenced = !fenced;
            end_paragraph(&mut out, &mut current);
            continue;
        }
        if fenced || trimmed.is_empty() || !is_prose(trimmed) {
            end_paragraph(&mut out, &mut current);
            continue;
        }
        current.push_str(trimmed);
        current.push(' ');
    }
    end_paragraph(&mut out, &mut current);
    out
}

fn end_paragraph(out: &mut Vec<String>, current: &mut String) {
    if !current.trim().is_empty() {
        out.push(std::mem::take(current));
    }
    current.clear();
}

/// Whether a (trimmed, non-empty) line is running prose.
fn is_prose(line: &str) -> bool {
    let starts = |p: &str| line.starts_with(p);
    let numbered = line
        .split_once(". ")
        .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    !(starts("|")
        || starts("#")
        || starts("- ")
        || starts("* ")
        || starts("+ ")
        || starts(">")
        || starts("<")
        || starts("![")
        || numbered)
}

/// `paragraph` with inline code as one word and links as their text.
fn plain(paragraph: &str) -> String {
    let mut out = String::with_capacity(paragraph.len());
    let mut rest = paragraph;
    while let Some(c) = rest.chars().next() {
        if c == '`' {
            // Inline code: one word, however long.
            match rest[1..].find('`') {
                Some(end) => {
                    out.push_str("Code");
                    rest = &rest[end + 2..];
                    continue;
                }
                None => {
                    rest = &rest[1..];
                    continue;
                }
            }
        }
        if c == ']' && rest[1..].starts_with('(') {
            // A link's target is not read.
            if let Some(end) = rest.find(')') {
                rest = &rest[end + 1..];
                continue;
            }
        }
        if c != '[' {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// The word counts of the sentences of `text`: a sentence ends at `.`,
/// `!`, `?`, `:` or `;` followed by white space and a capital letter, a
/// digit or an opening bracket (so "e.g. the" and "2.5 ms" do not end
/// one).
fn sentences(text: &str) -> Vec<usize> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut counts = Vec::new();
    let mut count = 0;
    for (i, word) in words.iter().enumerate() {
        count += 1;
        let ends = word.ends_with(['.', '!', '?', ':', ';']);
        let next_starts = words.get(i + 1).is_none_or(|next| {
            next.starts_with(|c: char| c.is_uppercase() || c.is_ascii_digit() || c == '(')
        });
        if ends && next_starts {
            counts.push(count);
            count = 0;
        }
    }
    if count > 0 {
        counts.push(count);
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_running_prose_only() {
        let text = "# A heading of many many many words here\n\
            \n\
            One two three. Four five six seven.\n\
            \n\
            ```rust\nlet code = not.counted();\n```\n\
            | a | table | row |\n\
            - a list item is not counted at all\n\
            > a quote neither\n\
            \n\
            See [the long link text](other.md#x), with `some code here`: Done.\n";
        let m = measure(text);
        // "See the long link text, with Code:" (7 words) ends at the colon
        // before a capital; "Done." is the fourth.
        assert_eq!(m.sentences, 4, "{m:?}");
        assert_eq!(m.words, 3 + 4 + 7 + 1, "{m:?}");
    }

    #[test]
    fn abbreviations_and_decimals_do_not_end_sentences() {
        assert_eq!(
            sentences("It took 2.5 ms, e.g. the first call. Then more."),
            vec![8, 2]
        );
    }

    #[test]
    fn a_long_winded_guide_fails_and_a_plain_one_passes() {
        let long = "This sentence goes on and on, clause after clause, \
            with asides and qualifications and conditions that a reader \
            must hold in mind all at once before the verb finally arrives.\n";
        assert!(measure(long).average() > MAX_AVERAGE);
        let plain = "This is short. So is this one. A reader follows it.\n";
        assert!(measure(plain).average() <= MAX_AVERAGE);
    }
}
