//! Member-to-member transport, server side: the `RaftPeer` gRPC service. Hands openraft messages
//! to openraft (a leader's appends as unary calls, or as messages on its replication stream, see
//! `replicate.rs`), proposes writes forwarded by followers, and answers read-index requests (as
//! unary calls, or as messages on a follower's session stream, see `session.rs`).

use std::sync::Arc;

use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use openraft::raft::AppendEntriesResponse;

use super::RaftNode;
use crate::apply::Command;
use crate::error::Error;
use crate::pb::concordpb::raft_peer_server::RaftPeer;
use crate::pb::concordpb::{session_reply, session_request};
use crate::pb::concordpb::{
    ForwardResponse, HelloReply, HelloRequest, LeaseRenewResponse, LeaseTimeToLiveReply,
    MemberChange, MemberChangeReply, MembersReply, MembersRequest, PreVoteReply, PreVoteRequest,
    RaftPayload, ReadIndexRequest, ReadIndexResponse, ReplicateReply, ReplicateRequest,
    SessionReply, SessionRequest, TimeoutNowReply, TimeoutNowRequest,
};
use crate::pb::etcdserverpb::{
    HashKvRequest, HashKvResponse, LeaseKeepAliveRequest, LeaseTimeToLiveRequest,
};

/// The `RaftPeer` service of one member.
pub struct PeerService {
    node: Arc<RaftNode>,
    /// Says `true` when the member stops: its peers' streams end then, so that the
    /// server's graceful shutdown does not wait for streams that never end by themselves.
    stop: watch::Receiver<bool>,
}

impl PeerService {
    /// Serves peers on behalf of `node` until `stop` says `true`.
    pub fn new(node: Arc<RaftNode>, stop: watch::Receiver<bool>) -> Self {
        PeerService { node, stop }
    }

    /// Resolves when the member stops (or its stop signal is gone).
    fn stopping(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut stop = self.stop.clone();
        async move {
            let _ = stop.wait_for(|s| *s).await;
        }
    }
}

impl PeerService {
    /// Refuses a Raft message sent by a member of another cluster.
    fn check_cluster<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let sender = req
            .metadata()
            .get(super::network::CLUSTER_ID_KEY)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| u64::from_str_radix(v, 16).ok());
        match sender {
            Some(id) if id != self.node.cluster_id => Err(Status::failed_precondition(format!(
                "cluster ID mismatch: the message is from cluster {id:x}, this is {:x}",
                self.node.cluster_id
            ))),
            _ => Ok(()),
        }
    }

    /// Member `id` reached this one: a replication stream waiting to retry it goes at once.
    /// An ID that is not a member is ignored.
    fn peer_back(&self, id: u64) {
        if self.node.members().0.contains_key(&id) {
            self.node.links.peer_back(id);
        }
    }
}

fn decode<T: DeserializeOwned>(req: Request<RaftPayload>) -> Result<T, Status> {
    bincode::deserialize(&req.into_inner().data).map_err(bad_payload)
}

/// A peer's message that does not decode.
fn bad_payload(e: bincode::Error) -> Status {
    Status::invalid_argument(format!("bad raft payload: {e}"))
}

