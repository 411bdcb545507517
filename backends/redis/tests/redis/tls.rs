//! TLS against real `redis-server --tls-port` processes, with a CA and
//! certificates this test makes itself: the conformance suite over mutual
//! TLS (standalone and the 6-node Cluster with TLS on its bus and
//! replication), and a clear error for a certificate that does not verify,
//! a missing client certificate, and settings that contradict the URL.
#![cfg(feature = "tls")]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tollgate_limiter::{Clock, ManualClock, Store, StoreError};
use tollgate_redis::{RedisStore, RedisStoreError, Tls};
use tollgate_testkit::conformance::unique;
use tollgate_testkit::redis_server::RedisServer;
use tollgate_testkit::tls_certificates::TestCertificates;

/// One CA and one TLS server (client certificates required, Redis's
/// default) for the whole test binary.
fn server() -> &'static (TestCertificates, RedisServer) {
    static SERVER: OnceLock<(TestCertificates, RedisServer)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let certs = TestCertificates::generate();
        let server = RedisServer::start_tls(&certs, &[]);
        (certs, server)
    })
}

/// The CA and a client certificate of `certs`.
fn mutual(certs: &TestCertificates) -> Tls {
    Tls::new()
        .ca_pem(certs.ca_pem())
        .client_pem(certs.client_cert_pem(), certs.client_key_pem())
}

fn tls_url() -> String {
    server().1.tls_url().expect("a TLS server")
}

async fn connect(tls: Option<Tls>) -> Result<RedisStore, StoreError> {
    let mut builder = RedisStore::builder(tls_url()).prefix(unique("tls"));
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    builder.connect().await
}

/// The TLS error's detail (with its hint), for the assertions below.
fn tls_error(result: Result<RedisStore, StoreError>) -> String {
    let error = result.expect_err("the connection must be refused");
    match RedisStoreError::of(&error) {
        Some(RedisStoreError::Tls(detail)) => detail.clone(),
        _ => panic!("expected a TLS error, got {error:?}"),
    }
}

/// Whether `detail` gives the hint that contains `hint`, and no other.
fn only_hint(detail: &str, hint: &str) {
    assert!(detail.contains(hint), "{detail}");
    for other in [
        "Tls::ca_pem",
        "Tls::client_pem",
        "validity period",
        "does not name the host",
    ] {
        if !hint.contains(other) && !other.contains(hint) {
            assert!(
                !detail.contains(other),
                "a hint for another cause: {detail}"
            );
        }
    }
}

mod conformance {
    use super::*;

    tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
        let (certs, _) = server();
        Arc::new(
            RedisStore::builder(tls_url())
                .tls(mutual(certs))
                .prefix(unique("tls"))
                .clock(Arc::new(clock) as Arc<dyn Clock>)
                .connect()
                .await
                .expect("connect over mutual TLS"),
        ) as Arc<dyn Store>
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_an_unknown_ca_is_refused_by_name() {
    let stranger = TestCertificates::generate();
    let detail = tls_error(connect(Some(mutual(&stranger))).await);
    // Another CA of the same name: its signature does not verify.
    assert!(detail.contains("BadSignature"), "{detail}");
    only_hint(&detail, "Tls::ca_pem");
    // Not in the system's trust store either.
    let detail = tls_error(connect(None).await);
    only_hint(&detail, "Tls::ca_pem");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_wants_a_client_certificate_refuses_a_store_without_one() {
    let (certs, _) = server();
    let result = connect(Some(Tls::new().ca_pem(certs.ca_pem()))).await;
    let detail = tls_error(result);
    only_hint(&detail, "Tls::client_pem");
}

/// An expired server certificate, and one for another host, are named as
/// such, with the hint for that cause only (not `Tls::ca_pem`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_wrong_host_certificates_get_their_own_hint() {
    use tollgate_testkit::tls_certificates::ServerCertificate;
    let cases = [
        (ServerCertificate::Expired, "validity period"),
        (
            ServerCertificate::ForHost("redis.example.invalid".into()),
            "does not name the host",
        ),
    ];
    for (kind, hint) in cases {
        let certs = TestCertificates::generate_with(kind.clone());
        let server = RedisServer::start_tls(&certs, &[]);
        let result = RedisStore::builder(server.tls_url().expect("TLS"))
            .tls(mutual(&certs))
            .connect()
            .await;
        let detail = tls_error(result);
        only_hint(&detail, hint);
    }
}

/// A pool whose deadline is longer than the connect timeout still names
/// the real cause at connect (a wrong CA), not a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_names_the_tls_failure_whatever_the_deadline() {
    let stranger = TestCertificates::generate();
    let result = RedisStore::builder(tls_url())
        .tls(mutual(&stranger))
        .connection_mode(tollgate_redis::ConnectionMode::Pool { size: 2 })
        .deadline(Duration::from_secs(3))
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await;
    let detail = tls_error(result);
    only_hint(&detail, "Tls::ca_pem");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_client_authentication_the_ca_alone_is_enough() {
    let certs = TestCertificates::generate();
    let server = RedisServer::start_tls(&certs, &["--tls-auth-clients", "no"]);
    let store = RedisStore::builder(server.tls_url().expect("TLS"))
        .tls(Tls::new().ca_pem(certs.ca_pem()))
        .connect()
        .await
        .expect("server-only TLS");
    assert_eq!(store.settings().prefix(), "tollgate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_settings_need_a_rediss_url() {
    let (certs, server) = server();
    let error = RedisStore::builder(server.url())
        .tls(mutual(certs))
        .build()
        .expect_err("redis:// with TLS settings");
    assert!(
        matches!(RedisStoreError::of(&error), Some(RedisStoreError::InvalidUrl(m)) if m.contains("rediss://")),
        "{error}"
    );
}

/// `#insecure` (TLS without verifying the server) is refused when the
/// store is built: it was accepted, and every connect failed (the TLS
/// client is built without an insecure mode), as a protocol error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insecure_tls_url_is_refused_with_what_to_do() {
    let error = RedisStore::builder(format!("{}#insecure", tls_url()))
        .build()
        .expect_err("#insecure");
    assert!(
        matches!(RedisStoreError::of(&error), Some(RedisStoreError::InvalidUrl(m)) if m.contains("ca_pem")),
        "{error}"
    );
}

/// Sentinel over TLS: the sentinels and the primary they name are
/// reached with the store's TLS settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_store_speaks_tls_to_the_sentinels_and_the_primary() {
    use tollgate_limiter::{Context, Limit, Limiter, Policy, Scope, Subject};
    use tollgate_testkit::redis_sentinel::{RedisSentinels, SERVICE};

