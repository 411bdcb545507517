//! `cargo xtask diagrams [--check]`: the diagrams of the guides, drawn from
//! their text sources. Each `docs/img/NAME.diagram` becomes
//! `docs/img/NAME.svg`; with `--check` (CI) they are drawn in memory and
//! compared byte for byte with the checked-in SVGs, so a picture cannot
//! drift from its source. No browser, no layout engine, no download: a
//! diagram is laid out on a grid its source states.
//!
//! # The text format
//!
//! One statement per line; words are bare or `"quoted"` (`\n` breaks a
//! line inside quotes, `\"` is a quote); `#` starts a comment line. A
//! quoted text that starts with `ok: `, `no: ` or `mid: ` is drawn green,
//! red or amber (the prefix is not shown).
//!
//! ```text
//! diagram boxes | states | sequence | table
//! title "What the picture shows"
//!
//! # boxes and states (states are drawn rounded)
//! gap 80 50                      # space between grid columns, rows
//! box ID COL ROW "heading" "line" ...
//! arrow FROM TO "label"          # label optional
//!
//! # sequence
//! actor ID "name"
//! message FROM TO "label"        # a call: solid arrow
//! reply FROM TO "label"          # an answer: dashed arrow
//! note ID "text"                 # on one lifeline, or ID..ID across
//! divider "text"                 # a band across every lifeline
//!
//! # table
//! header "cell" ...
//! row "cell" ...
//! ```

mod boxes;
mod parse;
mod sequence;
mod table;
mod text;

use crate::generated::write_or_check;
use crate::{root, Result};

pub(crate) fn diagrams(args: &[String]) -> Result {
    let check = args.iter().any(|a| a == "--check");
    let dir = root().join("docs/img");
    let mut sources: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| format!("read docs/img: {e}"))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "diagram"))
        .collect();
    sources.sort();
    if sources.is_empty() {
        return Err("docs/img holds no .diagram source".into());
    }
    let mut files = Vec::new();
    for path in sources {
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| format!("{}: not a UTF-8 file name", path.display()))?;
        let source = std::fs::read_to_string(&path)
            .map_err(|e| format!("read docs/img/{name}.diagram: {e}"))?;
        let diagram = parse::parse(&source)
            .map_err(|e| format!("docs/img/{name}.diagram:{}: {}", e.line, e.message))?;
        files.push((format!("{name}.svg"), diagram.render()));
    }
    write_or_check(&dir, &files, check, "diagrams", "cargo xtask diagrams")
}
