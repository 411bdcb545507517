//! Least privilege: a Redis user with exactly [`AclRule`] runs the
//! conformance suite (function library, and the script form), and a user
//! with any one permission fewer fails at connect with that permission
//! named.

use std::sync::{Arc, OnceLock};

use tollgate_limiter::{Clock, ManualClock, Store, StoreError};
use tollgate_redis::{AclRule, Engine, RedisStore, RedisStoreError};
use tollgate_testkit::conformance::unique;
use tollgate_testkit::redis_server::RedisServer;
use tollgate_testkit::resp::Reply;

/// Every store here has a prefix under this one: the rule's key pattern.
const PREFIX: &str = "acl";

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start)
}

/// Create (or replace) `user` with password `pw` and exactly `rule`.
fn set_user(user: &str, rule: &str) {
    let mut args = vec!["ACL", "SETUSER", user, "reset", "on", ">pw"];
    args.extend(rule.split_whitespace());
    let reply = server().command(&args);
    assert_eq!(reply, Reply::Status("OK".into()), "ACL SETUSER {rule}");
}

fn url(user: &str) -> String {
    format!("redis://{user}:pw@127.0.0.1:{}/", server().port())
}

async fn connect_as(user: &str, engine: Engine) -> Result<RedisStore, StoreError> {
    RedisStore::builder(url(user))
        .prefix(format!("{PREFIX}:{}", unique("t")))
        .engine(engine)
        .connect()
        .await
}

mod functions {
    use super::*;

    fn user() -> &'static str {
        static USER: OnceLock<()> = OnceLock::new();
        USER.get_or_init(|| set_user("tollgate-fn", &AclRule::new(PREFIX).to_string()));
        "tollgate-fn"
    }

    tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
        Arc::new(
            RedisStore::builder(url(user()))
                .prefix(format!("{PREFIX}:{}", unique("t")))
                .clock(Arc::new(clock) as Arc<dyn Clock>)
                .connect()
                .await
                .expect("connect with exactly the documented rule"),
        ) as Arc<dyn Store>
    });
}

mod eval {
    use super::*;

    fn user() -> &'static str {
        static USER: OnceLock<()> = OnceLock::new();
        USER.get_or_init(|| {
            let rule = AclRule::new(PREFIX).engine(Engine::Eval).to_string();
            set_user("tollgate-eval", &rule)
        });
        "tollgate-eval"
    }

    tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
        Arc::new(
            RedisStore::builder(url(user()))
                .prefix(format!("{PREFIX}:{}", unique("t")))
                .engine(Engine::Eval)
                .clock(Arc::new(clock) as Arc<dyn Clock>)
                .connect()
                .await
                .expect("connect with exactly the documented rule"),
        ) as Arc<dyn Store>
    });
}

/// Load the function library as the administrator (the default user).
fn admin_loads_the_library(server: &RedisServer) {
    let reply = server.command(&[
        "FUNCTION",
        "LOAD",
        "REPLACE",
        tollgate_redis::function_library(),
    ]);
    assert_eq!(
        reply,
        Reply::Bulk(Some(tollgate_redis::library_name().as_bytes().to_vec()))
    );
}

/// The recommended rule: the library loaded by an administrator, the
/// store's user allowed `FCALL` only.
mod preloaded {
    use super::*;

    pub(super) fn user() -> &'static str {
        static USER: OnceLock<()> = OnceLock::new();
        USER.get_or_init(|| {
            admin_loads_the_library(server());
            let rule = AclRule::new(PREFIX)
                .engine(Engine::PreloadedFunctions)
                .to_string();
            set_user("tollgate-pre", &rule)
        });
        "tollgate-pre"
    }

    tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
        Arc::new(
            RedisStore::builder(url(user()))
                .prefix(format!("{PREFIX}:{}", unique("t")))
                .engine(Engine::PreloadedFunctions)
                .clock(Arc::new(clock) as Arc<dyn Clock>)
                .connect()
                .await
                .expect("connect with exactly the restricted rule"),
        ) as Arc<dyn Store>
    });
}

