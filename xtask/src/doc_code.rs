//! `cargo xtask doc-code`: every `rust` block of the guides compiles. A
//! guide with Rust in it must be one of the facade's doc-tests (an
//! `include_str!` of it in `src/lib.rs`), and a block that cannot compile
//! (`rust,ignore`: an excerpt, or code needing a crate the facade does not
//! depend on) says why on the line before it, as
//! `<!-- ignore: the reason -->`.

use std::path::Path;

use crate::doc_links::guides;
use crate::Result;

/// What a justified `ignore` looks like, on the line before the fence.
const JUSTIFICATION: &str = "<!-- ignore: ";

pub fn doc_code(root: &Path) -> Result {
    let facade =
        std::fs::read_to_string(root.join("src/lib.rs")).map_err(|e| format!("src/lib.rs: {e}"))?;
    let mut problems = Vec::new();
    let mut blocks = 0;
    for (shown, text) in guides(root)? {
        let tested = is_doctested(&facade, &shown);
        for problem in problems_in(&text, tested) {
            problems.push(format!("{shown}:{problem}"));
        }
        blocks += rust_blocks(&text).len();
    }
    if problems.is_empty() {
        println!("doc-code: {blocks} rust blocks, each compiled or its `ignore` justified");
        return Ok(());
    }
    Err(format!(
        "rust blocks in the docs that are not compiled:\n{}",
        problems.join("\n")
    ))
}

/// Whether the facade includes `path` (relative to the root) as a doc-test.
fn is_doctested(facade: &str, path: &str) -> bool {
    facade.contains(&format!("include_str!(\"../{path}\")"))
}

/// A `rust` fence: its line (1-based), its info string and the line before.
struct Block<'a> {
    line: usize,
    info: &'a str,
    before: &'a str,
}

/// The opening fences of `rust` blocks in `text`.
fn rust_blocks(text: &str) -> Vec<Block<'_>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut fenced = false;
    for (i, line) in lines.iter().enumerate() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        if !fenced && info.starts_with("rust") {
            blocks.push(Block {
                line: i + 1,
                info,
                before: if i > 0 { lines[i - 1].trim() } else { "" },
            });
        }
        fenced = !fenced;
    }
    blocks
}

/// What is wrong with the `rust` blocks of a guide (`tested`: whether the
/// facade compiles it), one line each.
fn problems_in(text: &str, tested: bool) -> Vec<String> {
    let mut problems = Vec::new();
    for block in rust_blocks(text) {
        let ignored = block.info.split(',').any(|flag| flag.trim() == "ignore");
        let justified = block.before.starts_with(JUSTIFICATION);
        if ignored && !justified {
            problems.push(format!(
                "{}: `{}` without a reason: put `{JUSTIFICATION}why -->` on the line before",
                block.line, block.info
            ));
        } else if !ignored && !tested {
            problems.push(format!(
                "{}: a rust block in a guide the facade does not compile: add the guide to src/lib.rs's doc-tests",
                block.line
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ignored_block_needs_its_reason() {
        let bare = "text\n```rust,ignore\nlet x = 1;\n```\n";
        assert_eq!(problems_in(bare, true).len(), 1);
        let justified = "<!-- ignore: an excerpt -->\n```rust,ignore\nlet x = 1;\n```\n";
        assert!(problems_in(justified, true).is_empty());
    }

    #[test]
    fn a_compiled_block_needs_a_doctested_guide() {
        let text = "```rust\nlet x = 1;\n```\n```toml\n[a]\n```\n";
        assert!(problems_in(text, true).is_empty());
        assert_eq!(
            problems_in(text, false).len(),
            1,
            "the toml block is not Rust"
        );
    }

    #[test]
    fn the_facade_names_its_doctested_guides() {
        let facade = "#[doc = include_str!(\"../docs/http.md\")]";
        assert!(is_doctested(facade, "docs/http.md"));
        assert!(!is_doctested(facade, "docs/login.md"));
    }
}
