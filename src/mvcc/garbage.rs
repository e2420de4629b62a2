//! Compacted revisions whose records are still on disk, deleted by a thread of their own in
//! small batches, as etcd deletes them (it takes 1,000 per batch): a compaction of millions of
//! revisions no longer writes all their deletions in the batch that applies it, under the state
//! lock, while every write waits.
//!
//! Nothing reads a compacted revision (reads and watches below the compacted revision are
//! refused, HashKV skips them as etcd's does), so a record may outlive its compaction for a
//! while; a crash leaves some behind, and the key index, rebuilt at start, finds them again
//! (`KeyIndex::compact` at the compacted revision). Each batch is deleted under the state's
//! read lock: a snapshot install, which replaces the whole state under the write lock and then
//! clears this queue, never interleaves with a batch, so a revision of the old state is never
//! deleted from the new one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::time::Duration;

use super::store::State;
use super::Revision;
use crate::storage::{Space, Storage};

/// Deletions per batch (etcd's `compaction-batch-limit`): each holds writers back for a moment
/// only, and writers get the lock between two batches.
const BATCH: usize = 1000;
/// The pause between two batches, so that waiting writes go first.
const PAUSE: Duration = Duration::from_millis(1);

/// The queue of revisions to delete.
#[derive(Default)]
pub(super) struct Garbage {
    queue: Mutex<VecDeque<Revision>>,
    wake: Condvar,
    /// Revisions queued or being deleted.
    pending: AtomicUsize,
    /// Set when the store is dropped: the thread ends (and lets go of the storage) at once.
    stop: std::sync::atomic::AtomicBool,
}

impl Garbage {
    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Revision>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `revisions` for deletion. Called with the state locked for writing.
    pub(super) fn push(&self, revisions: Vec<Revision>) {
        if revisions.is_empty() {
            return;
        }
        self.pending.fetch_add(revisions.len(), Ordering::AcqRel);
        self.queue().extend(revisions);
        self.wake.notify_one();
    }

    /// Forgets every queued revision (the state was replaced). Called with the state locked
    /// for writing, so no batch is being deleted.
    pub(super) fn clear(&self) {
        self.queue().clear();
        self.pending.store(0, Ordering::Release);
    }

    /// Revisions still to delete.
    pub(super) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Tells the thread to end.
    pub(super) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _queue = self.queue();
        self.wake.notify_all();
    }
}

/// Starts the thread deleting `garbage` from `storage`; it ends on [`Garbage::stop`].
pub(super) fn start(
    storage: Storage,
    state: Weak<RwLock<State>>,
    garbage: Weak<Garbage>,
) -> Option<std::thread::JoinHandle<()>> {
    let spawned = std::thread::Builder::new()
        .name("mvcc-compaction".into())
        .spawn(move || run(&storage, &state, &garbage));
    match spawned {
        Ok(handle) => Some(handle),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the compaction thread");
            None
        }
    }
}

fn run(storage: &Storage, state: &Weak<RwLock<State>>, garbage: &Weak<Garbage>) {
    let mut round: Option<(std::time::Instant, usize)> = None;
    loop {
        let Some(g) = garbage.upgrade() else {
            return;
        };
        if g.stop.load(Ordering::Acquire) {
            return;
        }
        {
            let queue = g.queue();
            if queue.is_empty() {
                if let Some((started, deleted)) = round.take() {
                    tracing::info!(
                        deleted,
                        took_ms = started.elapsed().as_millis() as u64,
                        "finished deleting compacted revisions"
                    );
                }
                // Wakes to notice a dropped store too.
                let _ = g.wake.wait_timeout(queue, Duration::from_millis(200));
                continue;
            }
        }
        if round.is_some() {
            std::thread::sleep(PAUSE);
        }
        let Some(state) = state.upgrade() else {
            return;
        };
        let Ok(_readers_only) = state.read() else {
            return;
        };
        let batch: Vec<Revision> = {
            let mut queue = g.queue();
            let n = queue.len().min(BATCH);
            queue.drain(..n).collect()
        };
        let mut writes = storage.batch();
        for rev in &batch {
            writes.remove(Space::Kv, &rev.to_bytes());
        }
        if let Err(e) = writes.commit() {
            // Left on disk: found again by the next start's index rebuild.
            tracing::warn!(error = %e, "deleting compacted revisions");
        }
        // Still under the lock, so that a `clear` cannot come in between.
        g.pending.fetch_sub(batch.len(), Ordering::AcqRel);
        let (_, deleted) = round.get_or_insert((std::time::Instant::now(), 0));
        *deleted += batch.len();
    }
}