/// `FUNCTION LOAD REPLACE` of a library, sent as `user` of `server`.
async fn replace_a_library_as(server: &RedisServer, user: &str) -> redis::RedisResult<String> {
    let url = format!("redis://{user}:pw@127.0.0.1:{}/", server.port());
    let mut con = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg("#!lua name=otherapp\nredis.register_function('f', function() return 1 end)")
        .query_async(&mut con)
        .await
}

/// A leaked credential of the restricted rules (library preloaded, script,
/// module) cannot replace any library, another application's included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restricted_rules_cannot_replace_any_library() {
    assert_eq!(
        server().command(&[
            "FUNCTION",
            "LOAD",
            "REPLACE",
            "#!lua name=otherapp\nredis.register_function('f', function() return 1 end)",
        ]),
        Reply::Bulk(Some(b"otherapp".to_vec())),
        "the administrator can"
    );
    preloaded::user();
    // (The module's rule is tried on a server with the module, in
    // the_module_rule_decides_through_the_module.)
    for (user, engine) in [
        ("cannot-pre", Engine::PreloadedFunctions),
        ("cannot-eval", Engine::Eval),
    ] {
        set_user(user, &AclRule::new(PREFIX).engine(engine).to_string());
        let refused = replace_a_library_as(server(), user)
            .await
            .expect_err("FUNCTION LOAD is not granted");
        assert_eq!(refused.code(), Some("NOPERM"), "{user}: {refused}");
    }
    // The documented functions rule can: why it is not the recommended one.
    set_user("can-fn", &AclRule::new(PREFIX).to_string());
    assert_eq!(
        replace_a_library_as(server(), "can-fn").await.ok(),
        Some("otherapp".to_string())
    );
}

