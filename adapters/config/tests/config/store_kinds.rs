//! Store kinds from outside the crate: selected by name once registered,
//! their settings read and checked with the file, opened when the limiters
//! are built and again only when a reload changes `[store]`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tollgate_config::{Config, LiveConfig, SetupError, StoreKind, StoreKinds, StoreSpec};
use tollgate_limiter::{
    async_trait, Clock, Context, ManualClock, Store, StoreError, Subject, Timestamp,
};
use tollgate_memory::MemoryStore;

const START: Timestamp = Timestamp::from_micros(1_780_000_000_000_000);

/// `kind = "counted-memory"`: an in-process store, counting how often it
/// was opened; `fail = true` makes opening fail.
#[derive(Default, Clone)]
struct CountedMemory {
    opened: Arc<AtomicUsize>,
    /// Opens that fail (unavailable) before one succeeds.
    failing: Arc<AtomicUsize>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CountedSettings {
    max_keys: usize,
    #[serde(default)]
    fail: bool,
}

#[async_trait]
impl StoreKind for CountedMemory {
    type Settings = CountedSettings;

    fn name(&self) -> &'static str {
        "counted-memory"
    }

    async fn open(
        &self,
        settings: &CountedSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<dyn Store>, StoreError> {
        let failing = self
            .failing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if settings.fail || failing.is_ok() {
            return Err(StoreError::Unavailable("asked to fail".into()));
        }
        self.opened.fetch_add(1, Ordering::SeqCst);
        let store = MemoryStore::builder()
            .max_keys(settings.max_keys)
            .clock(clock);
        Ok(Arc::new(store.build()))
    }
}

fn file(store: &str, limit: u64) -> String {
    format!(
        r#"
[store]
{store}

[policies.api]
algorithm = "fixed_window"
limit = {limit}
window = "1m"

[routes.api]
layers = [{{ scope = "subject", policy = "api" }}]
"#
    )
}

const COUNTED: &str = "kind = \"counted-memory\"\nmax_keys = 100";

#[tokio::test]
async fn a_registered_kind_is_selected_by_name_and_decides() {
    let kind = CountedMemory::default();
    let kinds = StoreKinds::new().with(kind.clone());
    let config = Config::from_toml_str_with(&file(COUNTED, 1), &kinds).unwrap();
    assert!(matches!(config.store(), StoreSpec::Custom(c) if c.kind() == "counted-memory"));
    assert_eq!(kind.opened.load(Ordering::SeqCst), 0, "read, not opened");
    let limiters = config
        .build(Arc::new(ManualClock::new(START)))
        .await
        .unwrap();
    assert_eq!(kind.opened.load(Ordering::SeqCst), 1);
    assert_eq!(limiters.store().kind(), "memory");
    let api = limiters.route("api").unwrap();
    let ctx = Context::for_subject(Subject::new("k").unwrap());
    assert!(api.limiter().check(&ctx, 1).await.unwrap().is_allowed());
    assert!(!api.limiter().check(&ctx, 1).await.unwrap().is_allowed());
}

#[test]
fn an_unregistered_kind_is_refused_naming_every_kind() {
    let err = Config::from_toml_str(&file(COUNTED, 1)).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(
            "store.kind: \"counted-memory\" is not a store; write \"memory\", \"redis\", \"redis-sentinel\" or \"redis-cluster\""
        ),
        "{text}"
    );
    let kinds = StoreKinds::new().with(CountedMemory::default());
    let err = Config::from_toml_str_with(&file("kind = \"counted\"", 1), &kinds).unwrap_err();
    assert!(
        err.to_string()
            .contains("\"redis-cluster\" or \"counted-memory\""),
        "the registered kind is named: {err}"
    );
}

