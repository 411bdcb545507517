//! `[store] kind = "postgres"`: the configuration file selects this store
//! once its kind is registered, without the configuration crate knowing
//! it. The last test decides on a real PostgreSQL server (`DATABASE_URL`,
//! as the conformance tests; `cargo xtask custom-store` provides one).

use std::sync::Arc;

use tollgate::config::{Config, StoreKinds, StoreSpec};
use tollgate::{Context, ManualClock, Subject, Timestamp};
use tollgate_postgres_store::config::Postgres;

const DEFAULT_URL: &str = "postgres://postgres@localhost:5432/postgres";

fn file(store: &str) -> String {
    format!(
        r#"
[store]
kind = "postgres"
{store}

[policies.api]
algorithm = "fixed_window"
limit = 2
window = "1m"

[routes.api]
layers = [{{ scope = "subject", policy = "api" }}]
"#
    )
}

#[test]
fn the_file_names_the_store_once_registered() {
    let store = "url = \"postgres://localhost/x\"\npool_size = 2\ndeadline = \"250ms\"";
    let err = Config::from_toml_str(&file(store)).unwrap_err();
    assert!(
        err.to_string()
            .contains("store.kind: \"postgres\" is not a store"),
        "{err}"
    );
    let kinds = StoreKinds::new().with(Postgres);
    let config = Config::from_toml_str_with(&file(store), &kinds).unwrap();
    assert!(matches!(config.store(), StoreSpec::Custom(c) if c.kind() == "postgres"));
}

#[test]
fn bad_settings_are_reported_with_their_field() {
    let kinds = StoreKinds::new().with(Postgres);
    let cases = [
        ("pool_size = 2", "store: missing field `url`"),
        // (A `[store]` message never repeats the value read: it may be a
        // password.)
        (
            "url = \"x\"\ndeadline = \"soon\"",
            "store.deadline: \"…\" is not a duration",
        ),
        ("url = \"x\"\npool = 2", "store.pool: unknown field `pool`"),
    ];
    for (store, expected) in cases {
        let err = Config::from_toml_str_with(&file(store), &kinds).unwrap_err();
        assert!(err.to_string().contains(expected), "{store}: {err}");
    }
}

#[tokio::test]
async fn limiters_from_the_file_decide_on_postgres() {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_string());
    let table = format!("tollgate_config_test_{}", std::process::id());
    let store = format!("url = {url:?}\ntable = {table:?}\npool_size = 1");
    let kinds = StoreKinds::new().with(Postgres);
    let config = Config::from_toml_str_with(&file(&store), &kinds).unwrap();
    let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
        1_780_000_000_000_000,
    )));
    let limiters = config.build(clock).await.unwrap_or_else(|e| {
        panic!(
            "\n\nCannot open the PostgreSQL store: {e}\n\
             These tests need a running server: run `cargo xtask custom-store`, or start one \
             (Debian: `apt-get install -y postgresql && pg_ctlcluster <version> main start`) \
             and set DATABASE_URL=postgres://USER[:PASSWORD]@HOST:PORT/DBNAME\n"
        )
    });
    let api = limiters.route("api").unwrap();
    let ctx = Context::for_subject(Subject::new("customer-1").unwrap());
    let mut admitted = 0;
    for _ in 0..3 {
        admitted += usize::from(api.limiter().check(&ctx, 1).await.unwrap().is_allowed());
    }
    assert_eq!(admitted, 2, "the file's limit, kept in PostgreSQL");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let task = tokio::spawn(connection);
    let rows = client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap();
    assert_eq!(
        rows.get::<_, i64>(0),
        1,
        "one key's state, in the file's table"
    );
    client
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
    drop(client);
    let _ = task.await;
}
