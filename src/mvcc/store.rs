//! [`MvccStore`]: the key index and the revision counters over the `kv` keyspace, with read and
//! write transactions.
//!
//! Lock order: the state lock is the only lock here; a [`WriteTxn`] holds it for writing from
//! start to commit, so readers never see half of a request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use prost::Message;

use super::{Grouped, KeyIndex, KeyRange, KeyRevision, LeaseInfo, LeaseTable, Revision};
use crate::error::{Error, Result};
use crate::pb::mvccpb::event::EventType;
use crate::pb::mvccpb::{Event, KeyValue};
use crate::storage::{meta_key, Space, Storage, StorageError, StorageResult};

const PUT_TAG: u8 = b'p';
const TOMBSTONE_TAG: u8 = b't';

/// What the index and counters say at one moment.
#[derive(Debug)]
struct State {
    index: KeyIndex,
    /// The current main revision (1 in an empty store, as in etcd).
    current: i64,
    /// The last compacted main revision (-1 before any compaction, as in etcd).
    compacted: i64,
    /// Leases and their keys.
    leases: LeaseTable,
    /// Raised alarms: (member id, alarm type).
    alarms: std::collections::BTreeSet<(u64, i32)>,
}

impl State {
    fn index_range(&self, range: &KeyRange, at: i64) -> Vec<(Vec<u8>, KeyRevision)> {
        self.index
            .range(range, at)
            .map(|(k, kr)| (k.to_vec(), *kr))
            .collect()
    }
}

/// The revisioned key-value store of one member.
pub struct MvccStore {
    storage: Storage,
    state: RwLock<State>,
    /// The raised alarm types as a bit set (bit `t` for type `t`), published by each commit:
    /// the write path checks it on every request and must not wait for the state lock, which
    /// an apply holds through its disk write.
    raised: AtomicU64,
}

impl MvccStore {
    /// Loads the counters and rebuilds the key index from the `kv` keyspace.
    ///
    /// # Errors
    /// On a read failure or a corrupt record.
    pub fn open(storage: Storage) -> StorageResult<Self> {
        let state = load_state(&storage)?;
        Ok(MvccStore {
            storage,
            raised: AtomicU64::new(alarm_bits(&state.alarms)),
            state: RwLock::new(state),
        })
    }

    /// Reloads everything from disk, after a snapshot replaced the keyspaces.
    ///
    /// # Errors
    /// On a read failure or a corrupt record.
    pub fn reload(&self) -> StorageResult<()> {
        let fresh = load_state(&self.storage)?;
        let bits = alarm_bits(&fresh.alarms);
        *self.state.write().map_err(|_| poisoned())? = fresh;
        self.raised.store(bits, Ordering::Release);
        Ok(())
    }

