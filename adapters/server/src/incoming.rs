//! Connections accepted through TLS: each handshake runs in a task of its
//! own (a slow or silent client never holds up another's accept), with
//! the certificates in force when it began, and the finished connections
//! are handed to gRPC (a stream) or to the HTTP API (an axum listener).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Longest a handshake may take.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);

/// Finished handshakes waiting for the server to take them.
const QUEUE: usize = 128;

/// The certificates new handshakes use, swapped when the files change.
pub(crate) type Acceptor = Arc<RwLock<TlsAcceptor>>;

/// A connection through TLS.
pub(crate) struct TlsConnection(TlsStream<TcpStream>);

/// TLS connections accepted on one listener; stops accepting when dropped.
pub(crate) struct Incoming {
    connections: mpsc::Receiver<TlsConnection>,
    local: SocketAddr,
    accepting: JoinHandle<()>,
}

/// Where TCP connections come from: a listener, or connections another
/// runtime accepted (`grpc_runtimes.rs`), with the address they came to.
pub(crate) enum Tcp {
    Listener(TcpListener),
    Handed(mpsc::Receiver<std::net::TcpStream>, SocketAddr),
}

impl Tcp {
    fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Tcp::Listener(listener) => listener.local_addr(),
            Tcp::Handed(_, local) => Ok(*local),
        }
    }

    /// The next connection, registered with this runtime; `None` once no
    /// more can come.
    async fn next(&mut self) -> Option<TcpStream> {
        loop {
            let accepted = match self {
                Tcp::Listener(listener) => listener.accept().await.map(|(tcp, _)| tcp),
                Tcp::Handed(handed, _) => TcpStream::from_std(handed.recv().await?),
            };
            match accepted {
                Ok(tcp) => return Some(tcp),
                // Out of descriptors, a reset before accept: go on.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}

impl Incoming {
    /// Accept from `tcp` through `acceptor` from now on.
    pub(crate) fn start(mut source: Tcp, acceptor: Acceptor) -> io::Result<Incoming> {
        let local = source.local_addr()?;
        let (sender, connections) = mpsc::channel(QUEUE);
        let accepting = tokio::spawn(async move {
            while let Some(tcp) = source.next().await {
                // Without TCP_NODELAY a small answer waits for the
                // client's delayed ACK (40 ms).
                let _ = tcp.set_nodelay(true);
                let current = acceptor.read().unwrap_or_else(|p| p.into_inner()).clone();
                let sender = sender.clone();
                tokio::spawn(async move {
                    // A failed handshake is the client's to see (its alert).
                    if let Ok(Ok(tls)) =
                        tokio::time::timeout(HANDSHAKE_WITHIN, current.accept(tcp)).await
                    {
                        let _ = sender.send(TlsConnection(tls)).await;
                    }
                });
            }
        });
        Ok(Incoming {
            connections,
            local,
            accepting,
        })
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl tokio_stream::Stream for Incoming {
    type Item = io::Result<TlsConnection>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.connections.poll_recv(cx).map(|c| c.map(Ok))
    }
}

impl axum::serve::Listener for Incoming {
    type Io = TlsConnection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TlsConnection, SocketAddr) {
        match self.connections.recv().await {
            Some(connection) => (connection, self.local),
            // The accepting task is gone only when this is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

impl tonic::transport::server::Connected for TlsConnection {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}
