//! A leader's appends to each follower (replication and heartbeats) as messages on
//! long-lived gRPC streams to the peer (`RaftPeer.Replicate`), answered on the stream coming
//! back, instead of a unary `AppendEntries` call each.
//!
//! A unary call costs a new HTTP/2 stream with its headers and trailers on both members, and
//! every put on three members waits for one append round trip, every linearizable read for one
//! heartbeat round (etcd keeps its `MsgApp` streams open). All of a member's replication
//! streams to one peer share its entries stream, its heartbeats have another; the follower
//! runs each append on a task of its own, as it ran each call.
//!
//! Failures read as the unary call's would ([`PeerClient`](super::network::PeerClient) maps
//! them): a stream that could not be opened gives the call's status (`Unavailable` when the
//! peer is down); one that broke or ended afterwards fails the appends waiting on it, which
//! openraft sends again, and the next append opens a new stream. An append that times out on a
//! stream that answered nothing meanwhile abandons it, so nothing queues for a cut-off peer;
//! a slow answer on a stream that still answers others does not. A peer that answers
//! `Unimplemented` (an older member) gets unary calls for a minute before a stream is tried
//! again (a rolling upgrade may have replaced it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::task::AbortHandle;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Status};

use super::mux::{pump, Mux, TRY_AGAIN};
use crate::pb::concordpb::raft_peer_client::RaftPeerClient;
use crate::pb::concordpb::{ReplicateReply, ReplicateRequest};
use crate::transport::EagerChannel;

/// This member's replication streams, opened when first needed: two per peer URL, one for
/// appends that carry entries and one for heartbeats, as etcd keeps its `MsgApp` stream apart
/// from its other messages (a heartbeat of a read-index round never waits behind a large
/// append's data on one HTTP/2 stream).
#[derive(Default)]
pub(super) struct Pipes {
    /// By peer URL: the heartbeats' lane, then the entries' lane.
    state: Mutex<HashMap<String, [Lane; 2]>>,
}

#[derive(Default)]
struct Lane {
    /// The stream of this lane, if one was opened.
    current: Option<Arc<Pipe>>,
    /// When the peer answered `Unimplemented`: unary calls until [`TRY_AGAIN`] has passed.
    without: Option<Instant>,
}

impl Pipes {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, [Lane; 2]>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open stream to the peer at `addr` for appends with `entries` (or heartbeats),
    /// opened on `client` if there is none; `None` when the peer has no replication streams
    /// (use the unary call). The URL is copied only the first time a peer is seen.
    pub(super) fn to(
        self: &Arc<Self>,
        (addr, entries): (&str, bool),
        client: &RaftPeerClient<EagerChannel>,
        cluster_id: u64,
    ) -> Option<Arc<Pipe>> {
        let mut state = self.lock();
        if !state.contains_key(addr) {
            state.insert(addr.to_string(), Default::default());
        }
        let lane = &mut state.get_mut(addr)?[usize::from(entries)];
        if lane
            .without
            .is_some_and(|since| since.elapsed() < TRY_AGAIN)
        {
            return None;
        }
        if let Some(p) = lane.current.as_ref().filter(|p| !p.mux.is_closed()) {
            return Some(p.clone());
        }
        let pipe = Pipe::open(
            (addr.to_string(), entries),
            client.clone(),
            cluster_id,
            Arc::downgrade(self),
        );
        lane.current = Some(pipe.clone());
        Some(pipe)
    }

    /// The peer at `addr` answered `Unimplemented` on the lane for `entries`: that lane gets
    /// unary calls for [`TRY_AGAIN`].
    fn unsupported(&self, (addr, entries): (String, bool)) {
        let mut state = self.lock();
        let lanes = state.entry(addr).or_default();
        lanes[usize::from(entries)].without = Some(Instant::now());
    }
}

/// One open replication stream to a peer and the appends waiting on it.
pub(super) struct Pipe {
    mux: Arc<Mux<ReplicateRequest, ReplicateReply, Status>>,
    /// The stream's task, aborted when the stream is abandoned.
    task: AbortHandle,
}

impl Pipe {
    /// Opens the stream on `client` to the peer at `lane` (its URL, and whether for entries)
    /// and starts the task that hands out its answers.
    fn open(
        lane: (String, bool),
        mut client: RaftPeerClient<EagerChannel>,
        cluster_id: u64,
        pipes: Weak<Pipes>,
    ) -> Arc<Pipe> {
        let (mux, rx) = Mux::new();
        let mux = Arc::new(mux);
        let weak = Arc::downgrade(&mux);
        let task = tokio::spawn(async move {
            let mut request = tonic::Request::new(UnboundedReceiverStream::new(rx));
            super::network::from_cluster(&mut request, cluster_id);
            match client.replicate(request).await {
                Ok(replies) => {
                    // The peer ends its streams only as it stops.
                    let ended = |status: Option<Status>| {
                        status.unwrap_or_else(|| {
                            Status::unavailable("the peer ended its replication stream")
                        })
                    };
                    pump(weak, replies.into_inner(), |r| Some((r.id, r)), ended).await;
                }
                Err(status) => {
                    if status.code() == Code::Unimplemented {
                        if let Some(p) = pipes.upgrade() {
                            p.unsupported(lane);
                        }
                    }
                    if let Some(mux) = weak.upgrade() {
                        mux.close(status);
                    }
                }
            }
        });
        Arc::new(Pipe {
            mux,
            task: task.abort_handle(),
        })
    }