    /// Starts a read at the current state.
    ///
    /// # Errors
    /// When the lock is poisoned (a writer panicked).
    pub fn read(&self) -> Result<ReadTxn<'_>> {
        Ok(ReadTxn {
            storage: &self.storage,
            state: self.state.read().map_err(|_| Error::Storage)?,
        })
    }

    /// Starts a write; readers wait for it to commit or drop.
    ///
    /// # Errors
    /// When the lock is poisoned.
    pub fn write(&self) -> StorageResult<WriteTxn<'_>> {
        Ok(WriteTxn {
            storage: &self.storage,
            state: self.state.write().map_err(|_| poisoned())?,
            raised: &self.raised,
            alarms_changed: false,
            staged: BTreeMap::new(),
            sub: 0,
            dirty: false,
            events: Vec::new(),
        })
    }

    /// Every change with `from <= revision <= to`, in revision order, as watch events (a
    /// delete's key-value carries only the key and its revision, as in etcd).
    ///
    /// # Errors
    /// [`Error::Compacted`] when `from` is below the compacted revision; a storage failure.
    pub fn history(&self, from: i64, to: i64) -> Result<Vec<Event>> {
        let state = self.state.read().map_err(|_| Error::Storage)?;
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
        self.state.read().ok()?.leases.get(id).map(read)
    }

    /// Every lease id with its granted TTL.
    pub fn leases(&self) -> Vec<(i64, i64)> {
        self.state.read().map_or(Vec::new(), |s| s.leases.all())
    }

    /// Keys with history in the index (live or deleted, not yet compacted).
    pub fn key_count(&self) -> usize {
        self.state.read().map_or(0, |s| s.index.len())
    }

    /// The current main revision.
    pub fn current_revision(&self) -> i64 {
        self.state.read().map_or(0, |s| s.current)
    }

    /// The last compacted main revision.
    pub fn compacted_revision(&self) -> i64 {
        self.state.read().map_or(0, |s| s.compacted)
    }

    /// Whether any member raised alarm `alarm`.
    pub fn has_alarm(&self, alarm: i32) -> bool {
        alarm_bit(alarm).is_some_and(|bit| self.raised.load(Ordering::Acquire) & bit != 0)
    }

    /// Every raised alarm: (member id, alarm type).
    pub fn alarms(&self) -> Vec<(u64, i32)> {
        self.state
            .read()
            .map_or(Vec::new(), |s| s.alarms.iter().copied().collect())
    }

    /// etcd's HashKV: CRC-32C (Castagnoli) of the bucket name `key` and then, in revision
    /// order, of every stored revision up to `at` as etcd lays it out (17-byte revision key,
    /// plus `t` for a tombstone, then the marshalled `KeyValue`; a tombstone's holds only the
    /// key). Revisions at or below the compacted one count only if they are some key's live
    /// version at `at` (etcd's `keep` set; all of them if that set is empty). The same
    /// operations give the same hash as etcd. Returns the hash, the compacted revision and the
    /// revision hashed (`at`, or the current one when `at` is 0).
    ///
    /// # Errors
    /// [`Error::Compacted`] / [`Error::FutureRevision`] for `at` out of range; a read failure.
    pub fn hash_kv(&self, at: i64) -> Result<(u32, i64, i64)> {
        let state = self.state.read().map_err(|_| Error::Storage)?;
        let at = if at <= 0 { state.current } else { at };
        if at > state.current {
            return Err(Error::FutureRevision);
        }
        if at <= state.compacted {
            return Err(Error::Compacted);
        }
        let compacted = state.compacted;
        let keep: std::collections::HashSet<Revision> = state
            .index
            .range(&KeyRange::From(Vec::new()), at)
            .map(|(_, kr)| kr.rev)
            .collect();
        let end = Revision::new(at.saturating_add(1), 0).to_bytes();
        let records = self
            .storage
            .scan_range(Space::Kv, &[], &end)
            .map_err(|_| Error::Storage)?;
        drop(state);
        let mut crc = crc32c::crc32c(b"key");
        for (k, v) in records {
            let rev = Revision::from_bytes(&k).ok_or(Error::Storage)?;
            if rev.main <= compacted && !keep.is_empty() && !keep.contains(&rev) {
                continue;
            }
            let (tombstone, kv) = decode_record(&v).map_err(|_| Error::Storage)?;
            let mut key = Vec::with_capacity(18);
            key.extend(rev.main.to_be_bytes());
            key.push(b'_');
            key.extend(rev.sub.to_be_bytes());
            if tombstone {
                key.push(b't');
            }
            crc = crc32c::crc32c_append(crc, &key);
            let value = if tombstone {
                KeyValue {
                    key: kv.key,
                    ..Default::default()
                }
                .encode_to_vec()
            } else {
                kv.encode_to_vec()
            };
            crc = crc32c::crc32c_append(crc, &value);
        }
        Ok((crc, compacted, at))
    }
}

/// The bit of alarm type `alarm` in [`MvccStore::raised`] (none for a type out of range).
fn alarm_bit(alarm: i32) -> Option<u64> {
    u32::try_from(alarm).ok().and_then(|t| 1u64.checked_shl(t))
}

