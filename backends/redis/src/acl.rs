//! The least-privilege Redis ACL rule for a Tollgate user: the commands a
//! store sends (around its code and inside it) and the key pattern of its
//! prefix, nothing else.

use std::fmt;

use crate::Engine;

/// What a store's code runs inside Redis: reading the time, counter states
/// (strings) and sliding logs (lists), and removing them (`Store::reset`,
/// a block on a log).
const CODE_COMMANDS: [&str; 13] = [
    "time", "get", "set", "pttl", "pexpire", "type", "rpush", "llen", "lrange", "lindex", "ltrim",
    "lrem", "del",
];

/// The ACL rule (`ACL SETUSER <user> on ><password> <rule>`) that gives a
/// Redis user exactly what a Tollgate store needs: its commands, and keys
/// under its prefix. A store connecting as a user that lacks one of them
/// fails at connect with
/// [`RedisStoreError::NoPermission`](crate::RedisStoreError::NoPermission),
/// naming it.
///
/// ```
/// use tollgate_redis::{AclRule, Engine};
///
/// let rule = AclRule::new("tollgate").to_string();
/// assert!(rule.starts_with("resetkeys ~tollgate:* resetchannels -@all +fcall +function|load"));
/// let script_only = AclRule::new("tollgate").engine(Engine::Eval).to_string();
/// assert!(script_only.contains("+evalsha +script|load"));
/// // The recommended rule: an administrator loads the library.
/// let restricted = AclRule::new("tollgate")
///     .engine(Engine::PreloadedFunctions)
///     .to_string();
/// assert!(restricted.contains(" +fcall ") && !restricted.contains("function"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclRule {
    prefix: String,
    engine: Engine,
    replica_ack: bool,
    cluster: bool,
    sentinel: bool,
    database: bool,
}

impl AclRule {
    /// The rule for stores with this key prefix, calling the function
    /// library (the default [`Engine::Auto`] on Redis 7.0 and later).
    pub fn new(prefix: impl Into<String>) -> Self {
        AclRule {
            prefix: prefix.into(),
            engine: Engine::Auto,
            replica_ack: false,
            cluster: false,
            sentinel: false,
            database: false,
        }
    }

    /// For stores built with this [`Engine`]: [`Engine::Eval`] needs
    /// `EVALSHA` and `SCRIPT LOAD` instead of `FCALL` and `FUNCTION LOAD`;
    /// [`Engine::PreloadedFunctions`] `FCALL` alone (the recommended
    /// rule: it cannot replace any library); [`Engine::Module`] the
    /// module's `TOLLGATE.PROTOCOL` and `TOLLGATE.DECIDE`.
    pub fn engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self
    }

    /// For stores that wait for replicas (`replica_ack`): adds `WAIT`.
    pub fn replica_ack(mut self, on: bool) -> Self {
        self.replica_ack = on;
        self
    }

    /// For the Cluster store: adds `CLUSTER SLOTS` (the client's map of
    /// the slots) and `ASKING` (following a slot in migration), and `EVAL`
    /// with the script form (how a node that lacks the script gets it).
    pub fn cluster(mut self, on: bool) -> Self {
        self.cluster = on;
        self
    }

    /// For a store found through Sentinel
    /// ([`RedisStore::sentinel`](crate::RedisStore::sentinel)): adds
    /// `ROLE`, with which the store checks that the server the sentinels
    /// name is a primary before it decides there.
    pub fn sentinel(mut self, on: bool) -> Self {
        self.sentinel = on;
        self
    }

    /// For stores whose URL names a database other than 0
    /// (`redis://host:6379/3`): adds `SELECT`, which the connection sends
    /// before anything else. (The Cluster has database 0 only.)
    pub fn database(mut self, on: bool) -> Self {
        self.database = on;
        self
    }
}

impl fmt::Display for AclRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "resetkeys ~{}:* resetchannels -@all", self.prefix)?;
        match self.engine {
            Engine::Eval => {
                f.write_str(" +evalsha +script|load")?;
                if self.cluster {
                    f.write_str(" +eval")?;
                }
            }
            // Loaded by an administrator: nothing that can replace code.
            Engine::PreloadedFunctions => f.write_str(" +fcall")?,
            Engine::Module => f.write_str(" +tollgate.protocol +tollgate.decide")?,
            _ => f.write_str(" +fcall +function|load")?,
        }
        for command in CODE_COMMANDS {
            write!(f, " +{command}")?;
        }
        if self.replica_ack {
            f.write_str(" +wait")?;
        }
        if self.cluster {
            f.write_str(" +cluster|slots +asking")?;
        }
        if self.sentinel {
            f.write_str(" +role")?;
        }
        if self.database {
            f.write_str(" +select")?;
        }
        Ok(())
    }
}