    /// Sends the encoded AppendEntries `data` and waits up to `deadline` for the peer's
    /// encoded answer. An append that finds no answer in its time, on a stream that brought
    /// no answer at all meanwhile, abandons the stream (see [`Self::abandon`]); a slow answer
    /// on a stream that still answers others does not.
    ///
    /// # Errors
    /// As [`Self::call`]; `DeadlineExceeded` when no answer came in time.
    pub(super) async fn call_within(
        &self,
        data: Vec<u8>,
        deadline: Duration,
    ) -> Result<Vec<u8>, Status> {
        let answers = self.mux.answers();
        match tokio::time::timeout(deadline, self.call(data)).await {
            Ok(reply) => reply,
            Err(_) => {
                if self.mux.answers() == answers {
                    self.abandon();
                }
                Err(Status::deadline_exceeded(
                    "no answer on the replication stream",
                ))
            }
        }
    }

    /// Gives the stream up after an append found no answer in its time and the stream none
    /// either: the appends waiting on it fail, and what is queued behind them is dropped, not
    /// kept for a peer that may be cut off for long (the next append opens a new stream).
    pub(super) fn abandon(&self) {
        self.mux.close(Status::deadline_exceeded(
            "the replication stream was abandoned",
        ));
        self.task.abort();
    }

