//! Requests that end their HTTP/2 stream with their last data frame.
//!
//! tonic's request body learns that it has ended only when polled once more after its message,
//! so hyper sends a unary request as a data frame and then a separate empty END_STREAM frame,
//! often in a later write (hyper's body pipe waits for send capacity in between). tonic's server
//! reads a unary request to its end before it calls the handler, so every request then waits for
//! that second frame: one more task hop on both ends (measured on a `Forward` and every
//! `AppendEntries` between members). grpc-go marks the data frame of a unary request
//! END_STREAM. [`EagerEnd`] looks one frame ahead, so that hyper sees the end together with the
//! last data frame and sends both in one frame.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tonic::transport::Channel;
use tower::util::MapRequest;

/// A body that polls its inner body one frame ahead.
pub struct EagerEnd<B: Body> {
    inner: B,
    /// A frame (or error) polled ahead, returned next.
    ahead: Option<Result<Frame<B::Data>, B::Error>>,
    /// The inner body returned its end.
    ended: bool,
}

impl<B: Body> EagerEnd<B> {
    /// Wraps `inner`.
    pub fn new(inner: B) -> Self {
        EagerEnd {
            inner,
            ahead: None,
            ended: false,
        }
    }
}

// No field is pinned: the frames are plain values and the inner body is `Unpin`.
impl<B: Body + Unpin> Unpin for EagerEnd<B> {}

impl<B: Body + Unpin> Body for EagerEnd<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let current = match this.ahead.take() {
            Some(next) => next,
            None if this.ended => return Poll::Ready(None),
            None => match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(next) => next,
                None => {
                    this.ended = true;
                    return Poll::Ready(None);
                }
            },
        };
        if current.is_ok() && !this.ended {
            // Pending leaves the waker registered with the inner body: harmless, the caller
            // polls again after this frame anyway.
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(next)) => this.ahead = Some(next),
                Poll::Ready(None) => this.ended = true,
                Poll::Pending => {}
            }
        }
        Poll::Ready(Some(current))
    }

    fn is_end_stream(&self) -> bool {
        self.ahead.is_none() && (self.ended || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        if self.ahead.is_some() {
            SizeHint::default()
        } else if self.ended {
            SizeHint::with_exact(0)
        } else {
            self.inner.size_hint()
        }
    }
}

/// A tonic request rewritten to send its end with its last message.
fn end_with_data(req: http::Request<tonic::body::Body>) -> http::Request<tonic::body::Body> {
    req.map(|body| tonic::body::Body::new(EagerEnd::new(body)))
}

/// A tonic channel whose requests end their stream with their last data frame.
pub type EagerChannel =
    MapRequest<Channel, fn(http::Request<tonic::body::Body>) -> http::Request<tonic::body::Body>>;

/// Wraps `channel` so that its requests end with their last data frame.
pub fn eager(channel: Channel) -> EagerChannel {
    MapRequest::new(channel, end_with_data as fn(_) -> _)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures::StreamExt;
    use http_body_util::{BodyExt, StreamBody};

    fn frames(
        items: Vec<&'static str>,
    ) -> StreamBody<impl futures::Stream<Item = Result<Frame<Bytes>, std::io::Error>> + Unpin> {
        StreamBody::new(futures::stream::iter(items).map(|s| Ok(Frame::data(Bytes::from(s)))))
    }

    #[tokio::test]
    async fn the_last_frame_carries_the_end() {
        let mut body = EagerEnd::new(frames(vec!["only"]));
        assert!(!body.is_end_stream());
        let frame = body
            .frame()
            .await
            .and_then(|f| f.ok())
            .and_then(|f| f.into_data().ok());
        assert_eq!(frame, Some(Bytes::from("only")));
        assert!(body.is_end_stream(), "the end is known with the last frame");
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn every_frame_arrives_in_order() {
        let body = EagerEnd::new(frames(vec!["a", "b", "c"]));
        let all = body.collect().await.map(|c| c.to_bytes()).ok();
        assert_eq!(all, Some(Bytes::from("abc")));
    }
}
