//! The gRPC listener served by one single-threaded runtime per core.
//!
//! A decision is a few microseconds of work; on a shared multi-threaded
//! runtime a gRPC call costs more than that in wake-ups between threads
//! (a stream's task woken on one thread, its connection's on another).
//! Here each runtime owns its connections from the moment they are
//! handed to it until they close: one task accepts on the one listener
//! and hands each new connection to the next runtime in turn, so nothing
//! of a call crosses a thread (docs/benchmarks.md, "The rate limit server
//! from outside"). One listener, not one per runtime with
//! `SO_REUSEPORT`: a second server started on the same port fails to
//! bind rather than silently taking half the connections (and, on the
//! in-process store, counting them apart).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::error::ServerError;
use crate::incoming::{self, Tcp};

/// Connections handed to a runtime and not yet taken, at most.
const HANDED: usize = 128;

/// Calls one gRPC connection may have open at once (Envoy opens another
/// connection past it): a bound on what one client holds.
const MAX_STREAMS: u32 = 1024;

/// Accept on `listener` until stopped, handing each connection to the
/// next of `runtimes` in turn (skipping one that has ended).
pub(crate) fn hand_out(
    listener: TcpListener,
    runtimes: Vec<mpsc::Sender<std::net::TcpStream>>,
    stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut next = 0;
        let accepting = async {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    // Out of descriptors, a reset before accept: go on.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                // Without TCP_NODELAY a small answer waits for the
                // client's delayed ACK (40 ms).
                let _ = tcp.set_nodelay(true);
                let Ok(mut tcp) = tcp.into_std() else {
                    continue;
                };
                for _ in 0..runtimes.len() {
                    let runtime = &runtimes[next % runtimes.len()];
                    next += 1;
                    match runtime.send(tcp).await {
                        Ok(()) => break,
                        Err(mpsc::error::SendError(back)) => tcp = back,
                    }
                }
            }
        };
        tokio::select! {
            () = accepting => {}
            () = crate::until_stopped(stopped) => {}
        }
    })
}

/// A runtime's handed connections, registered with it as they come.
struct Handed(mpsc::Receiver<std::net::TcpStream>);

impl tokio_stream::Stream for Handed {
    type Item = io::Result<TcpStream>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|tcp| tcp.map(TcpStream::from_std))
    }
}

/// What one runtime serves and how it stops.
pub(crate) struct Runtime {
    /// Its number, in its thread's name.
    pub(crate) n: usize,
    /// The connections handed to it, and the address they came to.
    pub(crate) handed: mpsc::Receiver<std::net::TcpStream>,
    pub(crate) local: SocketAddr,
    pub(crate) tls: Option<incoming::Acceptor>,
    pub(crate) routes: tonic::service::Routes,
    /// How long a connection stays quiet before it is pinged, and how long
    /// the ping waits (`grpc_keepalive`).
    pub(crate) keepalive: std::time::Duration,
    /// Stop accepting and finish the calls in flight.
    pub(crate) stopped: watch::Receiver<bool>,
    /// Stop now: the runtime is dropped with whatever it still serves.
    pub(crate) forced: watch::Receiver<bool>,
    /// Runs beside the service (the runtime's own store,
    /// `runtime_stores.rs`).
    pub(crate) beside: Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// A channel for the connections of one runtime.
pub(crate) fn channel() -> (
    mpsc::Sender<std::net::TcpStream>,
    mpsc::Receiver<std::net::TcpStream>,
) {
    mpsc::channel(HANDED)
}

/// Start `runtime` on a thread of its own; the task ends when it has
/// finished.
pub(crate) fn spawn(runtime: Runtime) -> Result<JoinHandle<()>, ServerError> {
    let (done, finished) = oneshot::channel::<()>();
    let n = runtime.n;
    let run = move || {
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(tokio) => tokio.block_on(async move {
                let Runtime {
                    handed,
                    local,
                    tls,
                    routes,
                    keepalive,
                    stopped,
                    forced,
                    beside,
                    ..
                } = runtime;
                tokio::spawn(beside);
                let server = tonic::transport::Server::builder()
                    .http2_keepalive_interval(Some(keepalive))
                    .http2_keepalive_timeout(Some(keepalive))
                    // hyper's own bound, which tonic lifts when unset: a
                    // client (unauthenticated when no token is set) must
                    // not hold unbounded calls open.
                    .max_concurrent_streams(Some(MAX_STREAMS))
                    .add_routes(routes);
                tokio::select! {
                    () = serve(handed, local, tls, server, stopped) => {}
                    () = crate::until_stopped(forced) => {}
                }
            }),
            Err(e) => eprintln!("gRPC runtime {n}: {e}"),
        }
        // The runtime is gone, and every connection it held with it.
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

/// Serve gRPC (the rate limit service and health, routed by `server`) on
/// the connections handed to this runtime, through TLS when `tls` is set,
/// until stopped.
async fn serve(
    handed: mpsc::Receiver<std::net::TcpStream>,
    local: SocketAddr,
    tls: Option<incoming::Acceptor>,
    server: tonic::transport::server::Router,
    stopped: watch::Receiver<bool>,
) {
    let served = match tls {
        Some(acceptor) => match incoming::Incoming::start(Tcp::Handed(handed, local), acceptor) {
            Ok(incoming) => {
                server
                    .serve_with_incoming_shutdown(incoming, crate::until_stopped(stopped))
                    .await
            }
            Err(e) => return eprintln!("gRPC server stopped: {e}"),
        },
        None => {
            server
                .serve_with_incoming_shutdown(Handed(handed), crate::until_stopped(stopped))
                .await
        }
    };
    if let Err(e) = served {
        eprintln!("gRPC server stopped: {e}");
    }
}
