//! An in-process gRPC connection: the JSON gateway calls the member's own gRPC services over
//! memory pipes instead of over a client listener, so it needs no TLS session and no client
//! certificate of its own whatever the client URLs require.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Bytes buffered each way in a pipe.
const PIPE_BYTES: usize = 256 * 1024;

/// The server's end of one in-process connection.
pub struct InProcessConn(DuplexStream);

impl tonic::transport::server::Connected for InProcessConn {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for InProcessConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for InProcessConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The connections a client dials, for a tonic server to serve.
pub type Incoming = ReceiverStream<io::Result<InProcessConn>>;

/// A connector for tonic channels whose every connection arrives on the returned stream.
pub fn pipe() -> (
    impl tower::Service<
            http::Uri,
            Response = TokioIo<DuplexStream>,
            Error = io::Error,
            Future = impl Send + 'static,
        > + Clone
        + Send
        + 'static,
    Incoming,
) {
    let (tx, rx) = mpsc::channel(16);
    let connector = tower::service_fn(move |_: http::Uri| {
        let tx = tx.clone();
        async move {
            let (client, server) = tokio::io::duplex(PIPE_BYTES);
            tx.send(Ok(InProcessConn(server)))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::NotConnected, "server stopped"))?;
            Ok(TokioIo::new(client))
        }
    });
    (connector, ReceiverStream::new(rx))
}