fn encode<T: Serialize>(v: &T) -> Result<Response<RaftPayload>, Status> {
    bincode::serialize(v)
        .map(|data| Response::new(RaftPayload { data }))
        .map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.check_cluster(&req)?;
        let data = append_reply(&self.node, &req.into_inner().data).await?;
        Ok(Response::new(RaftPayload { data }))
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.check_cluster(&req)?;
        let vote: openraft::raft::VoteRequest<u64> = decode(req)?;
        // A removed member that missed its removal campaigns; tell it, and it stops.
        if self
            .node
            .was_removed(vote.vote.leader_id().voted_for().unwrap_or(0))
        {
            return Err(Status::failed_precondition(super::REMOVED_MESSAGE));
        }
        let res = self.node.raft.vote(vote).await;
        // Granting a vote restarts the election timer, as in etcd.
        if matches!(&res, Ok(r) if r.vote_granted) {
            self.node.elector.restart_timer();
        }
        encode(&res)
    }

    async fn members(&self, _: Request<MembersRequest>) -> Result<Response<MembersReply>, Status> {
        Ok(Response::new(MembersReply {
            cluster_id: self.node.cluster_id,
            members: self.node.member_list(),
        }))
    }

    async fn change_members(
        &self,
        req: Request<MemberChange>,
    ) -> Result<Response<MemberChangeReply>, Status> {
        let reply = match self.node.change_members_local(req.into_inner()).await {
            Ok((member, members)) => MemberChangeReply {
                member: Some(member),
                members,
                error: 0,
            },
            Err(e) => MemberChangeReply {
                error: e.code(),
                ..Default::default()
            },
        };
        Ok(Response::new(reply))
    }

    async fn hash_kv(
        &self,
        req: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        let (hash, compact_revision, _) = self
            .node
            .mvcc
            .hash_kv(req.get_ref().revision)
            .map_err(crate::rpc::status::status)?;
        Ok(Response::new(HashKvResponse {
            header: None,
            hash,
            compact_revision,
        }))
    }

    async fn timeout_now(
        &self,
        _: Request<TimeoutNowRequest>,
    ) -> Result<Response<TimeoutNowReply>, Status> {
        self.node
            .raft
            .trigger()
            .elect()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(TimeoutNowReply {}))
    }

    async fn pre_vote(
        &self,
        req: Request<PreVoteRequest>,
    ) -> Result<Response<PreVoteReply>, Status> {
        self.check_cluster(&req)?;
        self.peer_back(req.get_ref().candidate);
        Ok(Response::new(self.node.pre_vote_reply(req.get_ref()).await))
    }

    async fn hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        self.check_cluster(&req)?;
        self.peer_back(req.get_ref().member);
        Ok(Response::new(HelloReply {}))
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.check_cluster(&req)?;
        let snapshot =
            super::snapshot_piece::decode(&req.into_inner().data).map_err(bad_payload)?;
        let (vote, last) = (snapshot.vote, snapshot.done);
        let res = self.node.raft.install_snapshot(snapshot).await;
        if matches!(&res, Ok(r) if r.vote == vote) {
            self.node.elector.heard_leader();
        }
        if let (true, Some(from)) = (last, vote.leader_id().voted_for()) {
            let how = match &res {
                Ok(r) if r.vote == vote => crate::metrics::SnapshotTransfer::Received,
                _ => crate::metrics::SnapshotTransfer::ReceiveFailed,
            };
            crate::metrics::count_snapshot_transfer(how, from);
        }
        encode(&res)
    }

    async fn forward(&self, req: Request<Command>) -> Result<Response<ForwardResponse>, Status> {
        self.check_cluster(&req)?;
        Ok(Response::new(
            forward_reply(&self.node, req.into_inner()).await,
        ))
    }

    async fn lease_renew(
        &self,
        req: Request<LeaseKeepAliveRequest>,
    ) -> Result<Response<LeaseRenewResponse>, Status> {
        Ok(Response::new(
            lease_renew_reply(&self.node, req.get_ref().id).await,
        ))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveReply>, Status> {
        let result = if self.node.leader() == Some(self.node.id) {
            self.node.time_to_live_local(req.get_ref())
        } else {
            Err(Error::LeaderChanged)
        };
        let reply = match result {
            Ok(r) => LeaseTimeToLiveReply {
                response: Some(r),
                error: 0,
            },
            Err(e) => LeaseTimeToLiveReply {
                response: None,
                error: e.code(),
            },
        };
        Ok(Response::new(reply))
    }

    async fn read_index(
        &self,
        _: Request<ReadIndexRequest>,
    ) -> Result<Response<ReadIndexResponse>, Status> {
        Ok(Response::new(read_index_reply(&self.node).await))
    }

    async fn session(
        &self,
        req: Request<Streaming<SessionRequest>>,
    ) -> Result<Response<Replies<SessionReply>>, Status> {
        self.check_cluster(&req)?;
        // A write waits for its commit, a read index for its round.
        let replies = self.each_on_its_own(req.into_inner(), |node, request| async move {
            let body = answer(&node, request.body?).await;
            Some(SessionReply {
                id: request.id,
                body: Some(body),
            })
        });
        Ok(Response::new(replies))
    }

    async fn replicate(
        &self,
        req: Request<Streaming<ReplicateRequest>>,
    ) -> Result<Response<Replies<ReplicateReply>>, Status> {
        self.check_cluster(&req)?;
        // As each unary call did: a heartbeat of a read-index round does not wait behind an
        // append's log write.
        let replies = self.each_on_its_own(req.into_inner(), |node, request| async move {
            Some(match append_reply(&node, &request.data).await {
                Ok(data) => ReplicateReply {
                    id: request.id,
                    data,
                    ..Default::default()
                },
                Err(status) => ReplicateReply {
                    id: request.id,
                    data: Vec::new(),
                    code: status.code() as i32,
                    message: status.message().to_string(),
                },
            })
        });
        Ok(Response::new(replies))
    }
}