/// Without the library (a new server, a `FUNCTION FLUSH`), a preloaded
/// store fails clearly, at connect and at every decision, never loading
/// it or falling back to the script; once the administrator loads it, the
/// same store decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preloaded_store_without_the_library_fails_clearly_until_it_is_loaded() {
    let own = RedisServer::start();
    let rule = AclRule::new(PREFIX)
        .engine(Engine::PreloadedFunctions)
        .to_string();
    let mut args = vec!["ACL", "SETUSER", "pre", "reset", "on", ">pw"];
    args.extend(rule.split_whitespace());
    assert_eq!(own.command(&args), Reply::Status("OK".into()));
    let builder = RedisStore::builder(format!("redis://pre:pw@127.0.0.1:{}/", own.port()))
        .prefix(format!("{PREFIX}:{}", unique("t")))
        .engine(Engine::PreloadedFunctions);
    let is_not_loaded = |e: &StoreError| {
        matches!(
            RedisStoreError::of(e),
            Some(RedisStoreError::LibraryNotLoaded(name)) if name == tollgate_redis::library_name()
        ) && e.to_string().contains("FUNCTION LOAD")
    };
    let e = builder.clone().connect().await.expect_err("no library yet");
    assert!(is_not_loaded(&e), "{e}");

    admin_loads_the_library(&own);
    let store = builder
        .connect()
        .await
        .expect("loaded by the administrator");
    let policy = tollgate_limiter::Policy::new(
        "pre",
        tollgate_limiter::Limit::fixed_window(5, std::time::Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    let key = tollgate_limiter::StoreKey::new("pre", &policy, "s", "u1");
    let request = [tollgate_limiter::LayerRequest {
        key,
        policy: &policy,
        cost: 1,
    }];
    assert!(
        tollgate_limiter::ask(&store, &request)
            .await
            .expect("decides")[0]
            .allowed
    );

    assert_eq!(
        own.command(&["FUNCTION", "FLUSH"]),
        Reply::Status("OK".into())
    );
    let e = tollgate_limiter::ask(&store, &request)
        .await
        .expect_err("flushed");
    assert!(is_not_loaded(&e), "{e}");
    assert_eq!(
        own.command(&["FUNCTION", "LIST"]),
        Reply::Array(Some(Vec::new())),
        "the store loaded nothing"
    );
    admin_loads_the_library(&own);
    let verdicts = tollgate_limiter::ask(&store, &request)
        .await
        .expect("decides again");
    assert_eq!(verdicts[0].remaining, 3, "the count survived the flush");
}

/// The module path under its own rule: a user with exactly it decides,
/// and cannot load any library.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_module_rule_decides_through_the_module() {
    let with_module = RedisServer::shared_with_module();
    let rule = AclRule::new(PREFIX).engine(Engine::Module).to_string();
    let mut args = vec!["ACL", "SETUSER", "tollgate-mod", "reset", "on", ">pw"];
    args.extend(rule.split_whitespace());
    assert_eq!(with_module.command(&args), Reply::Status("OK".into()));
    let store = RedisStore::builder(format!(
        "redis://tollgate-mod:pw@127.0.0.1:{}/",
        with_module.port()
    ))
    .prefix(format!("{PREFIX}:{}", unique("t")))
    .engine(Engine::Module)
    .connect()
    .await
    .expect("connect with exactly the module rule");
    let policy = tollgate_limiter::Policy::new(
        "mod",
        tollgate_limiter::Limit::fixed_window(2, std::time::Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    let request = [tollgate_limiter::LayerRequest {
        key: tollgate_limiter::StoreKey::new("mod", &policy, "s", "u1"),
        policy: &policy,
        cost: 1,
    }];
    let mut admitted = 0;
    for _ in 0..3 {
        admitted += u32::from(
            tollgate_limiter::ask(&store, &request)
                .await
                .expect("decides")[0]
                .allowed,
        );
    }
    assert_eq!(admitted, 2);
    let refused = replace_a_library_as(with_module, "tollgate-mod")
        .await
        .expect_err("FUNCTION LOAD is not granted");
    assert_eq!(refused.code(), Some("NOPERM"), "{refused}");
}

/// Each permission of the rule, removed alone, fails the connect with a
/// `NoPermission` naming it.
async fn one_fewer_fails_at_connect(rule: AclRule, engine: Engine, user: &str) {
    let rule = rule.to_string();
    let grants: Vec<&str> = rule
        .split_whitespace()
        .filter(|w| w.starts_with('+') || w.starts_with('~'))
        .collect();
    assert!(grants.len() >= 14, "{rule}");
    for missing in grants {
        let fewer: Vec<&str> = rule.split_whitespace().filter(|w| *w != missing).collect();
        set_user(user, &fewer.join(" "));
        let error = connect_as(user, engine)
            .await
            .expect_err(&format!("connect without {missing} must fail"));
        let Some(RedisStoreError::NoPermission(detail)) = RedisStoreError::of(&error) else {
            panic!("without {missing}: expected NoPermission, got {error:?}");
        };
        let named = match missing.strip_prefix('+') {
            Some(command) => command.split('|').next_back().unwrap().to_string(),
            None => "key".to_string(),
        };
        assert!(
            detail.to_lowercase().contains(&named),
            "without {missing}: the error names it: {detail}"
        );
        assert!(error.to_string().contains("docs/operations.md"), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_permission_fewer_fails_at_connect_with_functions() {
    one_fewer_fails_at_connect(AclRule::new(PREFIX), Engine::Auto, "fewer-fn").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_permission_fewer_fails_at_connect_with_the_preloaded_library() {
    preloaded::user();
    let rule = AclRule::new(PREFIX).engine(Engine::PreloadedFunctions);
    one_fewer_fails_at_connect(rule, Engine::PreloadedFunctions, "fewer-pre").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_permission_fewer_fails_at_connect_with_the_script() {
    let rule = AclRule::new(PREFIX).engine(Engine::Eval);
    one_fewer_fails_at_connect(rule, Engine::Eval, "fewer-eval").await;
}

/// A refused login, and a missing permission, are named at connect in
/// every connection mode, even
/// with a deadline longer than the connect timeout (a pool used to retry
/// until its own timeout and report "did not answer within …").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_or_permission_is_named_in_every_mode_whatever_the_deadline() {
    use std::time::Duration;
    use tollgate_redis::ConnectionMode;
    set_user("tollgate-login", &AclRule::new(PREFIX).to_string());
    let wrong = format!(
        "redis://tollgate-login:wrong@127.0.0.1:{}/",
        server().port()
    );
    for mode in [
        ConnectionMode::Multiplexed,
        ConnectionMode::Pool { size: 2 },
    ] {
        let started = std::time::Instant::now();
        let error = RedisStore::builder(wrong.clone())
            .prefix(format!("{PREFIX}:{}", unique("t")))
            .connection_mode(mode)
            .deadline(Duration::from_secs(3))
            .connect_timeout(Duration::from_secs(1))
            .connect()
            .await
            .expect_err("a wrong password");
        let text = error.to_string();
        assert!(
            !matches!(error, StoreError::Timeout(_)),
            "{mode:?}: {error:?}"
        );
        assert!(
            text.contains("WRONGPASS") || text.to_lowercase().contains("auth"),
            "{mode:?}: the cause is named: {text}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{mode:?}: at once"
        );

        // A missing permission, likewise.
        let rule = AclRule::new(PREFIX).to_string().replace(" +get", "");
        set_user("tollgate-noget", &rule);
        let error = RedisStore::builder(url("tollgate-noget"))
            .prefix(format!("{PREFIX}:{}", unique("t")))
            .connection_mode(mode)
            .deadline(Duration::from_secs(3))
            .connect_timeout(Duration::from_secs(1))
            .connect()
            .await
            .expect_err("GET is not granted");
        assert!(
            matches!(RedisStoreError::of(&error), Some(RedisStoreError::NoPermission(d)) if d.contains("get")),
            "{mode:?}: {error:?}"
        );
    }
}

/// A URL naming a database connects with `SELECT` first: without
/// `database(true)` the connect fails naming it, with it the store decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_in_the_url_needs_select() {
    let url = format!("redis://tollgate-db:pw@127.0.0.1:{}/3", server().port());
    let connect = || {
        RedisStore::builder(url.clone())
            .prefix(format!("{PREFIX}:{}", unique("t")))
            .connect()
    };
    set_user("tollgate-db", &AclRule::new(PREFIX).to_string());
    let error = connect().await.expect_err("SELECT is not granted");
    assert!(
        matches!(RedisStoreError::of(&error), Some(RedisStoreError::NoPermission(d)) if d.to_lowercase().contains("select")),
        "{error:?}"
    );
    set_user(
        "tollgate-db",
        &AclRule::new(PREFIX).database(true).to_string(),
    );
    let store = connect().await.expect("connect with the database's rule");
    let policy = tollgate_limiter::Policy::new(
        "db",
        tollgate_limiter::Limit::fixed_window(2, std::time::Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    let request = [tollgate_limiter::LayerRequest {
        key: tollgate_limiter::StoreKey::new("db", &policy, "s", "u1"),
        policy: &policy,
        cost: 1,
    }];
    let mut admitted = 0;
    for _ in 0..3 {
        let verdicts = tollgate_limiter::ask(&store, &request)
            .await
            .expect("decides");
        admitted += u32::from(verdicts[0].allowed);
    }
    assert_eq!(admitted, 2);
    let in_database_3 = server().command(&[
        "EVAL",
        "redis.call('SELECT', 3) return redis.call('DBSIZE')",
        "0",
    ]);
    assert_eq!(in_database_3, Reply::Int(1), "the state is in database 3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_replicas_needs_wait() {
    let rule = AclRule::new(PREFIX).replica_ack(true).to_string();
    set_user("fewer-wait", &rule.replace(" +wait", ""));
    let error = RedisStore::builder(url("fewer-wait"))
        .prefix(format!("{PREFIX}:{}", unique("t")))
        .replica_ack(1, std::time::Duration::from_millis(10))
        .connect()
        .await
        .expect_err("WAIT is not granted");
    assert!(
        matches!(RedisStoreError::of(&error), Some(RedisStoreError::NoPermission(d)) if d.contains("wait")),
        "{error:?}"
    );
}

/// The Cluster rule: a user with exactly it (on every node) decides across
/// slots, and each permission removed alone fails the connect naming it.
#[cfg(feature = "cluster")]
mod cluster {
    use super::*;
    use tollgate_limiter::{Context, Limit, Limiter, Policy, Scope, Subject};
    use tollgate_redis::cluster::RedisClusterStore;
    use tollgate_testkit::redis_cluster::RedisCluster;

    fn set_cluster_user(cluster: &RedisCluster, user: &str, rule: &str) {
        for node in 0..cluster.nodes().len() {
            let mut args = vec!["ACL", "SETUSER", user, "reset", "on", ">pw"];
            args.extend(rule.split_whitespace());
            assert_eq!(
                cluster.command(node, &args),
                Ok(Reply::Status("OK".into())),
                "ACL SETUSER on node {node}"
            );
        }
    }

    async fn connect(
        cluster: &RedisCluster,
        user: &str,
        engine: Engine,
    ) -> Result<RedisClusterStore, StoreError> {
        let urls = cluster
            .nodes()
            .iter()
            .map(|n| format!("redis://{user}:pw@127.0.0.1:{}/", n.port()));
        RedisClusterStore::builder(urls)
            .prefix(format!("{PREFIX}:{}", unique("c")))
            .engine(engine)
            .deadline(std::time::Duration::from_secs(2))
            .connect()
            .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn exactly_the_rule_decides_and_one_fewer_fails_at_connect() {
        let cluster = tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .unwrap();
        // The administrator loads the library on every master (a replica
        // refuses the write and gets it through replication).
        for node in 0..cluster.nodes().len() {
            let _ = cluster.command(
                node,
                &[
                    "FUNCTION",
                    "LOAD",
                    "REPLACE",
                    tollgate_redis::function_library(),
                ],
            );
        }
        for engine in [Engine::Auto, Engine::Eval, Engine::PreloadedFunctions] {
            let rule = AclRule::new(PREFIX)
                .engine(engine)
                .cluster(true)
                .to_string();
            set_cluster_user(&cluster, "tollgate-c", &rule);
            let store = connect(&cluster, "tollgate-c", engine)
                .await
                .expect("connect with exactly the rule");
            // Two layers on different slots: reserve-and-refund across nodes.
            let policy = Policy::new(
                "acl",
                Limit::fixed_window(2, std::time::Duration::from_secs(60)).unwrap(),
            )
            .unwrap();
            let limiter = Limiter::builder(Arc::new(store))
                .layer("user", Scope::Subject, policy.clone())
                .layer("all", Scope::Global, policy)
                .build()
                .unwrap();
            let ctx = Context::for_subject(Subject::new(unique("u")).unwrap());
            let mut admitted = 0;
            for _ in 0..3 {
                let d = limiter.check(&ctx, 1).await.unwrap();
                assert!(d.store_error().is_none(), "{d:?}");
                admitted += u32::from(d.is_allowed());
            }
            assert_eq!(admitted, 2);

            for missing in rule
                .split_whitespace()
                .filter(|w| w.starts_with('+') || w.starts_with('~'))
            {
                let fewer: Vec<&str> = rule.split_whitespace().filter(|w| *w != missing).collect();
                set_cluster_user(&cluster, "fewer-c", &fewer.join(" "));
                let error = connect(&cluster, "fewer-c", engine)
                    .await
                    .expect_err(&format!("connect without {missing} must fail"));
                assert!(
                    matches!(
                        RedisStoreError::of(&error),
                        Some(RedisStoreError::NoPermission(_))
                    ),
                    "without {missing}: expected NoPermission, got {error:?}"
                );
            }
        }
    }
}
