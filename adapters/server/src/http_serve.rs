//! The HTTP API's connections: HTTP/1 with a deadline for each request's
//! head (an idle keep-alive connection's wait for its next request
//! included) and a graceful end. axum's own `serve` reads a head for as
//! long as the client takes: a client that opens connections and sends
//! nothing held each of them, and the process's file descriptors, for
//! good — the gRPC listener Envoy uses included.

use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

/// How long a connection may take to send a request's head, or stay idle
/// between requests (hyper's one deadline for both; its own default). A
/// pooled client reusing a connection at the very instant it closes sees
/// its request fail, so the deadline is well above a renewal loop's
/// period.
pub(crate) const HEAD_WITHIN: Duration = Duration::from_secs(30);

/// How long a request may take to send its body (read by the handlers
/// that take one: [`json_body`](crate::http_api::json_body)).
pub(crate) const BODY_WITHIN: Duration = Duration::from_secs(30);

/// Serve `app` on the connections `listener` accepts until `stopped`,
/// then let the requests in flight finish; a connection that sends no
/// complete head within `head_within` is closed.
pub(crate) async fn serve<L>(
    mut listener: L,
    app: axum::Router,
    stopped: watch::Receiver<bool>,
    head_within: Duration,
) where
    L: axum::serve::Listener,
    L::Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut connections = http1::Builder::new();
    connections
        .timer(TokioTimer::new())
        .header_read_timeout(head_within);
    let graceful = GracefulShutdown::new();
    let stop = crate::until_stopped(stopped);
    tokio::pin!(stop);
    loop {
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let connection = connections.serve_connection(TokioIo::new(io), service);
        // A connection that fails (a reset, a late head) ends alone.
        tokio::spawn(graceful.watch(connection));
    }
    drop(listener);
    graceful.shutdown().await;
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// A connection that never finishes its request's head is closed at
    /// the deadline, while a whole request is answered; stopping ends the
    /// serving.
    #[tokio::test]
    async fn a_head_that_never_ends_is_cut_off() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (stop, stopped) = watch::channel(false);
        let serving = tokio::spawn(serve(listener, app, stopped, Duration::from_millis(200)));
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        let mut whole = TcpStream::connect(addr).await.unwrap();
        whole
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        whole.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut rest));
        assert!(closed.await.is_ok(), "the slow connection is still open");
        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), serving)
            .await
            .expect("serving ends once stopped")
            .unwrap();
    }
}
