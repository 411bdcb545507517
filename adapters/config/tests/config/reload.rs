//! Reloading a running configuration: atomic under traffic, refused
//! whole when invalid, the store kept, unbound routes reported.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
#[cfg(feature = "watch")]
use std::time::Duration;

use tollgate_config::{Config, LiveConfig, ReloadError};
use tollgate_limiter::{Context, ManualClock, ReloadableRoute as _, Subject, Timestamp};

const START: Timestamp = Timestamp::from_micros(1_780_000_000_000_000);

fn file(limit: u64, extra: &str) -> String {
    file_with("fixed_window", limit, extra)
}

fn file_with(algorithm: &str, limit: u64, extra: &str) -> String {
    format!(
        r#"
[store]
kind = "memory"
max_keys = 10000

[policies.api]
algorithm = "{algorithm}"
limit = {limit}
window = "1m"

[routes.api]
layers = [{{ scope = "subject", policy = "api" }}]
{extra}
"#
    )
}

async fn live(text: &str) -> (ManualClock, LiveConfig) {
    let clock = ManualClock::new(START);
    let live = LiveConfig::new(
        Config::from_toml_str(text).unwrap(),
        Arc::new(clock.clone()),
    )
    .await
    .unwrap();
    (clock, live)
}

/// Whether `route` admits one request of `ctx` now.
async fn admits(route: &tollgate_config::LiveRoute, ctx: &Context) -> bool {
    route
        .limits()
        .limiter()
        .check(ctx, 1)
        .await
        .unwrap()
        .is_allowed()
}

fn subject(name: &str) -> Context {
    Context::for_subject(Subject::new(name).unwrap())
}

