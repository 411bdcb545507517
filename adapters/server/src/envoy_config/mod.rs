//! envoyproxy/ratelimit's configuration, read as is: a directory of YAML
//! files, one domain each (`[server] envoy_config_dir`).
//!
//! Each descriptor with a `rate_limit` becomes a leaf: a fixed window of
//! its unit, aligned to the Unix epoch as the reference's, counted per
//! descriptor (its keys and values) — or, with Tollgate's extension
//! `tollgate: { policy: … }`, any policy of the server's file. How a
//! request's descriptor finds its leaf is `tree.rs`; the file format and
//! its checks are `file.rs`.

mod file;
mod tree;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{Limit, OnStoreFailure, Policy, Subject};

use crate::error::ServerError;
use file::{DescriptorYaml, File};
pub(crate) use tree::Node;

/// What a leaf does with the descriptors that land on it.
#[derive(Debug, Clone)]
pub(crate) enum Counting {
    /// Counted under this policy.
    Policy(Policy),
    /// `unlimited: true`: admitted, never counted.
    Unlimited,
    /// `requests_per_unit: 0`: always over the limit (answered `OK` in
    /// shadow mode, as the reference answers a shadow denial).
    Zero { shadow: bool },
}

/// A descriptor of a file that has a `rate_limit` (or `tollgate.policy`).
#[derive(Debug, Clone)]
pub(crate) struct Leaf {
    /// Its name among the server's rules (`rule_name`): its layer's and
    /// its policy's name.
    pub(crate) rule: String,
    /// The reference's name for it: `key_value.key2` under its domain,
    /// the `rule` label of its counters.
    pub(crate) label: String,
    pub(crate) counting: Counting,
    /// `rate_limit.name` (empty: none), what `replaces` names.
    pub(crate) name: String,
    /// The names of the limits it replaces in a request it takes part in.
    pub(crate) replaces: Vec<String>,
    /// Counters labelled with the request's values (`detailed_metric`).
    pub(crate) detailed: bool,
    /// Its domain.
    pub(crate) domain: String,
}

/// One domain: its tree, and how its descriptors are decided.
#[derive(Debug, Clone)]
pub(crate) struct Domain {
    pub(crate) root: Node,
    /// Together, all-or-nothing (Tollgate's extension), rather than each
    /// on its own as the reference decides them.
    pub(crate) all_or_nothing: bool,
    /// The keys whose values are hashed with the server's key (Tollgate's
    /// extension `hashed`): each a key of the domain's tree.
    pub(crate) hashed: Arc<BTreeSet<String>>,
    /// What its `rate_limit` limits and its overrides answer when the store
    /// fails (Tollgate's extension `on_failure`, fail open by default).
    pub(crate) on_failure: OnStoreFailure,
}

/// The loaded directory: its domains, and the leaves of all of them.
#[derive(Debug, Default, Clone)]
pub(crate) struct Domains {
    pub(crate) domains: HashMap<String, Domain>,
    pub(crate) leaves: Vec<Leaf>,
}

/// Where descriptors are loaded: their domain, the full key of the
/// descriptor they are under (ending in `.`), and the keys of the path to
/// it.
#[derive(Clone, Copy)]
struct Place<'a> {
    domain: &'a str,
    on_failure: &'a OnStoreFailure,
    parent: &'a str,
    path: &'a [String],
}

/// The hash of `parts`, each length-prefixed, as a name (`h.` and hex).
fn hashed_name<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut bytes = Vec::new();
    for part in parts {
        bytes.extend_from_slice(&(part.len() as u64).to_be_bytes());
        bytes.extend_from_slice(part);
    }
    Subject::hashed(bytes, crate::rules::odd_values_key())
        .as_str()
        .to_string()
}

/// A leaf's name among the rules, its policy's and its layer's: the hash
/// of its domain and the keys of its path, so two leaves never share one
/// (their full keys can: `p` with value `x.p` and `p_x` over `p` both
/// read `d.p_x.p`), and its store keys stay the same as long as its place
/// in the tree does.
fn rule_name(domain: &str, path: &[String]) -> String {
    let parts = [&b"leaf"[..], domain.as_bytes()];
    hashed_name(parts.into_iter().chain(path.iter().map(|k| k.as_bytes())))
}

/// The name of a domain's rule for descriptors with a limit override.
pub(crate) fn override_rule_name(domain: &str) -> String {
    hashed_name([&b"override"[..], domain.as_bytes()])
}

/// Directories read below the configuration's own, at most: a deeper
/// tree is most likely a symbolic link that loops.
const MAX_DEPTH: usize = 8;

