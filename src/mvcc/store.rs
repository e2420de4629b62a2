//! [`MvccStore`]: the key index and the revision counters over the `kv` keyspace, with read
//! transactions here and write transactions in `write_txn.rs` (record layouts: `records.rs`).
//!
//! Lock order: the state lock is the only lock here; a [`WriteTxn`] holds it for writing from
//! start to commit, so readers never see half of a request.

use std::sync::{Arc, RwLock, RwLockReadGuard};

use super::garbage::Garbage;
use super::published::{Published, Unreadable};
use super::range::{PendingRange, RangeStart};
use super::records::{
    alarm_bit, decode_alarm_key, decode_as, decode_lease, decode_record, etcd_entry, key_value,
    to_event,
};
use super::{KeyIndex, KeyRange, KeyRevision, LeaseInfo, LeaseTable, Revision, WriteTxn};
use crate::error::{Error, Result};
use crate::pb::etcdserverpb::RangeRequest;
use crate::pb::mvccpb::{Event, KeyValue};
use crate::storage::{meta_key, Space, Storage, StorageError, StorageResult};

/// What the index and counters say at one moment.
#[derive(Debug)]
pub(super) struct State {
    pub(super) index: KeyIndex,
    /// The current main revision (1 in an empty store, as in etcd).
    pub(super) current: i64,
    /// The last compacted main revision (-1 before any compaction, as in etcd).
    pub(super) compacted: i64,
    /// Leases and their keys.
    pub(super) leases: LeaseTable,
    /// Raised alarms: (member id, alarm type).
    pub(super) alarms: std::collections::BTreeSet<(u64, i32)>,
}

impl State {
    /// How many live keys `range` has at `at`, and the first `take` of them: a page of a large
    /// range copies only its own keys, however many follow it.
    pub(super) fn index_page(
        &self,
        range: &KeyRange,
        at: i64,
        take: usize,
    ) -> (usize, Vec<(Vec<u8>, KeyRevision)>) {
        let mut page = Vec::with_capacity(take.min(1024));
        let mut count = 0;
        for (k, kr) in self.index.range(range, at) {
            if count < take {
                page.push((k.to_vec(), *kr));
            }
            count += 1;
        }
        (count, page)
    }
}

/// The revisioned key-value store of one member.
pub struct MvccStore {
    storage: Storage,
    state: Arc<RwLock<State>>,
    /// Compacted revisions still on disk, deleted in the background (see `garbage.rs`).
    garbage: Arc<Garbage>,
    /// The thread deleting them, joined when the store is dropped.
    deleter: Option<std::thread::JoinHandle<()>>,
    /// Counters, alarms and readability as of the last commit, for callers that must not
    /// wait for the state lock (the write path checks the alarms on every request, every
    /// response carries the current revision) and for reads during an install, which refuse
    /// rather than wait or see a half-replaced state.
    published: Published,
}

impl MvccStore {
    /// Loads the counters and rebuilds the key index from the `kv` keyspace.
    ///
    /// # Errors
    /// On a read failure or a corrupt record.
    pub fn open(storage: Storage) -> StorageResult<Self> {
        Self::open_deleting(storage, true)
    }

    /// As [`MvccStore::open`], with compacted revisions left on disk (no deleting thread): what
    /// a store holds before its deletion has got anywhere.
    #[cfg(test)]
    pub(super) fn open_keeping_compacted(storage: Storage) -> StorageResult<Self> {
        Self::open_deleting(storage, false)
    }

    fn open_deleting(storage: Storage, delete: bool) -> StorageResult<Self> {
        let (state, leftover) = load_state(&storage)?;
        let published = Published::default();
        published.publish(&state);
        let (state, garbage) = (Arc::new(RwLock::new(state)), Arc::<Garbage>::default());
        garbage.push(leftover);
        let deleter = delete
            .then(|| super::garbage::start(storage.clone(), state.clone(), garbage.clone()))
            .flatten();
        Ok(MvccStore {
            storage,
            published,
            state,
            garbage,
            deleter,
        })
    }

    /// Compacted revisions whose records are not deleted yet (`physical` compactions wait for
    /// none to be left).
    pub fn compaction_pending(&self) -> usize {
        self.garbage.pending()
    }

