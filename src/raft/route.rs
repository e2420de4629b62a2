//! Reaching the leader for a request that only the leader can serve (a write, a read index, a
//! lease renewal, a membership change), through a leader election if one is under way.
//!
//! A request waits, up to its own deadline, for a leader that is alive: this member leading
//! with a quorum, or a leader this member heard from within a few heartbeats. So a request that
//! arrives while the leader is stopped, crashed or cut off is held and sent to the next leader
//! (etcd holds proposals while it has no leader the same way), instead of failing at once or
//! hanging on the silent leader's socket. A call already sent to a leader ends as soon as this
//! member learns of another leader, so it does not outlive the leader it was sent to.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::RaftNode;
use crate::error::{Error, Result};
use crate::pb::concordpb::raft_peer_client::RaftPeerClient;
use crate::transport::EagerChannel;

/// How often a waiting request looks for a live leader again (it also looks whenever
/// openraft's view of the leader changes).
const POLL: Duration = Duration::from_millis(10);

/// Where a request goes.
pub(super) enum Leader {
    /// This member leads.
    Local,
    /// Member `id` leads (reached on this member's session with it, or by
    /// [`RaftNode::leader_client`]).
    Remote(u64),
}

impl RaftNode {
    /// Waits until there is a live leader (see the module doc), or `deadline`.
    ///
    /// # Errors
    /// [`Error::NoLeader`] at the deadline.
    pub(super) async fn live_leader(&self, deadline: Instant) -> Result<Leader> {
        // Subscribed only when there is something to wait for (every request comes here).
        let mut metrics = None;
        loop {
            match self.leader() {
                Some(l) if l == self.id => return Ok(Leader::Local),
                Some(l) if self.elector.leader_alive() => return Ok(Leader::Remote(l)),
                _ => {}
            }
            if Instant::now() + POLL > deadline {
                return Err(Error::NoLeader);
            }
            // A new leader shows in openraft's metrics: look again at once. Whether it is alive
            // (heard recently) changes without them, so look every `POLL` too.
            let metrics = metrics.get_or_insert_with(|| self.raft.metrics());
            tokio::select! {
                changed = metrics.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep(POLL).await;
                    }
                }
                _ = tokio::time::sleep(POLL) => {}
            }
        }
    }

    /// A client of leader `leader`'s peer service.
    ///
    /// # Errors
    /// [`Error::NoLeader`] when its peer URL is not known or not valid (a caller may ask again).
    pub(super) fn leader_client(&self, leader: u64) -> Result<RaftPeerClient<EagerChannel>> {
        self.leader_addr(leader)
            .and_then(|addr| self.peers.client(&addr).ok())
            .ok_or(Error::NoLeader)
    }

    /// Runs `call` on leader `leader`; ends with [`Error::LeaderChanged`] as soon as this member
    /// knows another leader (or none). A call the transport could not deliver (no connection
    /// to the leader) ends with [`Error::NoLeader`]: it never reached the leader and may be
    /// sent again; any other transport failure is [`Error::LeaderChanged`] (it may have).
    pub(super) async fn on_leader<T, F>(&self, leader: u64, call: F) -> Result<T>
    where
        F: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let call = async {
            call.await.map(tonic::Response::into_inner).map_err(|s| {
                if undelivered(&s) {
                    Error::NoLeader
                } else {
                    Error::LeaderChanged
                }
            })
        };
        self.until_leader_changes(leader, call).await
    }

    /// Runs `call` (a request to leader `leader`), ending it with [`Error::LeaderChanged`] as
    /// soon as this member knows another leader (or none).
    pub(super) async fn until_leader_changes<T>(
        &self,
        leader: u64,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        // openraft's server metrics change only with the vote, the leader or the membership
        // (its full metrics are sent again after every log write and apply, and each send would
        // wake this call while it waits for the leader's answer).
        let mut server = self.raft.server_metrics();
        let moved = server.wait_for(|m| m.current_leader != Some(leader));
        tokio::select! {
            reply = call => reply,
            _ = moved => Err(Error::LeaderChanged),
        }
    }
}

/// Whether a failed peer call certainly never reached the peer: the connection was refused,
/// which only happens while connecting, so nothing was sent. (A timed-out or unreachable error
/// can also end an established connection, e.g. `TCP_USER_TIMEOUT` on peer sockets, after the
/// call was delivered: those are not retried, so a write is never applied twice.)
pub(super) fn undelivered(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    let mut source = status.source();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        source = e.source();
    }
    false
}
