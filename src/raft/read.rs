//! Linearizable reads by the read-index protocol. Concurrent reads share one leader
//! confirmation: a single task takes every read waiting when it starts a round, asks the leader
//! (itself, or on its session with the leader when this member follows) for a quorum-confirmed
//! commit index, and hands that index to the whole batch. Each read then waits until this
//! member has applied up to it and reads its local store.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, RaftError};
use tokio::sync::{mpsc, oneshot};

use super::route::Leader;
use super::{Raft, RaftNode};
use crate::error::{Error, Result};
use crate::pb::concordpb::{session_reply, session_request, ReadIndexRequest};

type Waiter = oneshot::Sender<Result<u64>>;

/// The batching read-index task's handle.
pub struct ReadBatcher {
    tx: mpsc::UnboundedSender<Waiter>,
}

/// The receiving end, handed to the task once the member exists.
pub struct ReadQueue(mpsc::UnboundedReceiver<Waiter>);

impl ReadBatcher {
    /// A batcher whose task is started later by [`RaftNode::start_reads`].
    pub fn new() -> (Self, ReadQueue) {
        let (tx, rx) = mpsc::unbounded_channel::<Waiter>();
        (ReadBatcher { tx }, ReadQueue(rx))
    }

    async fn read_index(&self) -> Result<u64> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(tx).map_err(|_| Error::Stopped)?;
        rx.await.map_err(|_| Error::Stopped)?
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
    /// Starts the batching task: each round takes every read waiting when it starts.
    pub(super) fn start_reads(self: &Arc<Self>, queue: ReadQueue) {
        let node = Arc::downgrade(self);
        let mut rx = queue.0;
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while let Ok(more) = rx.try_recv() {
                    batch.push(more);
                }
                let Some(node) = node.upgrade() else { return };
                let index = node.obtain_read_index().await;
                for waiter in batch {
                    let _ = waiter.send(index);
                }
            }
        });
    }

    /// One confirmation round: the leader's quorum-confirmed read index. Asks the live leader
    /// (waiting through an election), and asks again when the leader changes meanwhile: a read
    /// index is safe to ask of any leader.
    async fn obtain_read_index(&self) -> Result<u64> {
        let deadline = tokio::time::Instant::now() + self.options.request_timeout;
        let round = async {
            loop {
                let answer = match self.live_leader(deadline).await? {
                    Leader::Local => confirm_leadership(&self.raft).await,
                    Leader::Remote(l) => {
                        let ask = session_request::Body::ReadIndex(ReadIndexRequest {});
                        match self.ask_leader(l, ask).await {
                            Ok(session_reply::Body::ReadIndex(reply)) => match reply.error {
                                0 => Ok(reply.index),
                                code => Err(Error::from_code(code)),
                            },
                            Ok(_) => Err(Error::Storage),
                            Err(e) => Err(e),
                        }
                    }
                };
                match answer {
                    Err(Error::NoLeader | Error::LeaderChanged) => {}
                    // A quorum slower to answer than the round's heartbeat interval (a busy
                    // machine, a follower behind its disk): asked again while this member still
                    // leads with a quorum heard within an election timeout, as etcd's read loop
                    // sends its ReadIndex again until the request times out. A leader cut off
                    // for that long no longer leads (`leader`) and fails.
                    Err(Error::Timeout) if self.leader() == Some(self.id) => {}
                    other => return other,
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout_at(deadline, round)
            .await
            .unwrap_or(Err(Error::Timeout))
    }

    /// On the leader, for a follower's `ReadIndex` call: the read index, from the same batched
    /// confirmation round as this member's own reads (one quorum heartbeat serves them all).
    ///
    /// # Errors
    /// [`Error::LeaderChanged`] when this member does not lead, else those of a round.
    pub(super) async fn leader_read_index(&self) -> Result<u64> {
        if self.metrics_now().current_leader != Some(self.id) {
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
        self.wait_applied(index).await
    }

    /// Waits (up to the request timeout) until this member has applied log `index`.
    ///
    /// # Errors
    /// [`Error::Timeout`] or [`Error::Stopped`].
    pub async fn wait_applied(&self, index: u64) -> Result<()> {
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
