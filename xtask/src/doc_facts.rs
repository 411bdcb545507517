//! `cargo xtask doc-facts`: a fact the guides state in figures has one
//! home, and every other guide links to it — two copies drift apart (a
//! guide once gave 136 bytes per key where another gave 88). Each fact
//! is recognised by the shape of its statement, and found anywhere but
//! its home is an error.

use std::path::Path;

use crate::doc_links::markdown_files;
use crate::Result;

/// A fact and where it is stated.
struct Fact {
    what: &'static str,
    /// The guides that may state it (the first is its home, to link to).
    homes: &'static [&'static str],
    /// Whether a line states it.
    stated_in: fn(&str) -> bool,
}

const FACTS: &[Fact] = &[
    Fact {
        what: "the memory a key takes in Redis (`<n> B`)",
        homes: &[
            "docs/algorithms.md",
            "docs/benchmarks.md",
            "docs/performance-history.md",
        ],
        stated_in: states_bytes,
    },
    Fact {
        what: "a Redis CPU figure against the classic script (`<n> µs (<r>×`)",
        homes: &["docs/benchmarks.md", "docs/performance-history.md"],
        stated_in: states_cpu_ratio,
    },
    Fact {
        what: "which versions of Redis are supported (`<x.y> and later`)",
        homes: &["docs/features.md"],
        stated_in: states_versions,
    },
];

pub fn doc_facts(root: &Path) -> Result {
    let mut problems = Vec::new();
    for file in markdown_files(root) {
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let shown = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for (n, line) in text.lines().enumerate() {
            for fact in FACTS {
                if !fact.homes.contains(&shown.as_str()) && (fact.stated_in)(line) {
                    problems.push(format!(
                        "{shown}:{}: states {}, which lives in {}: link to it instead",
                        n + 1,
                        fact.what,
                        fact.homes[0]
                    ));
                }
            }
        }
    }
    if problems.is_empty() {
        println!("doc-facts: every fact checked is stated in its home only");
        return Ok(());
    }
    Err(format!(
        "facts stated outside their home:\n{}",
        problems.join("\n")
    ))
}

/// Whether `text` at `at` starts with a decimal number (`12`, `1,192`,
/// `2.5`); its length in bytes.
fn number_at(text: &str, at: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'.') {
        return None;
    }
    let len = bytes[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit() || **b == b',' || **b == b'.')
        .count();
    let number = text[at..at + len].trim_end_matches([',', '.']);
    (number.bytes().next().is_some_and(|b| b.is_ascii_digit())).then_some(number.len())
}

/// Every decimal number in `line`, with what follows it.
fn numbers(line: &str) -> impl Iterator<Item = &str> + '_ {
    (0..line.len())
        .filter(|&i| line.is_char_boundary(i))
        .filter_map(move |i| number_at(line, i).map(|len| &line[i + len..]))
}

/// `88 B`, `1,192 B`: a size in bytes.
fn states_bytes(line: &str) -> bool {
    numbers(line).any(|after| {
        after
            .strip_prefix(" B")
            .is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric()))
    })
}

/// `8.3 µs (0.95×`: a Redis CPU figure with its ratio to another path.
fn states_cpu_ratio(line: &str) -> bool {
    numbers(line).any(|after| {
        after
            .strip_prefix(" µs (")
            .is_some_and(|rest| number_at(rest, 0).is_some_and(|len| rest[len..].starts_with('×')))
    })
}

/// `Redis 7.0 and later`, `6.2 or later` on a line about Redis: a
/// supported version of Redis.
fn states_versions(line: &str) -> bool {
    line.contains("Redis")
        && numbers(line)
            .any(|after| after.starts_with(" and later") || after.starts_with(" or later"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_recognised() {
        assert!(states_bytes("| GCRA | 88 B | fast |"));
        assert!(states_bytes("200 B + 10 B per request (1,192 B at 100)"));
        assert!(!states_bytes("a 2 Byte header, Plan B, 100 ms"));
    }

    #[test]
    fn cpu_ratios_are_recognised() {
        assert!(states_cpu_ratio("| 8.3 µs (0.95× the classic script) |"));
        assert!(!states_cpu_ratio("retry after 12 µs (rounded up)"));
    }

    #[test]
    fn versions_are_recognised() {
        assert!(states_versions("On Redis 7.0 and later the stores"));
        assert!(states_versions("Redis needs 6.2 or later"));
        assert!(!states_versions(
            "actix-web 4 (4.7 or later for `Route::wrap`)"
        ));
        assert!(!states_versions(
            "version 7.0 of Redis, and later versions too"
        ));
    }
}