/// The answers of a peer's long-lived stream, as they finish.
type Replies<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

impl PeerService {
    /// Runs `handle` on each request of a peer's stream, each on a task of its own; the answers
    /// (`None`: none) stream back as they finish. The stream ends after the peer's end and the
    /// last answer, or when this member stops.
    fn each_on_its_own<Req, Rep, F, Fut>(
        &self,
        mut requests: Streaming<Req>,
        handle: F,
    ) -> Replies<Rep>
    where
        Req: Send + 'static,
        Rep: Send + 'static,
        F: Fn(Arc<RaftNode>, Req) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Option<Rep>> + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        let node = self.node.clone();
        let stopping = self.stopping();
        tokio::spawn(async move {
            tokio::pin!(stopping);
            loop {
                let request = tokio::select! {
                    r = requests.next() => r,
                    () = &mut stopping => None,
                };
                let Some(Ok(request)) = request else { break };
                let work = handle(node.clone(), request);
                let tx = tx.clone();
                tokio::spawn(async move {
                    if let Some(reply) = work.await {
                        let _ = tx.send(Ok(reply));
                    }
                });
            }
        });
        Box::pin(UnboundedReceiverStream::new(rx).take_until(self.stopping()))
    }
}

/// Hands an encoded AppendEntries to openraft and encodes its answer.
async fn append_reply(node: &RaftNode, data: &[u8]) -> Result<Vec<u8>, Status> {
    let rpc = bincode::deserialize(data).map_err(bad_payload)?;
    let res = node.raft.append_entries(rpc).await;
    // Accepted from a leader this member follows: the election timer restarts.
    if matches!(&res, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
        node.elector.heard_leader();
    }
    bincode::serialize(&res).map_err(|e| Status::internal(e.to_string()))
}

/// The leader's answer to one session request: what the matching unary call answers.
async fn answer(node: &RaftNode, body: session_request::Body) -> session_reply::Body {
    match body {
        session_request::Body::Forward(cmd) => {
            session_reply::Body::Forward(forward_reply(node, cmd).await)
        }
        session_request::Body::ReadIndex(_) => {
            session_reply::Body::ReadIndex(read_index_reply(node).await)
        }
        session_request::Body::LeaseRenew(r) => {
            session_reply::Body::LeaseRenew(lease_renew_reply(node, r.id).await)
        }
    }
}

/// Proposes a forwarded write here, or refuses it: a forwarded write is never forwarded again.
async fn forward_reply(node: &RaftNode, cmd: Command) -> ForwardResponse {
    match node.propose_local(cmd).await {
        Ok(result) => ForwardResponse {
            result: Some(result),
            error: 0,
        },
        Err(e) => ForwardResponse {
            result: None,
            error: e.code(),
        },
    }
}

/// The read index from this leader's batched confirmation round, or why there is none.
async fn read_index_reply(node: &RaftNode) -> ReadIndexResponse {
    match node.leader_read_index().await {
        Ok(index) => ReadIndexResponse { index, error: 0 },
        Err(e) => ReadIndexResponse {
            index: 0,
            error: e.code(),
        },
    }
}

/// Renews lease `id` on this member; `renew_on_leader` refuses with `LeaderChanged` unless it
/// leads.
async fn lease_renew_reply(node: &RaftNode, id: i64) -> LeaseRenewResponse {
    match node.renew_on_leader(id).await {
        Ok(ttl) => LeaseRenewResponse { ttl, error: 0 },
        Err(e) => LeaseRenewResponse {
            ttl: 0,
            error: e.code(),
        },
    }
}