    /// Runs `replace`, which rewrites the keyspaces wholesale (a snapshot install), with every
    /// reader and writer kept out, then reloads the state from disk: no read sees a mix.
    ///
    /// # Errors
    /// Those of `replace`; a reload failure.
    pub fn replace_all<E: From<StorageError>>(
        &self,
        replace: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let mut state = self.state.write().map_err(|_| poisoned())?;
        self.published.installing();
        // The old state's compacted revisions are not the new one's.
        self.garbage.clear();
        // Nothing reads the old index from here on (reads refuse while installing, and after a
        // failure): freed now, the new one is not built beside it.
        state.index = KeyIndex::default();
        let replaced = replace().and_then(|()| Ok(load_state(&self.storage)?));
        let (loaded, leftover) = match replaced {
            Ok(loaded) => loaded,
            Err(e) => {
                // Failed half-way, the keyspaces hold neither state: nothing is read again.
                self.published.failed();
                return Err(e);
            }
        };
        *state = loaded;
        self.garbage.push(leftover);
        self.published.publish(&state);
        self.published.installed();
        Ok(())
    }

    /// Starts a read at the current state.
    ///
    /// # Errors
    /// [`Error::Installing`] while a snapshot is installed (without waiting for it);
    /// [`Error::Storage`] when the state is unreadable for good, or the lock is poisoned (a
    /// writer panicked).
    pub fn read(&self) -> Result<ReadTxn<'_>> {
        match self.published.readable() {
            Ok(()) => {}
            Err(Unreadable::Installing) => return Err(Error::Installing),
            Err(Unreadable::Failed) => return Err(Error::Storage),
        }
        Ok(ReadTxn {
            storage: &self.storage,
            state: self.lock_readable()?,
        })
    }

    /// The state locked for reading, refused if it became unreadable for good while the reader
    /// waited for the lock (a write batch dropped uncommitted, a failed install: memory no
    /// longer matches the disk).
    fn lock_readable(&self) -> Result<RwLockReadGuard<'_, State>> {
        let state = self.state.read().map_err(|_| Error::Storage)?;
        match self.published.readable() {
            Err(Unreadable::Failed) => Err(Error::Storage),
            Ok(()) | Err(Unreadable::Installing) => Ok(state),
        }
    }

    /// Starts a range: answered at once if it reads fewer than `pending_from` values; otherwise
    /// its key-index part is done under the state's lock and its values are left to read from a
    /// view of the store taken with it, without the lock ([`PendingRange::finish`]). For reads
    /// that wait for the disk or read many values: the apply needs the lock for writing, and a
    /// range holding it through its reads held every write behind it (benches/RESULTS.md, "A
    /// cold range held every write").
    ///
    /// # Errors
    /// As [`super::range`].
    pub fn range_start(&self, req: &RangeRequest, pending_from: usize) -> Result<RangeStart> {
        let read = self.read()?;
        match super::range::plan(&read, req)? {
            super::range::Planned::Done(resp) => Ok(RangeStart::Done(resp)),
            super::range::Planned::Load(plan) if plan.values_to_read(req) < pending_from => {
                let resp = super::range::finish(&plan, req, |key, change| read.load(key, change))?;
                Ok(RangeStart::Done(resp))
            }
            super::range::Planned::Load(plan) => Ok(RangeStart::Pending(PendingRange::new(
                plan,
                self.storage.view(),
            ))),
        }
    }

    /// A view of the store for a copy in another format (etcd's database, see `etcd_db`), with
    /// what it needs to leave compacted revisions out: while a compaction's records are still
    /// being deleted, the revisions at or below the compacted one that it keeps (`None` when no
    /// compacted record is left on disk, so the view holds only kept ones).
    ///
    /// # Errors
    /// As [`Self::read`].
    pub fn export_view(
        &self,
    ) -> Result<(
        crate::storage::View,
        Option<std::collections::HashSet<Revision>>,
    )> {
        let txn = self.read()?;
        // Checked before the view is taken: new leftovers come only with a write, which the
        // lock keeps out; ones deleted meanwhile are filtered all the same.
        let kept = (self.garbage.pending() > 0).then(|| {
            txn.state
                .index
                .revisions_through(txn.state.compacted)
                .into_iter()
                .collect()
        });
        Ok((self.storage.view(), kept))
    }

    /// Starts a write; readers wait for it to commit or drop.
    ///
    /// # Errors
    /// When the lock is poisoned.
    pub fn write(&self) -> StorageResult<WriteTxn<'_>> {
        let state = self.state.write().map_err(|_| poisoned())?;
        Ok(WriteTxn::new(
            &self.storage,
            state,
            &self.published,
            &self.garbage,
        ))
    }

    /// Every change with `from <= revision <= to`, in revision order, as watch events (a
    /// delete's key-value carries only the key and its revision, as in etcd).
    ///
    /// # Errors
    /// [`Error::Compacted`] when `from` is below the compacted revision; a storage failure.
    pub fn history(&self, from: i64, to: i64) -> Result<Vec<Event>> {
        let state = self.lock_readable()?;
        if from < state.compacted {
            return Err(Error::Compacted);
        }
        if from > to {
            return Ok(Vec::new());
        }
        let start = Revision::new(from, 0).to_bytes();
        let end = Revision::new(to.saturating_add(1), 0).to_bytes();
        let records = self
            .storage
            .scan_range(Space::Kv, &start, &end)
            .map_err(|_| Error::Storage)?;
        drop(state);
        records
            .iter()
            .map(|(_, v)| {
                let (tombstone, kv) = decode_record(v).map_err(|_| Error::Storage)?;
                Ok(to_event(tombstone, kv))
            })
            .collect()
    }

    /// Reads lease `id` in place (a keep-alive needs its TTLs, not a copy of its keys).
    pub fn with_lease<T>(&self, id: i64, read: impl FnOnce(&LeaseInfo) -> T) -> Option<T> {
        self.lock_readable().ok()?.leases.get(id).map(read)
    }

    /// Every lease id with its granted TTL.
    pub fn leases(&self) -> Vec<(i64, i64)> {
        self.lock_readable().map_or(Vec::new(), |s| s.leases.all())
    }

    /// Keys with history in the index (live or deleted, not yet compacted).
    pub fn key_count(&self) -> usize {
        self.lock_readable().map_or(0, |s| s.index.len())
    }

    /// The current main revision (as of the last commit: never waits for one).
    pub fn current_revision(&self) -> i64 {
        self.published.current()
    }

    /// The last compacted main revision (as of the last commit).
    pub fn compacted_revision(&self) -> i64 {
        self.published.compacted()
    }

    /// Whether any member raised alarm `alarm`.
    pub fn has_alarm(&self, alarm: i32) -> bool {
        alarm_bit(alarm).is_some_and(|bit| self.published.raised() & bit != 0)
    }

    /// Every raised alarm: (member id, alarm type).
    pub fn alarms(&self) -> Vec<(u64, i32)> {
        self.lock_readable()
            .map_or(Vec::new(), |s| s.alarms.iter().copied().collect())
    }

    /// etcd's HashKV: CRC-32C (Castagnoli) of the bucket name `key` and then, in revision
    /// order, of every stored revision up to `at` as etcd lays it out (17-byte revision key,
    /// plus `t` for a tombstone, then the marshalled `KeyValue`; a tombstone's holds only the
    /// key). Revisions at or below the compacted one count only if they are some key's live
    /// version at `at` (etcd's `keep` set); if that set is empty, etcd counts every one still
    /// in its database, which once its compaction is done are the ones the compaction kept:
    /// here, the ones the key index still holds (records compacted but not yet deleted in the
    /// background never count, so members agree whatever their deletion progress). The same
    /// operations give the same hash as etcd. Returns the hash, the compacted revision and the
    /// revision hashed (`at`, or the current one when `at` is 0).
    ///
    /// # Errors
    /// [`Error::Compacted`] / [`Error::FutureRevision`] for `at` out of range; a read failure.
    pub fn hash_kv(&self, at: i64) -> Result<(u32, i64, i64)> {
        let state = self.lock_readable()?;
        let at = if at <= 0 { state.current } else { at };
        if at > state.current {
            return Err(Error::FutureRevision);
        }
        if at < state.compacted {
            return Err(Error::Compacted);
        }
        let compacted = state.compacted;
        let mut keep: std::collections::HashSet<Revision> = state
            .index
            .range(&KeyRange::From(Vec::new()), at)
            .map(|(_, kr)| kr.rev)
            .collect();
        if keep.is_empty() {
            keep.extend(state.index.revisions_through(compacted));
        }
        let end = Revision::new(at.saturating_add(1), 0).to_bytes();
        // A view taken under the lock, read after it: one record at a time, however large the
        // keyspace, without holding up writes.
        let view = self.storage.view();
        drop(state);
        let mut crc = crc32c::crc32c(b"key");
        let corrupt = |k: &[u8]| StorageError(format!("corrupt kv record {k:?}"));
        view.for_each_below(Space::Kv, &end, |k, v| {
            let rev = Revision::from_bytes(k).ok_or_else(|| corrupt(k))?;
            if rev.main <= compacted && !keep.contains(&rev) {
                return Ok(());
            }
            let (key, value) = etcd_entry(rev, v).map_err(|_| corrupt(k))?;
            crc = crc32c::crc32c_append(crc, &key);
            crc = crc32c::crc32c_append(crc, &value);
            Ok::<(), StorageError>(())
        })
        .map_err(|_| Error::Storage)?;
        Ok((crc, compacted, at))
    }
}

