//! gRPC clients to every member over lazily connected channels, with per-call deadlines (a
//! paused member never answers, so every call is bounded).

use std::future::Future;
use std::time::Duration;

use concord::pb::etcdserverpb::kv_client::KvClient;
use concord::pb::etcdserverpb::lease_client::LeaseClient;
use concord::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use concord::pb::etcdserverpb::watch_client::WatchClient;
use concord::pb::etcdserverpb::StatusRequest;
use concord::pb::v3lockpb::lock_client::LockClient;
use tonic::transport::{Channel, Endpoint};

use crate::history::CallOutcome;

/// How long a client waits for one answer before it counts the call as timed out.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// One channel per member.
#[derive(Clone)]
pub struct Clients {
    channels: Vec<Channel>,
}

/// What a bounded call produced: an answer, an error status, or nothing in time.
pub enum Outcome<T> {
    /// The server answered.
    Ok(T),
    /// The server (or the transport) answered with an error.
    Err(tonic::Status),
    /// No answer within the deadline: the call may or may not have taken effect.
    Timeout,
}

impl<T> Outcome<T> {
    /// How the call ended, for availability.
    pub fn call_outcome(&self) -> CallOutcome {
        match self {
            Outcome::Ok(_) => CallOutcome::Ok,
            Outcome::Err(_) => CallOutcome::Failed,
            Outcome::Timeout => CallOutcome::Timeout,
        }
    }

    /// The answer, if there was one.
    pub fn ok(self) -> Option<T> {
        match self {
            Outcome::Ok(t) => Some(t),
            _ => None,
        }
    }
}

impl Clients {
    /// Channels to `urls` (connected on first use, reconnected after a member restarts).
    pub fn new(urls: &[String]) -> anyhow::Result<Clients> {
        let mut channels = Vec::new();
        for url in urls {
            let ch = Endpoint::from_shared(url.clone())?
                .connect_timeout(Duration::from_millis(500))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(1))
                .keep_alive_timeout(Duration::from_secs(2))
                .connect_lazy();
            channels.push(ch);
        }
        Ok(Clients { channels })
    }

    /// How many members there are.
    pub fn len(&self) -> usize {
        self.channels.len()
    }

    fn channel(&self, m: usize) -> Channel {
        let i = m % self.channels.len().max(1);
        self.channels[i].clone()
    }

    /// A KV client to member `m`.
    pub fn kv(&self, m: usize) -> KvClient<Channel> {
        KvClient::new(self.channel(m))
    }

    /// A Lease client to member `m`.
    pub fn lease(&self, m: usize) -> LeaseClient<Channel> {
        LeaseClient::new(self.channel(m))
    }

    /// A Watch client to member `m`.
    pub fn watch(&self, m: usize) -> WatchClient<Channel> {
        WatchClient::new(self.channel(m))
    }

    /// A Lock client to member `m`.
    pub fn lock(&self, m: usize) -> LockClient<Channel> {
        LockClient::new(self.channel(m))
    }

    /// Member `m`'s (member id, leader id), if it answers within `limit`.
    pub async fn status(&self, m: usize, limit: Duration) -> Option<(u64, u64)> {
        self.status_term(m, limit)
            .await
            .map(|(id, leader, _)| (id, leader))
    }

    /// Member `m`'s (member id, leader id, Raft term), if it answers within `limit`.
    pub async fn status_term(&self, m: usize, limit: Duration) -> Option<(u64, u64, u64)> {
        let mut c = MaintenanceClient::new(self.channel(m));
        let resp = bounded(limit, c.status(StatusRequest {})).await.ok()?;
        Some((
            resp.header.map_or(0, |h| h.member_id),
            resp.leader,
            resp.raft_term,
        ))
    }
}

/// Runs a gRPC call with a deadline.
pub async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Outcome<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(resp)) => Outcome::Ok(resp.into_inner()),
        Ok(Err(status)) => Outcome::Err(status),
        Err(_) => Outcome::Timeout,
    }
}