/// The YAML files of `dir` and of its subdirectories, in path order, as
/// the reference reads its runtime tree: `*.yaml` and `*.yml`, hidden
/// files and directories (Kubernetes' `..data`) left out, symbolic links
/// followed (a ConfigMap's nested paths are links to directories). What
/// cannot be read refuses the lot, loudly, as an unreadable file does: a
/// part skipped would be limits gone without a word. So is a tree with any
/// other visible file: the reference reads every file whatever its name,
/// so a file of limits may have neither ending, and skipping it would drop
/// its domain's limits (a tree whose files all lack one would limit
/// nothing).
fn files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let (files, others) = tree(dir)?;
    if !others.is_empty() {
        return Err(format!(
            "files without a *.yaml or *.yml name in the directory: {} (the reference reads every file as limits): give each file of the configuration one of these endings, and move anything else out",
            others.join(", ")
        ));
    }
    Ok(files)
}

/// The YAML files under `dir` and the names of its other visible files,
/// each in order.
fn tree(dir: &Path) -> Result<(Vec<PathBuf>, Vec<String>), String> {
    let (mut files, mut others) = (Vec::new(), Vec::new());
    walk(dir, 0, &mut files, &mut others)?;
    files.sort();
    others.sort();
    Ok((files, others))
}

/// Add the YAML files under `dir` (`depth` levels below the
/// configuration's directory) to `files`, the names of its other visible
/// files to `others`.
fn walk(
    dir: &Path,
    depth: usize,
    files: &mut Vec<PathBuf>,
    others: &mut Vec<String>,
) -> Result<(), String> {
    let unreadable = |e: std::io::Error| {
        match depth {
        0 => format!("cannot read the directory: {e}"),
        _ => format!(
            "cannot read its subdirectory {}: {e} (point envoy_config_dir at the configuration's own directory, not a volume's root)",
            dir.display()
        ),
    }
    };
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or(".");
        if name.starts_with('.') {
            continue;
        }
        // Followed through links: a link to nothing (or an entry whose
        // kind cannot be read) refuses the tree, naming it.
        let kind =
            std::fs::metadata(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if kind.is_dir() {
            if depth == MAX_DEPTH {
                return Err(format!(
                    "{} is more than {MAX_DEPTH} directories deep (a symbolic link that loops?)",
                    path.display()
                ));
            }
            walk(&path, depth + 1, files, others)?;
        } else if name.ends_with(".yaml") || name.ends_with(".yml") {
            // (Reading a pipe or a device could wait forever.)
            if !kind.is_file() {
                return Err(format!("{} is not a regular file", path.display()));
            }
            files.push(path);
        } else {
            others.push(name.to_string());
        }
    }
    Ok(())
}

/// What a watch compares: every YAML file's name and contents, the names
/// of the tree's other visible files, and what could not be read, as its
/// error. A tree the server would refuse is a change all the same: the
/// reload the watch then attempts refuses it, naming the culprit, and is
/// counted (were it no change, every edit would be ignored without a word
/// while a stray file stayed).
pub(crate) fn contents(dir: &Path) -> Vec<u8> {
    let (files, others) = match tree(dir) {
        Ok(tree) => tree,
        Err(unreadable) => return [&b"unreadable\0"[..], unreadable.as_bytes()].concat(),
    };
    let mut all = Vec::new();
    for name in &others {
        all.extend_from_slice(name.as_bytes());
        all.push(0);
    }
    all.push(0);
    for path in &files {
        all.extend_from_slice(path.as_os_str().as_encoded_bytes());
        all.push(0);
        match std::fs::read(path) {
            Ok(text) => all.extend(text),
            Err(e) => all.extend_from_slice(format!("unreadable: {e}").as_bytes()),
        }
        all.push(0);
    }
    all
}

/// The keys of `file`'s `tollgate.hashed`, each a key of its tree (a typo
/// would leave the secret it meant as sent).
fn hashed_keys(file: &File) -> Result<BTreeSet<String>, String> {
    fn keys<'f>(descriptors: &'f [DescriptorYaml], into: &mut BTreeSet<&'f str>) {
        for d in descriptors {
            into.insert(&d.key);
            keys(&d.descriptors, into);
        }
    }
    let mut in_tree = BTreeSet::new();
    keys(&file.descriptors, &mut in_tree);
    let hashed = &file.tollgate.hashed;
    match hashed.iter().find(|k| !in_tree.contains(k.as_str())) {
        Some(missing) => Err(format!(
            "tollgate.hashed names {missing:?}, which is no descriptor's key in domain '{}'",
            file.domain
        )),
        None => Ok(hashed.iter().cloned().collect()),
    }
}

impl Domains {
    /// Load `dir`; `policy` finds a `[policies.<name>]` of the server's
    /// file for `tollgate.policy`. Any invalid file refuses the lot.
    pub(crate) fn load(
        dir: &Path,
        policy: &dyn Fn(&str) -> Option<Policy>,
    ) -> Result<Domains, ServerError> {
        let refuse = |file: &Path, reason: String| ServerError::EnvoyConfig {
            file: file.display().to_string(),
            reason,
        };
        let mut domains = Domains::default();
        for path in files(dir).map_err(|e| refuse(dir, e))? {
            let text = std::fs::read_to_string(&path).map_err(|e| refuse(&path, e.to_string()))?;
            let loading = |e| refuse(&path, format!("error loading config file: {e}"));
            let mut value: serde_norway::Value = serde_norway::from_str(&text).map_err(loading)?;
            // Merge keys (`<<: *defaults`), which the reference's YAML
            // reader applies too.
            value.apply_merge().map_err(loading)?;
            file::check_keys(&value).map_err(|e| refuse(&path, e))?;
            let file: File = serde_norway::from_value(value).map_err(loading)?;
            domains.add(file, policy).map_err(|e| refuse(&path, e))?;
        }
        Ok(domains)
    }