impl Drop for MvccStore {
    /// Ends the deleting thread, so that nothing holds the storage open after the store.
    fn drop(&mut self) {
        self.garbage.stop();
        if let Some(handle) = self.deleter.take() {
            let _ = handle.join();
        }
    }
}

fn poisoned() -> StorageError {
    StorageError("mvcc state lock poisoned".into())
}

/// The state on disk, and the compacted revisions still on disk (a crash came before the
/// background deletion was done).
fn load_state(storage: &Storage) -> StorageResult<(State, Vec<Revision>)> {
    let read_i64 = |key: &[u8], default: i64| -> StorageResult<i64> {
        Ok(match storage.get(Space::Meta, key)? {
            Some(v) => <[u8; 8]>::try_from(v.as_slice())
                .map(i64::from_be_bytes)
                .map_err(|_| StorageError(format!("corrupt meta value for {key:?}")))?,
            None => default,
        })
    };
    let current = read_i64(meta_key::REVISION, 1)?;
    let compacted = read_i64(meta_key::COMPACTED, -1)?;
    let loading = std::time::Instant::now();
    let mut index = super::index_load::load_index(storage, current)?;
    let leftover = if compacted > 0 {
        index.compact(compacted)
    } else {
        Vec::new()
    };
    tracing::info!(
        keys = index.len(),
        elapsed_ms = loading.elapsed().as_millis() as u64,
        "key index loaded"
    );
    let mut leases = LeaseTable::default();
    for (k, v) in storage.scan(Space::Lease)? {
        let id = <[u8; 8]>::try_from(k.as_slice()).map(i64::from_be_bytes);
        match (id, decode_lease(&v)) {
            (Ok(id), Some((ttl, remaining))) => leases.grant(id, ttl, remaining),
            _ => return Err(StorageError(format!("corrupt lease record {k:?}"))),
        }
    }
    for (key, kr) in index.range(&KeyRange::From(Vec::new()), current) {
        if kr.lease != 0 {
            leases.attach(kr.lease, key);
        }
    }
    let mut alarms = std::collections::BTreeSet::new();
    for (k, _) in storage.scan_prefix(Space::Meta, meta_key::ALARM)? {
        alarms.insert(decode_alarm_key(&k)?);
    }
    Ok((
        State {
            index,
            current,
            compacted,
            leases,
            alarms,
        },
        leftover,
    ))
}

