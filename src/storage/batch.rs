//! An atomic write across the state's keyspaces ([`Batch`]), and values built in place for it
//! ([`Value`]).

use super::{Space, Storage, StorageResult};

/// A value built in place for a [`Batch`], which takes it without copying it (a value given
/// as a slice is copied into fjall's own buffer).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Value(fjall::Slice);

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
        Ok(())
    }
}
