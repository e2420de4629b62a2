//! [`View`]: a consistent point-in-time view of the state-machine keyspaces (a fjall snapshot),
//! read as a stream. Snapshots are built from one while the state machine goes on applying.

use std::ops::Bound;

use fjall::Readable;

use super::{Space, Storage, StorageError, StorageResult};

/// The state-machine keyspaces as they were when [`Storage::view`] was called. Holding one keeps
/// fjall from dropping the versions it sees: drop it when done.
pub struct View {
    snapshot: fjall::Snapshot,
    storage: Storage,
}

impl Storage {
    /// A consistent view of every state-machine keyspace at this instant (batches committed
    /// before the call are in it whole, later ones not at all).
    pub fn view(&self) -> View {
        View {
            snapshot: self.db.snapshot(),
            storage: self.clone(),
        }
    }
}

impl View {
    /// Syncs the state's journal (everything in the view, and more, is then on disk), and
    /// flushes the values it left to the Raft log ([`Storage::flush_logged`]).
    ///
    /// # Errors
    /// When the sync or the flush fails.
    pub fn persist_state(&self) -> StorageResult<()> {
        self.storage.persist_state()?;
        // The log up to the view may go once the snapshot is taken: the values the state
        // journal left to it go to tables first.
        self.storage.flush_logged()
    }

    /// The state's sequence number as of the view: two views with the same one (in one
    /// process) see the same data.
    pub fn seqno(&self) -> u64 {
        self.snapshot.seqno()
    }

    /// One value as of the view.
    ///
    /// # Errors
    /// On a read failure.
    pub fn get(&self, space: Space, key: &[u8]) -> StorageResult<Option<Vec<u8>>> {
        Ok(self
            .snapshot
            .get(self.storage.space(space), key)?
            .map(|v| v.to_vec()))
    }

    /// One value as of the view, shared or copied as [`Storage::get_shared`] does.
    ///
    /// # Errors
    /// On a read failure.
    pub fn get_shared(&self, space: Space, key: &[u8]) -> StorageResult<Option<bytes::Bytes>> {
        Ok(self
            .snapshot
            .get(self.storage.space(space), key)?
            .map(super::shared_bytes))
    }

    /// Calls `visit` with every `(key, value)` of `space` whose key starts with `prefix` (all of
    /// them for an empty prefix), in key order, one at a time.
    ///
    /// # Errors
    /// On a read failure, or the first error `visit` returns.
    pub fn for_each<E: From<StorageError>>(
        &self,
        space: Space,
        prefix: &[u8],
        visit: impl FnMut(&[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let end = super::prefix_end(prefix);
        let upper = if prefix.is_empty() || end == [0] {
            Bound::Unbounded
        } else {
            Bound::Excluded(end.as_slice())
        };
        self.visit(space, (Bound::Included(prefix), upper), visit)
    }

    /// Calls `visit` with every `(key, value)` of `space` with `key < end`, in key order.
    ///
    /// # Errors
    /// On a read failure, or the first error `visit` returns.
    pub fn for_each_below<E: From<StorageError>>(
        &self,
        space: Space,
        end: &[u8],
        visit: impl FnMut(&[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        self.visit(space, (Bound::Unbounded, Bound::Excluded(end)), visit)
    }

    fn visit<E: From<StorageError>>(
        &self,
        space: Space,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let ks = self.storage.space(space);
        for guard in self.snapshot.range::<&[u8], _>(ks, range) {
            let (k, v) = guard.into_inner().map_err(StorageError::from)?;
            visit(&k, &v)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_does_not_see_later_writes() -> StorageResult<()> {
        let dir = tempfile::tempdir().map_err(|e| StorageError(e.to_string()))?;
        let s = Storage::open(dir.path())?;
        let mut b = s.batch();
        b.insert(Space::Kv, b"a", b"1");
        b.insert(Space::Meta, b"m/x", b"2");
        b.commit()?;
        let view = s.view();
        let mut b = s.batch();
        b.insert(Space::Kv, b"b", b"3");
        b.remove(Space::Kv, b"a");
        b.insert(Space::Meta, b"m/y", b"4");
        b.commit()?;
        let mut seen = Vec::new();
        view.for_each::<StorageError>(Space::Kv, b"", |k, v| {
            seen.push((k.to_vec(), v.to_vec()));
            Ok(())
        })?;
        assert_eq!(seen, vec![(b"a".to_vec(), b"1".to_vec())]);
        let mut meta = Vec::new();
        view.for_each::<StorageError>(Space::Meta, b"m/", |k, _| {
            meta.push(k.to_vec());
            Ok(())
        })?;
        assert_eq!(meta, vec![b"m/x".to_vec()]);
        assert_eq!(view.get(Space::Kv, b"b")?, None);
        let mut below = Vec::new();
        view.for_each_below::<StorageError>(Space::Meta, b"m/y", |k, _| {
            below.push(k.to_vec());
            Ok(())
        })?;
        assert!(below.contains(&b"m/x".to_vec()) && !below.iter().any(|k| k >= &b"m/y".to_vec()));
        Ok(())
    }
}
