//! Writes: every mutation becomes a [`Command`] in the Raft log. Acknowledged only after a
//! quorum has the entry on disk and the leader applied it.
//!
//! Group commit: the leader's [`Batcher`] keeps one entry in flight and puts every proposal that
//! arrives meanwhile into the next entry (a [`CommandBatch`]); one fsync, one replication round
//! and one apply then cover them all. A follower forwards its proposals to the leader on its
//! session with it (`session.rs`), where they join the same batches.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use openraft::error::RaftError;
use prost::Message;
use tokio::sync::{mpsc, oneshot};

use super::route::Leader;
use super::{Raft, RaftNode};
use crate::apply::{Command, CommandBatch, CommandResult, EncodedCommand, Op, Outcome};
use crate::error::{Error, Result};
use crate::pb::concordpb::{session_reply, session_request};

// One entry in flight: the next entry forms while the current one is flushed, replicated and
// applied, so it gathers everything that arrived meanwhile. Measured with concord-bench put (64
// clients, 1 node) when this was a setting: 1 → 26k puts/s, 2 → 23k, 8 → 18.5k (more, smaller
// entries cost more per put in RaftCore and apply than the overlap saves). With one, the batcher
// submits the entry itself instead of handing it to a task of its own (one task hop less).
/// Pause before a request that could not reach a leader looks for one again.
const RETRY: std::time::Duration = std::time::Duration::from_millis(20);
/// Most proposals in one entry.
const MAX_BATCH: usize = 512;
/// Proposals queued before new ones are refused with `too many requests`, as etcd refuses
/// proposals when apply falls too far behind (bounded memory under overload).
const QUEUE: usize = 16 * MAX_BATCH;

type Waiter = oneshot::Sender<Result<CommandResult>>;

/// The leader-side proposal batcher.
pub struct Batcher {
    tx: mpsc::UnboundedSender<(Command, Waiter)>,
    queued: Arc<AtomicUsize>,
}

impl Batcher {
    /// Starts the batching task; entries are at most about `max_bytes` big.
    pub fn start(raft: Raft, max_bytes: usize) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Command, Waiter)>();
        let queued = Arc::new(AtomicUsize::new(0));
        let taken = queued.clone();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut size = first.0.encoded_len();
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH && size < max_bytes {
                    let Ok(next) = rx.try_recv() else { break };
                    size += next.0.encoded_len();
                    batch.push(next);
                }
                taken.fetch_sub(batch.len(), Ordering::Relaxed);
                submit(&raft, batch).await;
            }
        });
        Batcher { tx, queued }
    }

    async fn propose(&self, cmd: Command) -> Result<CommandResult> {
        let (tx, rx) = oneshot::channel();
        if self.queued.fetch_add(1, Ordering::Relaxed) >= QUEUE {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(Error::TooManyRequests);
        }
        self.tx.send((cmd, tx)).map_err(|_| Error::Stopped)?;
        rx.await.map_err(|_| Error::Stopped)?
    }
}

/// Proposes one entry for `batch` and hands each waiter its own result.
async fn submit(raft: &Raft, mut batch: Vec<(Command, Waiter)>) {
    let single = batch.len() == 1;
    let (cmds, waiters): (Vec<Command>, Vec<Waiter>) = batch.drain(..).unzip();
    let entry = if single {
        cmds.into_iter().next().unwrap_or_default()
    } else {
        Command::new(Op::Batch(CommandBatch { commands: cmds }))
    };
    let result = match raft.client_write(EncodedCommand::encode(&entry)).await {
        Ok(resp) => Ok(resp.data),
        Err(RaftError::APIError(_)) => Err(Error::LeaderChanged),
        Err(RaftError::Fatal(_)) => Err(Error::Stopped),
    };
    match result {
        Ok(r) if single => {
            for w in waiters {
                let _ = w.send(Ok(r.clone()));
            }
        }
        Ok(CommandResult {
            result: Some(Outcome::Batch(all)),
        }) => {
            let mut results = all.results.into_iter();
            for w in waiters {
                let _ = w.send(results.next().ok_or(Error::Storage));
            }
        }
        Ok(_) => {
            for w in waiters {
                let _ = w.send(Err(Error::Storage));
            }
        }
        Err(e) => {
            for w in waiters {
                let _ = w.send(Err(e));
            }
        }
    }
}

impl RaftNode {
    /// Replicates and applies `cmd`, returning its outcome (a domain error if apply rejected it).
    ///
    /// # Errors
    /// [`Error::RequestTooLarge`], [`Error::NoLeader`], [`Error::Timeout`], [`Error::Stopped`], or
    /// the error apply returned.
    #[tracing::instrument(name = "propose", level = "debug", skip_all)]
    pub async fn propose(&self, cmd: Command) -> Result<Outcome> {
        if cmd.encoded_len() > self.options.max_request_bytes {
            return Err(Error::RequestTooLarge);
        }
        self.check_quota(&cmd).await?;
        self.settle(self.route(cmd)).await
    }

