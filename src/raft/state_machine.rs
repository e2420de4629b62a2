//! The Raft state machine: applies committed entries to the MVCC store through [`crate::apply`],
//! builds and installs snapshots.
//!
//! The applied log id and membership are written in the same fjall batch as the entries' data,
//! so a crash never loses or double-applies an entry; entries at or below the applied index are
//! skipped.

use std::io::{Cursor, Write};
use std::path::PathBuf;
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use super::TypeConfig;
use crate::apply::{self, CommandResult};
use crate::mvcc::{KvTxn, MvccStore};
use crate::storage::{meta_key, Space, Storage};
use crate::watch::WatchHub;

type Entry = openraft::Entry<TypeConfig>;
type Membership = StoredMembership<u64, openraft::BasicNode>;

/// Everything a snapshot carries besides openraft's metadata: the full MVCC keyspace and the
/// revision counters.
#[derive(Serialize, Deserialize)]
struct SnapshotBody {
    kv: Vec<(Vec<u8>, Vec<u8>)>,
    leases: Vec<(Vec<u8>, Vec<u8>)>,
    revision: Option<Vec<u8>>,
    compacted: Option<Vec<u8>>,
    /// Meta entries written by applied commands (members' attributes, removed members, alarms).
    replicated_meta: Vec<(Vec<u8>, Vec<u8>)>,
}

/// A snapshot as saved in the data dir.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<u64, openraft::BasicNode>,
    data: Vec<u8>,
}

/// The state machine of one member.
pub struct StateMachine {
    id: u64,
    removed: Arc<tokio::sync::watch::Sender<bool>>,
    storage: Storage,
    mvcc: Arc<MvccStore>,
    auth: Arc<crate::auth::AuthStore>,
    hub: Arc<WatchHub>,
    snapshot_path: PathBuf,
    applied: Option<LogId<u64>>,
    membership: Membership,
    snapshot_seq: u64,
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

    /// Loads the applied state from `storage`.
    ///
    /// # Errors
    /// On a read failure or corrupt metadata.
    pub fn open(
        id: u64,
        storage: Storage,
        mvcc: Arc<MvccStore>,
        auth: Arc<crate::auth::AuthStore>,
        hub: Arc<WatchHub>,
        data_dir: &std::path::Path,
        removed: Arc<tokio::sync::watch::Sender<bool>>,
    ) -> Result<Self, StorageError<u64>> {
        let decode = |key: &[u8]| -> Result<Option<Vec<u8>>, StorageError<u64>> {
            storage.get(Space::Meta, key).map_err(sm_err)
        };
        let applied = match decode(meta_key::APPLIED)? {
            Some(b) => bincode::deserialize(&b).map_err(sm_err)?,
            None => None,
        };
        let membership = match decode(meta_key::MEMBERSHIP)? {
            Some(b) => bincode::deserialize(&b).map_err(sm_err)?,
            None => Membership::default(),
        };
        let mut removed_key = meta_key::REMOVED.to_vec();
        removed_key.extend(id.to_be_bytes());
        if decode(&removed_key)?.is_some() {
            removed.send_replace(true);
        }
        Ok(StateMachine {
            id,
            removed,
            storage,
            mvcc,
            auth,
            hub,
            snapshot_path: snapshot_path(data_dir),
            applied,
            membership,
            snapshot_seq: 0,
            slow_apply: std::time::Duration::from_millis(100),
        })
    }
}

/// Where a member keeps its latest snapshot.
pub fn snapshot_path(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("snapshot.bin")
}

/// Writes a snapshot file atomically: temp file, fsync, rename.
fn save_snapshot(path: &std::path::Path, snap: &StoredSnapshot) -> Result<(), StorageError<u64>> {
    let bytes = bincode::serialize(snap).map_err(snap_err)?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(snap_err)?;
    f.write_all(&bytes).map_err(snap_err)?;
    f.sync_all().map_err(snap_err)?;
    std::fs::rename(&tmp, path).map_err(snap_err)
}

