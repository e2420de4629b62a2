//! Member-local maintenance: a consistent copy of the state for `Maintenance.Snapshot`, and
//! leadership transfer for `MoveLeader`.
//!
//! openraft 0.9 has no leadership transfer. So the leader transfers like etcd: it waits for the
//! transferee to have its whole log, goes quiet (sends no appends or heartbeats) until the
//! transferee holds at least what every other voter holds, then asks it to campaign at once
//! (`TimeoutNow`, which skips PreVote as etcd's forced campaign does; openraft's voters keep no
//! lease here, see `election.rs`). The transferee's log is the longest, so it wins. Proposals
//! made while quiet are not committed and end with `leader changed`, as etcd drops proposals
//! during a transfer.

use std::sync::atomic::Ordering;

use super::{first_url, RaftNode};
use crate::error::{Error, Result};
use crate::pb::concordpb::TimeoutNowRequest;
use crate::storage::{meta_key, Space};

impl RaftNode {
    /// The state as applied when called, measured as etcd's database and ready to be streamed:
    /// a consistent point-in-time view of the whole state in etcd's database format (so etcd's
    /// tools read and restore it; `concord snapshot restore` reads it too). Measuring reads the
    /// whole view once; writing ([`crate::etcd_db::Export::write_to`]) reads it again, and
    /// nothing is kept on disk or in memory between the two.
    ///
    /// # Errors
    /// [`Error::Storage`].
    pub async fn snapshot_export(&self) -> Result<crate::etcd_db::Export> {
        // A view taken while no apply runs: its applied index describes it.
        let (view, kept) = self.mvcc.export_view()?;
        let made = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let meta = super::snapshots::meta_of(&view, "maintenance")?;
            let applied = meta
                .last_log_id
                .map_or((0, 0), |l| (l.index, l.leader_id.term));
            let export = crate::etcd_db::Export::plan(view, applied, kept)?;
            tracing::info!(
                bytes = export.size(),
                took_ms = started.elapsed().as_millis() as u64,
                "measured etcd database snapshot"
            );
            Ok::<_, std::io::Error>(export)
        })
        .await;
        match made {
            Ok(Ok(export)) => Ok(export),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "making a snapshot");
                Err(Error::Storage)
            }
            Err(_) => Err(Error::Storage),
        }
    }

    /// Hands leadership to voter `target` (etcd's MoveLeader); must run on the leader.
    ///
    /// # Errors
    /// [`Error::NotLeader`], [`Error::BadLeaderTransferee`] for a learner or unknown member,
    /// [`Error::LeaderTransferTimeout`].
    pub async fn move_leader(&self, target: u64) -> Result<()> {
        if self.leader() != Some(self.id) {
            return Err(Error::NotLeader);
        }
        if target == self.id {
            return Ok(());
        }
        let member = self
            .member_list()
            .into_iter()
            .find(|m| m.id == target && !m.is_learner)
            .ok_or(Error::BadLeaderTransferee)?;
        let addr = member
            .peer_ur_ls
            .first()
            .map(|u| first_url(u).to_string())
            .ok_or(Error::BadLeaderTransferee)?;
        let deadline = tokio::time::Instant::now() + self.options.request_timeout * 2;
        // The transferee must have everything, or the voters would not elect it.
        let mut metrics = self.raft.metrics();
        let caught_up = metrics.wait_for(|m| {
            let last = m.last_log_index;
            let matched = m
                .replication
                .as_ref()
                .and_then(|r| r.get(&target).cloned().flatten())
                .map(|l| l.index);
            last.is_some() && matched == last
        });
        tokio::time::timeout_at(deadline, caught_up)
            .await
            .map_err(|_| Error::LeaderTransferTimeout)?
            .map_err(|_| Error::Stopped)?;
        tracing::info!(target = format!("{target:x}"), "transferring leadership");
        self.links.quiet.store(true, Ordering::SeqCst);
        let transferred = async {
            // Appends in flight when the leader went quiet land; then the transferee must hold
            // at least what every other voter holds, or they would not vote for it.
            tokio::time::sleep(self.options.heartbeat * 2).await;
            let mut metrics = self.raft.metrics();
            metrics
                .wait_for(|m| {
                    let matched = |id: &u64| {
                        m.replication
                            .as_ref()
                            .and_then(|r| r.get(id).cloned().flatten())
                            .map(|l| l.index)
                    };
                    let mine = matched(&target);
                    m.replication
                        .as_ref()
                        .is_some_and(|r| r.keys().all(|id| matched(id) <= mine))
                })
                .await
                .map_err(|_| Error::Stopped)?;
            let mut client = self
                .peers
                .client(&addr)
                .map_err(|_| Error::BadLeaderTransferee)?;
            client
                .timeout_now(TimeoutNowRequest {})
                .await
                .map_err(|_| Error::LeaderTransferTimeout)?;
            let mut metrics = self.raft.metrics();
            metrics
                .wait_for(|m| m.current_leader == Some(target))
                .await
                .map_err(|_| Error::Stopped)?;
            Ok(())
        };
        let result = tokio::time::timeout_at(deadline, transferred)
            .await
            .unwrap_or(Err(Error::LeaderTransferTimeout));
        self.links.quiet.store(false, Ordering::SeqCst);
        self.links.wake_all();
        result
    }
}

impl RaftNode {
    /// The backend size: what `Status.dbSize` reports and the space quota counts.
    pub fn state_size(&self) -> u64 {
        self.storage.state_size()
    }

    /// Reclaims space of compacted history (etcd's defragment); blocking.
    ///
    /// # Errors
    /// [`Error::Storage`].
    pub fn defragment(&self) -> Result<()> {
        let done = self.storage.defragment().map_err(|e| {
            tracing::error!(error = %e, "defragment failed");
            Error::Storage
        });
        // The space quota measures again on the next write.
        self.quota.invalidate();
        done
    }

    /// etcd's `Hash`: a CRC-32C of the whole replicated state (keys with their history,
    /// leases, members' attributes and alarms), equal on members that applied the same log.
    ///
    /// # Errors
    /// [`Error::Storage`].
    pub fn state_hash(&self) -> Result<u32> {
        // A view taken while no apply runs, read one record at a time after.
        let view = {
            let _consistent = self.mvcc.read()?;
            self.storage.view()
        };
        let mut crc = 0;
        for (space, prefix) in [
            (Space::Kv, &b""[..]),
            (Space::Lease, &b""[..]),
            (Space::Meta, meta_key::REPLICATED),
        ] {
            view.for_each(space, prefix, |k, v| {
                crc = crc32c::crc32c_append(crc, k);
                crc = crc32c::crc32c_append(crc, v);
                Ok::<(), crate::storage::StorageError>(())
            })
            .map_err(|_| Error::Storage)?;
        }
        Ok(crc)
    }
}
