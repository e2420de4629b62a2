//! TCP connections for gRPC with write coalescing, for clients and peers alike.
//!
//! hyper's HTTP/2 connection task writes and flushes every time it is woken, and each finished
//! request wakes it: under load that is one `writev` per response (measured: 1.4 per unary
//! call), and on a socket every `writev` pays the whole TCP send path. grpc-go's writer flushes
//! only when it has nothing more queued. [`Coalesced`] gets the same effect under hyper: writes
//! go to a buffer, and the first flush of a buffer yields once (the connection task re-queues
//! itself behind the request tasks that are ready, so their responses join the buffer), the
//! second one writes everything in one call. The cost is one scheduler turn of latency.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

mod eager_end;
pub mod in_process;
mod maybe_tls;
mod ping_policy;

pub use eager_end::{eager, EagerChannel, EagerEnd};
pub use maybe_tls::MaybeTls;
pub use ping_policy::PingPolicy;

/// Writes at least this large skip the buffer when it is empty (no copy of big bodies).
const PASS_THROUGH: usize = 64 * 1024;
/// The buffer is written out before it would grow past this.
const CAPACITY: usize = 256 * 1024;

/// A connection whose writes are gathered until a flush, and whose flushes wait one turn.
pub struct Coalesced<T> {
    io: T,
    buf: Vec<u8>,
    /// How much of `buf` is already written.
    written: usize,
    /// The current buffer's flush has already yielded once.
    yielded: bool,
}

impl<T> Coalesced<T> {
    /// Wraps `io`.
    pub fn new(io: T) -> Self {
        Coalesced {
            io,
            buf: Vec::new(),
            written: 0,
            yielded: false,
        }
    }
}

/// Writes `buf[*written..]` to `io`, counting in `written` what went, until all of it has.
fn poll_write_rest<T: AsyncWrite + Unpin>(
    io: &mut T,
    cx: &mut Context<'_>,
    buf: &[u8],
    written: &mut usize,
) -> Poll<io::Result<()>> {
    while *written < buf.len() {
        let n = ready!(Pin::new(&mut *io).poll_write(cx, &buf[*written..]))?;
        if n == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        *written += n;
    }
    Poll::Ready(Ok(()))
}

impl<T: AsyncWrite + Unpin> Coalesced<T> {
    /// Writes out the whole buffer.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(poll_write_rest(
            &mut self.io,
            cx,
            &self.buf,
            &mut self.written
        ))?;
        self.buf.clear();
        self.written = 0;
        self.yielded = false;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesced<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(data)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let len: usize = data.iter().map(|s| s.len()).sum();
        if this.buf.is_empty() && len >= PASS_THROUGH {
            return Pin::new(&mut this.io).poll_write_vectored(cx, data);
        }
        if this.buf.len() + len > CAPACITY {
            ready!(this.poll_drain(cx))?;
            if len >= PASS_THROUGH {
                return Pin::new(&mut this.io).poll_write_vectored(cx, data);
            }
        }
        for slice in data {
            this.buf.extend_from_slice(slice);
        }
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.buf.is_empty() {
            return Pin::new(&mut this.io).poll_flush(cx);
        }
        if !this.yielded {
            this.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesced<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Coalesced<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// A connector for tonic channels (`Endpoint::connect_with_connector[_lazy]`): TCP with
/// `TCP_NODELAY`, at most `timeout` to connect (and to finish a TLS handshake), writes
/// coalesced; with `tls`, a TLS session over it whose server name is the URL's host.
///
/// `unacked`, if given, becomes the socket's `TCP_USER_TIMEOUT`: a connection whose sent data stays
/// unacknowledged that long (the peer is cut off by a partition) is closed by the kernel, so the
/// next request connects afresh the moment the network heals instead of waiting out TCP's
/// exponential retransmission backoff (seconds after a few seconds of partition). A peer that is
/// merely busy or stopped still acknowledges (its kernel does), so this never cuts it.
pub fn connector(
    timeout: Duration,
    unacked: Option<Duration>,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> impl tower::Service<
    http::Uri,
    Response = TokioIo<Coalesced<MaybeTls>>,
    Error = io::Error,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |uri: http::Uri| {
        let tls = tls.clone();
        async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no host in URL"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(80);
            let stream = staggered(timeout, RETRY_SYN, || {
                let host = host.clone();
                async move { TcpStream::connect((host.as_str(), port)).await }
            })
            .await?;
            stream.set_nodelay(true)?;
            if unacked.is_some() {
                if let Err(e) = socket2::SockRef::from(&stream).set_tcp_user_timeout(unacked) {
                    tracing::debug!(error = %e, "TCP_USER_TIMEOUT not set");
                }
            }
            let stream = match tls {
                None => MaybeTls::Plain(stream),
                Some(config) => {
                    MaybeTls::Tls(Box::new(tls_session(config, host, stream, timeout).await?))
                }
            };
            Ok(TokioIo::new(Coalesced::new(stream)))
        }
    })
}

