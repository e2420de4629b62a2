//! Member-to-member transport, client side: openraft RPCs over Concord's `RaftPeer` gRPC service,
//! with bincode-encoded openraft messages as payload. Appends go on the peer's replication
//! stream (`replicate.rs`), votes and snapshot chunks as calls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use std::future::Future;

use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed,
    StreamingError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::storage::Snapshot;
use openraft::{BasicNode, OptionalSend, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::Endpoint;
use tonic::Status;

use crate::transport::{eager, EagerChannel};

use super::replicate::Pipes;
use super::TypeConfig;
use crate::pb::concordpb::raft_peer_client::RaftPeerClient;
use crate::pb::concordpb::RaftPayload;

/// How long sent data may stay unacknowledged on a peer connection before the kernel closes it
/// when no election timeout is known (a member asking others for its identity at start).
pub const UNACKED: Duration = Duration::from_secs(1);

/// Opens a lazily connected gRPC channel to a peer URL (requests end with their data frame);
/// a connection whose data stays unacknowledged for `unacked` is dropped (see
/// [`crate::transport::connector`]).
///
/// # Errors
/// When the URL is not a valid endpoint.
pub fn peer_channel(
    addr: &str,
    unacked: Duration,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<EagerChannel, tonic::transport::Error> {
    let tls = tls.filter(|_| crate::tls::is_https(addr));
    if let Some(path) = crate::config::unix_socket(addr) {
        return Ok(eager(
            Endpoint::from_static("http://unix.socket")
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(5))
                .connect_with_connector_lazy(crate::transport::unix_connector(
                    path.to_string(),
                    Duration::from_millis(500),
                    tls,
                )),
        ));
    }
    // The connector does TLS itself; tonic sees a plain URL.
    let plain = match addr.strip_prefix("https://") {
        Some(rest) => format!("http://{rest}"),
        None => addr.to_string(),
    };
    Ok(eager(
        Endpoint::from_shared(plain)?
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .connect_with_connector_lazy(crate::transport::connector(
                Duration::from_millis(500),
                Some(unacked),
                tls,
            )),
    ))
}

/// What the transport shares with the rest of the member.
pub struct Links {
    /// This member's cluster: sent with every Raft message, checked by the receiver.
    pub cluster_id: u64,
    /// Raised when a peer refuses this member as removed from the cluster.
    pub removed: Arc<watch::Sender<bool>>,
    /// While set, no appends or heartbeats go out (leadership transfer).
    pub quiet: AtomicBool,
    /// When each peer last answered a Raft message.
    contacts: std::sync::Mutex<std::collections::HashMap<u64, Instant>>,
    /// The election clock, told when a leader answers this member directly.
    elector: Arc<super::election::Elector>,
    /// Per peer, how many times it said it is back (a `Hello` as it started, or a PreVote).
    returns: std::sync::Mutex<std::collections::HashMap<u64, watch::Sender<u64>>>,
}

impl Links {
    /// Links of a member of `cluster_id`.
    pub fn new(
        cluster_id: u64,
        removed: Arc<watch::Sender<bool>>,
        elector: Arc<super::election::Elector>,
    ) -> Self {
        Links {
            cluster_id,
            removed,
            quiet: AtomicBool::new(false),
            contacts: std::sync::Mutex::new(std::collections::HashMap::new()),
            elector,
            returns: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Peer `id` reached this member, so it is up: a replication stream waiting to try it again
    /// tries at once (see [`PeerClient`]).
    pub fn peer_back(&self, id: u64) {
        self.returns_of(id).send_modify(|n| *n += 1);
    }

    /// Every waiting replication stream tries its peer at once (a leadership transfer's quiet
    /// ended: appends may go out again).
    pub fn wake_all(&self) {
        let returns = match self.returns.lock() {
            Ok(r) => r,
            Err(poisoned) => poisoned.into_inner(),
        };
        for r in returns.values() {
            r.send_modify(|n| *n += 1);
        }
    }

    /// A receiver of peer `id`'s returns.
    fn returns(&self, id: u64) -> watch::Receiver<u64> {
        self.returns_of(id).subscribe()
    }

    fn returns_of(&self, id: u64) -> watch::Sender<u64> {
        let mut returns = match self.returns.lock() {
            Ok(r) => r,
            Err(poisoned) => poisoned.into_inner(),
        };
        returns
            .entry(id)
            .or_insert_with(|| watch::channel(0).0)
            .clone()
    }

    /// Whether peer `id` answered a Raft message within `within` (etcd's "active" peers).
    pub fn reached_within(&self, id: u64, within: Duration) -> bool {
        let contacts = match self.contacts.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        contacts.get(&id).is_some_and(|t| t.elapsed() <= within)
    }

    fn touch(&self, id: u64) {
        let mut contacts = match self.contacts.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        contacts.insert(id, Instant::now());
    }
}

/// Builds [`PeerClient`]s over the member's shared peer channels.
#[derive(Clone)]
pub struct NetworkFactory {
    links: Arc<Links>,
    channels: Arc<PeerChannels>,
    pipes: Arc<Pipes>,
    retry: Duration,
}

impl NetworkFactory {
    /// A factory whose clients share `links` and the connections of `channels`, and retry an
    /// unreachable peer about every `retry` (one heartbeat interval; see [`PeerClient`]).
    pub fn new(links: Arc<Links>, channels: Arc<PeerChannels>, retry: Duration) -> Self {
        NetworkFactory {
            links,
            channels,
            pipes: Arc::default(),
            retry,
        }
    }
}

/// The gRPC metadata key carrying the sender's cluster ID on Raft messages: a member refuses
/// messages from another cluster (etcd's `X-Etcd-Cluster-ID`).
pub const CLUSTER_ID_KEY: &str = "concord-cluster-id";

/// Marks `request` as sent by a member of `cluster_id` (see [`CLUSTER_ID_KEY`]).
pub fn from_cluster<T>(request: &mut tonic::Request<T>, cluster_id: u64) {
    if let Ok(v) = format!("{cluster_id:x}").parse() {
        request.metadata_mut().insert(CLUSTER_ID_KEY, v);
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerClient {
        let addr = super::first_url(&node.addr).to_string();
        PeerClient {
            target,
            // openraft 0.9 asks for a client per replication stream and also per leadership
            // check (every read-index round): a channel of their own made each round open a
            // TCP connection to every follower (measured: ~1,900 connects/s under reads).
            client: self.channels.client(&addr).ok(),
            addr,
            pipes: self.pipes.clone(),
            back: self.links.returns(target),
            links: self.links.clone(),
            retry: self.retry,
            unreachable: false,
            last: Method::Append { entries: false },
        }
    }
}

/// The openraft client of one peer.
///
/// After a call that found no connection to the peer, an append waits up to half a heartbeat
/// interval before it goes out, unless the peer says it is back (a `Hello` as it starts, or a
/// PreVote) or a leadership transfer's quiet ends. A leader then reaches a restarted member
/// within milliseconds of its start, where openraft alone would wait out the whole retry
/// interval (measured on 3 local members: the restarted member's first served write 26 ms
/// after its start instead of 73, median). With openraft's own backoff kept short (see
/// [`RaftNetwork::backoff`]), a peer that stays down is tried every 0.6–1.1 heartbeats (every
/// heartbeat before). An append that waited the whole half goes out with the half of its time
/// that is left: after a partition heals (no `Hello`), a long first append may time out once;
/// the next one has its whole time.
pub struct PeerClient {
    target: u64,
    addr: String,
    client: Option<RaftPeerClient<EagerChannel>>,
    /// The member's replication streams: appends go on the peer's (see [`super::replicate`]).
    pipes: Arc<Pipes>,
    links: Arc<Links>,
    retry: Duration,
    /// The peer's returns, marked seen when a call found it unreachable.
    back: watch::Receiver<u64>,
    /// Whether the last call found no connection to the peer (or was not sent: a leadership
    /// transfer's quiet, a bad address).
    unreachable: bool,
    /// What the last call was (a snapshot chunk keeps the whole backoff between its retries).
    last: Method,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

impl PeerClient {
    async fn call<Req, Resp, E>(
        &mut self,
        method: Method,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<u64, BasicNode, RaftError<u64, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let started = Instant::now();
        if self.unreachable && matches!(method, Method::Append { .. }) {
            let _ = tokio::time::timeout(self.retry / 2, self.back.changed()).await;
        }
        // Seen before the call: a return signalled while it runs wakes the next wait.
        self.back.borrow_and_update();
        self.unreachable = false;
        self.last = method;
        self.try_call(method, req, option.hard_ttl(), started).await
    }

    /// Sends `req` and waits for the answer until `limit` after `called`; an append that
    /// carries entries gets at most [`append_time`] for its size.
    async fn try_call<Req, Resp, E>(
        &mut self,
        method: Method,
        req: &Req,
        limit: Duration,
        called: Instant,
    ) -> Result<Resp, RPCError<u64, BasicNode, RaftError<u64, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        if matches!(method, Method::Append { .. }) && self.links.quiet.load(Ordering::SeqCst) {
            self.unreachable = true;
            let e = TransportError("quiet: leadership transfer in progress".into());
            return Err(RPCError::Unreachable(Unreachable::new(&e)));
        }
        let Some(client) = self.client.as_mut() else {
            self.unreachable = true;
            let e = TransportError(format!("bad peer address {}", self.addr));
            return Err(RPCError::Unreachable(Unreachable::new(&e)));
        };
        let encode =
            || bincode::serialize(req).map_err(|e| RPCError::Network(NetworkError::new(&e)));
        let mut data = Some(encode()?);
        let size = data.as_ref().map_or(0, Vec::len);
        let limit = match method {
            Method::Append { entries: true } => limit.min(append_time(self.retry, size)),
            _ => limit,
        };
        let deadline = limit.saturating_sub(called.elapsed());
        let started = Instant::now();
        let mut reply = Err(Status::unimplemented("no replication stream"));
        if let Method::Append { entries } = method {
            let lane = (self.addr.as_str(), entries);
            if let Some(pipe) = self.pipes.to(lane, client, self.links.cluster_id) {
                if let Some(data) = data.take() {
                    reply = pipe.call_within(data, deadline).await;
                }
            }
        }
        // Not sent on a stream (a vote, a snapshot chunk, a peer without streams): a call.
        if matches!(&reply, Err(s) if s.code() == tonic::Code::Unimplemented) {
            let data = match data.take() {
                Some(data) => data,
                None => encode()?,
            };
            let mut request = tonic::Request::new(RaftPayload { data });
            request.set_timeout(deadline.saturating_sub(started.elapsed()));
            from_cluster(&mut request, self.links.cluster_id);
            reply = match method {
                Method::Append { .. } => client.append_entries(request).await,
                Method::Vote => client.vote(request).await,
                Method::Snapshot => client.install_snapshot(request).await,
            }
            .map(|r| r.into_inner().data);
        }
        if let Err(s) = &reply {
            // No connection (refused or reset): the peer is down or its process is. A deadline
            // that passed is not this (the next append must not lose time), nor is a connect to
            // a cut-off peer, which outlasts openraft's own time limit and ends as its timeout.
            self.unreachable = s.code() == tonic::Code::Unavailable;
            if s.code() == tonic::Code::FailedPrecondition && s.message() == super::REMOVED_MESSAGE
            {
                tracing::error!(peer = self.target, "{}", super::REMOVED_MESSAGE);
                self.links.removed.send_replace(true);
            }
        }
        if reply.is_ok() {
            self.links.touch(self.target);
            crate::metrics::observe_peer_rtt(self.target, started.elapsed());
        }
        let reply = reply.map_err(|s| {
            let e = TransportError(format!("{}: {}", s.code(), s.message()));
            RPCError::Unreachable(Unreachable::new(&e))
        })?;
        let decoded: Result<Resp, RaftError<u64, E>> =
            bincode::deserialize(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        decoded.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl PeerClient {
    /// Whether the peer answers at all: a `Hello` naming no member (so it wakes nothing there),
    /// given ten heartbeat intervals.
    async fn probe(&mut self) -> Result<(), String> {
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| format!("bad peer address {}", self.addr))?;
        let mut request = tonic::Request::new(crate::pb::concordpb::HelloRequest { member: 0 });
        request.set_timeout(self.retry * 10);
        from_cluster(&mut request, self.links.cluster_id);
        match client.hello(request).await {
            Ok(_) => {
                self.links.touch(self.target);
                Ok(())
            }
            Err(s) => Err(format!("{}: {}", s.code(), s.message())),
        }
    }
}

/// How long an append of `size` encoded bytes may wait for its answer: one heartbeat interval,
/// plus one more for each MiB it carries. The follower answers only once the entries are on its
/// disk, and a message of a MiB or more (at most 1 MiB of entries, or one entry of up to twice
/// `--max-request-bytes`) may take longer than a heartbeat interval to cross a link and be
/// synced; abandoned at that point it was sent again from the same index, each time too late
/// (RELIABILITY.md, bug 8). openraft caps it at one election timeout (its vendored patch).
fn append_time(heartbeat: Duration, size: usize) -> Duration {
    const MIB: u128 = 1 << 20;
    let extra = heartbeat.as_nanos().saturating_mul(size as u128) / MIB;
    heartbeat.saturating_add(Duration::from_nanos(
        u64::try_from(extra).unwrap_or(u64::MAX),
    ))
}

#[derive(Clone, Copy)]
enum Method {
    /// An AppendEntries; `entries` unless a heartbeat (each kind has its own stream to the
    /// peer, so a heartbeat never waits behind a large append's data).
    Append {
        entries: bool,
    },
    Vote,
    Snapshot,
}

impl RaftNetwork<TypeConfig> for PeerClient {
    /// An unreachable peer is tried again about every heartbeat interval, not openraft's
    /// 500 ms: a member back from a pause or a partition hears its leader (and serves) that much
    /// sooner. A try costs a refused or timed-out connect at most. Most of the interval is
    /// spent in the next append's wait (see [`PeerClient`]), which a returning peer cuts short;
    /// openraft's own pause, which nothing cuts short, is a tenth of it. Between the retries of
    /// a snapshot chunk (openraft gives up after a few) the pause stays a whole heartbeat, so a
    /// follower's brief reconnect does not abort a long transfer.
    fn backoff(&self) -> Backoff {
        let pause = match self.last {
            Method::Snapshot => self.retry,
            Method::Append { .. } | Method::Vote => self.retry / 10,
        };
        Backoff::new(std::iter::repeat(pause))
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let method = Method::Append {
            entries: !rpc.entries.is_empty(),
        };
        let resp = self.call(method, &rpc, &option).await?;
        // The peer refused as the leader of a newer term: a deposed leader (back from a pause
        // or a partition) has just heard its successor, and follows it from now on. Counting
        // that as hearing the leader lets it forward its clients' requests at once, instead of
        // waiting up to a heartbeat or two for the new leader's next append to reach it (etcd's
        // buffered heartbeats reach it at once).
        if let AppendEntriesResponse::HigherVote(v) = &resp {
            if v.is_committed() && v.leader_id().voted_for() == Some(self.target) {
                self.links.elector.heard_leader();
            }
        }
        Ok(resp)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        let piece = super::snapshot_piece::Outgoing(&rpc);
        self.call(Method::Snapshot, &piece, &option).await
    }

    /// A snapshot in pieces of openraft's chunked protocol, each through
    /// [`Self::install_snapshot`], with three additions to openraft's own sender. A peer that does not answer a `Hello` is reported unreachable before the state
    /// is written out for it: openraft tries again after a pause, and a member that stays down
    /// costs no copies of the state. The pieces go out as the snapshot is written into them,
    /// with no file ([`super::snapshot_send`]), and a failure to read the state fails this
    /// transfer, not the leader. The transfer is counted once, as etcd counts them.
    async fn full_snapshot(
        &mut self,
        vote: Vote<u64>,
        snapshot: Snapshot<TypeConfig>,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<u64>, StreamingError<TypeConfig, Fatal<u64>>> {
        self.last = Method::Snapshot;
        if let Err(e) = self.probe().await {
            // openraft's pause before the next try is the appends' (a tenth of a heartbeat
            // interval): wait here for the peer to say it is back, at most five intervals.
            self.back.borrow_and_update();
            tokio::select! {
                closed = cancel => return Err(StreamingError::Closed(closed)),
                _ = tokio::time::timeout(self.retry * 5, self.back.changed()) => {}
            }
            let e = TransportError(format!("no snapshot made for an unreachable peer: {e}"));
            return Err(StreamingError::Unreachable(Unreachable::new(&e)));
        }
        let source = match snapshot.snapshot.into_source().await {
            Ok(source) => source,
            Err(e) => {
                tracing::warn!(error = %e, peer = self.target, "making a snapshot to send");
                return Err(StreamingError::Network(NetworkError::new(&e)));
            }
        };
        let res =
            super::snapshot_send::send(self, vote, snapshot.meta, source, cancel, option).await;
        let how = match &res {
            Ok(r) if r.vote == vote => crate::metrics::SnapshotTransfer::Sent,
            _ => crate::metrics::SnapshotTransfer::SendFailed,
        };
        crate::metrics::count_snapshot_transfer(how, self.target);
        res
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.call(Method::Vote, &rpc, &option).await
    }
}

/// Cached channels to peers, by URL, for forwarded writes and read-index requests.
pub struct PeerChannels {
    channels: std::sync::Mutex<std::collections::HashMap<String, EagerChannel>>,
    unacked: Duration,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl PeerChannels {
    /// Channels whose connections are dropped after `unacked` of unacknowledged data (one
    /// election timeout: a peer cut off that long is replaced anyway).
    /// `tls` dials `https://` peers.
    pub fn new(unacked: Duration, tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        PeerChannels {
            channels: std::sync::Mutex::new(std::collections::HashMap::new()),
            unacked,
            tls,
        }
    }

    /// A client for the peer at `addr`, reusing its channel.
    ///
    /// # Errors
    /// When the URL is not a valid endpoint.
    pub fn client(
        &self,
        addr: &str,
    ) -> Result<RaftPeerClient<EagerChannel>, tonic::transport::Error> {
        let mut map = match self.channels.lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(c) = map.get(addr) {
            return Ok(peer_client(c.clone()));
        }
        let channel = peer_channel(addr, self.unacked, self.tls.clone())?;
        map.insert(addr.to_string(), channel.clone());
        Ok(peer_client(channel))
    }
}

/// A `RaftPeer` client on `channel` that takes answers of any size: a forwarded write's answer
/// (a txn's ranges) is as large as the client's own limits allow, and must not fail at gRPC's
/// 4 MiB default (which on a session would end every request waiting on it).
pub(super) fn peer_client(channel: EagerChannel) -> RaftPeerClient<EagerChannel> {
    RaftPeerClient::new(channel).max_decoding_message_size(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::Vote;

    #[test]
    fn an_append_gets_a_heartbeat_interval_and_one_more_per_mib() {
        let hb = Duration::from_millis(100);
        assert_eq!(append_time(hb, 0), hb);
        assert_eq!(append_time(hb, 4096), Duration::from_nanos(100_390_625));
        assert_eq!(append_time(hb, 1 << 20), Duration::from_millis(200));
        assert_eq!(append_time(hb, 3 << 20), Duration::from_millis(400));
        assert_eq!(append_time(Duration::MAX, usize::MAX), Duration::MAX);
    }

    fn heartbeat() -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        }
    }

    #[tokio::test]
    async fn an_append_after_an_unreachable_peer_waits_until_the_peer_says_it_is_back() {
        let elector = Arc::new(super::super::election::Elector::new(
            Duration::from_secs(1),
            Duration::from_millis(100),
        ));
        let links = Arc::new(Links::new(1, Arc::new(watch::channel(false).0), elector));
        let channels = Arc::new(PeerChannels::new(Duration::from_secs(1), None));
        // A retry interval of an hour: half an hour of waiting, unless woken.
        let mut factory = NetworkFactory::new(links.clone(), channels, Duration::from_secs(3600));
        // Nothing listens on port 1: every call is refused.
        let mut client = factory
            .new_client(2, &BasicNode::new("http://127.0.0.1:1"))
            .await;
        let option = RPCOption::new(Duration::from_secs(3600));
        let first = client.append_entries(heartbeat(), option.clone()).await;
        assert!(matches!(first, Err(RPCError::Unreachable(_))), "{first:?}");

        let second = tokio::spawn(async move {
            let r = client.append_entries(heartbeat(), option).await;
            (client, r)
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !second.is_finished(),
            "the append waits for the peer to come back"
        );
        links.peer_back(3);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !second.is_finished(),
            "another peer's return does not wake it"
        );
        links.peer_back(2);
        let Ok(Ok((mut client, r))) = tokio::time::timeout(Duration::from_secs(30), second).await
        else {
            panic!("not woken by the peer's return");
        };
        assert!(matches!(r, Err(RPCError::Unreachable(_))), "{r:?}");

        // The end of a leadership transfer's quiet wakes every waiting stream.
        let third = tokio::spawn(async move {
            let r = client
                .append_entries(heartbeat(), RPCOption::new(Duration::from_secs(3600)))
                .await;
            (client, r)
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!third.is_finished(), "the append waits again");
        links.wake_all();
        let Ok(Ok((mut client, r))) = tokio::time::timeout(Duration::from_secs(30), third).await
        else {
            panic!("not woken by the end of the quiet");
        };
        assert!(matches!(r, Err(RPCError::Unreachable(_))), "{r:?}");

        // A vote is never held back.
        let vote = client.vote(
            VoteRequest::new(Vote::new(2, 1), None),
            RPCOption::new(Duration::from_secs(3600)),
        );
        let Ok(vote) = tokio::time::timeout(Duration::from_secs(30), vote).await else {
            panic!("a vote goes out at once");
        };
        assert!(matches!(vote, Err(RPCError::Unreachable(_))), "{vote:?}");
    }
}
