//! [`WriteTxn`]: the apply path's atomic batch of one or more requests over the store.

use std::collections::BTreeMap;
use std::sync::RwLockWriteGuard;

use super::published::Published;
use super::records::{
    alarm_key, decode_record, encode_index_entry, encode_lease, encode_record, key_value, to_event,
};
use super::store::{load_from_disk, KvTxn, State};
use super::value_source::{value_offset, ValueSource};
use super::{KeyRange, KeyRevision, Revision};
use crate::error::{Error, Result};
use crate::pb::mvccpb::{Event, KeyValue};
use crate::storage::logged::LogSpan;
use crate::storage::{meta_key, Space, Storage, StorageResult, Value};

/// A write of one or more requests into one atomic batch (the apply path's unit of work).
///
/// Call [`WriteTxn::end_request`] after each request: a request that changed anything takes the
/// next main revision, and its changes get sub-revisions 0, 1, 2, ...
///
/// The state in memory changes as the requests are applied, the disk at [`WriteTxn::commit`]: a
/// batch that changed anything and is dropped uncommitted (an apply or commit that failed)
/// leaves memory ahead of the disk, so the store refuses its reads from then on (as after a
/// failed install) until the member restarts from its disk. (The auth store's own memory is
/// not covered: it is ahead until the member, which must stop then, exits.)
pub struct WriteTxn<'a> {
    storage: &'a Storage,
    state: RwLockWriteGuard<'a, State>,
    /// What the store publishes, updated by [`WriteTxn::commit`] (the alarms only when this
    /// batch raised or cleared one).
    published: &'a Published,
    alarms_changed: bool,
    /// Writes of this batch by keyspace and key (`None` deletes), readable before commit and
    /// written as one fjall batch by [`WriteTxn::commit`].
    staged: BTreeMap<(Space, Vec<u8>), Option<Value>>,
    /// The `index` keyspace's entries of this batch's records (never read back before commit,
    /// nor written twice: kept apart from `staged`).
    index_entries: Vec<([u8; 16], Value)>,
    /// Changes made by the current request.
    sub: i64,
    /// Whether a record or compaction was written since the batch began, until it commits (a
    /// batch dropped while dirty, or while `staged` holds writes, left memory ahead of the disk).
    dirty: bool,
    /// The changes of this batch, in revision order, for watchers.
    events: Vec<Event>,
    /// Where a compaction made by this batch goes on, once it commits.
    garbage: &'a super::garbage::Garbage,
    /// The revision this batch compacted at, if it did.
    compacted_at: Option<i64>,
    /// The log entry being applied, which holds the values of its puts (see
    /// [`WriteTxn::apply_from`]).
    source: Option<ValueSource>,
    /// Records of `staged` whose value the log holds: the record's key, where the value starts
    /// in the record and its length, and where the log holds it.
    logged: BTreeMap<Vec<u8>, (usize, usize, LogSpan)>,
}

impl<'a> WriteTxn<'a> {
    /// A write over `state` (locked for writing until commit or drop).
    pub(super) fn new(
        storage: &'a Storage,
        state: RwLockWriteGuard<'a, State>,
        published: &'a Published,
        garbage: &'a super::garbage::Garbage,
    ) -> Self {
        WriteTxn {
            storage,
            state,
            published,
            alarms_changed: false,
            staged: BTreeMap::new(),
            index_entries: Vec::new(),
            sub: 0,
            dirty: false,
            events: Vec::new(),
            garbage,
            compacted_at: None,
            source: None,
            logged: BTreeMap::new(),
        }
    }

    /// The requests applied from here on come from the Raft log entry at `index`, whose stored
    /// bytes end with `bytes` (its encoded command): the state journal may refer to the values
    /// of their puts there instead of repeating them (`storage::logged`).
    pub fn apply_from(&mut self, index: u64, bytes: bytes::Bytes) {
        self.source = Some(ValueSource::new(index, bytes));
    }

    fn next_revision(&mut self) -> Revision {
        let rev = Revision::new(self.state.current + 1, self.sub);
        self.sub += 1;
        rev
    }

    fn record(&mut self, key: &[u8], change: KeyRevision, value: &[u8]) {
        let kv = key_value(key, &change, bytes::Bytes::copy_from_slice(value));
        let bytes = encode_record(change.is_tombstone(), &kv);
        let rev = change.rev.to_bytes();
        let span = self.source.as_mut().and_then(|s| s.locate(value));
        if let Some(span) = span {
            if let Some(at) = value_offset(&bytes, value, change.lease) {
                self.logged.insert(rev.to_vec(), (at, value.len(), span));
            }
        }
        self.staged.insert((Space::Kv, rev.to_vec()), Some(bytes));
        self.index_entries
            .push((rev, encode_index_entry(key, &change)));
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
        // The key index is compacted, and the records deleted, in the background once this
        // batch commits (`garbage.rs`): reads below `at` are refused from here on, and reads at
        // or above it see the same versions whether or not the older history is still there.
        self.compacted_at = Some(at);
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
            Some(encode_lease(ttl, 0).into()),
        );
        Ok(())
    }

    /// Records a lease's remaining TTL (leases that are gone are skipped).
    pub fn checkpoint_lease(&mut self, id: i64, remaining: i64) {
        if let Some(ttl) = self.state.leases.checkpoint(id, remaining) {
            self.staged.insert(
                (Space::Lease, id.to_be_bytes().to_vec()),
                Some(encode_lease(ttl, remaining).into()),
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
            .insert((Space::Meta, key.to_vec()), Some(value.to_vec().into()));
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
            self.staged
                .insert((Space::Meta, key), on.then(Value::default));
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
        // A batch of lease, alarm or membership changes alone stages writes without being
        // dirty: once taken from `staged`, a failed write must still mark the state (drop).
        self.dirty |= !self.staged.is_empty();
        let mut batch = self.storage.batch();
        for ((space, key), value) in std::mem::take(&mut self.staged) {
            let logged = (space == Space::Kv)
                .then(|| self.logged.get(&key))
                .flatten();
            match (value, logged) {
                (Some(v), Some(&(at, len, span))) => batch.insert_logged(&key, v, at, len, span),
                (Some(v), None) => batch.insert_value(space, &key, v),
                (None, _) => batch.remove(space, &key),
            }
        }
        for (rev, entry) in std::mem::take(&mut self.index_entries) {
            batch.insert_value(Space::Index, &rev, entry);
        }
        batch.commit()?;
        // Written: nothing is left for the drop to count as lost.
        self.dirty = false;
        if let Some(at) = self.compacted_at.take() {
            self.garbage.compact_index(at);
        }
        if self.alarms_changed {
            self.published.publish(&self.state);
        } else {
            self.published.publish_counters(&self.state);
        }
        Ok(std::mem::take(&mut self.events))
    }
}

impl Drop for WriteTxn<'_> {
    fn drop(&mut self) {
        if self.dirty || !self.staged.is_empty() {
            tracing::error!("a write batch was dropped uncommitted; the state is unreadable");
            self.published.failed();
        }
    }
}

impl KvTxn for WriteTxn<'_> {
    fn read_revision(&self) -> i64 {
        self.state.current + i64::from(self.sub > 0)
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
            // Read before anything changes: a failed read leaves this key as it was.
            deleted.push(if with_values {
                self.load(&key, &kr)?
            } else {
                key_value(&key, &kr, bytes::Bytes::new())
            });
            if kr.lease != 0 {
                self.state.leases.detach(kr.lease, &key);
            }
            let rev = self.next_revision();
            self.record(&key, KeyRevision::tombstone(rev), b"");
        }
        Ok(deleted)
    }
}