/// The bit set of the alarm types in `alarms`.
fn alarm_bits(alarms: &std::collections::BTreeSet<(u64, i32)>) -> u64 {
    alarms
        .iter()
        .filter_map(|(_, a)| alarm_bit(*a))
        .fold(0, |bits, bit| bits | bit)
}

fn poisoned() -> StorageError {
    StorageError("mvcc state lock poisoned".into())
}

fn load_state(storage: &Storage) -> StorageResult<State> {
    let read_i64 = |key: &[u8], default: i64| -> StorageResult<i64> {
        Ok(match storage.get(Space::Meta, key)? {
            Some(v) => <[u8; 8]>::try_from(v.as_slice())
                .map(i64::from_be_bytes)
                .map_err(|_| StorageError(format!("corrupt meta value for {key:?}")))?,
            None => default,
        })
    };
    let current = read_i64(meta_key::REVISION, 1)?;
    let loading = std::time::Instant::now();
    let index = load_index(storage, current)?;
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
    Ok(State {
        index,
        current,
        compacted: read_i64(meta_key::COMPACTED, -1)?,
        leases,
        alarms,
    })
}

/// The meta key of alarm `alarm` raised by `member`.
fn alarm_key(member: u64, alarm: i32) -> Vec<u8> {
    let mut k = meta_key::ALARM.to_vec();
    k.extend(member.to_be_bytes());
    k.extend(alarm.to_be_bytes());
    k
}

fn decode_alarm_key(k: &[u8]) -> StorageResult<(u64, i32)> {
    let rest = k.get(meta_key::ALARM.len()..).unwrap_or_default();
    let member = rest.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok());
    let alarm = rest.get(8..12).and_then(|b| <[u8; 4]>::try_from(b).ok());
    match (member, alarm) {
        (Some(m), Some(a)) if rest.len() == 12 => {
            Ok((u64::from_be_bytes(m), i32::from_be_bytes(a)))
        }
        _ => Err(StorageError(format!("corrupt alarm key {k:?}"))),
    }
}

/// A lease record: granted TTL, then the checkpointed remaining TTL (both i64 big-endian).
fn encode_lease(ttl: i64, remaining: i64) -> Vec<u8> {
    let mut v = ttl.to_be_bytes().to_vec();
    v.extend(remaining.to_be_bytes());
    v
}

fn decode_lease(v: &[u8]) -> Option<(i64, i64)> {
    let ttl = v.get(..8)?.try_into().ok().map(i64::from_be_bytes)?;
    let remaining = v.get(8..16)?.try_into().ok().map(i64::from_be_bytes)?;
    Some((ttl, remaining))
}

/// A change as a watch event: a delete carries only the key and the deleting revision.
fn to_event(tombstone: bool, kv: KeyValue) -> Event {
    if tombstone {
        Event {
            r#type: EventType::Delete as i32,
            kv: Some(KeyValue {
                key: kv.key,
                mod_revision: kv.mod_revision,
                ..Default::default()
            }),
            prev_kv: None,
        }
    } else {
        Event {
            r#type: EventType::Put as i32,
            kv: Some(kv),
            prev_kv: None,
        }
    }
}

fn encode_record(tombstone: bool, kv: &KeyValue) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + kv.encoded_len());
    out.push(if tombstone { TOMBSTONE_TAG } else { PUT_TAG });
    kv.encode(&mut out).unwrap_or_default();
    out
}

/// Decodes a stored record as `M` (the whole `KeyValue`, or just the fields the index needs);
/// returns whether it is a tombstone.
fn decode_as<M: Message + Default>(bytes: &[u8]) -> StorageResult<(bool, M)> {
    let (tag, body) = bytes
        .split_first()
        .ok_or_else(|| StorageError("empty mvcc record".into()))?;
    let msg = M::decode(body).map_err(|e| StorageError(format!("corrupt record: {e}")))?;
    Ok((*tag == TOMBSTONE_TAG, msg))
}

