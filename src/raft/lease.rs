//! Lease operations that need the leader: keep-alives and remaining TTL are answered by the
//! leader's [`Lessor`] (a follower forwards them), and the leader's expiry loop revokes expired
//! leases through the log.

use std::sync::Arc;
use std::time::Duration;

use super::route::Leader;
use super::RaftNode;
use crate::apply::{Command, Op};
use crate::error::{Error, Result};
use crate::lease::{Lessor, Renewal};
use crate::pb::concordpb::{session_reply, session_request};
use crate::pb::etcdserverpb::{
    LeaseCheckpoint, LeaseCheckpointRequest, LeaseKeepAliveRequest, LeaseRevokeRequest,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, ResponseHeader,
};

/// How often the leader looks for expired leases.
const EXPIRY_TICK: Duration = Duration::from_millis(250);
/// Most revokes proposed per tick: thousands expiring at once go out in batches.
const REVOKES_PER_TICK: usize = 1000;
/// When to retry a revoke that has not taken effect.
const REVOKE_RETRY: Duration = Duration::from_secs(3);

impl RaftNode {
    /// The leader-side lease clock.
    pub fn lessor(&self) -> &Lessor {
        &self.lessor
    }

    /// Renews lease `id` on the leader; returns its TTL, or 0 if it does not exist or expired.
    /// As etcd, waits through a leader election (up to the request timeout) rather than fail,
    /// so a keep-alive stream survives a leader change.
    ///
    /// # Errors
    /// [`Error::Timeout`] when no leader answered in time; other errors (say, too many
    /// requests) as they are.
    pub async fn lease_renew(&self, id: i64) -> Result<i64> {
        let deadline = tokio::time::Instant::now() + self.options.request_timeout;
        loop {
            match self.try_lease_renew(id, deadline).await {
                Err(Error::NoLeader | Error::LeaderChanged | Error::Timeout) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(Error::Timeout);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                answer => return answer,
            }
        }
    }

    async fn try_lease_renew(&self, id: i64, deadline: tokio::time::Instant) -> Result<i64> {
        match self.live_leader(deadline).await? {
            Leader::Local => self.renew_on_leader(id).await,
            Leader::Remote(l) => {
                let ask = session_request::Body::LeaseRenew(LeaseKeepAliveRequest { id });
                match self.ask_leader(l, ask).await? {
                    session_reply::Body::LeaseRenew(reply) => match reply.error {
                        0 => Ok(reply.ttl),
                        code => Err(Error::from_code(code)),
                    },
                    _ => Err(Error::Storage),
                }
            }
        }
    }

    /// Renews on this member, which must lead; returns the TTL, or 0 if the lease is gone.
    ///
    /// Better than etcd in one respect: leadership is confirmed by a quorum first (a read-index
    /// round, batched with other reads), so a deposed leader that has not noticed yet (say,
    /// resumed after a pause) cannot promise a TTL the real leader will not honour. As etcd,
    /// if a checkpoint recorded less than the full TTL, the renewal clears it through the log
    /// before answering, so a next leader resumes from the full TTL promised here.
    ///
    /// # Errors
    /// [`Error::LeaderChanged`] when this member no longer leads; proposal errors.
    pub(super) async fn renew_on_leader(&self, id: i64) -> Result<i64> {
        let leads = || self.leader() == Some(self.id);
        if !leads() {
            return Err(Error::LeaderChanged);
        }
        self.read_index().await?;
        if !leads() {
            return Err(Error::LeaderChanged);
        }
        let term = self.metrics_now().current_term;
        let _gate = self.checkpoint_gate.read().await;
        let Some((ttl, checkpointed)) = self.mvcc.with_lease(id, |l| (l.ttl, l.remaining)) else {
            return Ok(0);
        };
        match self.lessor.renew(id, ttl, term) {
            Renewal::Renewed => {}
            Renewal::Expired => return Ok(0),
            // Elected a moment ago: asked again once the expiry loop has taken the leases over.
            Renewal::NotReady => return Err(Error::LeaderChanged),
        }
        if checkpointed > 0 {
            let clear = LeaseCheckpoint {
                id,
                remaining_ttl: 0,
            };
            let cmd = Command::new(Op::LeaseCheckpoint(LeaseCheckpointRequest {
                checkpoints: vec![clear],
            }));
            self.propose(cmd).await?;
        }
        Ok(ttl)
    }