    /// Sends the encoded AppendEntries `data` and waits for the peer's encoded answer. The
    /// caller bounds the wait.
    ///
    /// # Errors
    /// The status the stream failed with, or the one the peer answered: `Unimplemented` when
    /// the peer has no replication streams (nothing was sent: use the unary call).
    pub(super) async fn call(&self, data: Vec<u8>) -> Result<Vec<u8>, Status> {
        let make = |id| ReplicateRequest { id, data };
        let unsent = Status::unavailable("the replication stream had ended");
        let broken = Status::unavailable("the replication stream's task ended");
        let reply = self.mux.call(make, unsent, broken).await?;
        match Code::from(reply.code) {
            Code::Ok => Ok(reply.data),
            code => Err(Status::new(code, reply.message)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::mux::fake::{client_of, pairs_reversed, Replies};
    use super::*;
    use crate::pb::concordpb::raft_peer_server::RaftPeer;
    use futures::StreamExt;
    use tonic::{Request, Response, Streaming};

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    /// A follower that answers each pair of appends in reverse order, echoing the payload
    /// reversed; a payload `[0]` is refused as a bad one; with `hang_up`, it ends the stream
    /// after the first append.
    struct FakeFollower {
        hang_up: bool,
    }

    #[tonic::async_trait]
    impl RaftPeer for FakeFollower {
        async fn replicate(
            &self,
            req: Request<Streaming<ReplicateRequest>>,
        ) -> std::result::Result<Response<Replies<ReplicateReply>>, Status> {
            let replies = pairs_reversed(req.into_inner(), self.hang_up, |r: ReplicateRequest| {
                if r.data == [0] {
                    ReplicateReply {
                        id: r.id,
                        code: Code::InvalidArgument as i32,
                        message: "bad raft payload".into(),
                        ..Default::default()
                    }
                } else {
                    let mut data = r.data;
                    data.reverse();
                    ReplicateReply {
                        id: r.id,
                        data,
                        ..Default::default()
                    }
                }
            });
            Ok(Response::new(replies))
        }
    }

    /// Returns once an append waits on `pipe` (sent, not answered).
    async fn until_waiting(pipe: &Pipe) {
        while pipe.mux.waiting() == 0 {
            tokio::task::yield_now().await;
        }
    }

    /// A member without replication streams.
    struct OldFollower;

    #[tonic::async_trait]
    impl RaftPeer for OldFollower {}

    #[tokio::test]
    async fn appends_get_their_own_answers_and_the_peers_refusals() -> TestResult {
        let pipes = Arc::new(Pipes::default());
        let client = client_of(FakeFollower { hang_up: false });
        let pipe = pipes.to(("a", true), &client, 1).ok_or("a stream")?;
        let (first, second) = tokio::join!(pipe.call(vec![1, 2]), pipe.call(vec![3, 4]));
        assert_eq!(first?, [2, 1]);
        assert_eq!(second?, [4, 3]);
        let (good, bad) = tokio::join!(pipe.call(vec![5, 6]), pipe.call(vec![0]));
        assert_eq!(good?, [6, 5]);
        let bad = bad.err().ok_or("a refusal")?;
        assert_eq!(
            (bad.code(), bad.message()),
            (Code::InvalidArgument, "bad raft payload")
        );
        let again = pipes.to(("a", true), &client, 1).ok_or("a stream")?;
        assert!(Arc::ptr_eq(&pipe, &again), "one stream per peer");
        let other = pipes.to(("b", true), &client, 1).ok_or("a stream")?;
        assert!(!Arc::ptr_eq(&pipe, &other), "a stream of its own per peer");
        let beats = pipes.to(("a", false), &client, 1).ok_or("a stream")?;
        assert!(!Arc::ptr_eq(&pipe, &beats), "heartbeats have their own");
        Ok(())
    }

    #[tokio::test]
    async fn a_stream_that_ends_fails_its_appends_and_is_replaced() -> TestResult {
        let pipes = Arc::new(Pipes::default());
        let client = client_of(FakeFollower { hang_up: true });
        let pipe = pipes.to(("a", true), &client, 1).ok_or("a stream")?;
        let failed = pipe.call(vec![1]).await.err().ok_or("no answer")?;
        assert_eq!(failed.code(), Code::Unavailable, "{failed:?}");
        assert!(pipe.mux.is_closed());
        let next = pipes.to(("a", true), &client, 1).ok_or("a new stream")?;
        assert!(!Arc::ptr_eq(&pipe, &next), "an ended stream is replaced");
        Ok(())
    }

    #[tokio::test]
    async fn an_abandoned_stream_fails_its_appends_and_is_replaced() -> TestResult {
        let pipes = Arc::new(Pipes::default());
        let client = client_of(FakeFollower { hang_up: false });
        let pipe = pipes.to(("a", true), &client, 1).ok_or("a stream")?;
        // The fake answers appends in pairs: a lone one waits.
        let waiting = tokio::spawn({
            let pipe = pipe.clone();
            async move { pipe.call(vec![1]).await }
        });
        until_waiting(&pipe).await;
        pipe.abandon();
        let failed = waiting.await?.err().ok_or("no answer")?;
        assert_eq!(failed.code(), Code::DeadlineExceeded, "{failed:?}");
        let next = pipes.to(("a", true), &client, 1).ok_or("a new stream")?;
        assert!(
            !Arc::ptr_eq(&pipe, &next),
            "an abandoned stream is replaced"
        );
        let (first, second) = tokio::join!(next.call(vec![1, 2]), next.call(vec![3, 4]));
        assert_eq!((first?, second?), (vec![2, 1], vec![4, 3]));
        Ok(())
    }

    /// A follower that answers every append at once with an empty answer, except `[9]`,
    /// which it never answers.
    struct IgnoresNine;

    #[tonic::async_trait]
    impl RaftPeer for IgnoresNine {
        async fn replicate(
            &self,
            req: Request<Streaming<ReplicateRequest>>,
        ) -> std::result::Result<Response<Replies<ReplicateReply>>, Status> {
            let replies = req.into_inner().filter_map(|r| async move {
                match r {
                    Ok(r) if r.data == [9] => None,
                    Ok(r) => Some(Ok(ReplicateReply {
                        id: r.id,
                        ..Default::default()
                    })),
                    Err(e) => Some(Err(e)),
                }
            });
            Ok(Response::new(Box::pin(replies)))
        }
    }

    #[tokio::test]
    async fn a_timed_out_append_abandons_only_a_stream_that_stopped_answering() -> TestResult {
        let pipes = Arc::new(Pipes::default());
        let client = client_of(IgnoresNine);
        let pipe = pipes.to(("a", false), &client, 1).ok_or("a stream")?;
        // Unanswered while the stream answers others: the stream stays.
        let slow = tokio::spawn({
            let pipe = pipe.clone();
            async move { pipe.call_within(vec![9], Duration::from_secs(1)).await }
        });
        until_waiting(&pipe).await;
        assert_eq!(pipe.call(vec![1]).await?, Vec::<u8>::new());
        let slow = slow.await?;
        assert_eq!(slow.err().map(|s| s.code()), Some(Code::DeadlineExceeded));
        assert!(!pipe.mux.is_closed(), "a stream that answers is kept");
        // Unanswered, and nothing else answered meanwhile: abandoned.
        let silent = pipe.call_within(vec![9], Duration::from_millis(50)).await;
        assert_eq!(silent.err().map(|s| s.code()), Some(Code::DeadlineExceeded));
        assert!(pipe.mux.is_closed(), "a silent stream is abandoned");
        Ok(())
    }

    #[tokio::test]
    async fn a_peer_without_streams_gets_unary_calls_for_a_while() -> TestResult {
        let pipes = Arc::new(Pipes::default());
        let client = client_of(OldFollower);
        let pipe = pipes
            .to(("a", true), &client, 1)
            .ok_or("a stream is tried first")?;
        let refused = pipe.call(vec![1]).await.err().ok_or("refused")?;
        assert_eq!(refused.code(), Code::Unimplemented);
        assert!(
            pipes.to(("a", true), &client, 1).is_none(),
            "unary calls for a while"
        );
        assert!(
            pipes.to(("b", true), &client, 1).is_some(),
            "another peer is tried"
        );
        if let Some(lanes) = pipes.lock().get_mut("a") {
            lanes[1].without = Instant::now().checked_sub(TRY_AGAIN);
        }
        assert!(
            pipes.to(("a", true), &client, 1).is_some(),
            "a stream is tried again after a while (the peer may have been upgraded)"
        );
        Ok(())
    }
}
