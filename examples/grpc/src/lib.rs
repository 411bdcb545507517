//! Tollgate's tower layer in front of a tonic server: gRPC's standard
//! health service, limited to two calls per minute per client address, and
//! tonic's own client calling it three times.
//!
//! The third call fails the gRPC way — `RESOURCE_EXHAUSTED`, with the
//! rate-limit headers and `retry-after` as metadata and a
//! `google.rpc.RetryInfo` in the status details — where a plain HTTP 429
//! would reach the client as `INTERNAL` ("invalid compression flag").

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tollgate::tower::{ClientIp, Identity, RateLimitLayer};
use tollgate::{Limit, Limiter, MemoryStore, Policy, Scope};
use tonic::transport::{Channel, Server};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;

/// What one call saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// Answered: the serving status and the `ratelimit` metadata.
    Served {
        /// The health status, as tonic names it.
        status: String,
        /// The `ratelimit` response metadata.
        ratelimit: Option<String>,
    },
    /// Refused: the gRPC code, the `retry-after` metadata, the delay of
    /// the `RetryInfo` detail, and the message.
    Refused {
        /// The gRPC status code.
        code: tonic::Code,
        /// The `retry-after` metadata, whole seconds.
        retry_after: Option<String>,
        /// The `ratelimit` metadata.
        ratelimit: Option<String>,
        /// The delay a tonic client reads with `tonic-types`.
        retry_delay: Option<Duration>,
        /// `grpc-message`.
        message: String,
    },
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Call::Served { status, ratelimit } => write!(
                f,
                "{status} (ratelimit: {})",
                ratelimit.as_deref().unwrap_or("none")
            ),
            Call::Refused {
                code,
                retry_after,
                retry_delay,
                message,
                ..
            } => write!(
                f,
                "{code:?}, retry-after {}, RetryInfo {}: {message}",
                retry_after.as_deref().unwrap_or("none"),
                retry_delay.map_or("none".to_string(), |d| format!("{:.1}s", d.as_secs_f64()))
            ),
        }
    }
}

/// Serve the health service behind a limiter of `per_minute` calls per
/// client address on a free loopback port; the server's address.
pub async fn serve(per_minute: u64) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    let limiter = Limiter::builder(Arc::new(MemoryStore::default()))
        .layer(
            "client",
            Scope::Subject,
            Policy::new(
                "per-client",
                // GCRA: a steady pace with a burst, so the waits are the
                // same on every run.
                Limit::gcra(per_minute, Duration::from_secs(60), per_minute)?,
            )?,
        )
        .build()?;
    let layer = RateLimitLayer::builder(limiter)
        // With the `tonic` feature, `ClientIp` reads tonic's TcpConnectInfo.
        .identity(Identity::new().client_ip(ClientIp::direct()))
        .build()?;
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    Ok(addr)
}

/// One `Health/Check` call through tonic's client.
pub async fn call(client: &mut HealthClient<Channel>) -> Call {
    let metadata = |m: &tonic::metadata::MetadataMap, name: &str| {
        m.get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    match client.check(HealthCheckRequest::default()).await {
        Ok(response) => Call::Served {
            ratelimit: metadata(response.metadata(), "ratelimit"),
            status: format!("{:?}", response.get_ref().status()),
        },
        Err(status) => Call::Refused {
            code: status.code(),
            retry_after: metadata(status.metadata(), "retry-after"),
            ratelimit: metadata(status.metadata(), "ratelimit"),
            retry_delay: status
                .get_details_retry_info()
                .and_then(|info| info.retry_delay),
            message: status.message().to_string(),
        },
    }
}

/// Serve with a limit of two per minute and call three times.
pub async fn run() -> Result<Vec<Call>, Box<dyn std::error::Error>> {
    let addr = serve(2).await?;
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    let mut calls = Vec::new();
    for _ in 0..3 {
        calls.push(call(&mut client).await);
    }
    Ok(calls)
}
