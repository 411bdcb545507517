//! Stores of one's own in the file: a [`StoreKind`] names a store and
//! reads its settings, and [`StoreKinds`] is the list a file is read
//! against, so `[store] kind = "postgres"` selects a store this crate has
//! never heard of.

use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use tollgate_limiter::{async_trait, Clock, PolicyError, Store, StoreError};
use toml::Value;

/// The kinds this crate builds itself: a registered kind takes none of
/// these names.
pub(crate) const BUILT_IN: [&str; 4] = ["memory", "redis", "redis-sentinel", "redis-cluster"];

/// A store the configuration file can select with `[store] kind = "…"`,
/// from a crate this one does not know: register it with
/// [`StoreKinds::with`] and read the file with
/// [`Config::from_toml_str_with`](crate::Config::from_toml_str_with) (or
/// [`from_file_with`](crate::Config::from_file_with)).
///
/// The `[store]` table's other fields are the kind's
/// [`Settings`](StoreKind::Settings), read with serde when the file is read:
/// an error names its field (`store.pool_size: invalid type: …`), with the
/// file's other errors. Refuse unknown fields with
/// `#[serde(deny_unknown_fields)]`, as every built-in section does.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use tollgate_config::{Config, StoreKind, StoreKinds};
/// use tollgate_limiter::{async_trait, Clock, Context, MonotonicClock, Store, StoreError, Subject};
/// use tollgate_memory::MemoryStore;
///
/// /// `kind = "small-memory"`: an in-process store of a few keys.
/// struct SmallMemory;
///
/// #[derive(Debug, serde::Deserialize)]
/// #[serde(deny_unknown_fields)]
/// struct SmallMemorySettings {
///     keys: usize,
/// }
///
/// #[async_trait]
/// impl StoreKind for SmallMemory {
///     type Settings = SmallMemorySettings;
///
///     fn name(&self) -> &'static str {
///         "small-memory"
///     }
///
///     async fn open(
///         &self,
///         settings: &SmallMemorySettings,
///         clock: Arc<dyn Clock>,
///     ) -> Result<Arc<dyn Store>, StoreError> {
///         Ok(Arc::new(MemoryStore::builder().max_keys(settings.keys).clock(clock).build()))
///     }
/// }
///
/// let kinds = StoreKinds::new().with(SmallMemory);
/// let config = Config::from_toml_str_with(r#"
///     [store]
///     kind = "small-memory"
///     keys = 1000
///
///     [policies.search]
///     algorithm = "fixed_window"
///     limit = 1
///     window = "1m"
///
///     [routes.search]
///     layers = [{ scope = "subject", policy = "search" }]
/// "#, &kinds)?;
/// assert_eq!(config.store().kind(), "small-memory");
/// let limiters = config.build(Arc::new(MonotonicClock::new())).await?;
/// let search = limiters.route("search").expect("configured");
/// let ctx = Context::for_subject(Subject::new("key-7")?);
/// assert!(search.limiter().check(&ctx, 1).await?.is_allowed());
/// assert!(!search.limiter().check(&ctx, 1).await?.is_allowed());
///
/// let err = Config::from_toml_str_with(
///     "[store]\nkind = \"small-memory\"\nkeys = \"many\"\n",
///     &kinds,
/// ).unwrap_err();
/// assert!(err.to_string().contains("store.keys: invalid type"), "{err}");
/// # Ok(()) }
/// ```
#[async_trait]
pub trait StoreKind: Send + Sync + 'static {
    /// The `[store]` table's fields other than `kind`.
    type Settings: DeserializeOwned + fmt::Debug + Send + Sync + 'static;

    /// The name `kind = "…"` gives: not one of the built-in kinds
    /// (`memory`, `redis`, `redis-sentinel`, `redis-cluster`).
    fn name(&self) -> &'static str;

    /// Open the store `settings` describe, deciding on `clock` (the
    /// clock [`Config::build`](crate::Config::build) was given). Called when
    /// the limiters are built, and again on a reload that changes the
    /// `[store]` section (refused for a store kept
    /// [in process](StoreKind::in_process)).
    async fn open(
        &self,
        settings: &Self::Settings,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<dyn Store>, StoreError>;

    /// Whether the store keeps its state in this process, so that a new
    /// one starts empty, as `memory` does. A reload that would replace
    /// such a store is refused as one replacing `memory` is: every limit
    /// would be lifted once. False unless overridden: the state of most
    /// stores of one's own lives in a database or a server.
    fn in_process(&self) -> bool {
        false
    }
}

/// The store kinds a configuration file may name besides the built-in
/// ones. [`Config::from_toml_str`](crate::Config::from_toml_str) reads
/// against none; a [`LiveConfig`](crate::LiveConfig) reloads against the
/// kinds its configuration was read with.
#[derive(Clone, Default)]
pub struct StoreKinds {
    kinds: Vec<Arc<dyn ReadSettings>>,
    /// The store is given in code ([`LiveConfig::load_on`](crate::LiveConfig::load_on)):
    /// `[store]` is not read at all, whatever it names. Never kept by a
    /// parsed configuration.
    store_given: bool,
}

