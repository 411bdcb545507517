//! The gRPC listener served by one single-threaded runtime per core.
//!
//! A decision is a few microseconds of work; on a shared multi-threaded
//! runtime a gRPC call costs more than that in wake-ups between threads
//! (a stream's task woken on one thread, its connection's on another).
//! Here each runtime owns its connections from accept to close: the
//! address is bound once per runtime with `SO_REUSEPORT`, so the kernel
//! spreads new connections over them, and nothing of a call crosses a
//! thread (docs/benchmarks.md, "The rate limit server").

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::error::ServerError;
use crate::incoming;

/// Connections waiting to be accepted, per listener.
const BACKLOG: u32 = 1024;

/// `runtimes` listeners on `addr` (port 0: one free port for all), each
/// with `SO_REUSEPORT`, and the address they share.
pub(crate) fn bind(
    addr: SocketAddr,
    runtimes: usize,
) -> Result<(Vec<std::net::TcpListener>, SocketAddr), ServerError> {
    let mut at = addr;
    let mut listeners = Vec::with_capacity(runtimes);
    for _ in 0..runtimes.max(1) {
        let bind_error = |source| ServerError::Bind { addr, source };
        let socket = match at {
            SocketAddr::V4(_) => TcpSocket::new_v4(),
            SocketAddr::V6(_) => TcpSocket::new_v6(),
        }
        .map_err(bind_error)?;
        socket.set_reuseaddr(true).map_err(bind_error)?;
        socket.set_reuseport(true).map_err(bind_error)?;
        socket.bind(at).map_err(bind_error)?;
        let listener = socket.listen(BACKLOG).map_err(bind_error)?;
        at = listener.local_addr().map_err(bind_error)?;
        // Registered again by the runtime that serves it.
        listeners.push(listener.into_std().map_err(bind_error)?);
    }
    Ok((listeners, at))
}

/// Serve `routes` on `listener` in a runtime of its own, on a thread of
/// its own, until stopped, with `beside` running there too (the runtime's
/// own store, `runtime_stores.rs`); the task ends when that runtime has
/// finished.
pub(crate) fn spawn(
    n: usize,
    listener: std::net::TcpListener,
    tls: Option<incoming::Acceptor>,
    routes: tonic::service::Routes,
    stopped: watch::Receiver<bool>,
    beside: Pin<Box<dyn Future<Output = ()> + Send>>,
) -> Result<JoinHandle<()>, ServerError> {
    let (done, finished) = oneshot::channel::<()>();
    let run = move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        match runtime {
            Ok(runtime) => runtime.block_on(async move {
                tokio::spawn(beside);
                match TcpListener::from_std(listener) {
                    Ok(listener) => serve(listener, tls, routes, stopped).await,
                    Err(e) => eprintln!("gRPC runtime {n}: {e}"),
                }
            }),
            Err(e) => eprintln!("gRPC runtime {n}: {e}"),
        }
        drop(done);
    };
    std::thread::Builder::new()
        .name(format!("tollgate-grpc-{n}"))
        .spawn(run)
        .map_err(|source| ServerError::Runtime { source })?;
    Ok(tokio::spawn(async move {
        let _ = finished.await;
    }))
}

/// Serve gRPC (the rate limit service and health) on `listener`, through
/// TLS when `tls` is set, until stopped.
async fn serve(
    listener: TcpListener,
    tls: Option<incoming::Acceptor>,
    routes: tonic::service::Routes,
    stopped: watch::Receiver<bool>,
) {
    let server = tonic::transport::Server::builder().add_routes(routes);
    let served = match tls {
        Some(acceptor) => match incoming::Incoming::start(listener, acceptor) {
            Ok(incoming) => {
                server
                    .serve_with_incoming_shutdown(incoming, crate::until_stopped(stopped))
                    .await
            }
            Err(e) => return eprintln!("gRPC server stopped: {e}"),
        },
        None => {
            // Without TCP_NODELAY a small answer waits for the client's
            // delayed ACK (40 ms).
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            server
                .serve_with_incoming_shutdown(incoming, crate::until_stopped(stopped))
                .await
        }
    };
    if let Err(e) = served {
        eprintln!("gRPC server stopped: {e}");
    }
}
