//! The Raft state machine: applies committed entries to the MVCC store through [`crate::apply`],
//! takes and installs snapshots (see [`super::snapshots`]).
//!
//! The applied log id and membership are written in the same fjall batch as the entries' data,
//! so a crash never loses or double-applies an entry; entries at or below the applied index are
//! skipped.

use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};

use super::snapshot_data::SnapshotData;
use super::snapshots::SnapshotFiles;
use super::TypeConfig;
use crate::apply::{self, CommandResult};
use crate::mvcc::{KvTxn, MvccStore};
use crate::pb::mvccpb::Event;
use crate::storage::{meta_key, Space, Storage, View};
use crate::watch::{Publisher, WatchHub};

type Entry = openraft::Entry<TypeConfig>;
type Membership = StoredMembership<u64, openraft::BasicNode>;

/// The state machine of one member.
pub struct StateMachine {
    id: u64,
    removed: Arc<tokio::sync::watch::Sender<bool>>,
    storage: Storage,
    mvcc: Arc<MvccStore>,
    auth: Arc<crate::auth::AuthStore>,
    /// Hands committed events to the watch hub, off the apply path.
    publisher: Publisher,
    snapshots: Arc<SnapshotFiles>,
    applied: Option<LogId<u64>>,
    membership: Membership,
    /// Tells this process's snapshot ids from an earlier one's (its start time).
    boot: u64,
    /// The latest snapshot installed, with the state's sequence number after it: what openraft
    /// is told again while the state has not changed since.
    installed: Option<(SnapshotMeta<u64, openraft::BasicNode>, u64)>,
    /// `--experimental-warning-apply-duration`: applies slower than this are logged.
    slow_apply: std::time::Duration,
}

fn sm_err(e: impl std::fmt::Display) -> StorageError<u64> {
    StorageIOError::write_state_machine(AnyError::error(e.to_string())).into()
}

fn snap_err(e: impl std::fmt::Display) -> StorageError<u64> {
    StorageIOError::write_snapshot(None, AnyError::error(e.to_string())).into()
}

impl StateMachine {
    /// Logs applies slower than `limit` (`--experimental-warning-apply-duration`).
    pub fn warn_slower_than(mut self, limit: std::time::Duration) -> Self {
        self.slow_apply = limit;
        self
    }

    /// Loads the applied state from `storage`, after finishing a snapshot install that a
    /// stop interrupted (see [`super::snapshots`]), and starts the task that publishes its
    /// events to `hub` (needs a Tokio runtime).
    ///
    /// # Errors
    /// On a read failure or corrupt metadata.
    pub fn open(
        id: u64,
        storage: Storage,
        mvcc: Arc<MvccStore>,
        auth: Arc<crate::auth::AuthStore>,
        hub: Arc<WatchHub>,
        snapshots: Arc<SnapshotFiles>,
        removed: Arc<tokio::sync::watch::Sender<bool>>,
    ) -> Result<Self, StorageError<u64>> {
        if let Some(meta) = SnapshotFiles::interrupted_install(&storage).map_err(sm_err)? {
            mvcc.replace_all(|| {
                snapshots
                    .finish_install(&storage, &meta)
                    .map_err(|e| crate::storage::StorageError(e.to_string()))
            })
            .map_err(snap_err)?;
            auth.reload(&storage).map_err(snap_err)?;
            hub.resync_all(mvcc.current_revision());
        }
        snapshots.forget_unused();
        // The applied log id and membership are what a snapshot of the state would say.
        let described = super::snapshots::meta_of(&storage.view(), "open").map_err(sm_err)?;
        let (applied, membership) = (described.last_log_id, described.last_membership);
        let mut removed_key = meta_key::REMOVED.to_vec();
        removed_key.extend(id.to_be_bytes());
        if storage
            .get(Space::Meta, &removed_key)
            .map_err(sm_err)?
            .is_some()
        {
            removed.send_replace(true);
        }
        Ok(StateMachine {
            id,
            removed,
            storage,
            mvcc,
            auth,
            publisher: Publisher::spawn(hub),
            snapshots,
            applied,
            membership,
            boot: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            installed: None,
            slow_apply: std::time::Duration::from_millis(100),
        })
    }
}

/// Takes a snapshot: syncs the state as of a view taken while the state machine was exclusively
/// borrowed (so it matches `meta` exactly), after which openraft may purge the log below it.
/// The snapshot's bytes are only written if read.
pub struct SnapshotBuilder {
    meta: SnapshotMeta<u64, openraft::BasicNode>,
    view: Option<View>,
    snapshots: Arc<SnapshotFiles>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let view = self
            .view
            .take()
            .ok_or_else(|| snap_err("snapshot builder used twice"))?;
        let view = tokio::task::spawn_blocking(move || view.persist_state().map(|()| view))
            .await
            .map_err(snap_err)?
            .map_err(snap_err)?;
        tracing::debug!(snapshot = %self.meta.snapshot_id, "took snapshot");
        Ok(Snapshot {
            meta: self.meta.clone(),
            snapshot: Box::new(SnapshotData::deferred(
                self.snapshots.clone(),
                self.meta.clone(),
                view,
            )),
        })
    }
}