    fn add(&mut self, file: File, policy: &dyn Fn(&str) -> Option<Policy>) -> Result<(), String> {
        if file.domain.is_empty() {
            return Err("config file cannot have empty domain".into());
        }
        if self.domains.contains_key(&file.domain) {
            return Err(format!("duplicate domain '{}' in config file", file.domain));
        }
        let mut root = Node::default();
        let parent = format!("{}.", file.domain);
        let on_failure = file.tollgate.on_failure.policy();
        let at = Place {
            domain: &file.domain,
            on_failure: &on_failure,
            parent: &parent,
            path: &[],
        };
        self.descriptors(&mut root, at, &file.descriptors, policy)?;
        let domain = Domain {
            root,
            all_or_nothing: file.tollgate.all_or_nothing,
            hashed: Arc::new(hashed_keys(&file)?),
            on_failure,
        };
        self.domains.insert(file.domain, domain);
        Ok(())
    }

    /// Load `descriptors` under `node`.
    fn descriptors(
        &mut self,
        node: &mut Node,
        at: Place<'_>,
        descriptors: &[DescriptorYaml],
        policy: &dyn Fn(&str) -> Option<Policy>,
    ) -> Result<(), String> {
        for d in descriptors {
            d.check()?;
            let key = d.final_key();
            let full = format!("{}{key}", at.parent);
            let path = [at.path, std::slice::from_ref(&key)].concat();
            let mut child = Node::default();
            if let Some(leaf) = leaf(d, at, &full, &path, policy)? {
                child.leaf = Some(self.leaves.len());
                self.leaves.push(leaf);
            }
            let below = Place {
                domain: at.domain,
                on_failure: at.on_failure,
                parent: &format!("{full}."),
                path: &path,
            };
            self.descriptors(&mut child, below, &d.descriptors, policy)?;
            if !node.insert(&key, child) {
                return Err(format!("duplicate descriptor composite key '{full}'"));
            }
        }
        Ok(())
    }
}

/// The leaf of descriptor `d` of `domain` (full key `full`, at the end of
/// `path`), if it has a limit.
fn leaf(
    d: &DescriptorYaml,
    at: Place<'_>,
    full: &str,
    path: &[String],
    policy: &dyn Fn(&str) -> Option<Policy>,
) -> Result<Option<Leaf>, String> {
    let domain = at.domain;
    let rule = rule_name(domain, path);
    let mut leaf = Leaf {
        label: full[domain.len() + 1..].to_string(),
        rule: rule.clone(),
        counting: Counting::Zero { shadow: false },
        name: String::new(),
        replaces: Vec::new(),
        detailed: d.detailed_metric,
        domain: domain.to_string(),
    };
    let shadow = |p: Policy| if d.shadow_mode { p.shadow() } else { p };
    leaf.counting = match (&d.rate_limit, &d.tollgate) {
        (Some(limit), _) => {
            leaf.name = limit.name.clone();
            leaf.replaces = limit.replaces.iter().map(|r| r.name.clone()).collect();
            match file::unit_seconds(&limit.unit) {
                _ if limit.unlimited => Counting::Unlimited,
                _ if limit.requests_per_unit == 0 => Counting::Zero {
                    shadow: d.shadow_mode,
                },
                Some(seconds) => {
                    let window = Duration::from_secs(seconds);
                    let rpu = u64::from(limit.requests_per_unit);
                    let limit = Limit::fixed_window(rpu, window).map_err(|e| {
                        format!("descriptor {full:?}: requests_per_unit {}", e.reason())
                    })?;
                    let policy = Policy::new(&rule, limit)
                        .and_then(|p| p.with_on_failure(at.on_failure.clone()))
                        .map_err(|e| e.to_string())?;
                    Counting::Policy(shadow(policy))
                }
                None => return Err(format!("invalid rate limit unit '{}'", limit.unit)),
            }
        }
        (None, Some(extension)) => match policy(&extension.policy) {
            Some(p) if matches!(p.limit(), Limit::Concurrency(_)) => {
                return Err(format!(
                    "descriptor {:?}: tollgate.policy {:?} is a concurrency limit: Envoy's rate limit protocol cannot give a place back, so it would stay taken until its lease ran out; hold places through the HTTP API (POST /v1/acquire)",
                    d.key, extension.policy
                ))
            }
            Some(p) => Counting::Policy(shadow(p)),
            None => {
                return Err(format!(
                    "descriptor {:?}: tollgate.policy {:?} is not a [policies.<name>] of the server's file",
                    d.key, extension.policy
                ))
            }
        },
        (None, None) => return Ok(None),
    };
    Ok(Some(leaf))
}