/// Builds a snapshot from data captured while the state machine was exclusively borrowed.
pub struct SnapshotBuilder {
    meta: SnapshotMeta<u64, openraft::BasicNode>,
    body: Result<Vec<u8>, String>,
    path: PathBuf,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let data = self.body.clone().map_err(snap_err)?;
        let stored = StoredSnapshot {
            meta: self.meta.clone(),
            data,
        };
        save_snapshot(&self.path, &stored)?;
        Ok(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        })
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
        let mut w = self.mvcc.write().map_err(sm_err)?;
        let mut results = Vec::new();
        for entry in entries {
            if self.applied.is_some_and(|a| entry.log_id.index <= a.index) {
                results.push(CommandResult::default());
                continue;
            }
            let result = match &entry.payload {
                EntryPayload::Blank => CommandResult::default(),
                EntryPayload::Normal(cmd) => {
                    let started = std::time::Instant::now();
                    let result = apply::apply(&mut w, &self.auth, entry.log_id.index, cmd);
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
        // After the commit, in apply order: watchers only ever see committed changes.
        self.hub.publish(revision, &events);
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshot_seq += 1;
        let snapshot_id = match self.applied {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, self.snapshot_seq),
            None => format!("0-0-{}", self.snapshot_seq),
        };
        let meta = SnapshotMeta {
            last_log_id: self.applied,
            last_membership: self.membership.clone(),
            snapshot_id,
        };
        // Captured now, while no entry can be applied, so the data matches `meta` exactly.
        let body = (|| -> Result<Vec<u8>, String> {
            let body = SnapshotBody {
                kv: self.storage.scan(Space::Kv).map_err(|e| e.to_string())?,
                leases: self.storage.scan(Space::Lease).map_err(|e| e.to_string())?,
                revision: self
                    .storage
                    .get(Space::Meta, meta_key::REVISION)
                    .map_err(|e| e.to_string())?,
                compacted: self
                    .storage
                    .get(Space::Meta, meta_key::COMPACTED)
                    .map_err(|e| e.to_string())?,
                replicated_meta: self
                    .storage
                    .scan_prefix(Space::Meta, meta_key::REPLICATED)
                    .map_err(|e| e.to_string())?,
            };
            bincode::serialize(&body).map_err(|e| e.to_string())
        })();
        SnapshotBuilder {
            meta,
            body,
            path: self.snapshot_path.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let data = snapshot.into_inner();
        let body: SnapshotBody = bincode::deserialize(&data).map_err(snap_err)?;
        // One atomic batch replaces the whole state: a crash leaves either the old state with
        // its applied index or the new one with the snapshot's.
        let mut batch = self.storage.batch();
        for (space, entries) in [(Space::Kv, &body.kv), (Space::Lease, &body.leases)] {
            let incoming: std::collections::HashSet<&[u8]> =
                entries.iter().map(|(k, _)| k.as_slice()).collect();
            for (k, _) in self.storage.scan(space).map_err(snap_err)? {
                if !incoming.contains(k.as_slice()) {
                    batch.remove(space, &k);
                }
            }
            for (k, v) in entries {
                batch.insert(space, k, v);
            }
        }
        for (key, value) in [
            (meta_key::REVISION, &body.revision),
            (meta_key::COMPACTED, &body.compacted),
        ] {
            match value {
                Some(v) => batch.insert(Space::Meta, key, v),
                None => batch.remove(Space::Meta, key),
            }
        }
        for (k, _) in self
            .storage
            .scan_prefix(Space::Meta, meta_key::REPLICATED)
            .map_err(snap_err)?
        {
            batch.remove(Space::Meta, &k);
        }
        for (k, v) in &body.replicated_meta {
            batch.insert(Space::Meta, k, v);
        }
        let applied = bincode::serialize(&meta.last_log_id).map_err(snap_err)?;
        batch.insert(Space::Meta, meta_key::APPLIED, &applied);
        let membership = bincode::serialize(&meta.last_membership).map_err(snap_err)?;
        batch.insert(Space::Meta, meta_key::MEMBERSHIP, &membership);
        batch.commit().map_err(snap_err)?;
        self.storage.persist_state().map_err(snap_err)?;
        self.mvcc.reload().map_err(snap_err)?;
        self.auth.reload(&self.storage).map_err(snap_err)?;
        self.hub.resync_all(self.mvcc.current_revision());
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        save_snapshot(
            &self.snapshot_path,
            &StoredSnapshot {
                meta: meta.clone(),
                data,
            },
        )
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let bytes = match std::fs::read(&self.snapshot_path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(snap_err(e)),
        };
        let stored: StoredSnapshot = bincode::deserialize(&bytes).map_err(snap_err)?;
        Ok(Some(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        }))
    }
}

/// Writes the state a snapshot file carries (as `Maintenance.Snapshot` streams it, without the
/// trailing checksum) into an empty `storage`, for a new cluster: keys with their history,
/// leases, revisions and alarms; not the old cluster's members. Returns the revision.
///
/// # Errors
/// A corrupt snapshot, or a storage failure.
pub fn restore_snapshot(storage: &Storage, bytes: &[u8]) -> Result<i64, String> {
    let stored: StoredSnapshot = bincode::deserialize(bytes).map_err(|e| e.to_string())?;
    let body: SnapshotBody = bincode::deserialize(&stored.data).map_err(|e| e.to_string())?;
    let mut batch = storage.batch();
    for (k, v) in &body.kv {
        batch.insert(Space::Kv, k, v);
    }
    for (k, v) in &body.leases {
        batch.insert(Space::Lease, k, v);
    }
    for (key, value) in [
        (meta_key::REVISION, &body.revision),
        (meta_key::COMPACTED, &body.compacted),
    ] {
        if let Some(v) = value {
            batch.insert(Space::Meta, key, v);
        }
    }
    // Alarms and the auth store (users, roles, enabled) carry over to the new cluster, as in
    // etcd; members and removals belong to the old one.
    for (k, v) in body.replicated_meta.iter().filter(|(k, _)| {
        k.starts_with(meta_key::ALARM) || k.starts_with(crate::auth::state::key::PREFIX)
    }) {
        batch.insert(Space::Meta, k, v);
    }
    batch.commit().map_err(|e| e.to_string())?;
    storage.persist_state().map_err(|e| e.to_string())?;
    let revision = body
        .revision
        .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
        .map_or(1, i64::from_be_bytes);
    Ok(revision)
}