/// A connector for tonic channels to the Unix socket at `path` (whatever URL the channel has),
/// at most `timeout` to connect (and to finish a TLS handshake), writes coalesced; with `tls`
/// (`unixs://`), a TLS session over it whose server name is the socket name's host part
/// (`localhost` of `localhost:2379`, as grpc-go's target authority gives it).
pub fn unix_connector(
    path: String,
    timeout: Duration,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> impl tower::Service<
    http::Uri,
    Response = TokioIo<Coalesced<MaybeTls>>,
    Error = io::Error,
    Future = impl Send + 'static,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |_: http::Uri| {
        let (path, tls) = (path.clone(), tls.clone());
        async move {
            let stream = tokio::time::timeout(timeout, tokio::net::UnixStream::connect(&path))
                .await
                .map_err(timed_out)??;
            let stream = match tls {
                None => MaybeTls::Unix(stream),
                Some(config) => {
                    let file = path.rsplit('/').next().unwrap_or(&path);
                    let host = file.rsplit_once(':').map_or(file, |(host, _)| host);
                    let session = tls_session(config, host.to_string(), stream, timeout).await?;
                    MaybeTls::UnixTls(Box::new(session))
                }
            };
            Ok(TokioIo::new(Coalesced::new(stream)))
        }
    })
}

/// How long a TCP connect may go unanswered before another one starts beside it.
const RETRY_SYN: Duration = Duration::from_millis(100);

/// The first of connect attempts made by `attempt`, a new one every `every` while none has
/// succeeded, for at most `timeout` in all; the others are dropped. The kernel sends a lost SYN
/// again only after a second: when a partition heals, a new attempt gets through at once where
/// the attempt made during the partition would wait out its timeout (up to `timeout` of every
/// heal). On a network that answers within `every`, one attempt is all there is.
async fn staggered<T, F, Fut>(timeout: Duration, every: Duration, mut attempt: F) -> io::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = io::Result<T>>,
{
    use futures::stream::{FuturesUnordered, StreamExt};
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut pending = FuturesUnordered::new();
    pending.push(attempt());
    loop {
        let next = tokio::time::sleep(every);
        tokio::select! {
            () = &mut deadline => return Err(timed_out(())),
            Some(done) = pending.next() => return done,
            () = next => pending.push(attempt()),
        }
    }
}

fn timed_out<E>(_: E) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connect timed out")
}

/// A TLS client session over `stream` for server name `host`, its handshake done within
/// `timeout`.
async fn tls_session<S: AsyncRead + AsyncWrite + Unpin>(
    config: std::sync::Arc<rustls::ClientConfig>,
    host: String,
    stream: S,
    timeout: Duration,
) -> io::Result<tokio_rustls::client::TlsStream<S>> {
    let name = rustls::pki_types::ServerName::try_from(host)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let session = tokio_rustls::TlsConnector::from(config).connect(name, stream);
    tokio::time::timeout(timeout, session)
        .await
        .map_err(timed_out)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn writes_arrive_whole_and_in_order() -> io::Result<()> {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let mut w = Coalesced::new(a);
        let big = vec![7u8; PASS_THROUGH + 1];
        w.write_all(b"one ").await?;
        w.write_all(b"two ").await?;
        w.flush().await?;
        w.write_all(&big).await?;
        w.write_all(b"three").await?;
        w.shutdown().await?;
        let mut got = Vec::new();
        b.read_to_end(&mut got).await?;
        let mut want = b"one two ".to_vec();
        want.extend(&big);
        want.extend(b"three");
        assert_eq!(got, want);
        Ok(())
    }

    #[tokio::test]
    async fn nothing_is_written_before_a_flush() -> io::Result<()> {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let mut w = Coalesced::new(a);
        w.write_all(b"held").await?;
        let mut one = [0u8; 4];
        let early = tokio::time::timeout(std::time::Duration::from_millis(50), b.read(&mut one));
        assert!(early.await.is_err(), "bytes arrived before the flush");
        w.flush().await?;
        b.read_exact(&mut one).await?;
        assert_eq!(&one, b"held");
        Ok(())
    }

    #[tokio::test]
    async fn a_connect_unanswered_for_a_while_gets_a_second_attempt_beside_it() -> io::Result<()> {
        use std::time::Duration;
        // The first attempt never finishes (its SYN was lost); the second one answers.
        let mut made = 0;
        let got = staggered(Duration::from_secs(5), Duration::from_millis(20), || {
            made += 1;
            let n = made;
            async move {
                if n == 1 {
                    std::future::pending::<()>().await;
                }
                Ok(n)
            }
        })
        .await?;
        assert_eq!(got, 2);

        // Nothing answers: the whole time limit, then `timed out`.
        let none = staggered(
            Duration::from_millis(100),
            Duration::from_millis(20),
            std::future::pending::<io::Result<()>>,
        )
        .await;
        assert_eq!(none.err().map(|e| e.kind()), Some(io::ErrorKind::TimedOut));

        // A refusal ends it at once.
        let refused = staggered(
            Duration::from_secs(5),
            Duration::from_millis(20),
            || async { Err::<(), _>(io::Error::from(io::ErrorKind::ConnectionRefused)) },
        )
        .await;
        assert_eq!(
            refused.err().map(|e| e.kind()),
            Some(io::ErrorKind::ConnectionRefused)
        );
        Ok(())
    }
}
