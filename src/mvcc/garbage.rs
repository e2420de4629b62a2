//! Compacted revisions whose records are still on disk, deleted by a thread of their own in
//! small batches, as etcd deletes them (it takes 1,000 per batch): a compaction of millions of
//! revisions no longer writes all their deletions in the batch that applies it, under the state
//! lock, while every write waits. The same thread compacts the key index first, 10,000 keys at
//! a time under the write lock (etcd locks its index per key while it compacts it), and queues
//! each step's compacted revisions.
//!
//! Nothing reads a compacted revision (reads and watches below the compacted revision are
//! refused, HashKV skips them as etcd's does), so a record may outlive its compaction for a
//! while; a crash leaves some behind, and the key index, rebuilt at start, finds them again
//! (`KeyIndex::compact` at the compacted revision). Each batch is deleted under the state's
//! read lock: a snapshot install, which replaces the whole state under the write lock and then
//! clears this queue, never interleaves with a batch, so a revision of the old state is never
//! deleted from the new one.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use super::store::State;
use super::Revision;
use crate::storage::{Space, Storage};

/// Deletions per batch (etcd's `compaction-batch-limit`): each holds writers back for a moment
/// only, and writers get the lock between two batches.
const BATCH: usize = 1000;
/// Keys of the key index compacted per step (each under the state's write lock: a few
/// milliseconds).
const INDEX_STEP: usize = 10_000;
/// The pause between two batches, so that waiting writes go first.
const PAUSE: Duration = Duration::from_millis(1);

/// The queue of revisions to delete.
///
/// It changes only under the state's write lock (a commit queues, an install clears), and the
/// thread deletes under the read lock: a batch is deleted first and taken off the queue after,
/// so what is queued is exactly what is still on disk.
#[derive(Default)]
pub(super) struct Garbage {
    queue: Mutex<Queue>,
    wake: Condvar,
}

#[derive(Default)]
struct Queue {
    revisions: VecDeque<Revision>,
    /// A compaction of the key index still under way: its revision, and the key to go on from.
    index: Option<(i64, Box<[u8]>)>,
    /// Set when the store is dropped: the thread ends (and lets go of the storage).
    stopped: bool,
}

impl Garbage {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `revisions` for deletion. Called with the state locked for writing.
    pub(super) fn push(&self, revisions: Vec<Revision>) {
        if revisions.is_empty() {
            return;
        }
        self.queue().revisions.extend(revisions);
        self.wake.notify_one();
    }

    /// Compacts the key index at `at`, [`INDEX_STEP`] keys at a time, queueing each step's
    /// compacted revisions (a compaction still under way goes on at `at`, from the first key).
    /// Called with the state locked for writing, once the compaction is committed.
    pub(super) fn compact_index(&self, at: i64) {
        self.queue().index = Some((at, Box::default()));
        self.wake.notify_one();
    }

    /// Forgets every queued revision and the index compaction under way (the state was
    /// replaced). Called with the state locked for writing, so no batch is being deleted.
    pub(super) fn clear(&self) {
        let mut queue = self.queue();
        queue.revisions.clear();
        queue.index = None;
    }

    /// Revisions still on disk, plus one while the key index is being compacted.
    pub(super) fn pending(&self) -> usize {
        let queue = self.queue();
        queue.revisions.len() + usize::from(queue.index.is_some())
    }

    /// Tells the thread to end.
    pub(super) fn stop(&self) {
        self.queue().stopped = true;
        self.wake.notify_all();
    }
}

