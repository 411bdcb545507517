//! Files the xtask generates and checks in (`docs/img/`): written when they
//! changed, or with `--check` (as CI runs it) compared byte for byte, so a
//! checked-in file cannot drift from what generates it.

use std::path::Path;

use crate::Result;

/// Writes each `(name, contents)` into `dir`, or with `check` only compares.
/// `what` names the files in messages; `command` regenerates them.
pub(crate) fn write_or_check(
    dir: &Path,
    files: &[(String, String)],
    check: bool,
    what: &str,
    command: &str,
) -> Result {
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let mut stale = Vec::new();
    for (name, contents) in files {
        let path = dir.join(name);
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if &current == contents {
            continue;
        }
        if check {
            stale.push(name.as_str());
        } else {
            std::fs::write(&path, contents).map_err(|e| format!("write {name}: {e}"))?;
            eprintln!("docs/img/{name}: written");
        }
    }
    if !stale.is_empty() {
        return Err(format!(
            "{what} differ from what generates them: {}; run `{command}` and commit docs/img",
            stale.join(", ")
        ));
    }
    eprintln!("docs/img: every one of the {what} is current");
    Ok(())
}