    /// Proposes `cmd` only while this member leads with a quorum, and never forwards it: for
    /// entries that only this leader's own state justifies (a lease expired by its clock, a
    /// checkpoint of its deadlines). Forwarded after a leader change, such an entry would be
    /// committed by a leader whose lessor never decided it: a deposed leader resuming from a
    /// pause revoked a lease the new leader had just renewed (fault suite, seed 5003). Proposed
    /// here, it can only commit in the term it was decided in.
    ///
    /// # Errors
    /// [`Error::LeaderChanged`] when this member does not lead; as [`RaftNode::propose`].
    pub(super) async fn propose_as_leader(&self, cmd: Command) -> Result<Outcome> {
        if !self.leads_with_quorum() {
            return Err(Error::LeaderChanged);
        }
        self.settle(self.propose_local(cmd)).await
    }

    /// Bounds a proposal by the request timeout, counts failures, and unpacks its outcome.
    async fn settle(
        &self,
        proposal: impl std::future::Future<Output = Result<CommandResult>>,
    ) -> Result<Outcome> {
        let result = tokio::time::timeout(self.options.request_timeout, proposal)
            .await
            .map_err(|_| Error::Timeout)
            .and_then(|r| r)
            .inspect_err(|_| {
                crate::metrics::PROPOSALS_FAILED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            })?;
        match result.result {
            Some(Outcome::Error(code)) => Err(Error::from_code(code)),
            Some(o) => Ok(o),
            None => Err(Error::Storage),
        }
    }

    /// etcd's space quota: a request that could grow the store fails with `database space
    /// exceeded` while NOSPACE is raised, and raises it when the backend would pass the quota.
    async fn check_quota(&self, cmd: &Command) -> Result<()> {
        let grows = match &cmd.op {
            Some(Op::Put(_) | Op::LeaseGrant(_)) => true,
            Some(Op::Txn(t)) => crate::apply::txn_writes(t),
            _ => false,
        };
        if !grows {
            return Ok(());
        }
        let nospace = crate::pb::etcdserverpb::AlarmType::Nospace as i32;
        if self.mvcc.has_alarm(nospace) {
            return Err(Error::NoSpace);
        }
        let len = cmd.encoded_len() as u64;
        let size = self.quota.size() + len;
        if size <= self.options.quota_bytes {
            self.quota.admit(len);
            return Ok(());
        }
        tracing::warn!(
            size,
            quota = self.options.quota_bytes,
            "space quota exceeded: raising NOSPACE"
        );
        let raise = Command::new(Op::Alarm(crate::pb::etcdserverpb::AlarmRequest {
            action: crate::pb::etcdserverpb::alarm_request::AlarmAction::Activate as i32,
            member_id: self.id,
            alarm: nospace,
        }));
        // Through the plain route: an alarm is not subject to the quota.
        if let Err(e) = self.route(raise).await {
            tracing::warn!(error = %e, "raising NOSPACE failed");
        }
        Err(Error::NoSpace)
    }

    /// Proposes on this member when it leads, else forwards to the live leader, waiting for one
    /// through an election (see `route.rs`). A proposal that may have reached a leader is never
    /// re-sent elsewhere: if leadership is lost meanwhile the entry may still commit, so the
    /// answer is `leader changed`, as in etcd. One that certainly did not (no connection) is
    /// sent again to the next live leader.
    async fn route(&self, cmd: Command) -> Result<CommandResult> {
        let deadline = tokio::time::Instant::now() + self.options.request_timeout;
        loop {
            match self.live_leader(deadline).await? {
                Leader::Local => return self.propose_local(cmd).await,
                Leader::Remote(l) => {
                    let ask = session_request::Body::Forward(cmd.clone());
                    match self.ask_leader(l, ask).await {
                        Err(Error::NoLeader) => tokio::time::sleep(RETRY).await,
                        Err(e) => return Err(e),
                        Ok(session_reply::Body::Forward(reply)) if reply.error != 0 => {
                            return Err(Error::from_code(reply.error))
                        }
                        Ok(session_reply::Body::Forward(reply)) => {
                            return reply.result.ok_or(Error::Storage)
                        }
                        Ok(_) => return Err(Error::Storage),
                    }
                }
            }
        }
    }

    /// Proposes on this member, which must be the leader.
    ///
    /// # Errors
    /// [`Error::LeaderChanged`] if it is not (or stops being) the leader, [`Error::Stopped`].
    pub(super) async fn propose_local(&self, cmd: Command) -> Result<CommandResult> {
        if matches!(cmd.op, Some(Op::Batch(_))) {
            // Batches are formed here only; a client cannot send one.
            return Err(Error::Storage);
        }
        self.proposals.propose(cmd).await
    }
}