#[test]
fn settings_errors_name_their_field_beside_the_files_other_errors() {
    let kinds = StoreKinds::new().with(CountedMemory::default());
    let store = "kind = \"counted-memory\"\nmax_keys = \"many\"";
    let err = Config::from_toml_str_with(&file(store, 0), &kinds).unwrap_err();
    let text = err.to_string();
    assert_eq!(err.errors().len(), 2, "{text}");
    assert!(text.contains("store.max_keys: invalid type"), "{text}");
    assert!(text.contains("policies.api.limit"), "{text}");
    let store = "kind = \"counted-memory\"\nmax_keys = 1\ncolour = \"red\"";
    let err = Config::from_toml_str_with(&file(store, 1), &kinds).unwrap_err();
    assert!(
        err.to_string()
            .contains("store.colour: unknown field `colour`"),
        "{err}"
    );
    let err =
        Config::from_toml_str_with(&file("kind = \"counted-memory\"", 1), &kinds).unwrap_err();
    assert!(
        err.to_string().contains("store: missing field `max_keys`"),
        "{err}"
    );
}

#[tokio::test]
async fn a_store_that_cannot_open_names_its_kind() {
    let kinds = StoreKinds::new().with(CountedMemory::default());
    let store = "kind = \"counted-memory\"\nmax_keys = 1\nfail = true";
    let config = Config::from_toml_str_with(&file(store, 1), &kinds).unwrap();
    let err = config
        .build(Arc::new(ManualClock::new(START)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            SetupError::Store {
                kind: "counted-memory",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("asked to fail"), "{err}");
}

#[test]
#[should_panic(expected = "store kind \"counted-memory\" is registered twice")]
fn a_kind_registered_twice_is_refused() {
    let _ = StoreKinds::new()
        .with(CountedMemory::default())
        .with(CountedMemory::default());
}

#[test]
#[should_panic(
    expected = "store kind \"redis\" is registered twice (or is a built-in kind's name)"
)]
fn a_kind_named_as_a_built_in_is_refused() {
    struct NotRedis;
    #[async_trait]
    impl StoreKind for NotRedis {
        type Settings = ();
        fn name(&self) -> &'static str {
            "redis"
        }
        async fn open(&self, _: &(), _: Arc<dyn Clock>) -> Result<Arc<dyn Store>, StoreError> {
            unreachable!("never registered")
        }
    }
    let _ = StoreKinds::new().with(NotRedis);
}

