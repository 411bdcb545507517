//! What the server's test binaries share.
// Each test binary uses a part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use tollgate_testkit::tls_certificates::TestCertificates;

/// A configuration of one rule, `api` of domain `edge`: entry `user_id`
/// counted per subject, `limit` per minute in fixed windows; `store`
/// before it (a `[store]` table, or nothing for the in-process store) and
/// `server` at the end of `[server]` (settings, then its tables).
pub fn one_rule_config(store: &str, limit: u64, server: &str) -> String {
    format!(
        r#"
{store}

[policies.per-user]
algorithm = "fixed_window"
limit = {limit}
window = "1m"

[routes.api]
layers = [{{ name = "user", scope = "subject", policy = "per-user" }}]

[server]
grpc_listen = "127.0.0.1:0"
http_listen = "127.0.0.1:0"
{server}

[[server.rules]]
name = "api"
domain = "edge"
route = "api"
entries = {{ user_id = "subject" }}
"#
    )
}

/// A gRPC client of the rate limit service at `addr` (plain TCP).
pub async fn client(addr: SocketAddr) -> RateLimitServiceClient<tonic::transport::Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

/// A descriptor of text `entries`, with its own `hits_addend` if any.
pub fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..Default::default()
    }
}

/// A directory of its own for a test's files, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new, empty directory; `label` names the test file it serves.
    pub fn new(label: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "tollgate-server-{label}-{}-{n}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("a directory");
        TempDir(dir)
    }

    /// The path of `name` in it.
    pub fn path(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }

    /// Write `name` and answer its path.
    pub fn write(&self, name: &str, text: &str) -> String {
        std::fs::write(self.0.join(name), text).expect("write");
        self.path(name)
    }

    /// Put `certs`' server certificate, key and CA here (replacing any).
    pub fn install(&self, certs: &TestCertificates) {
        for name in ["server.crt", "server.key", "ca.crt"] {
            let text = std::fs::read(certs.dir().join(name)).expect("a certificate file");
            std::fs::write(self.0.join(name), text).expect("write");
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
