//! Accepting TLS connections for a tonic server: handshakes run in their own tasks (a slow or
//! hostile client does not hold up the next one), failures are logged and dropped, and each
//! connection carries its peer's address and certificate CN to the request path.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio_stream::wrappers::ReceiverStream;

/// How long a client may take to complete its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the request path can learn about a TLS connection (a request extension).
#[derive(Clone, Debug)]
pub struct TlsConnectInfo {
    /// The client's address.
    pub remote_addr: Option<SocketAddr>,
    /// The CN of the client's verified certificate, if it presented one.
    pub common_name: Option<String>,
}

/// A listening socket whose connections can carry TLS: TCP (`https://`) or a Unix socket
/// (`unixs://`).
pub trait Accept: Send + 'static {
    /// An accepted connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The next connection and the client's address (none on a Unix socket).
    fn accept_one(
        &self,
    ) -> impl std::future::Future<Output = io::Result<(Self::Io, Option<SocketAddr>)>> + Send;
}

impl Accept for TcpListener {
    type Io = TcpStream;

    async fn accept_one(&self) -> io::Result<(TcpStream, Option<SocketAddr>)> {
        let (tcp, remote) = self.accept().await?;
        let _ = tcp.set_nodelay(true);
        Ok((tcp, Some(remote)))
    }
}

impl Accept for UnixListener {
    type Io = UnixStream;

    async fn accept_one(&self) -> io::Result<(UnixStream, Option<SocketAddr>)> {
        Ok((self.accept().await?.0, None))
    }
}

/// A server-side TLS connection over TCP or (`S = UnixStream`) a Unix socket.
pub struct TlsConn<S = TcpStream> {
    io: tokio_rustls::server::TlsStream<S>,
    info: TlsConnectInfo,
}

impl<S> tonic::transport::server::Connected for TlsConn<S> {
    type ConnectInfo = TlsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsConn<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsConn<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The TLS connections accepted on `listener` with `config` (which may change between
/// handshakes: see `reload.rs`), until the stream is dropped.
pub fn incoming<L: Accept>(
    listener: L,
    config: Arc<rustls::ServerConfig>,
) -> ReceiverStream<io::Result<TlsConn<L::Io>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept_one() => a,
                () = tx.closed() => return,
            };
            let (stream, remote) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            let from = remote.map_or_else(|| "unix socket".to_string(), |a| a.to_string());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(io)) => {
                        let common_name = io
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .and_then(|c| super::verify::common_name(c));
                        let info = TlsConnectInfo {
                            remote_addr: remote,
                            common_name,
                        };
                        let _ = tx.send(Ok(TlsConn { io, info })).await;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(remote_addr = %from, error = %e, "rejected connection");
                    }
                    Err(_) => {
                        tracing::warn!(remote_addr = %from, "rejected connection: TLS handshake timed out")
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