/// Starts the thread deleting `garbage` from `storage`; it ends on [`Garbage::stop`].
pub(super) fn start(
    storage: Storage,
    state: Arc<RwLock<State>>,
    garbage: Arc<Garbage>,
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

fn run(storage: &Storage, state: &RwLock<State>, garbage: &Garbage) {
    let mut round: Option<(std::time::Instant, usize)> = None;
    loop {
        {
            let mut queue = garbage.queue();
            while queue.revisions.is_empty() && queue.index.is_none() && !queue.stopped {
                if let Some((started, deleted)) = round.take() {
                    tracing::info!(
                        deleted,
                        took_ms = started.elapsed().as_millis() as u64,
                        "finished deleting compacted revisions"
                    );
                }
                queue = garbage.wake.wait(queue).unwrap_or_else(|p| p.into_inner());
            }
            if queue.stopped {
                return;
            }
        }
        if round.is_some() {
            std::thread::sleep(PAUSE);
        }
        let (_, deleted) = round.get_or_insert((std::time::Instant::now(), 0));
        if !compact_index_step(state, garbage) {
            return;
        }
        let Ok(_readers_only) = state.read() else {
            return;
        };
        // An install may have cleared the queue since it was looked at.
        let batch: Vec<Revision> = garbage
            .queue()
            .revisions
            .iter()
            .take(BATCH)
            .copied()
            .collect();
        if batch.is_empty() {
            continue;
        }
        let mut writes = storage.batch();
        for rev in &batch {
            writes.remove(Space::Kv, &rev.to_bytes());
            writes.remove(Space::Index, &rev.to_bytes());
        }
        if let Err(e) = writes.commit() {
            // Left on disk: found again by the next start's index rebuild.
            tracing::warn!(error = %e, "deleting compacted revisions");
        }
        garbage.queue().revisions.drain(..batch.len());
        *deleted += batch.len();
    }
}

/// Compacts the next [`INDEX_STEP`] keys of the key index if a compaction is under way, under
/// the state's write lock (writers wait for one step, not for the whole index), and queues
/// their compacted revisions. False when the state lock is poisoned.
fn compact_index_step(state: &RwLock<State>, garbage: &Garbage) -> bool {
    if garbage.queue().index.is_none() {
        return true;
    }
    let Ok(mut state) = state.write() else {
        return false;
    };
    let mut queue = garbage.queue();
    // An install may have cleared it since it was looked at.
    let Some((at, from)) = queue.index.take() else {
        return true;
    };
    let (removed, next) = state.index.compact_keys(&from, at, INDEX_STEP);
    queue.index = next.map(|key| (at, key));
    queue.revisions.extend(removed);
    true
}

#[cfg(test)]
pub(super) mod tests {
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

    /// Waits until every compacted revision's record is deleted (at most 20 s).
    pub(in crate::mvcc) fn wait_drained(store: &MvccStore) -> TestResult {
        let deadline = Instant::now() + std::time::Duration::from_secs(20);
        while store.compaction_pending() > 0 {
            if Instant::now() > deadline {
                return Err("compacted revisions never deleted".into());
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(())
    }

    /// What a crash right after a compaction leaves: `keys` keys written three times (and all
    /// deleted, with `delete_all`), the compacted revision recorded, every record still there.
    fn crashed_after_compaction(storage: &Storage, keys: usize, delete_all: bool) -> TestResult {
        let store = MvccStore::open(storage.clone())?;
        write_versions(&store, keys)?;
        let mut w = store.write()?;
        if delete_all {
            w.delete_range(&crate::mvcc::KeyRange::From(Vec::new()), false)?;
            w.end_request();
        }
        let at = w.read_revision();
        w.set_meta(crate::storage::meta_key::COMPACTED, &at.to_be_bytes());
        w.commit()?;
        Ok(())
    }

    #[test]
    fn compacted_records_are_deleted_after_the_compaction_commits() -> TestResult {
        let dir = tempfile::tempdir()?;
        let storage = Storage::open(dir.path())?;
        let store = MvccStore::open(storage.clone())?;
        write_versions(&store, 5000)?;
        assert_eq!(storage.scan(Space::Kv)?.len(), 15_000);
        assert_eq!(storage.scan(Space::Index)?.len(), 15_000);
        let mut w = store.write()?;
        w.compact(w.read_revision())?;
        w.commit()?;
        wait_drained(&store)?;
        // Each key's last version is all that is left, and it still reads.
        assert_eq!(storage.scan(Space::Kv)?.len(), 5000);
        assert_eq!(
            storage.scan(Space::Index)?.len(),
            5000,
            "index entries go too"
        );
        let r = store.read()?;
        assert_eq!(
            r.index_range(&crate::mvcc::KeyRange::Single(b"k7".to_vec()), 15_001)
                .len(),
            1
        );
        Ok(())
    }

    #[test]
    fn reads_and_hash_kv_do_not_wait_for_the_index_compaction() -> TestResult {
        let (a_dir, b_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
        // The same history twice: one store that never compacts its index in the background
        // (no thread), one that does.
        let pending = MvccStore::open_keeping_compacted(Storage::open(a_dir.path())?)?;
        let done = MvccStore::open(Storage::open(b_dir.path())?)?;
        for store in [&pending, &done] {
            write_versions(store, 300)?;
            let mut w = store.write()?;
            // Half of the keys deleted, then a compaction in the middle of the last round.
            w.delete_range(&crate::mvcc::KeyRange::new(b"k1", b"k5"), false)?;
            w.end_request();
            w.commit()?;
            let mut w = store.write()?;
            w.compact(800)?;
            w.commit()?;
        }
        wait_drained(&done)?;
        assert!(
            pending.compaction_pending() > 0,
            "the index compaction has not run"
        );
        let all = crate::mvcc::KeyRange::From(Vec::new());
        for at in [800, 850, 902] {
            let (p, d) = (pending.read()?, done.read()?);
            assert_eq!(p.index_range(&all, at), d.index_range(&all, at), "at {at}");
        }
        assert_eq!(pending.hash_kv(0)?, done.hash_kv(0)?);
        assert_eq!(pending.hash_kv(850)?, done.hash_kv(850)?);
        Ok(())
    }

    #[test]
    fn hash_kv_does_not_depend_on_how_far_the_deletion_got() -> TestResult {
        let dir = tempfile::tempdir()?;
        let storage = Storage::open(dir.path())?;
        // Every key deleted: no key is live, etcd's `keep` set is empty.
        crashed_after_compaction(&storage, 300, true)?;
        let before = {
            let kept = MvccStore::open_keeping_compacted(storage.clone())?;
            assert_eq!(kept.compaction_pending(), 1200, "nothing deleted yet");
            kept.hash_kv(0)?
        };
        let store = MvccStore::open(storage.clone())?;
        wait_drained(&store)?;
        assert_eq!(storage.scan(Space::Kv)?.len(), 0);
        assert_eq!(store.hash_kv(0)?, before);
        Ok(())
    }

    #[test]
    fn records_a_crash_left_behind_are_found_again_at_start() -> TestResult {
        let dir = tempfile::tempdir()?;
        let storage = Storage::open(dir.path())?;
        crashed_after_compaction(&storage, 100, false)?;
        assert_eq!(storage.scan(Space::Kv)?.len(), 300);
        assert_eq!(
            MvccStore::open_keeping_compacted(storage.clone())?.compaction_pending(),
            200
        );
        let store = MvccStore::open(storage.clone())?;
        wait_drained(&store)?;
        assert_eq!(storage.scan(Space::Kv)?.len(), 100);
        Ok(())
    }
}
