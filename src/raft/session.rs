//! A follower's session with its leader: forwarded writes, read-index requests and lease
//! renewals as messages on one long-lived gRPC stream (`RaftPeer.Session`), answered on the
//! stream coming back, instead of a unary call each.
//!
//! A unary call between members costs a new HTTP/2 stream with its headers and trailers, and a
//! task on the leader per call; etcd's followers send `MsgProp` and `MsgReadIndex` as one-way
//! messages on the Raft streams they keep open. A session message is one data frame each way.
//!
//! Delivery is reported as the unary calls report it (`route.rs`): a request on a session whose
//! stream could not be opened (connection refused, or a leader without sessions) never reached
//! the leader and ends with [`Error::NoLeader`], so it is sent again; one on a stream that broke
//! afterwards may have, and ends with [`Error::LeaderChanged`]. A leader that answers
//! `Unimplemented` (an older member) is remembered, and requests to it use the unary calls for
//! a minute before a session is tried again (a rolling upgrade may have replaced it).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio_stream::wrappers::UnboundedReceiverStream;

use super::mux::{pump, Mux, TRY_AGAIN};
use super::route::undelivered;
use crate::error::{Error, Result};
use crate::pb::concordpb::raft_peer_client::RaftPeerClient;
use crate::pb::concordpb::{session_reply, session_request, SessionReply, SessionRequest};
use crate::transport::EagerChannel;

/// This member's session with the leader it follows, made when first needed.
#[derive(Default)]
pub(super) struct Sessions {
    state: Mutex<SessionsState>,
}

#[derive(Default)]
struct SessionsState {
    /// The session with the current leader, if one was opened.
    current: Option<Arc<Session>>,
    /// A leader that answered `Unimplemented`, and when: reached by unary calls for a while.
    without: Option<(u64, Instant)>,
}

impl Sessions {
    fn lock(&self) -> MutexGuard<'_, SessionsState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session with `leader`, if one is open.
    pub(super) fn open_to(&self, leader: u64) -> Option<Arc<Session>> {
        self.lock()
            .current
            .as_ref()
            .filter(|s| s.leader == leader && !s.is_closed())
            .cloned()
    }

    /// The open session with `leader`, opened on `client` if there is none; `None` when that
    /// leader has no sessions (use the unary calls).
    pub(super) fn with(
        self: &Arc<Self>,
        leader: u64,
        client: &RaftPeerClient<EagerChannel>,
        cluster_id: u64,
    ) -> Option<Arc<Session>> {
        let mut state = self.lock();
        if let Some((id, since)) = state.without {
            if id == leader && since.elapsed() < TRY_AGAIN {
                return None;
            }
        }
        if let Some(s) = state
            .current
            .as_ref()
            .filter(|s| s.leader == leader && !s.is_closed())
        {
            return Some(s.clone());
        }
        let session = Session::open(leader, client.clone(), cluster_id, Arc::downgrade(self));
        state.current = Some(session.clone());
        Some(session)
    }

    /// `leader` answered `Unimplemented`: it is reached by unary calls for [`TRY_AGAIN`].
    fn unsupported(&self, leader: u64) {
        self.lock().without = Some((leader, Instant::now()));
    }
}

/// One open stream to a leader and the requests waiting on it.
pub(super) struct Session {
    leader: u64,
    mux: Arc<Mux<SessionRequest, session_reply::Body, Error>>,
}

impl Session {
    /// Opens the stream on `client` and starts the task that hands out its answers.
    fn open(
        leader: u64,
        mut client: RaftPeerClient<EagerChannel>,
        cluster_id: u64,
        sessions: std::sync::Weak<Sessions>,
    ) -> Arc<Session> {
        let (mux, rx) = Mux::new();
        let mux = Arc::new(mux);
        let weak = Arc::downgrade(&mux);
        tokio::spawn(async move {
            let mut request = tonic::Request::new(UnboundedReceiverStream::new(rx));
            super::network::from_cluster(&mut request, cluster_id);
            match client.session(request).await {
                Ok(replies) => {
                    let split = |r: SessionReply| r.body.map(|body| (r.id, body));
                    pump(weak, replies.into_inner(), split, |_| Error::LeaderChanged).await;
                }
                Err(status) => {
                    // Nothing was taken from the stream by a leader that refused it.
                    let refused = status.code() == tonic::Code::Unimplemented;
                    if refused {
                        if let Some(s) = sessions.upgrade() {
                            s.unsupported(leader);
                        }
                    }
                    let e = if refused || undelivered(&status) {
                        Error::NoLeader
                    } else {
                        Error::LeaderChanged
                    };
                    if let Some(mux) = weak.upgrade() {
                        mux.close(e);
                    }
                }
            }
        });
        Arc::new(Session { leader, mux })
    }

    fn is_closed(&self) -> bool {
        self.mux.is_closed()
    }

    /// Sends `body` to the leader and waits for its answer. The caller bounds the wait (and
    /// ends it when the leader changes, see `RaftNode::on_leader`).
    ///
    /// # Errors
    /// [`Error::NoLeader`] when the request was never sent, [`Error::LeaderChanged`] when the
    /// stream ended after it may have been.
    pub(super) async fn call(&self, body: session_request::Body) -> Result<session_reply::Body> {
        let make = |id| SessionRequest {
            id,
            body: Some(body),
        };
        self.mux
            .call(make, Error::NoLeader, Error::LeaderChanged)
            .await
    }
}