    let certs = TestCertificates::generate();
    let group = tokio::task::spawn_blocking(move || {
        let group = RedisSentinels::start_tls(&certs);
        (certs, group)
    })
    .await
    .unwrap();
    let (certs, group) = group;
    let prefix = unique("tlss");
    let store = RedisStore::sentinel(group.tls_sentinel_urls(), SERVICE)
        .tls(mutual(&certs))
        .prefix(prefix.clone())
        .connect()
        .await
        .expect("connect through TLS sentinels");
    let policy = Policy::new(
        "p",
        Limit::fixed_window(2, Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    let limiter = Limiter::builder(Arc::new(store))
        .layer("user", Scope::Subject, policy)
        .build()
        .unwrap();
    let ctx = Context::for_subject(Subject::new("erin").unwrap());
    let mut admitted = [false; 3];
    for slot in admitted.iter_mut() {
        let d = limiter.check(&ctx, 1).await.unwrap();
        assert!(d.store_error().is_none(), "{d:?}");
        *slot = d.is_allowed();
    }
    assert_eq!(admitted, [true, true, false]);
    // The state is on the primary the sentinels named.
    let key = format!("{prefix}:{{erin}}:p:v1:fw:s");
    assert_eq!(
        group.primary().command(&["EXISTS", &key]),
        tollgate_testkit::resp::Reply::Int(1),
        "{key}"
    );
    // Without the client certificate the sentinels refuse the store.
    let error = RedisStore::sentinel(group.tls_sentinel_urls(), SERVICE)
        .tls(Tls::new().ca_pem(certs.ca_pem()))
        .connect()
        .await
        .expect_err("no client certificate");
    assert!(
        matches!(RedisStoreError::of(&error), Some(RedisStoreError::NoPrimary { detail, .. }) if detail.contains("CertificateRequired")),
        "{error:?}"
    );
}

/// The conformance suite on the Cluster over TLS.
#[cfg(feature = "cluster")]
mod cluster {
    use super::*;
    use tollgate_redis::cluster::RedisClusterStore;
    use tollgate_testkit::redis_cluster::RedisCluster;

    fn cluster() -> &'static (TestCertificates, RedisCluster) {
        static CLUSTER: OnceLock<(TestCertificates, RedisCluster)> = OnceLock::new();
        CLUSTER.get_or_init(|| {
            let certs = TestCertificates::generate();
            let cluster = RedisCluster::start_tls(&certs);
            (certs, cluster)
        })
    }

    tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
        let (certs, cluster) = cluster();
        Arc::new(
            RedisClusterStore::builder(cluster.tls_urls())
                .tls(mutual(certs))
                .prefix(unique("tlsc"))
                .deadline(Duration::from_secs(2))
                .clock(Arc::new(clock) as Arc<dyn Clock>)
                .connect()
                .await
                .expect("connect to the TLS cluster"),
        ) as Arc<dyn Store>
    });

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unknown_ca_is_refused_by_name() {
        let (_, cluster) = cluster();
        let stranger = TestCertificates::generate();
        let error = RedisClusterStore::builder(cluster.tls_urls())
            .tls(mutual(&stranger))
            .connect()
            .await
            .expect_err("the cluster's certificates must not verify");
        assert!(
            matches!(RedisStoreError::of(&error), Some(RedisStoreError::Tls(_))),
            "{error:?}"
        );
    }
}
