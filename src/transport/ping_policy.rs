//! gRPC's keepalive enforcement on a server connection (`--grpc-keepalive-min-time`): a client
//! that pings more often than the minimum interval is sent a GOAWAY with `ENHANCE_YOUR_CALM` and
//! `too_many_pings`, and the connection is closed, as grpc-go's server (so etcd) does. grpc-go
//! clients then double their keepalive interval.
//!
//! hyper, which runs tonic's HTTP/2, has no such policy, so this wrapper reads the HTTP/2 frame
//! headers passing through the connection (payloads are skipped, never copied): PING frames from
//! the client count, HEADERS and DATA frames from the server forgive (grpc-go's rule), and the
//! GOAWAY is written between two of the server's frames. grpc-go's rule: a ping less than the
//! minimum interval after the previous one is a strike, unless the server sent headers or data
//! in between; the third strike closes the connection. (grpc-go applies a two-hour minimum to
//! pings on a connection with no open stream; streams are not followed here, so the one minimum
//! applies to every ping.)

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// grpc-go's `maxPingStrikes`: the connection closes on the strike after this many.
const MAX_STRIKES: u32 = 2;
/// The client's connection preface, before its first frame.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const PREFACE_LEN: usize = PREFACE.len();
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
/// HTTP/2's `ENHANCE_YOUR_CALM` error code.
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// Follows frame boundaries in one direction of an HTTP/2 connection.
#[derive(Debug, Default)]
struct FrameScan {
    /// Bytes of the client preface still to skip.
    preface: usize,
    header: [u8; 9],
    /// Bytes of `header` read so far.
    have: usize,
    /// Payload bytes of the current frame still to pass.
    payload: usize,
}

impl FrameScan {
    fn after_preface() -> Self {
        FrameScan {
            preface: PREFACE_LEN,
            ..Default::default()
        }
    }

    /// Whether the next byte starts a frame.
    fn at_boundary(&self) -> bool {
        self.preface == 0 && self.have == 0 && self.payload == 0
    }

    /// Bytes to the end of the current frame (or preface); 0 at a boundary.
    fn to_boundary(&self) -> usize {
        if self.preface > 0 {
            self.preface
        } else if self.have > 0 {
            9 - self.have
        } else {
            self.payload
        }
    }

    /// Passes `data`, calling `frame(type, flags, stream)` for each frame header completed.
    fn feed(&mut self, mut data: &[u8], mut frame: impl FnMut(u8, u8, u32)) {
        while !data.is_empty() {
            if self.preface > 0 {
                let n = self.preface.min(data.len());
                self.preface -= n;
                data = &data[n..];
            } else if self.payload > 0 {
                let n = self.payload.min(data.len());
                self.payload -= n;
                data = &data[n..];
            } else {
                let n = (9 - self.have).min(data.len());
                self.header[self.have..self.have + n].copy_from_slice(&data[..n]);
                self.have += n;
                data = &data[n..];
                if self.have == 9 {
                    let h = self.header;
                    self.have = 0;
                    self.payload =
                        usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    frame(h[3], h[4], stream);
                }
            }
        }
    }
}

/// The strike count of one connection (grpc-go's `handlePing`).
#[derive(Debug)]
struct Strikes {
    min_time: Duration,
    last_ping: Option<Instant>,
    strikes: u32,
    /// The server sent headers or data since the last ping.
    forgiven: bool,
}

impl Strikes {
    /// Counts a ping received at `now`; true when the connection must close.
    fn ping(&mut self, now: Instant) -> bool {
        let last = self.last_ping.replace(now);
        if std::mem::take(&mut self.forgiven) {
            self.strikes = 0;
            return false;
        }
        if last.is_some_and(|l| now < l + self.min_time) {
            self.strikes += 1;
        }
        self.strikes > MAX_STRIKES
    }
}