/// Operations a request runs against the store, shared by reads and writes so that request
/// semantics (range options, txn) are written once.
pub trait KvTxn {
    /// The revision reads see: the current one, or the in-progress one inside a write that has
    /// already changed something.
    fn read_revision(&self) -> i64;
    /// The last compacted revision.
    fn compacted_revision(&self) -> i64;
    /// Every live key of `range` at `at`, with its metadata.
    fn index_range(&self, range: &KeyRange, at: i64) -> Vec<(Vec<u8>, KeyRevision)> {
        self.index_page(range, at, usize::MAX).1
    }
    /// How many live keys `range` has at `at`, and the first `take` of them.
    fn index_page(
        &self,
        range: &KeyRange,
        at: i64,
        take: usize,
    ) -> (usize, Vec<(Vec<u8>, KeyRevision)>);
    /// The full key-value of one index entry.
    ///
    /// # Errors
    /// On a read failure.
    fn load(&self, key: &[u8], change: &KeyRevision) -> Result<KeyValue>;
    /// Puts `key`, returning its previous value if it existed.
    ///
    /// # Errors
    /// On a read failure, or when called on a read-only transaction.
    fn put(&mut self, key: &[u8], value: &[u8], lease: i64) -> Result<()>;
    /// Whether lease `id` exists.
    fn lease_exists(&self, id: i64) -> bool;
    /// Deletes every key of `range`, returning the deleted key-values (with their values only
    /// when `with_values`: reading them costs a disk read each).
    ///
    /// # Errors
    /// On a read failure, or when called on a read-only transaction.
    fn delete_range(&mut self, range: &KeyRange, with_values: bool) -> Result<Vec<KeyValue>>;
}

