//! Calls multiplexed on one long-lived gRPC stream between two members: each request gets an
//! id, its answer comes back with that id, in any order. Used by a follower's session with its
//! leader (`session.rs`) and by a leader's replication stream to each follower
//! (`replicate.rs`).
//!
//! The stream's own task (in those modules) hands answers to [`Mux::deliver`] and ends the
//! table with [`Mux::close`] when the stream ends; every request still waiting then fails with
//! the error given, so that its caller can tell "never sent" from "sent, maybe handled".

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

/// How long a peer that answered `Unimplemented` (an older member) is asked by unary calls
/// before a stream is tried again (it may have been upgraded meanwhile, keeping its ID).
pub(super) const TRY_AGAIN: Duration = Duration::from_secs(60);

/// Callers waiting for their answers, by request id.
type Waiters<Ans, E> = HashMap<u64, oneshot::Sender<Result<Ans, E>>>;

/// The requests sent on one stream and not yet answered.
pub(super) struct Mux<Req, Ans, E> {
    tx: mpsc::UnboundedSender<Req>,
    next_id: AtomicU64,
    /// How many answers have come back.
    answers: AtomicU64,
    /// Waiters by request id; `None` once the stream has ended.
    waiting: Mutex<Option<Waiters<Ans, E>>>,
}

impl<Req, Ans, E: Clone> Mux<Req, Ans, E> {
    /// An open table, and the receiver of the requests to write on the stream.
    pub(super) fn new() -> (Self, mpsc::UnboundedReceiver<Req>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mux = Mux {
            tx,
            next_id: AtomicU64::new(1),
            answers: AtomicU64::new(0),
            waiting: Mutex::new(Some(HashMap::new())),
        };
        (mux, rx)
    }

    fn lock(&self) -> MutexGuard<'_, Option<Waiters<Ans, E>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the stream has ended.
    pub(super) fn is_closed(&self) -> bool {
        self.lock().is_none()
    }

    /// How many requests wait for an answer.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.lock().as_ref().map_or(0, HashMap::len)
    }

    /// How many answers have come back so far (any request's).
    pub(super) fn answers(&self) -> u64 {
        self.answers.load(Ordering::Relaxed)
    }

    /// Hands `answer` to request `id`'s caller, if it still waits.
    pub(super) fn deliver(&self, id: u64, answer: Ans) {
        self.answers.fetch_add(1, Ordering::Relaxed);
        let waiter = self.lock().as_mut().and_then(|w| w.remove(&id));
        if let Some(waiter) = waiter {
            let _ = waiter.send(Ok(answer));
        }
    }

    /// Ends the table: every request still waiting ends with `error`, later ones are not sent.
    pub(super) fn close(&self, error: E) {
        let waiting = self.lock().take();
        for (_, waiter) in waiting.into_iter().flatten() {
            let _ = waiter.send(Err(error.clone()));
        }
    }

    /// Sends the request `make` builds around its id and waits for its answer. The caller
    /// bounds the wait.
    ///
    /// # Errors
    /// `unsent` when the stream had ended before the request was sent; otherwise what
    /// [`Self::close`] was given, or `broken` if the stream's task went away without closing.
    pub(super) async fn call(
        &self,
        make: impl FnOnce(u64) -> Req,
        unsent: E,
        broken: E,
    ) -> Result<Ans, E> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut waiting = self.lock();
            let Some(w) = waiting.as_mut() else {
                return Err(unsent);
            };
            w.insert(id, tx);
            // Under the lock: the stream's end cannot slip between the insert and the send.
            if self.tx.send(make(id)).is_err() {
                w.remove(&id);
                return Err(unsent);
            }
        }
        let forget = Forget { mux: self, id };
        let answer = rx.await;
        // Answered or ended: the stream's task has taken the waiter already.
        std::mem::forget(forget);
        answer.unwrap_or(Err(broken))
    }
}