fn decode_record(bytes: &[u8]) -> StorageResult<(bool, KeyValue)> {
    decode_as(bytes)
}

/// Rebuilds the key index from every stored change. The two halves of the revision space are
/// read and decoded on two threads, then the changes are sorted by key (stably, so each key's
/// revisions stay in order) and the tree is built from sorted input: a million keys load in
/// about half the time of inserting them one by one in revision order.
fn load_index(storage: &Storage, current: i64) -> StorageResult<KeyIndex> {
    let middle = Revision::new(current / 2 + 1, 0).to_bytes();
    let (low, high) = std::thread::scope(|scope| {
        let low = scope.spawn(|| read_changes(storage, &[], Some(&middle)));
        let high = read_changes(storage, &middle, None);
        (low.join(), high)
    });
    let low = low.map_err(|_| StorageError("key index loader panicked".into()))??;
    Ok(KeyIndex::from_groups(low, high?))
}

/// The key index entries of the changes stored at revisions `from <= rev < to`, grouped by key
/// (sorting is most of building the index: each scan thread sorts its own span).
fn read_changes(storage: &Storage, from: &[u8], to: Option<&[u8]>) -> StorageResult<Grouped> {
    let mut changes = Vec::new();
    storage.for_each_in(Space::Kv, from, to, |k, v| {
        let rev = Revision::from_bytes(k)
            .ok_or_else(|| StorageError(format!("corrupt revision key {k:?}")))?;
        let (tombstone, head) = decode_as::<IndexFields>(v)?;
        let change = if tombstone {
            KeyRevision::tombstone(rev)
        } else {
            KeyRevision {
                rev,
                create_revision: head.create_revision,
                version: head.version,
                lease: head.lease,
            }
        };
        changes.push((head.key.into_boxed_slice(), change));
        Ok(())
    })?;
    Ok(Grouped::new(changes))
}

/// The fields of a stored `mvccpb.KeyValue` the key index needs: decoding skips the value
/// (field 5) instead of copying it, which is most of a start-up scan.
#[derive(Clone, PartialEq, prost::Message)]
struct IndexFields {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(int64, tag = "2")]
    create_revision: i64,
    #[prost(int64, tag = "4")]
    version: i64,
    #[prost(int64, tag = "6")]
    lease: i64,
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
    fn index_range(&self, range: &KeyRange, at: i64) -> Vec<(Vec<u8>, KeyRevision)>;
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

fn key_value(key: &[u8], change: &KeyRevision, value: Vec<u8>) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        create_revision: change.create_revision,
        mod_revision: change.rev.main,
        version: change.version,
        value,
        lease: change.lease,
    }
}

