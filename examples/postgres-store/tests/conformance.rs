//! The Tollgate store conformance suite, run against [`PgStore`] on a real
//! PostgreSQL server.
//!
//! The server is `DATABASE_URL` (for example
//! `postgres://postgres@localhost:5432/postgres`), or that default when the
//! variable is unset. No server reachable is a loud failure with the command
//! to start one, never a silent skip. `cargo xtask custom-store` finds or
//! starts PostgreSQL, creates a database for these tests and runs them.

use std::sync::Arc;

use tokio::sync::OnceCell;
use tollgate::{ManualClock, Store};
use tollgate_postgres_store::PgStore;

const DEFAULT_URL: &str = "postgres://postgres@localhost:5432/postgres";

fn url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_string())
}

/// Where the tests connect, for messages (the URL itself may hold a password).
fn where_() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(_) => "DATABASE_URL".to_string(),
        Err(_) => format!("{DEFAULT_URL} (DATABASE_URL is unset)"),
    }
}

/// This run's own table, emptied once before the first case.
fn table() -> String {
    format!("tollgate_conformance_{}", std::process::id())
}

static FRESH_TABLE: OnceCell<()> = OnceCell::const_new();

async fn store(clock: ManualClock) -> Arc<dyn Store> {
    FRESH_TABLE
        .get_or_init(|| async {
            let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "\n\nCannot reach PostgreSQL at {}: {e}\n\
                         These tests need a running server. Either:\n  \
                         - run `cargo xtask custom-store` (finds or starts PostgreSQL and sets DATABASE_URL), or\n  \
                         - install and start one (Debian: `apt-get install -y postgresql && pg_ctlcluster <version> main start`)\n    \
                         and set DATABASE_URL=postgres://USER[:PASSWORD]@HOST:PORT/DBNAME\n",
                        where_()
                    )
                });
            let task = tokio::spawn(connection);
            // This run's table, and those of earlier runs whose process is
            // gone (they would otherwise pile up), start from nothing.
            let tables = client
                .query(
                    "SELECT tablename FROM pg_tables WHERE tablename LIKE 'tollgate_conformance_%'",
                    &[],
                )
                .await
                .expect("list earlier runs' tables");
            let proc_fs = std::path::Path::new("/proc/self").exists();
            for row in tables {
                let name: String = row.get(0);
                let pid = name.trim_start_matches("tollgate_conformance_");
                let gone = proc_fs && !std::path::Path::new("/proc").join(pid).exists();
                if name == table() || gone {
                    client
                        .batch_execute(&format!("DROP TABLE IF EXISTS {name}"))
                        .await
                        .expect("drop an earlier run's table");
                }
            }
            drop(client);
            let _ = task.await;
        })
        .await;
    let store = PgStore::builder(url())
        .table(table())
        .pool_size(4)
        .clock(Arc::new(clock))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("PgStore at {}: {e}", where_()));
    Arc::new(store)
}

tollgate_testkit::conformance_tests!(store);

/// Expired rows count as absent (and the denial that meets one deletes it):
/// the request sees a fresh window, and a denied request charges nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_rows_count_as_absent() {
    use std::time::Duration;
    use tollgate::{Context, Limit, Limiter, Policy, Scope, Subject, Timestamp};

    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let store = store(clock.clone()).await;
    let policy = Policy::new(
        tollgate_testkit::conformance::unique("lazy"),
        Limit::fixed_window(1, Duration::from_secs(1)).unwrap(),
    )
    .unwrap();
    let narrow = Policy::new(
        tollgate_testkit::conformance::unique("narrow"),
        Limit::fixed_window(1, Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    let limiter = Limiter::builder(store.clone())
        .layer("a", Scope::Subject, policy)
        .layer("b", Scope::Tenant, narrow)
        .build()
        .unwrap();
    let ctx =
        Context::for_subject(Subject::new(tollgate_testkit::conformance::unique("s")).unwrap())
            .with_tenant(Subject::new(tollgate_testkit::conformance::unique("t")).unwrap());
    assert!(limiter.check(&ctx, 1).await.unwrap().is_allowed());
    assert!(!limiter.check(&ctx, 1).await.unwrap().is_allowed());
    // After a second the subject's window has expired (its row is dead);
    // the tenant's minute has not, so the request is denied and the
    // subject's expired row is deleted on the way.
    clock.advance(Duration::from_secs(1));
    let denied = limiter.check(&ctx, 1).await.unwrap();
    assert!(!denied.is_allowed());
    assert!(
        denied.layers()[0].verdict().allowed,
        "the expired row counts as absent"
    );
    assert_eq!(
        denied.layers()[0].verdict().remaining,
        1,
        "a fresh window, not charged"
    );
}

/// Rows another program put in the table (a state of another shape, a
/// counter that is not three numbers, negative numbers).
struct PgForeign {
    client: tokio_postgres::Client,
}

#[tollgate::async_trait]
impl tollgate_testkit::conformance::ForeignWriter for PgForeign {
    fn kinds(&self) -> Vec<&'static str> {
        vec!["other shape", "two numbers", "negative"]
    }

    async fn plant(&self, key: &tollgate::StoreKey<'_>, kind: &str) {
        let (is_log, state) = planted(key, kind);
        self.client
            .execute(
                &format!(
                    "INSERT INTO {} (key, is_log, state, expires_at) VALUES ($1, $2, $3, $4)",
                    table()
                ),
                &[&key.render(), &is_log, &state, &i64::MAX],
            )
            .await
            .expect("plant a foreign row");
    }

    async fn intact(&self, key: &tollgate::StoreKey<'_>, kind: &str) -> bool {
        let row = self
            .client
            .query_one(
                &format!(
                    "SELECT is_log, state, expires_at FROM {} WHERE key = $1",
                    table()
                ),
                &[&key.render()],
            )
            .await
            .expect("the foreign row");
        let (is_log, state) = planted(key, kind);
        row.get::<_, bool>(0) == is_log
            && row.get::<_, Vec<i64>>(1) == state
            && row.get::<_, i64>(2) == i64::MAX
    }
}

/// The row planted for `kind` at a key of `key`'s algorithm.
fn planted(key: &tollgate::StoreKey<'_>, kind: &str) -> (bool, Vec<i64>) {
    let log = key.to_string().contains(":log:");
    match kind {
        "other shape" => (!log, vec![1, 2, 3]),
        "two numbers" => (false, vec![1, 2]),
        _ => (log, vec![-1, -2, -3]),
    }
}

/// Rows this store did not write are conflicts, left exactly as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_are_conflicts() {
    let store = store(ManualClock::new(tollgate_testkit::conformance::START)).await;
    let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(connection);
    tollgate_testkit::conformance::foreign_values_are_conflicts(store, &PgForeign { client }).await;
}
