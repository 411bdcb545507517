//! `cargo xtask doc-facts`: a fact the guides state in figures has one
//! home, and every other guide links to it — two copies drift apart (a
//! guide once gave 136 bytes per key where another gave 88). Each fact is
//! recognised by the shape of its statement, and found anywhere but its
//! home is an error. The feature lists must agree too: the facade's
//! manifest, the features CI builds alone, and docs/features.md.

use std::path::Path;

use crate::doc_links::guides;
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
    let mut problems = feature_lists(root)?;
    for (shown, text) in guides(root)? {
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
        println!(
            "doc-facts: every fact checked is stated in its home only, and the feature lists agree"
        );
        return Ok(());
    }
    Err(format!(
        "facts in the docs out of their home, or lists out of step:\n{}",
        problems.join("\n")
    ))
}

/// The facade's features (`Cargo.toml`), the ones `cargo xtask features`
/// builds alone ([`FEATURES`](crate::FEATURES)) and the ones
/// docs/features.md lists (a table row each, and the list of those built
/// alone) are one list: what is missing where, one line each.
fn feature_lists(root: &Path) -> std::result::Result<Vec<String>, String> {
    let read =
        |path: &str| std::fs::read_to_string(root.join(path)).map_err(|e| format!("{path}: {e}"));
    let manifest = read("Cargo.toml")?;
    let guide = read("docs/features.md")?;
    let declared = manifest_features(&manifest);
    let alone = guide
        .split("## Every feature builds on its own")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .unwrap_or("");
    let mut problems = Vec::new();
    for feature in &declared {
        let quoted = format!("`{feature}`");
        if !crate::FEATURES.contains(&feature.as_str()) {
            problems.push(format!(
                "feature {quoted} is not in xtask's FEATURES (built alone in CI)"
            ));
        }
        if !guide.lines().any(|l| l.starts_with(&format!("| {quoted}"))) {
            problems.push(format!("docs/features.md has no table row for {quoted}"));
        }
        if !alone.contains(&quoted) {
            problems.push(format!(
                "docs/features.md's features built alone omit {quoted}"
            ));
        }
    }
    for feature in crate::FEATURES {
        if !declared.iter().any(|d| d == feature) {
            problems.push(format!(
                "xtask's FEATURES names `{feature}`, which the facade does not have"
            ));
        }
    }
    Ok(problems)
}

/// The features a manifest declares, `default` aside.
fn manifest_features(manifest: &str) -> Vec<String> {
    manifest
        .lines()
        .skip_while(|l| l.trim() != "[features]")
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter_map(|l| l.split_once('=').map(|(name, _)| name.trim()))
        .filter(|name| !name.is_empty() && !name.starts_with('#') && *name != "default")
        .map(str::to_string)
        .collect()
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
    fn a_manifests_features_are_read() {
        let manifest = "[package]\nname = \"x\"\n\n[features]\ndefault = [\"a\"]\n## docs\na = []\nb-c = [\"a\"]\n\n[dependencies]\nd = \"1\"\n";
        assert_eq!(manifest_features(manifest), ["a", "b-c"]);
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