/// Hands each answer on `replies` to its caller (`split` gives its id and answer, or `None`
/// for a message to skip) until the stream ends, then closes the table with what `ended` makes
/// of the end (`Some` status of a broken stream, `None` when the other member ended it).
/// Returns early once nobody holds the table.
pub(super) async fn pump<Req, Ans, E: Clone, R>(
    mux: Weak<Mux<Req, Ans, E>>,
    mut replies: tonic::Streaming<R>,
    split: impl Fn(R) -> Option<(u64, Ans)>,
    ended: impl FnOnce(Option<Status>) -> E,
) {
    let end = loop {
        match replies.next().await {
            Some(Ok(reply)) => {
                let Some(mux) = mux.upgrade() else { return };
                if let Some((id, answer)) = split(reply) {
                    mux.deliver(id, answer);
                }
            }
            Some(Err(status)) => break Some(status),
            None => break None,
        }
    };
    if let Some(mux) = mux.upgrade() {
        mux.close(ended(end));
    }
}

/// Removes a request's waiter when its caller stops waiting before an answer (a leader change,
/// a timeout).
struct Forget<'a, Req, Ans, E: Clone> {
    mux: &'a Mux<Req, Ans, E>,
    id: u64,
}

impl<Req, Ans, E: Clone> Drop for Forget<'_, Req, Ans, E> {
    fn drop(&mut self) {
        if let Some(w) = self.mux.lock().as_mut() {
            w.remove(&self.id);
        }
    }
}

/// Fakes of the other member, for the tests of the streams built on [`Mux`].
#[cfg(test)]
pub(super) mod fake {
    use futures::StreamExt;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::UnboundedReceiverStream;
    use tonic::{Status, Streaming};

    use crate::pb::concordpb::raft_peer_client::RaftPeerClient;
    use crate::pb::concordpb::raft_peer_server::{RaftPeer, RaftPeerServer};
    use crate::transport::EagerChannel;

    /// A stream's answers.
    pub(in crate::raft) type Replies<T> =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

    /// A client of `server`, served in-process.
    pub(in crate::raft) fn client_of<S: RaftPeer>(server: S) -> RaftPeerClient<EagerChannel> {
        let (connector, incoming) = crate::transport::in_process::pipe();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftPeerServer::new(server))
                .serve_with_incoming(incoming),
        );
        let channel = tonic::transport::Endpoint::from_static("http://in-process")
            .connect_with_connector_lazy(connector);
        RaftPeerClient::new(crate::transport::eager(channel))
    }

    /// Answers each pair of `requests` in reverse order with `answer`; or, with `hang_up`,
    /// ends the stream after the first request.
    pub(in crate::raft) fn pairs_reversed<Req, Rep>(
        mut requests: Streaming<Req>,
        hang_up: bool,
        answer: impl Fn(Req) -> Rep + Send + 'static,
    ) -> Replies<Rep>
    where
        Req: Send + 'static,
        Rep: Send + 'static,
        Streaming<Req>: futures::Stream<Item = Result<Req, Status>>,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some(Ok(r)) = requests.next().await {
                if hang_up {
                    return;
                }
                held.push(r);
                if held.len() == 2 {
                    for r in held.drain(..).rev() {
                        let _ = tx.send(Ok(answer(r)));
                    }
                }
            }
        });
        Box::pin(UnboundedReceiverStream::new(rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    #[tokio::test]
    async fn answers_meet_their_own_calls_and_a_close_fails_the_rest() -> TestResult {
        let (mux, mut rx) = Mux::<u64, &str, &str>::new();
        let mux = std::sync::Arc::new(mux);
        let calls: Vec<_> = (0..3)
            .map(|_| {
                let mux = mux.clone();
                tokio::spawn(async move { mux.call(|id| id, "unsent", "broken").await })
            })
            .collect();
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(rx.recv().await.ok_or("a request")?);
        }
        ids.sort_unstable();
        mux.deliver(ids[2], "third");
        mux.deliver(ids[0], "first");
        mux.close("closed");
        let mut answers = Vec::new();
        for c in calls {
            answers.push(c.await?);
        }
        answers.sort_unstable();
        assert_eq!(answers, [Ok("first"), Ok("third"), Err("closed")]);
        assert!(mux.is_closed());
        assert_eq!(mux.call(|id| id, "unsent", "broken").await, Err("unsent"));
        Ok(())
    }

    #[tokio::test]
    async fn a_call_that_stops_waiting_leaves_no_waiter() -> TestResult {
        let (mux, _rx) = Mux::<u64, (), ()>::new();
        let waited = tokio::time::timeout(
            std::time::Duration::from_millis(10),
            mux.call(|id| id, (), ()),
        )
        .await;
        assert!(waited.is_err(), "no answer came");
        assert_eq!(mux.waiting(), 0);
        Ok(())
    }
}
