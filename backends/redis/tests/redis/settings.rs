//! `RedisSettings`: the Redis stores' settings as a file writes them,
//! checked and opened by the store's own crate.

use tollgate_redis::{RedisKind, RedisSettings, RedisSettingsError};

fn settings(json: &str) -> RedisSettings {
    serde_json::from_str(json).expect("readable settings")
}

fn fields(settings: &RedisSettings) -> Vec<String> {
    settings
        .problems()
        .into_iter()
        .map(|(field, _)| field)
        .collect()
}

#[test]
fn each_kind_takes_its_own_fields_and_refuses_the_others() {
    let sentinel = settings(
        r#"{ "kind": "redis-sentinel", "url": "redis://a/", "sentinels": ["10.0.0.1:26379"],
             "replica_ack": 0, "client_cert_file": "client.crt" }"#,
    );
    assert_eq!(sentinel.kind, RedisKind::Sentinel);
    assert_eq!(
        fields(&sentinel),
        [
            "client_cert_file",
            "replica_ack",
            "url",
            "sentinels[0]",
            "service"
        ]
    );
    let standalone = settings(
        r#"{ "kind": "redis", "url": "http://a/", "password": "secret", "nodes": ["redis://b/"],
             "pool_size": 0, "deadline": "2m" }"#,
    );
    assert_eq!(
        fields(&standalone),
        ["deadline", "nodes", "password", "url", "pool_size"]
    );
    let problems = format!("{:?} {standalone:?}", standalone.problems());
    assert!(!problems.contains("secret"), "{problems}");
    // A username alone would be dropped: the store would log in as the
    // default user.
    let unpaired = settings(
        r#"{ "kind": "redis-sentinel", "sentinels": ["redis://10.0.0.1:26379"],
             "service": "mymaster", "username": "tollgate" }"#,
    );
    assert_eq!(fields(&unpaired), ["username"]);
    let cluster = settings(r#"{ "kind": "redis-cluster", "nodes": ["redis://a/"], "lazy": true }"#);
    assert_eq!(fields(&cluster), ["lazy"]);
    let fine = settings(
        r#"{ "kind": "redis", "url": "redis://127.0.0.1:6379/", "engine": "preloaded-functions",
             "replica_ack": 1, "replica_ack_timeout": "15ms", "prefix": "limits" }"#,
    );
    assert!(fine.problems().is_empty(), "{:?}", fine.problems());
    // Unknown fields and kinds are refused when read.
    assert!(serde_json::from_str::<RedisSettings>(r#"{ "kind": "redis", "uri": "x" }"#).is_err());
    assert!(serde_json::from_str::<RedisSettings>(r#"{ "kind": "valkey" }"#).is_err());
}

#[tokio::test]
async fn settings_open_their_store_or_say_why_not() {
    let invalid = settings(r#"{ "kind": "redis" }"#);
    match invalid.open().await {
        Err(RedisSettingsError::Invalid { field, .. }) => assert_eq!(field, "url"),
        other => panic!("expected the missing url, got {other:?}"),
    }
    // Lazy: opened without a server (it connects on first use).
    let lazy = settings(r#"{ "kind": "redis", "url": "redis://127.0.0.1:1/", "lazy": true }"#);
    let store = lazy.open().await.expect("a lazy store opens without Redis");
    assert_eq!(store.kind(), "redis");
    let unreachable = settings(
        r#"{ "kind": "redis", "url": "redis://127.0.0.1:1/", "connect_timeout": "200ms" }"#,
    );
    assert!(matches!(
        unreachable.open().await,
        Err(RedisSettingsError::Open(_))
    ));
    let missing_ca = settings(
        r#"{ "kind": "redis", "url": "rediss://127.0.0.1:1/", "lazy": true,
             "ca_file": "no-such-directory/ca.pem" }"#,
    );
    match missing_ca.open().await {
        Err(
            e @ RedisSettingsError::TlsFile {
                field: "ca_file", ..
            },
        ) => {
            assert!(e.to_string().starts_with("ca_file: cannot read"), "{e}")
        }
        other => panic!("expected the unreadable CA file, got {other:?}"),
    }
}