impl StoreKinds {
    /// No kinds but the built-in ones.
    pub fn new() -> Self {
        StoreKinds::default()
    }

    /// These kinds and `kind`.
    ///
    /// # Panics
    ///
    /// When `kind`'s name is a built-in kind's or one already registered:
    /// a file could not say which it means.
    #[must_use]
    pub fn with<K: StoreKind>(mut self, kind: K) -> Self {
        let name = kind.name();
        assert!(
            !BUILT_IN.contains(&name) && self.find(name).is_none(),
            "store kind {name:?} is registered twice (or is a built-in kind's name): give it a name of its own"
        );
        self.kinds.push(Arc::new(Registered(Arc::new(kind))));
        self
    }

    /// These kinds, with no `[store]` read: the caller decides on a store
    /// of its own.
    pub(crate) fn ignoring_store(&self) -> Self {
        StoreKinds {
            store_given: true,
            ..self.clone()
        }
    }

    /// These kinds, `[store]` read: what a parsed configuration keeps, so
    /// that a file parsed with its kinds is read whole.
    pub(crate) fn reading_store(&self) -> Self {
        StoreKinds {
            store_given: false,
            ..self.clone()
        }
    }

    /// Whether `[store]` is left unread ([`ignoring_store`](Self::ignoring_store)).
    pub(crate) fn ignores_store(&self) -> bool {
        self.store_given
    }

    /// The registered kinds' names, in registration order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.kinds.iter().map(|k| k.name())
    }

    /// The registered kind named `name`, which reads `[store]`'s fields
    /// as its settings; `None` when no such kind is registered.
    pub(crate) fn find(&self, name: &str) -> Option<&Arc<dyn ReadSettings>> {
        self.kinds.iter().find(|k| k.name() == name)
    }
}

impl fmt::Debug for StoreKinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// Two lists are the same when they name the same kinds.
impl PartialEq for StoreKinds {
    fn eq(&self, other: &Self) -> bool {
        self.names().eq(other.names())
    }
}

/// A registered kind, its settings type erased.
pub(crate) trait ReadSettings: Send + Sync {
    fn name(&self) -> &'static str;
    /// `[store]`'s `fields` (its `kind` removed) read as this kind's
    /// settings; `None` when they do not fit (recorded in `errors`).
    fn read(&self, errors: &mut Vec<PolicyError>, fields: toml::Table) -> Option<CustomStore>;
}

struct Registered<K>(Arc<K>);

impl<K: StoreKind> ReadSettings for Registered<K> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn read(&self, errors: &mut Vec<PolicyError>, fields: toml::Table) -> Option<CustomStore> {
        let settings =
            crate::spec::de::<K::Settings>(errors, "store", Value::Table(fields.clone()))?;
        Some(CustomStore {
            kind: self.0.name(),
            in_process: self.0.in_process(),
            fields,
            opener: Arc::new(Read {
                kind: self.0.clone(),
                settings,
            }),
        })
    }
}

/// `[store]` of a registered kind, read: what
/// [`StoreSpec::Custom`](crate::StoreSpec::Custom) holds.
#[derive(Clone)]
pub struct CustomStore {
    kind: &'static str,
    /// The kind keeps its state in this process ([`StoreKind::in_process`]).
    in_process: bool,
    /// The fields as written, to tell whether a reload changed them.
    fields: toml::Table,
    opener: Arc<dyn OpenStore>,
}

impl CustomStore {
    /// The kind's name.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Whether the kind keeps its state in this process
    /// ([`StoreKind::in_process`]).
    pub fn in_process(&self) -> bool {
        self.in_process
    }

    /// Open the store, on `clock`.
    pub async fn open(&self, clock: Arc<dyn Clock>) -> Result<Arc<dyn Store>, StoreError> {
        self.opener.open(clock).await
    }
}

/// The kind and its fields only: settings may hold secrets.
impl fmt::Debug for CustomStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomStore")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// The same kind with the same fields as written.
impl PartialEq for CustomStore {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.fields == other.fields
    }
}

/// Read settings and the kind that opens them.
#[async_trait]
trait OpenStore: Send + Sync {
    async fn open(&self, clock: Arc<dyn Clock>) -> Result<Arc<dyn Store>, StoreError>;
}

struct Read<K: StoreKind> {
    kind: Arc<K>,
    settings: K::Settings,
}

#[async_trait]
impl<K: StoreKind> OpenStore for Read<K> {
    async fn open(&self, clock: Arc<dyn Clock>) -> Result<Arc<dyn Store>, StoreError> {
        self.kind.open(&self.settings, clock).await
    }
}