/// A GOAWAY frame: `last_stream`, `ENHANCE_YOUR_CALM`, "too_many_pings".
fn goaway(last_stream: u32) -> Vec<u8> {
    let debug = b"too_many_pings";
    let len = 8 + debug.len();
    let mut f = vec![
        (len >> 16) as u8,
        (len >> 8) as u8,
        len as u8,
        GOAWAY,
        0,
        0,
        0,
        0,
        0,
    ];
    f.extend_from_slice(&last_stream.to_be_bytes());
    f.extend_from_slice(&ENHANCE_YOUR_CALM.to_be_bytes());
    f.extend_from_slice(debug);
    f
}

/// Where the connection stands.
#[derive(Debug)]
enum State {
    Open,
    /// A GOAWAY to write (bytes written so far), then close.
    GoingAway(Vec<u8>, usize),
    /// The GOAWAY is out: reads end, writes fail.
    Closed,
}

/// A server connection under a keepalive policy (see the module doc); with no minimum, a plain
/// pass-through.
pub struct PingPolicy<T> {
    io: T,
    policy: Option<Policed>,
}

struct Policed {
    strikes: Strikes,
    from_client: FrameScan,
    to_client: FrameScan,
    /// The highest stream the client opened (the GOAWAY's last stream).
    last_stream: u32,
    state: State,
}

impl<T> PingPolicy<T> {
    /// Wraps a server connection; `min_time` is the smallest ping interval allowed (`None`:
    /// no policy).
    pub fn new(io: T, min_time: Option<Duration>) -> Self {
        PingPolicy {
            io,
            policy: min_time.map(|min_time| Policed {
                strikes: Strikes {
                    min_time,
                    last_ping: None,
                    strikes: 0,
                    forgiven: false,
                },
                from_client: FrameScan::after_preface(),
                to_client: FrameScan::default(),
                last_stream: 0,
                state: State::Open,
            }),
        }
    }
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "closed: too many pings")
}