/// A reload reads the file against the kinds it was loaded with, keeps
/// the store while `[store]` is unchanged, and opens it again when it
/// changes.
#[tokio::test]
async fn a_reload_reads_the_registered_kinds_and_reopens_only_on_change() {
    let kind = CountedMemory::default();
    let kinds = StoreKinds::new().with(kind.clone());
    let dir = std::env::temp_dir().join(format!("tollgate-kinds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    std::fs::write(&path, file(COUNTED, 1)).unwrap();
    let live = LiveConfig::load_with(&path, &kinds, Arc::new(ManualClock::new(START)))
        .await
        .unwrap();
    let route = live.route("api").unwrap();
    assert_eq!(kind.opened.load(Ordering::SeqCst), 1);

    std::fs::write(&path, file(COUNTED, 5)).unwrap();
    let report = live.reload().await.unwrap();
    assert!(!report.store_reopened);
    assert_eq!(kind.opened.load(Ordering::SeqCst), 1, "the store is kept");
    assert_eq!(route.limits().limiter().layers()[0].policy().capacity(), 5);

    let bigger = COUNTED.replace("100", "200");
    std::fs::write(&path, file(&bigger, 5)).unwrap();
    let report = live.reload().await.unwrap();
    assert!(report.store_reopened);
    assert_eq!(
        kind.opened.load(Ordering::SeqCst),
        2,
        "a changed [store]: opened again"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kind = "kept-memory"`: an in-process store that says so.
#[derive(Default, Clone)]
struct KeptMemory(CountedMemory);

#[async_trait]
impl StoreKind for KeptMemory {
    type Settings = CountedSettings;

    fn name(&self) -> &'static str {
        "kept-memory"
    }

    async fn open(
        &self,
        settings: &CountedSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<dyn Store>, StoreError> {
        self.0.open(settings, clock).await
    }

    fn in_process(&self) -> bool {
        true
    }
}

/// A registered kind that keeps its state in this process is kept as the
/// in-process store is: a reload that would open a new one (empty: every
/// limit lifted once) is refused and the running store keeps deciding; a
/// reload with `[store]` as it runs applies.
#[tokio::test]
async fn a_reload_never_replaces_a_registered_in_process_store() {
    let kind = KeptMemory::default();
    let kinds = StoreKinds::new().with(kind.clone());
    let dir = std::env::temp_dir().join(format!("tollgate-kinds-kept-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    let kept = "kind = \"kept-memory\"\nmax_keys = 100";
    std::fs::write(&path, file(kept, 1)).unwrap();
    let live = LiveConfig::load_with(&path, &kinds, Arc::new(ManualClock::new(START)))
        .await
        .unwrap();
    assert!(live.config().store().in_process());
    let route = live.route("api").unwrap();
    let ctx = Context::for_subject(Subject::new("key-7").unwrap());
    assert!(route
        .limits()
        .limiter()
        .check(&ctx, 1)
        .await
        .unwrap()
        .is_allowed());

    std::fs::write(&path, file(&kept.replace("100", "200"), 1)).unwrap();
    let refused = live.reload().await.unwrap_err().to_string();
    assert!(refused.contains("restart"), "{refused}");
    assert_eq!(
        kind.0.opened.load(Ordering::SeqCst),
        1,
        "never opened again"
    );
    let limits = route.limits();
    assert!(
        !limits.limiter().check(&ctx, 1).await.unwrap().is_allowed(),
        "the running store still holds the key's charge"
    );

    std::fs::write(&path, file(kept, 3)).unwrap();
    let report = live.reload().await.unwrap();
    assert!(!report.store_reopened);
    assert_eq!(route.limits().limiter().layers()[0].policy().capacity(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A watched file whose store cannot be opened for now is tried again
/// (each failure reported) until it applies; an edit made between the
/// load and the watch is applied too.
#[cfg(feature = "watch")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_watch_tries_a_transient_failure_again_and_starts_from_the_load() {
    let dir = std::env::temp_dir().join(format!("tollgate-kinds-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    std::fs::write(&path, file(COUNTED, 2)).unwrap();
    let counted = CountedMemory::default();
    let kinds = StoreKinds::new().with(counted.clone());
    let live = LiveConfig::load_with(&path, &kinds, Arc::new(ManualClock::new(START)))
        .await
        .unwrap();
    let capacity = |live: &LiveConfig| live.config().policy("api").unwrap().capacity();
    // Edited before the watch starts.
    std::fs::write(&path, file(COUNTED, 3)).unwrap();
    let (tx, mut reports) = tokio::sync::mpsc::unbounded_channel();
    let every = std::time::Duration::from_secs(1);
    let _watch = live
        .watch(every, move |r| {
            let _ = tx.send(r.map_err(|e| e.is_transient()));
        })
        .unwrap();
    tokio::time::sleep(3 * every).await; // paused time: instant
    assert_eq!(capacity(&live), 3, "the edit made before the watch");
    assert!(matches!(reports.try_recv(), Ok(Ok(_))));
    // A new store that fails to open twice, then opens.
    counted.failing.store(2, Ordering::SeqCst);
    std::fs::write(&path, file("kind = \"counted-memory\"\nmax_keys = 200", 7)).unwrap();
    let mut seen = Vec::new();
    for _ in 0..600 {
        tokio::time::sleep(every).await;
        while let Ok(report) = reports.try_recv() {
            seen.push(report.map(drop));
        }
    }
    assert_eq!(
        seen,
        [Err(true), Err(true), Ok(())],
        "tried until it applied"
    );
    assert_eq!(capacity(&live), 7);
    let _ = std::fs::remove_dir_all(&dir);
}
