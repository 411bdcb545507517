//! `cargo xtask doc-links`: every link from one of the repository's
//! markdown files to another file of it resolves, and so does its anchor
//! (a heading of the target, named as GitHub names it).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::Result;

/// The markdown files checked: the README and everything under docs/.
pub(crate) fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Each markdown file ([`markdown_files`]) named from the root, with its
/// text: what the docs checks read.
pub(crate) fn guides(root: &Path) -> std::result::Result<Vec<(String, String)>, String> {
    markdown_files(root)
        .into_iter()
        .map(|file| {
            let text =
                std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let shown = file
                .strip_prefix(root)
                .unwrap_or(&file)
                .display()
                .to_string();
            Ok((shown, text))
        })
        .collect()
}

/// The text outside code: fenced blocks and inline code are blanked, so
/// a link shown as code is not a link.
fn prose(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if fenced {
            out.push('\n');
            continue;
        }
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            }
            out.push(if in_code || c == '`' { ' ' } else { c });
        }
        out.push('\n');
    }
    out
}

/// The targets of `[text](target)` links in `text`.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.to_string());
        rest = &rest[end..];
    }
    targets
}

/// The anchors GitHub gives the headings of a markdown `text`: lower case,
/// punctuation other than `-` and `_` dropped, spaces as `-`, a repeated
/// one numbered (`-1`, `-2`, …).
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#').trim();
        let slug: String = heading
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while !seen.insert(unique.clone()) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
    }
    seen
}

/// What is wrong with `target`, linked from `file`; `None` when it resolves.
fn broken(file: &Path, target: &str) -> Option<String> {
    let external = ["http://", "https://", "mailto:"];
    if target.is_empty() || external.iter().any(|s| target.starts_with(s)) {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let resolved = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent().expect("a directory").join(path)
    };
    if !resolved.exists() {
        return Some(format!("{target}: no such file"));
    }
    let anchor = anchor?;
    if resolved.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let text = std::fs::read_to_string(&resolved).unwrap_or_default();
    if anchors(&text).contains(anchor) {
        None
    } else {
        Some(format!("{target}: no heading makes the anchor #{anchor}"))
    }
}

/// Check every link; a list of the broken ones fails.
pub fn doc_links(root: &Path) -> Result {
    let mut problems = Vec::new();
    let mut links = 0;
    for file in markdown_files(root) {
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        for target in link_targets(&prose(&text)) {
            links += 1;
            if let Some(problem) = broken(&file, &target) {
                let shown = file.strip_prefix(root).unwrap_or(&file);
                problems.push(format!("{}: {problem}", shown.display()));
            }
        }
    }
    if problems.is_empty() {
        println!("doc-links: {links} links, every one resolves");
        return Ok(());
    }
    Err(format!(
        "{} broken links in the docs:\n{}",
        problems.len(),
        problems.join("\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_are_named_as_github_names_them() {
        let text = "# The rate limit server\n## Redis: functions or scripts\n## Notes\n## Notes\n```\n# not a heading\n```\n";
        let a = anchors(text);
        for wanted in [
            "the-rate-limit-server",
            "redis-functions-or-scripts",
            "notes",
            "notes-1",
        ] {
            assert!(a.contains(wanted), "{wanted}: {a:?}");
        }
        assert!(!a.contains("not-a-heading"));
    }

    #[test]
    fn links_in_code_are_not_links() {
        let text = prose("see [a](a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n");
        assert_eq!(link_targets(&text), ["a.md"]);
    }
}
