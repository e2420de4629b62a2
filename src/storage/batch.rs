//! An atomic write across the state's keyspaces ([`Batch`]), values built in place for it
//! ([`Value`]), and writes too many for one batch ([`Batches`]).

use super::{Space, Storage, StorageResult};

/// A value built in place for a [`Batch`], which takes it without copying it (a value given
/// as a slice is copied into fjall's own buffer).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Value(pub(super) fjall::Slice);

impl Value {
    /// A value of `len` bytes written by `fill`.
    pub fn build(len: usize, fill: impl FnOnce(&mut [u8])) -> Value {
        let mut view = byteview::ByteView::with_size(len);
        match view.get_mut() {
            Some(mut bytes) => fill(&mut bytes),
            // Not shared when just made; should it ever be, build it aside and copy it.
            None => {
                let mut bytes = vec![0; len];
                fill(&mut bytes);
                return Value(bytes.into());
            }
        }
        Value(view.into())
    }
}

impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value(v.into())
    }
}

impl std::ops::Deref for Value {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// An atomic write across the state-machine keyspaces.
pub struct Batch {
    pub(super) inner: fjall::OwnedWriteBatch,
    pub(super) storage: Storage,
    /// The highest log index a value of this batch was left to (see [`super::logged`]).
    pub(super) logged_upto: Option<u64>,
}

impl Batch {
    /// Sets `key` to `value` in `space`.
    pub fn insert(&mut self, space: Space, key: &[u8], value: &[u8]) {
        let ks = self.storage.space(space);
        self.inner.insert(ks, key, value);
    }

    /// Sets `key` to a value built in place (not copied).
    pub fn insert_value(&mut self, space: Space, key: &[u8], value: Value) {
        let ks = self.storage.space(space);
        self.inner.insert(ks, key, value.0);
    }

    /// Sets `key` of the `kv` keyspace to `record` (built in place), whose bytes `at..at + len`
    /// the Raft log holds at `span`: the state journal records a reference to the log instead
    /// of them (see [`super::logged`]). A record too short for them, or whose entry the log has
    /// not synced yet, is journaled whole.
    pub fn insert_logged(
        &mut self,
        key: &[u8],
        record: Value,
        at: usize,
        len: usize,
        span: super::logged::LogSpan,
    ) {
        let ks = self.storage.space(Space::Kv);
        // Only an entry the log has synced: a leader may apply an entry its followers hold
        // before its own write of it is done, and a crash would then leave the journal naming an
        // entry the log never got.
        let synced = span.index < self.storage.wal.synced_end();
        let reference = synced
            .then(|| super::logged::reference(&record, at, len, span))
            .flatten();
        match reference {
            Some(reference) => {
                self.inner.insert_journaled_as(ks, key, record.0, reference);
                self.logged_upto = self.logged_upto.max(Some(span.index));
            }
            None => self.inner.insert(ks, key, record.0),
        }
    }

    /// Removes `key` from `space`.
    pub fn remove(&mut self, space: Space, key: &[u8]) {
        let ks = self.storage.space(space);
        self.inner.remove(ks, key);
    }

    /// Commits the batch atomically. Not synced: the Raft log, synced on every append, is the
    /// durability point, and [`Storage::persist_state`] runs before the log is ever purged.
    pub fn commit(self) -> StorageResult<()> {
        self.inner.commit()?;
        self.storage.writeback.wrote();
        // After the commit: a flush that reads this mark covers the batch's references.
        if let Some(upto) = self.logged_upto {
            self.storage.logged.wrote(upto);
        }
        Ok(())
    }
}

/// Writes too many for one [`Batch`] (a snapshot install, a rebuilt keyspace), committed in
/// batches of at most [`Batches::BYTES`] as they fill: atomic batch by batch, not as a whole,
/// so a caller that a crash interrupts must be able to start again. Each commit waits while too
/// many memtables wait to be flushed, so memory does not grow with what is written.
pub struct Batches<'a> {
    storage: &'a Storage,
    batch: Option<Batch>,
    bytes: usize,
}

impl<'a> Batches<'a> {
    /// Bytes of keys and values (each entry counted 16 more) per committed batch.
    pub const BYTES: usize = 8 << 20;

    /// No writes yet.
    pub fn new(storage: &'a Storage) -> Self {
        Batches {
            storage,
            batch: None,
            bytes: 0,
        }
    }

    fn batch(&mut self) -> &mut Batch {
        self.batch.get_or_insert_with(|| self.storage.batch())
    }

    /// Sets `key` to `value` in `space`.
    ///
    /// # Errors
    /// When a filled batch cannot be committed.
    pub fn insert(&mut self, space: Space, key: &[u8], value: &[u8]) -> StorageResult<()> {
        self.batch().insert(space, key, value);
        self.grew(key.len() + value.len())
    }

    /// Sets `key` to a value built in place (not copied).
    ///
    /// # Errors
    /// When a filled batch cannot be committed.
    pub fn insert_value(&mut self, space: Space, key: &[u8], value: Value) -> StorageResult<()> {
        let len = key.len() + value.len();
        self.batch().insert_value(space, key, value);
        self.grew(len)
    }

    /// Removes `key` from `space`.
    ///
    /// # Errors
    /// When a filled batch cannot be committed.
    pub fn remove(&mut self, space: Space, key: &[u8]) -> StorageResult<()> {
        self.batch().remove(space, key);
        self.grew(key.len())
    }

    fn grew(&mut self, by: usize) -> StorageResult<()> {
        self.bytes += by + 16;
        if self.bytes >= Self::BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Commits what is not committed yet.
    ///
    /// # Errors
    /// When the batch cannot be committed.
    pub fn flush(&mut self) -> StorageResult<()> {
        if let Some(b) = self.batch.take() {
            b.commit()?;
            self.storage.wait_for_flushes();
        }
        self.bytes = 0;
        Ok(())
    }
}