    /// Lease `id`'s remaining and granted TTL (and keys), from the leader.
    ///
    /// # Errors
    /// [`Error::LeaseNotFound`], [`Error::NoLeader`].
    pub async fn lease_time_to_live(
        &self,
        req: LeaseTimeToLiveRequest,
    ) -> Result<LeaseTimeToLiveResponse> {
        let deadline = tokio::time::Instant::now() + self.options.request_timeout;
        match self.live_leader(deadline).await? {
            Leader::Local => self.time_to_live_local(&req),
            Leader::Remote(l) => {
                let mut client = self.leader_client(l)?;
                let reply = self.on_leader(l, client.lease_time_to_live(req)).await?;
                match reply.error {
                    0 => reply.response.ok_or(Error::Storage),
                    code => Err(Error::from_code(code)),
                }
            }
        }
    }

    /// Answers TimeToLive on this member, which must lead.
    pub(super) fn time_to_live_local(
        &self,
        req: &LeaseTimeToLiveRequest,
    ) -> Result<LeaseTimeToLiveResponse> {
        let (granted_ttl, resume_ttl, keys) = self
            .mvcc
            .with_lease(req.id, |l| {
                let keys = if req.keys {
                    l.keys.iter().cloned().collect()
                } else {
                    Vec::new()
                };
                (l.ttl, l.resume_ttl(), keys)
            })
            .ok_or(Error::LeaseNotFound)?;
        // Not tracked yet (a new leader's first tick): what the lessor is about to start with.
        let remaining = self
            .lessor
            .remaining(req.id)
            .map_or(resume_ttl, |d| d.as_secs() as i64);
        Ok(LeaseTimeToLiveResponse {
            // The leader's revision: a follower that forwarded the request may not have applied
            // the latest writes yet, and etcd answers with the leader's.
            header: Some(ResponseHeader {
                revision: self.mvcc.current_revision(),
                ..Default::default()
            }),
            id: req.id,
            ttl: remaining,
            granted_ttl,
            keys,
        })
    }

    /// Proposes the remaining TTL of every lease, so a new leader does not restart them. Holds
    /// the checkpoint gate from reading the deadlines until the entry commits, so no renewal
    /// slips between the two unrecorded.
    fn propose_checkpoints(self: &Arc<Self>) {
        let node = self.clone();
        tokio::spawn(async move {
            let _gate = node.checkpoint_gate.write().await;
            let checkpoints: Vec<LeaseCheckpoint> = node
                .lessor
                .remaining_all()
                .into_iter()
                .map(|(id, remaining_ttl)| LeaseCheckpoint { id, remaining_ttl })
                .collect();
            if checkpoints.is_empty() {
                return;
            }
            let cmd = Command::new(Op::LeaseCheckpoint(LeaseCheckpointRequest { checkpoints }));
            if let Err(e) = node.propose_as_leader(cmd).await {
                tracing::debug!(error = %e, "lease checkpoint not committed");
            }
        });
    }

    /// Starts the leader's expiry loop.
    pub(super) fn start_lease_expiry(self: &Arc<Self>) {
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EXPIRY_TICK);
            let mut last_checkpoint = tokio::time::Instant::now();
            loop {
                tick.tick().await;
                let Some(node) = node.upgrade() else { return };
                // Judged now, not by the elector's last tick: right after a pause (SIGSTOP, a
                // stalled VM) a deposed leader's deadlines have all passed, and it must not act
                // on them before it notices that it lost its quorum.
                let leading = node.leads_with_quorum();
                if !leading {
                    if node.lessor.term().is_some() {
                        node.lessor.demote();
                    }
                    continue;
                }
                // A new leadership (or a new term of it): every lease starts over from its
                // checkpoint, whatever this member's deadlines from an earlier term say. Only
                // once this term's first entry is applied: every entry of earlier terms is then
                // applied too, among them a checkpoint cleared by a renewal the last leader
                // answered, which must not resume from the TTL it cleared.
                let (term, applied_term) = {
                    let m = node.raft.metrics();
                    let m = m.borrow();
                    (m.current_term, m.last_applied.map(|l| l.leader_id.term))
                };
                let leases = node.mvcc.leases();
                if node.lessor.term() != Some(term) {
                    if applied_term != Some(term) {
                        continue;
                    }
                    node.lessor.promote(term, &leases);
                }
                let expired = node.lessor.expired(&leases, REVOKES_PER_TICK, REVOKE_RETRY);
                if last_checkpoint.elapsed() >= node.options.lease_checkpoint_interval {
                    last_checkpoint = tokio::time::Instant::now();
                    node.propose_checkpoints();
                }
                for id in expired {
                    let node = node.clone();
                    tokio::spawn(async move {
                        let cmd = Command::new(Op::LeaseRevoke(LeaseRevokeRequest { id }));
                        match node.propose_as_leader(cmd).await {
                            Ok(_) | Err(Error::LeaseNotFound) => {
                                tracing::debug!(lease = id, "lease expired and revoked");
                            }
                            Err(e) => tracing::warn!(lease = id, error = %e, "lease revoke failed"),
                        }
                    });
                }
            }
        });
    }
}