impl StateMachine {
    /// The metadata of a snapshot of `view`, the state as applied now. Its id names the log
    /// position, this member, this process and the view's sequence number, so one id always
    /// names the same bytes (compactions change the state between applies too): pieces of two
    /// transfers never mix in a receiver. While the state is as a snapshot left it, that
    /// snapshot's metadata (openraft's contract).
    fn snapshot_meta(&self, view: &View) -> SnapshotMeta<u64, openraft::BasicNode> {
        if let Some((installed, seqno)) = &self.installed {
            if *seqno == view.seqno() && installed.last_log_id == self.applied {
                return installed.clone();
            }
        }
        let (term, index) = self.applied.map_or((String::from("0"), 0), |l| {
            (l.leader_id.to_string(), l.index)
        });
        SnapshotMeta {
            last_log_id: self.applied,
            last_membership: self.membership.clone(),
            snapshot_id: format!(
                "{term}-{index}-{:x}-{:x}-{}",
                self.id,
                self.boot,
                view.seqno()
            ),
        }
    }

    /// Applies `entries` in one state transaction and commits it: each entry's result, the
    /// revision after the batch and the events it made.
    fn apply_entries(
        &mut self,
        entries: impl IntoIterator<Item = Entry>,
    ) -> Result<(Vec<CommandResult>, i64, Vec<Event>), StorageError<u64>> {
        let mut w = self.mvcc.write().map_err(sm_err)?;
        let mut results = Vec::new();
        for entry in entries {
            if self.applied.is_some_and(|a| entry.log_id.index <= a.index) {
                results.push(CommandResult::default());
                continue;
            }
            let result = match &entry.payload {
                EntryPayload::Blank => CommandResult::default(),
                EntryPayload::Normal(encoded) => {
                    let cmd = &encoded.decode().map_err(sm_err)?;
                    w.apply_from(entry.log_id.index, encoded.bytes().clone());
                    let started = std::time::Instant::now();
                    // A storage failure ends the batch uncommitted and stops the Raft core
                    // (a state machine error is fatal to it): the member exits.
                    let result = apply::apply(&mut w, &self.auth, entry.log_id.index, cmd)
                        .map_err(sm_err)?;
                    let took = started.elapsed();
                    if took > self.slow_apply {
                        crate::metrics::SLOW_APPLY
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!(
                            took_ms = took.as_millis() as u64,
                            expected_duration_ms = self.slow_apply.as_millis() as u64,
                            request = apply::kind(cmd),
                            index = entry.log_id.index,
                            "apply request took too long"
                        );
                    }
                    result
                }
                EntryPayload::Membership(m) => {
                    // Members that leave are recorded: peers refuse them from now on.
                    for (gone, _) in self.membership.membership().nodes() {
                        if m.get_node(gone).is_none() {
                            let mut key = meta_key::REMOVED.to_vec();
                            key.extend(gone.to_be_bytes());
                            w.set_meta(&key, b"");
                            if *gone == self.id {
                                self.removed.send_replace(true);
                            }
                        }
                    }
                    self.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                    let bytes = bincode::serialize(&self.membership).map_err(sm_err)?;
                    w.set_meta(meta_key::MEMBERSHIP, &bytes);
                    CommandResult::default()
                }
            };
            self.applied = Some(entry.log_id);
            results.push(result);
        }
        let applied = bincode::serialize(&self.applied).map_err(sm_err)?;
        w.set_meta(meta_key::APPLIED, &applied);
        let revision = w.read_revision();
        let started = std::time::Instant::now();
        let events = w.commit().map_err(sm_err)?;
        crate::metrics::BACKEND_COMMIT.observe(started.elapsed());
        Ok((results, revision, events))
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, Membership), StorageError<u64>> {
        Ok((self.applied, self.membership.clone()))
    }

    #[tracing::instrument(name = "apply", level = "debug", skip_all)]
    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResult>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let (results, revision, events) = self.apply_entries(entries)?;
        // After the commit, in apply order: watchers only ever see committed changes. Queued,
        // so that the writes' responses do not wait behind the deliveries.
        self.publisher.publish(revision, events).await;
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        // Taken now, while no entry can be applied, so the data matches the metadata exactly.
        let view = self.storage.view();
        SnapshotBuilder {
            meta: self.snapshot_meta(&view),
            view: Some(view),
            snapshots: self.snapshots.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotData>, StorageError<u64>> {
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(self.snapshots.start_receiving())
            .await
            .map_err(snap_err)?;
        Ok(Box::new(SnapshotData::file(file)))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, openraft::BasicNode>,
        snapshot: Box<SnapshotData>,
    ) -> Result<(), StorageError<u64>> {
        let file = snapshot.into_file().await.map_err(snap_err)?;
        let (storage, mvcc, snapshots) = (
            self.storage.clone(),
            self.mvcc.clone(),
            self.snapshots.clone(),
        );
        let announced = meta.clone();
        let installed = tokio::task::spawn_blocking(move || {
            mvcc.replace_all(|| {
                snapshots
                    .install_received(&storage, &announced, file)
                    .map_err(|e| crate::storage::StorageError(e.to_string()))
            })
        })
        .await;
        self.snapshots.receiving_ended();
        installed.map_err(snap_err)?.map_err(snap_err)?;
        self.auth.reload(&self.storage).map_err(snap_err)?;
        self.publisher
            .resync_all(self.mvcc.current_revision())
            .await;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.installed = Some((meta.clone(), self.storage.view().seqno()));
        Ok(())
    }

    /// A snapshot of the state as applied now (the state on disk is the snapshot; its bytes are
    /// written only if read).
    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        if self.applied.is_none() {
            return Ok(None);
        }
        let view = self.storage.view();
        let meta = self.snapshot_meta(&view);
        let data = SnapshotData::deferred(self.snapshots.clone(), meta.clone(), view);
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(data),
        }))
    }
}