/// Creates a queue and a state shared with its thread.
pub(super) fn shared(state: State) -> (Arc<RwLock<State>>, Arc<Garbage>) {
    (Arc::new(RwLock::new(state)), Arc::new(Garbage::default()))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use crate::mvcc::{KvTxn, MvccStore};
    use crate::storage::{Space, Storage};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// Three versions of each of `keys` keys: revisions 2..=3*keys+1.
    fn write_versions(store: &MvccStore, keys: usize) -> TestResult {
        for version in 0..3 {
            for k in 0..keys {
                let mut w = store.write()?;
                w.put(
                    format!("k{k}").as_bytes(),
                    format!("v{version}").as_bytes(),
                    0,
                )?;
                w.end_request();
                w.commit()?;
            }
        }
        Ok(())
    }

    fn wait_drained(store: &MvccStore) -> TestResult {
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        while store.compaction_pending() > 0 {
            if Instant::now() > deadline {
                return Err("compacted revisions never deleted".into());
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(())
    }

    #[test]
    fn compacted_records_are_deleted_after_the_compaction_commits() -> TestResult {
        let dir = tempfile::tempdir()?;
        let storage = Storage::open(dir.path())?;
        let store = MvccStore::open(storage.clone())?;
        write_versions(&store, 5000)?;
        assert_eq!(storage.scan(Space::Kv)?.len(), 15_000);
        let mut w = store.write()?;
        w.compact(store_current(&w))?;
        w.commit()?;
        wait_drained(&store)?;
        // Each key's last version is all that is left, and it still reads.
        assert_eq!(storage.scan(Space::Kv)?.len(), 5000);
        let r = store.read()?;
        assert_eq!(
            r.index_range(&crate::mvcc::KeyRange::Single(b"k7".to_vec()), 15_001)
                .len(),
            1
        );
        Ok(())
    }

    fn store_current(w: &crate::mvcc::WriteTxn<'_>) -> i64 {
        w.read_revision()
    }

    #[test]
    fn hash_kv_does_not_depend_on_how_far_the_deletion_got() -> TestResult {
        let dir = tempfile::tempdir()?;
        let storage = Storage::open(dir.path())?;
        {
            let store = MvccStore::open(storage.clone())?;
            write_versions(&store, 300)?;
            // Every key deleted: no key is live, etcd's `keep` set is empty.
            let mut w = store.write()?;
            w.delete_range(&crate::mvcc::KeyRange::From(Vec::new()), false)?;
            w.end_request();
            let at = w.read_revision();
            w.set_meta(crate::storage::meta_key::COMPACTED, &at.to_be_bytes());
            w.commit()?;
        }
        let store = MvccStore::open(storage.clone())?;
        let early = store.hash_kv(0)?;
        wait_drained(&store)?;
        assert_eq!(store.hash_kv(0)?, early);
        Ok(())
    }

    #[test]
    fn records_a_crash_left_behind_are_found_again_at_start() -> TestResult {
        let dir = tempfile::tempdir()?;
        let storage = Storage::open(dir.path())?;
        {
            let store = MvccStore::open(storage.clone())?;
            write_versions(&store, 100)?;
            // What a crash right after a compaction leaves: the compacted revision recorded,
            // every record still there.
            let mut w = store.write()?;
            let at = w.read_revision();
            w.set_meta(crate::storage::meta_key::COMPACTED, &at.to_be_bytes());
            w.commit()?;
        }
        assert_eq!(storage.scan(Space::Kv)?.len(), 300);
        let store = MvccStore::open(storage.clone())?;
        wait_drained(&store)?;
        assert_eq!(storage.scan(Space::Kv)?.len(), 100);
        Ok(())
    }
}