/// Thousands of decisions across a reload: none fails, none is lost, and
/// once the reload returned every decision runs on the new limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_traffic_loses_nothing() {
    let (_clock, live) = live(&file(1_000_000, "")).await;
    let route = live.route("api").unwrap();
    let decided = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (route, decided) = (route.clone(), decided.clone());
            tokio::spawn(async move {
                for i in 0..2_000 {
                    let limits = route.current();
                    let ctx = subject(&format!("w{w}-{}", i % 50));
                    let d = limits.limiter().check(&ctx, limits.cost()).await;
                    assert!(d.expect("no error across a reload").store_error().is_none());
                    decided.fetch_add(1, Ordering::Relaxed);
                    if i % 100 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    // A limit change, a swap to another algorithm and back, a tight limit.
    for (algorithm, limit) in [
        ("fixed_window", 500_000),
        ("sliding_window", 300_000),
        ("fixed_window", 2),
        ("sliding_log", 10_000),
    ] {
        tokio::task::yield_now().await;
        live.reload_with(Config::from_toml_str(&file_with(algorithm, limit, "")).unwrap())
            .await
            .unwrap();
        assert_eq!(
            route.limits().limiter().layers()[0]
                .policy()
                .limit()
                .algorithm_name(),
            algorithm
        );
        assert_eq!(
            route.limits().limiter().layers()[0].policy().capacity(),
            limit,
            "the new limits are in force once reload returns"
        );
    }
    for worker in workers {
        worker.await.unwrap();
    }
    assert_eq!(decided.load(Ordering::Relaxed), 8_000, "no decision lost");
    // The limit changed within one algorithm: the counters were kept.
    live.reload_with(Config::from_toml_str(&file(3, "")).unwrap())
        .await
        .unwrap();
    let limits = route.limits();
    let fresh = subject("fresh");
    let admitted = {
        let mut n = 0;
        for _ in 0..5 {
            n += u32::from(
                limits
                    .limiter()
                    .check(&fresh, 1)
                    .await
                    .unwrap()
                    .is_allowed(),
            );
        }
        n
    };
    assert_eq!(admitted, 3, "the reloaded limit is enforced");
}

/// An invalid file changes nothing and reports every error.
#[tokio::test]
async fn an_invalid_reload_keeps_the_running_limits() {
    let (_clock, live) = live(&file(2, "")).await;
    let route = live.route("api").unwrap();
    let bad = file(0, "").replace("window = \"1m\"", "window = \"1m\"\nburts = 3");
    let err = Config::from_toml_str(&bad).unwrap_err();
    assert_eq!(err.errors().len(), 2, "{err}");
    // Through a file, as an operator would.
    let dir = std::env::temp_dir().join(format!("tollgate-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    std::fs::write(&path, file(2, "")).unwrap();
    let from_file = LiveConfig::load(&path, Arc::new(ManualClock::new(START)))
        .await
        .unwrap();
    let file_route = from_file.route("api").unwrap();
    std::fs::write(&path, &bad).unwrap();
    let refused = from_file.reload().await.unwrap_err();
    let ReloadError::Invalid(e) = &refused else {
        panic!("{refused}")
    };
    assert_eq!(e.errors().len(), 2, "every error reported: {refused}");
    assert!(
        refused.to_string().contains("policies.api.limit"),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("policies.api.burts"),
        "{refused}"
    );
    assert_eq!(
        file_route.limits().limiter().layers()[0]
            .policy()
            .capacity(),
        2
    );
    let _ = std::fs::remove_dir_all(&dir);

    // [access] is read by gates when they are built: a changed one is
    // refused, never reported as applied while the gates keep the old.
    let denying = file(2, "[access]\ndeny_subjects = [\"leaked-key\"]\n");
    let refused = live
        .reload_with(Config::from_toml_str(&denying).unwrap())
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("restart"), "{refused}");
    assert!(refused.to_string().contains("access"), "{refused}");

    // The in-memory way: same outcome.
    let ctx = subject("s");
    for _ in 0..2 {
        assert!(admits(&route, &ctx).await);
    }
    assert!(!admits(&route, &ctx).await);
}

/// A route the code is bound to cannot vanish; routes nobody binds are
/// reported; the in-process store (and its counters) is kept, and a
/// `[store]` that would replace it is refused.
#[tokio::test]
async fn bound_routes_stay_unbound_ones_are_reported_and_the_store_is_kept() {
    let (_clock, live) = live(&file(2, "")).await;
    let route = live.route("api").unwrap();
    assert!(live.route("apl").is_err(), "an unknown route is an error");
    let store = live.store();
    let ctx = subject("s");
    assert!(admits(&route, &ctx).await);

    let without = file(2, "").replace("[routes.api]", "[routes.other]");
    let refused = live
        .reload_with(Config::from_toml_str(&without).unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, ReloadError::MissingRoutes(r) if r == &["api".to_string()]),
        "{refused}"
    );

    let extra = file(
        2,
        "[routes.typo]\nlayers = [{ scope = \"subject\", policy = \"api\" }]",
    );
    let report = live
        .reload_with(Config::from_toml_str(&extra).unwrap())
        .await
        .unwrap();
    assert_eq!(report.unbound_routes, vec!["typo".to_string()]);
    assert!(!report.store_reopened);
    assert!(Arc::ptr_eq(&store, &live.store()), "the store was kept");
    // The counter survived the reload: one of two used.
    assert!(admits(&route, &ctx).await);
    assert!(!admits(&route, &ctx).await);

    // Defaults written out are the same store: kept, counters and all.
    let defaults = extra.replace(
        "max_keys = 10000",
        "max_keys = 10000\nshards = 64\nwhen_full = \"evict\"",
    );
    assert_ne!(defaults, extra);
    let report = live
        .reload_with(Config::from_toml_str(&defaults).unwrap())
        .await
        .unwrap();
    assert!(!report.store_reopened, "only defaults written out");
    assert!(Arc::ptr_eq(&store, &live.store()));
    assert!(
        !admits(&route, &ctx).await,
        "the counter kept: two of two used"
    );

    // A new in-process store would start empty: refused, the running
    // one and its counters kept.
    let bigger = extra.replace("max_keys = 10000", "max_keys = 20000");
    let refused = live
        .reload_with(Config::from_toml_str(&bigger).unwrap())
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("restart"), "{refused}");
    assert!(Arc::ptr_eq(&store, &live.store()));
    assert!(!admits(&route, &ctx).await, "the counter kept");
}

/// A configuration error printed through `main`'s `?` (its Debug form)
/// reads like its message.
#[test]
fn config_errors_debug_as_their_message() {
    let err = Config::from_toml_str(&file(0, "")).unwrap_err();
    let debug = format!("{err:?}");
    assert_eq!(debug, err.to_string());
    assert!(debug.contains("\n  policies.api.limit"), "{debug}");
}

/// With the `watch` feature, an edit of the file is reloaded on its own.
#[cfg(feature = "watch")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_watched_file_reloads_when_it_changes() {
    let dir = std::env::temp_dir().join(format!("tollgate-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    std::fs::write(&path, file(2, "")).unwrap();
    let live = LiveConfig::load(&path, Arc::new(ManualClock::new(START)))
        .await
        .unwrap();
    let route = live.route("api").unwrap();
    let (tx, mut reports) = tokio::sync::mpsc::unbounded_channel();
    let _watch = live
        .watch(Duration::from_secs(1), move |r| {
            let _ = tx.send(r.is_ok());
        })
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await; // paused time: instant
    assert_eq!(route.limits().limiter().layers()[0].policy().capacity(), 2);
    std::fs::write(&path, file(7, "")).unwrap();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if route.limits().limiter().layers()[0].policy().capacity() == 7 {
            break;
        }
    }
    assert_eq!(route.limits().limiter().layers()[0].policy().capacity(), 7);
    assert_eq!(reports.recv().await, Some(true), "the reload was reported");
    // An invalid edit is reported once, and changes nothing.
    std::fs::write(&path, file(0, "")).unwrap();
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert_eq!(reports.recv().await, Some(false));
    assert!(
        reports.try_recv().is_err(),
        "reported once, not at every check"
    );
    assert_eq!(route.limits().limiter().layers()[0].policy().capacity(), 7);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One emergency store per running configuration: made when a policy
/// first falls back, the same one after a reload that keeps `[fallback]`,
/// a new one when its size changes.
#[tokio::test]
async fn the_emergency_store_is_one_and_kept_across_reloads() {
    let (_clock, live) = live(&file(2, "")).await;
    assert!(live.fallback_store().is_none(), "nothing falls back");
    let falls_back = file(2, "").replace(
        "window = \"1m\"",
        "window = \"1m\"\non_failure = { fallback_share = 2 }",
    );
    live.reload_with(Config::from_toml_str(&falls_back).unwrap())
        .await
        .unwrap();
    let first = live.fallback_store().expect("a policy falls back");
    live.reload_with(Config::from_toml_str(&falls_back.replace("limit = 2", "limit = 3")).unwrap())
        .await
        .unwrap();
    let kept = live.fallback_store().unwrap();
    assert!(Arc::ptr_eq(&first, &kept), "the same emergency store");
    let resized = format!("{falls_back}\n[fallback]\nmax_keys = 500\n");
    live.reload_with(Config::from_toml_str(&resized).unwrap())
        .await
        .unwrap();
    let new = live.fallback_store().unwrap();
    assert!(!Arc::ptr_eq(&first, &new), "a new size, a new store");
}

/// `load_on` decides on the caller's store: the file's `[store]` is not
/// read at all, now or on a reload, whatever kind it names.
#[tokio::test]
async fn a_given_store_leaves_the_store_section_unread() {
    let dir = std::env::temp_dir().join(format!("tollgate-given-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    let elsewhere = |limit| {
        file(limit, "").replace(
            "kind = \"memory\"\nmax_keys = 10000",
            "kind = \"postgres\"\nurl = \"postgres://db/limits\"",
        )
    };
    std::fs::write(&path, elsewhere(2)).unwrap();
    let clock = Arc::new(ManualClock::new(START));
    let store: Arc<dyn tollgate_limiter::Store> = Arc::new(
        tollgate_memory::MemoryStore::builder()
            .clock(clock.clone())
            .build(),
    );
    let live = LiveConfig::load_on(&path, store.clone(), clock)
        .await
        .expect("[store] is not read");
    assert!(Arc::ptr_eq(&live.store(), &store), "the given store");
    std::fs::write(&path, elsewhere(3)).unwrap();
    live.reload()
        .await
        .expect("a reload does not read it either");
    let route = live.route("api").unwrap();
    assert_eq!(route.limits().limiter().layers()[0].policy().capacity(), 3);
    assert!(Arc::ptr_eq(&live.store(), &store), "still the given store");
    let _ = std::fs::remove_dir_all(&dir);
}