fn load_from_disk(storage: &Storage, key: &[u8], change: &KeyRevision) -> Result<KeyValue> {
    let bytes = storage
        .get(Space::Kv, &change.rev.to_bytes())
        .map_err(|_| Error::Storage)?
        .ok_or(Error::Storage)?;
    let (_, stored) = decode_record(&bytes).map_err(|_| Error::Storage)?;
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

    fn index_range(&self, range: &KeyRange, at: i64) -> Vec<(Vec<u8>, KeyRevision)> {
        self.state.index_range(range, at)
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

/// A write of one or more requests into one atomic batch (the apply path's unit of work).
///
/// Call [`WriteTxn::end_request`] after each request: a request that changed anything takes the
/// next main revision, and its changes get sub-revisions 0, 1, 2, ...
pub struct WriteTxn<'a> {
    storage: &'a Storage,
    state: RwLockWriteGuard<'a, State>,
    /// The store's published alarm bits, updated by [`WriteTxn::commit`] when this batch
    /// raised or cleared an alarm.
    raised: &'a AtomicU64,
    alarms_changed: bool,
    /// Writes of this batch by keyspace and key (`None` deletes), readable before commit and
    /// written as one fjall batch by [`WriteTxn::commit`].
    staged: BTreeMap<(Space, Vec<u8>), Option<Vec<u8>>>,
    /// Changes made by the current request.
    sub: i64,
    /// Whether anything was written since the batch began.
    dirty: bool,
    /// The changes of this batch, in revision order, for watchers.
    events: Vec<Event>,
}

impl WriteTxn<'_> {
    fn next_revision(&mut self) -> Revision {
        let rev = Revision::new(self.state.current + 1, self.sub);
        self.sub += 1;
        rev
    }

    fn record(&mut self, key: &[u8], change: KeyRevision, value: &[u8]) {
        let kv = key_value(key, &change, value.to_vec());
        let bytes = encode_record(change.is_tombstone(), &kv);
        self.staged
            .insert((Space::Kv, change.rev.to_bytes().to_vec()), Some(bytes));
        self.state.index.push(key, change);
        self.dirty = true;
        self.events.push(to_event(change.is_tombstone(), kv));
    }

    /// Closes the current request; returns the revision it produced (the current revision if it
    /// changed nothing).
    pub fn end_request(&mut self) -> i64 {
        if self.sub > 0 {
            self.state.current += 1;
            self.sub = 0;
        }
        self.state.current
    }

    /// Compacts history below `at`.
    ///
    /// # Errors
    /// [`Error::Compacted`] if `at` is not above the last compaction, [`Error::FutureRevision`]
    /// if it is above the current revision.
    pub fn compact(&mut self, at: i64) -> Result<()> {
        if at <= self.state.compacted {
            return Err(Error::Compacted);
        }
        if at > self.state.current {
            return Err(Error::FutureRevision);
        }
        for rev in self.state.index.compact(at) {
            self.staged
                .insert((Space::Kv, rev.to_bytes().to_vec()), None);
        }
        self.state.compacted = at;
        self.set_meta(meta_key::COMPACTED, &at.to_be_bytes());
        self.dirty = true;
        Ok(())
    }

    /// Grants a lease.
    ///
    /// # Errors
    /// [`Error::LeaseExists`].
    pub fn grant_lease(&mut self, id: i64, ttl: i64) -> Result<()> {
        if self.state.leases.contains(id) {
            return Err(Error::LeaseExists);
        }
        self.state.leases.grant(id, ttl, 0);
        self.staged.insert(
            (Space::Lease, id.to_be_bytes().to_vec()),
            Some(encode_lease(ttl, 0)),
        );
        Ok(())
    }

    /// Records a lease's remaining TTL (leases that are gone are skipped).
    pub fn checkpoint_lease(&mut self, id: i64, remaining: i64) {
        if let Some(ttl) = self.state.leases.checkpoint(id, remaining) {
            self.staged.insert(
                (Space::Lease, id.to_be_bytes().to_vec()),
                Some(encode_lease(ttl, remaining)),
            );
        }
    }

    /// Revokes a lease, deleting every key attached to it within the current request.
    ///
    /// # Errors
    /// [`Error::LeaseNotFound`], or a storage failure.
    pub fn revoke_lease(&mut self, id: i64) -> Result<()> {
        let lease = self.state.leases.remove(id).ok_or(Error::LeaseNotFound)?;
        self.staged
            .insert((Space::Lease, id.to_be_bytes().to_vec()), None);
        for key in lease.keys {
            self.delete_range(&KeyRange::Single(key), false)?;
        }
        Ok(())
    }

    /// Adds a metadata write (applied index, membership) to the batch.
    pub fn set_meta(&mut self, key: &[u8], value: &[u8]) {
        self.staged
            .insert((Space::Meta, key.to_vec()), Some(value.to_vec()));
    }

    /// Adds a metadata delete to the batch.
    pub fn remove_meta(&mut self, key: &[u8]) {
        self.staged.insert((Space::Meta, key.to_vec()), None);
    }

    /// The keys attached to lease `id` (none if it does not exist).
    pub fn lease_keys(&self, id: i64) -> Vec<Vec<u8>> {
        self.state
            .leases
            .get(id)
            .map(|l| l.keys.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Raises (`on`) or clears an alarm; true if that changed anything.
    pub fn set_alarm(&mut self, member: u64, alarm: i32, on: bool) -> bool {
        let changed = if on {
            self.state.alarms.insert((member, alarm))
        } else {
            self.state.alarms.remove(&(member, alarm))
        };
        if changed {
            self.alarms_changed = true;
            let key = alarm_key(member, alarm);
            self.staged.insert((Space::Meta, key), on.then(Vec::new));
        }
        changed
    }

    /// Whether any member raised alarm `alarm`.
    pub fn has_alarm(&self, alarm: i32) -> bool {
        self.state.alarms.iter().any(|(_, a)| *a == alarm)
    }

    /// Makes room for the events of `requests` more requests (a proposal batch of tens of puts
    /// otherwise regrows, and moves, the event list several times).
    pub fn reserve_events(&mut self, requests: usize) {
        self.events.reserve(requests);
    }

    /// Commits the batch atomically; readers see it from now on. Returns the batch's events in
    /// revision order, for the watch hub.
    ///
    /// # Errors
    /// When the batch cannot be written: the member must stop, its memory is ahead of its disk.
    pub fn commit(mut self) -> StorageResult<Vec<Event>> {
        if self.dirty {
            let current = self.state.current;
            self.set_meta(meta_key::REVISION, &current.to_be_bytes());
        }
        let mut batch = self.storage.batch();
        for ((space, key), value) in std::mem::take(&mut self.staged) {
            match value {
                Some(v) => batch.insert(space, &key, &v),
                None => batch.remove(space, &key),
            }
        }
        batch.commit()?;
        if self.alarms_changed {
            self.raised
                .store(alarm_bits(&self.state.alarms), Ordering::Release);
        }
        Ok(self.events)
    }
}

impl KvTxn for WriteTxn<'_> {
    fn read_revision(&self) -> i64 {
        self.state.current + i64::from(self.sub > 0)
    }

    fn compacted_revision(&self) -> i64 {
        self.state.compacted
    }

    fn index_range(&self, range: &KeyRange, at: i64) -> Vec<(Vec<u8>, KeyRevision)> {
        self.state.index_range(range, at)
    }

    fn load(&self, key: &[u8], change: &KeyRevision) -> Result<KeyValue> {
        let staged = self
            .staged
            .get(&(Space::Kv, change.rev.to_bytes().to_vec()));
        match staged {
            Some(Some(bytes)) => {
                let (_, kv) = decode_record(bytes).map_err(|_| Error::Storage)?;
                Ok(key_value(key, change, kv.value))
            }
            _ => load_from_disk(self.storage, key, change),
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8], lease: i64) -> Result<()> {
        // The index holds everything a put needs of the previous version: no disk read.
        let prev = self.state.index.get(key, self.read_revision()).copied();
        let rev = self.next_revision();
        let change = KeyRevision {
            rev,
            create_revision: prev.map_or(rev.main, |p| p.create_revision),
            version: prev.map_or(1, |p| p.version + 1),
            lease,
        };
        if let Some(p) = prev.filter(|p| p.lease != 0) {
            self.state.leases.detach(p.lease, key);
        }
        if lease != 0 {
            self.state.leases.attach(lease, key);
        }
        self.record(key, change, value);
        Ok(())
    }

    fn lease_exists(&self, id: i64) -> bool {
        self.state.leases.contains(id)
    }

    fn delete_range(&mut self, range: &KeyRange, with_values: bool) -> Result<Vec<KeyValue>> {
        let at = self.read_revision();
        let mut deleted = Vec::new();
        for (key, kr) in self.index_range(range, at) {
            if kr.lease != 0 {
                self.state.leases.detach(kr.lease, &key);
            }
            deleted.push(if with_values {
                self.load(&key, &kr)?
            } else {
                key_value(&key, &kr, Vec::new())
            });
            let rev = self.next_revision();
            self.record(&key, KeyRevision::tombstone(rev), b"");
        }
        Ok(deleted)
    }
}