impl super::RaftNode {
    /// Asks leader `leader` on this member's session with it (or by the unary call, when it
    /// has no sessions), ending with [`Error::LeaderChanged`] as soon as another leader is
    /// known (see `RaftNode::on_leader`).
    ///
    /// # Errors
    /// [`Error::NoLeader`] when the request never reached the leader (it may be sent again),
    /// [`Error::LeaderChanged`] when it may have and no answer came.
    pub(super) async fn ask_leader(
        &self,
        leader: u64,
        body: session_request::Body,
    ) -> Result<session_reply::Body> {
        use session_request::Body as Ask;
        // An open session needs no client: the channel is looked up only to open one.
        if let Some(session) = self.sessions.open_to(leader) {
            return self.until_leader_changes(leader, session.call(body)).await;
        }
        let mut client = self.leader_client(leader)?;
        if let Some(session) = self.sessions.with(leader, &client, self.cluster_id) {
            return self.until_leader_changes(leader, session.call(body)).await;
        }
        match body {
            Ask::Forward(cmd) => self
                .on_leader(leader, client.forward(cmd))
                .await
                .map(session_reply::Body::Forward),
            Ask::ReadIndex(r) => self
                .on_leader(leader, client.read_index(r))
                .await
                .map(session_reply::Body::ReadIndex),
            Ask::LeaseRenew(r) => self
                .on_leader(leader, client.lease_renew(r))
                .await
                .map(session_reply::Body::LeaseRenew),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::mux::fake::{client_of, pairs_reversed, Replies};
    use super::*;
    use crate::pb::concordpb::raft_peer_server::RaftPeer;
    use crate::pb::concordpb::{ReadIndexRequest, ReadIndexResponse};
    use tonic::{Request, Response, Status, Streaming};

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    /// A leader whose session answers each pair of requests in reverse order, with the index
    /// 10 x the request's id; or, with `hang_up`, ends the stream after the first request.
    struct FakeLeader {
        hang_up: bool,
    }

    #[tonic::async_trait]
    impl RaftPeer for FakeLeader {
        async fn session(
            &self,
            req: Request<Streaming<SessionRequest>>,
        ) -> std::result::Result<Response<Replies<SessionReply>>, Status> {
            let replies = pairs_reversed(req.into_inner(), self.hang_up, |r: SessionRequest| {
                SessionReply {
                    id: r.id,
                    body: Some(session_reply::Body::ReadIndex(ReadIndexResponse {
                        index: r.id * 10,
                        error: 0,
                    })),
                }
            });
            Ok(Response::new(replies))
        }
    }

    /// A leader without sessions: every method is the generated `Unimplemented` stub.
    struct OldLeader;

    #[tonic::async_trait]
    impl RaftPeer for OldLeader {}

    fn ask() -> session_request::Body {
        session_request::Body::ReadIndex(ReadIndexRequest {})
    }

    fn index_of(reply: Result<session_reply::Body>) -> Option<u64> {
        match reply {
            Ok(session_reply::Body::ReadIndex(r)) => Some(r.index),
            _ => None,
        }
    }

    #[tokio::test]
    async fn answers_reach_their_own_requests_whatever_their_order() -> TestResult {
        let sessions = Arc::new(Sessions::default());
        let client = client_of(FakeLeader { hang_up: false });
        let session = sessions.with(7, &client, 1).ok_or("a session")?;
        // `join!` polls the first call first, so it sends id 1; the leader answers id 2 first.
        let (first, second) = tokio::join!(session.call(ask()), session.call(ask()));
        assert_eq!(
            [index_of(first), index_of(second)],
            [Some(10), Some(20)],
            "each call gets the answer to its own id"
        );
        let again = sessions.with(7, &client, 1).ok_or("a session")?;
        assert!(Arc::ptr_eq(&session, &again), "one session per leader");
        let open = sessions.open_to(7).ok_or("the open session")?;
        assert!(Arc::ptr_eq(&session, &open));
        assert!(
            sessions.open_to(8).is_none(),
            "no session with another leader"
        );
        assert_eq!(session.mux.waiting(), 0);
        assert!(!session.is_closed());
        Ok(())
    }

    #[tokio::test]
    async fn a_stream_that_ends_fails_its_waiting_requests_as_maybe_delivered() -> TestResult {
        let sessions = Arc::new(Sessions::default());
        let client = client_of(FakeLeader { hang_up: true });
        let session = sessions.with(7, &client, 1).ok_or("a session")?;
        let reply = session.call(ask()).await;
        assert!(matches!(reply, Err(Error::LeaderChanged)), "{reply:?}");
        assert!(session.is_closed());
        assert!(
            sessions.open_to(7).is_none(),
            "a closed session is not handed out"
        );
        let next = sessions.with(7, &client, 1).ok_or("a new session")?;
        assert!(
            !Arc::ptr_eq(&session, &next),
            "a closed session is replaced"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_leader_without_sessions_is_asked_by_unary_calls() -> TestResult {
        let sessions = Arc::new(Sessions::default());
        let client = client_of(OldLeader);
        let session = sessions
            .with(7, &client, 1)
            .ok_or("a session is tried first")?;
        let reply = session.call(ask()).await;
        assert!(
            matches!(reply, Err(Error::NoLeader)),
            "never delivered: {reply:?}"
        );
        assert!(
            sessions.with(7, &client, 1).is_none(),
            "unary calls for a while"
        );
        sessions.lock().without = Instant::now().checked_sub(TRY_AGAIN).map(|t| (7, t));
        assert!(
            sessions.with(7, &client, 1).is_some(),
            "a session is tried again after a while (the leader may have been upgraded)"
        );
        assert!(
            sessions.with(8, &client, 1).is_some(),
            "another leader is tried again"
        );
        Ok(())
    }
}
