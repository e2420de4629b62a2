//! Linearizable reads by the read-index protocol. Concurrent reads share one leader
//! confirmation: a single task takes every read waiting when it starts a round, asks the leader
//! (itself, or over `ReadIndex` when this member follows) for a quorum-confirmed commit index,
//! and hands that index to the whole batch. Each read then waits until this member has applied
//! up to it and reads its local store.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, RaftError};
use tokio::sync::{mpsc, oneshot};

use super::network::PeerChannels;
use super::{leader_addr, Raft, RaftNode};
use crate::error::{Error, Result};
use crate::pb::concordpb::ReadIndexRequest;

type Waiter = oneshot::Sender<Result<u64>>;

/// The batching read-index task's handle.
pub struct ReadBatcher {
    tx: mpsc::UnboundedSender<Waiter>,
}

impl ReadBatcher {
    /// Starts the batching task.
    pub fn start(raft: Raft, id: u64, peers: Arc<PeerChannels>, timeout: Duration) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Waiter>();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while let Ok(more) = rx.try_recv() {
                    batch.push(more);
                }
                let index = tokio::time::timeout(timeout, obtain(&raft, id, &peers))
                    .await
                    .unwrap_or(Err(Error::Timeout));
                for waiter in batch {
                    let _ = waiter.send(index);
                }
            }
        });
        ReadBatcher { tx }
    }

    async fn read_index(&self) -> Result<u64> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(tx).map_err(|_| Error::Stopped)?;
        rx.await.map_err(|_| Error::Stopped)?
    }
}

/// One confirmation round: the leader's quorum-confirmed read index.
async fn obtain(raft: &Raft, id: u64, peers: &PeerChannels) -> Result<u64> {
    let leader = raft.metrics().borrow().current_leader;
    match leader {
        None => Err(Error::NoLeader),
        Some(l) if l == id => confirm_leadership(raft).await,
        Some(l) => {
            let addr = leader_addr(raft, l).ok_or(Error::NoLeader)?;
            let mut client = peers.client(&addr).map_err(|_| Error::NoLeader)?;
            let reply = client
                .read_index(ReadIndexRequest {})
                .await
                .map_err(|_| Error::NoLeader)?
                .into_inner();
            match reply.error {
                0 => Ok(reply.index),
                code => Err(Error::from_code(code)),
            }
        }
    }
}

/// On the leader: confirms leadership with a quorum and returns the index reads must wait for.
async fn confirm_leadership(raft: &Raft) -> Result<u64> {
    match raft.get_read_log_id().await {
        Ok((read_log_id, _)) => Ok(read_log_id.map_or(0, |l| l.index)),
        Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_))) => {
            Err(Error::LeaderChanged)
        }
        Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_))) => Err(Error::Timeout),
        Err(RaftError::Fatal(_)) => Err(Error::Stopped),
    }
}

impl RaftNode {
    /// On the leader, for a follower's `ReadIndex` call: the read index, from the same batched
    /// confirmation round as this member's own reads (one quorum heartbeat serves them all).
    ///
    /// # Errors
    /// [`Error::LeaderChanged`] when this member does not lead, else those of a round.
    pub(super) async fn leader_read_index(&self) -> Result<u64> {
        if self.raft.metrics().borrow().current_leader != Some(self.id) {
            return Err(Error::LeaderChanged);
        }
        self.reads.read_index().await
    }

    /// Waits until a linearizable read may be served from this member's store: every write
    /// acknowledged before the call is applied here when it returns.
    ///
    /// # Errors
    /// [`Error::NoLeader`], [`Error::LeaderChanged`], [`Error::Timeout`] or [`Error::Stopped`].
    pub async fn read_index(&self) -> Result<()> {
        let index = self.reads.read_index().await?;
        if self.applied_index() >= index {
            return Ok(());
        }
        self.raft
            .wait(Some(self.options.request_timeout))
            .applied_index_at_least(Some(index), "linearizable read")
            .await
            .map(|_| ())
            .map_err(|e| match e {
                openraft::metrics::WaitError::Timeout(..) => Error::Timeout,
                _ => Error::Stopped,
            })
    }
}