pub(super) fn load_from_disk(
    storage: &Storage,
    key: &[u8],
    change: &KeyRevision,
) -> Result<KeyValue> {
    let read = storage.get_shared(Space::Kv, &change.rev.to_bytes());
    stored_key_value(read, key, change)
}

/// The `KeyValue` of `key` at `change`, from its record as read (it must be there).
pub(super) fn stored_key_value(
    read: StorageResult<Option<bytes::Bytes>>,
    key: &[u8],
    change: &KeyRevision,
) -> Result<KeyValue> {
    let bytes = read.map_err(|_| Error::Storage)?.ok_or(Error::Storage)?;
    let (_, stored) = decode_as::<KeyValue>(bytes).map_err(|_| Error::Storage)?;
    Ok(key_value(key, change, stored.value))
}

/// A consistent read of the store; holds the state lock for reading.
pub struct ReadTxn<'a> {
    storage: &'a Storage,
    state: RwLockReadGuard<'a, State>,
}

impl KvTxn for ReadTxn<'_> {
    fn read_revision(&self) -> i64 {
        self.state.current
    }

    fn compacted_revision(&self) -> i64 {
        self.state.compacted
    }

    fn index_page(
        &self,
        range: &KeyRange,
        at: i64,
        take: usize,
    ) -> (usize, Vec<(Vec<u8>, KeyRevision)>) {
        self.state.index_page(range, at, take)
    }

    fn load(&self, key: &[u8], change: &KeyRevision) -> Result<KeyValue> {
        load_from_disk(self.storage, key, change)
    }

    fn put(&mut self, _: &[u8], _: &[u8], _: i64) -> Result<()> {
        Err(Error::Storage)
    }

    fn lease_exists(&self, id: i64) -> bool {
        self.state.leases.contains(id)
    }

    fn delete_range(&mut self, _: &KeyRange, _: bool) -> Result<Vec<KeyValue>> {
        Err(Error::Storage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_install_refuses_reads_as_unavailable_and_counters_never_wait_for_it(
    ) -> std::result::Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = MvccStore::open(Storage::open(dir.path())?)?;
        let mut w = store.write()?;
        w.put(b"k", b"v", 0)?;
        w.end_request();
        w.commit()?;
        assert_eq!(store.current_revision(), 2);

        let during: StorageResult<()> = store.replace_all(|| {
            // Called while the install holds the state lock: neither waits for it.
            assert_eq!(store.read().err(), Some(Error::Installing));
            assert_eq!(store.current_revision(), 2);
            Ok(())
        });
        during?;
        assert!(store.read().is_ok(), "readable again once installed");

        let failed: StorageResult<()> =
            store.replace_all(|| Err(StorageError("the disk failed".into())));
        assert!(failed.is_err());
        assert_eq!(
            store.read().err(),
            Some(Error::Storage),
            "a failed install leaves nothing to read, for good"
        );
        Ok(())
    }
}