impl<T: AsyncWrite + Unpin> PingPolicy<T> {
    /// Writes a pending GOAWAY once the server is between frames; Ready(Ok) when there is none
    /// to write (any more) or the server is mid-frame.
    fn poll_goaway(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(p) = self.policy.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        if !p.to_client.at_boundary() {
            return Poll::Ready(Ok(()));
        }
        if let State::GoingAway(frame, written) = &mut p.state {
            ready!(super::poll_write_rest(&mut self.io, cx, frame, written))?;
            ready!(Pin::new(&mut self.io).poll_flush(cx))?;
            tracing::warn!(
                "closed a client connection: too many pings (--grpc-keepalive-min-time)"
            );
            p.state = State::Closed;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for PingPolicy<T> {
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
        ready!(this.poll_goaway(cx))?;
        let Some(p) = this.policy.as_mut() else {
            return Pin::new(&mut this.io).poll_write_vectored(cx, data);
        };
        let n = match p.state {
            State::Closed => return Poll::Ready(Err(closed())),
            // Only up to the end of the current frame, so that the GOAWAY goes next.
            State::GoingAway(..) => {
                let first = data
                    .iter()
                    .find(|s| !s.is_empty())
                    .map_or(&[][..], |s| &s[..]);
                let end = first.len().min(p.to_client.to_boundary());
                ready!(Pin::new(&mut this.io).poll_write(cx, &first[..end]))?
            }
            State::Open => ready!(Pin::new(&mut this.io).poll_write_vectored(cx, data))?,
        };
        let mut left = n;
        for slice in data {
            let part = &slice[..left.min(slice.len())];
            left -= part.len();
            p.to_client.feed(part, |kind, _, _| {
                if kind == HEADERS || kind == DATA {
                    p.strikes.forgiven = true;
                }
            });
            if left == 0 {
                break;
            }
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_goaway(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for PingPolicy<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A GOAWAY waiting for a quiet moment: the server may have nothing more to write.
        ready!(this.poll_goaway(cx))?;
        let Some(p) = this.policy.as_mut() else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        if matches!(p.state, State::Closed) {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        // An HTTP/1 connection (the JSON gateway, /health, /metrics): no frames to follow.
        let read = &buf.filled()[before..];
        let seen = PREFACE_LEN - p.from_client.preface;
        let n = p.from_client.preface.min(read.len());
        if read[..n] != PREFACE[seen..seen + n] {
            this.policy = None;
            return Poll::Ready(Ok(()));
        }
        let now = Instant::now();
        let mut close = false;
        p.from_client.feed(read, |kind, flags, stream| {
            if kind == HEADERS {
                p.last_stream = p.last_stream.max(stream);
            } else if kind == PING && flags & ACK == 0 && p.strikes.ping(now) {
                close = true;
            }
        });
        if close && matches!(p.state, State::Open) {
            p.state = State::GoingAway(goaway(p.last_stream), 0);
            // Let the server answer what it read; the GOAWAY follows at its next frame
            // boundary (or right away, if it is between frames).
            cx.waker().wake_by_ref();
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for PingPolicy<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn frames_are_found_across_any_split_and_after_the_preface() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(HEADERS, 4, 1, &[0; 300]));
        bytes.extend(frame(PING, 0, 0, &[7; 8]));
        bytes.extend(frame(PING, ACK, 0, &[7; 8]));
        bytes.extend(frame(DATA, 1, 3, &[]));
        for split in [1, 2, 5, 9, 17, 64, bytes.len()] {
            let mut scan = FrameScan::after_preface();
            let mut seen = Vec::new();
            for chunk in bytes.chunks(split) {
                scan.feed(chunk, |k, f, s| seen.push((k, f, s)));
            }
            assert_eq!(
                seen,
                [(HEADERS, 4, 1), (PING, 0, 0), (PING, ACK, 0), (DATA, 1, 3)],
                "split {split}"
            );
            assert!(scan.at_boundary());
        }
        let mut scan = FrameScan::default();
        scan.feed(&frame(DATA, 0, 1, &[0; 10])[..12], |_, _, _| {});
        assert_eq!(scan.to_boundary(), 7);
    }

    #[test]
    fn the_third_early_ping_closes_unless_the_server_sent_data_between() {
        let min = Duration::from_secs(5);
        let t0 = Instant::now();
        let mut s = Strikes {
            min_time: min,
            last_ping: None,
            strikes: 0,
            forgiven: false,
        };
        assert!(!s.ping(t0), "the first ping is never a strike");
        assert!(!s.ping(t0 + Duration::from_secs(1)));
        assert!(!s.ping(t0 + Duration::from_secs(2)));
        s.forgiven = true;
        assert!(
            !s.ping(t0 + Duration::from_secs(3)),
            "data in between: strikes reset"
        );
        assert!(!s.ping(t0 + Duration::from_secs(4)));
        assert!(!s.ping(t0 + Duration::from_secs(10)), "on time: no strike");
        assert!(!s.ping(t0 + Duration::from_secs(11)));
        assert!(s.ping(t0 + Duration::from_secs(12)), "third strike");
    }

    #[tokio::test]
    async fn an_http1_connection_is_passed_through_untouched() -> io::Result<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(1024);
        let mut server = PingPolicy::new(server, Some(Duration::from_secs(5)));
        // Bytes that would read as three PING frames, were this HTTP/2.
        let mut request = b"GET /health HTTP/1.1\r\n\r\n".to_vec();
        for _ in 0..3 {
            request.extend(frame(PING, 0, 0, &[0; 8]));
        }
        client.write_all(&request).await?;
        let mut got = vec![0; request.len()];
        server.read_exact(&mut got).await?;
        assert_eq!(got, request);
        assert!(server.policy.is_none());
        server.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await?;
        Ok(())
    }

    #[test]
    fn the_goaway_names_the_last_stream_and_enhance_your_calm() {
        let g = goaway(7);
        let mut scan = FrameScan::default();
        let mut seen = Vec::new();
        scan.feed(&g, |k, f, s| seen.push((k, f, s)));
        assert_eq!(seen, [(GOAWAY, 0, 0)]);
        assert_eq!(&g[9..13], &7u32.to_be_bytes());
        assert_eq!(&g[13..17], &ENHANCE_YOUR_CALM.to_be_bytes());
        assert_eq!(&g[17..], b"too_many_pings");
    }
}
