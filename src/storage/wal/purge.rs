//! [`Wal::purge`]: removing the segments a snapshot covers, without holding up the log's
//! appends: renamed into the pool new segments reuse ([`super::recycle`]) or deleted, their
//! blocks freed a step at a time ([`crate::storage::release`]).

use std::io;
use std::sync::Arc;

use super::{sync_dir, Wal};
use crate::storage::release;

impl Wal {
    /// Removes the segments whose entries all lie at or below `upto`. Returns how many entries
    /// went. Under the log's lock, each is renamed into the pool of files new segments reuse
    /// ([`super::recycle`]) if the pool has room and no reader holds it, or else its name is
    /// removed; after the lock, the directory is synced, the renamed files join the pool and the
    /// removed files' blocks are freed, a step at a time (about a quarter of a second per full
    /// segment), on the caller's thread.
    ///
    /// # Errors
    /// On an I/O failure.
    pub fn purge(&self, upto: u64) -> io::Result<u64> {
        let mut inner = self.inner();
        let doomed: Vec<u64> = inner
            .segments
            .values()
            .filter(|s| s.end() <= upto.saturating_add(1) && !s.offsets.is_empty())
            .map(|s| s.first)
            .collect();
        let mut removed = 0;
        // Freeing a segment's blocks waits for the disk (the block bitmaps, the discards), and
        // every append waited behind it (358 ms with a cold page cache), so it happens outside
        // the lock and a step at a time (`release`). Only a file whose name is gone is cut.
        let mut unlinked = Vec::new();
        let mut pooled = Vec::new();
        let mut failed = None;
        for key in doomed {
            let Some(s) = inner.segments.remove(&key) else {
                continue;
            };
            let (end, entries) = (s.end(), s.offsets.len() as u64);
            // Out of the map, a file can no longer be taken, so a count of 1 stays 1; a reader
            // that took it before reads it whole (and the file is freed when it is done).
            if Arc::strong_count(&s.file) == 1 && inner.pool.admits(end, pooled.len()) {
                let to = inner.pool.path(end);
                let len = s.file_len();
                if let Err(e) = std::fs::rename(&s.path, &to) {
                    failed = Some(e);
                    break;
                }
                pooled.push((end, to, len));
            } else {
                if let Err(e) = std::fs::remove_file(&s.path) {
                    failed = Some(e);
                    break;
                }
                unlinked.push(s);
            }
            removed += entries;
        }
        drop(inner);
        // The renames and removals are made durable here, before any cut or reuse, so that a
        // crash can never bring back a named segment cut short or written over (a start refuses
        // one that is not the last); the log's next sync need not sync the directory again for
        // them, unless this failed (and then the renamed files stay out of the pool).
        let synced = (unlinked.is_empty() && pooled.is_empty()) || {
            let result = sync_dir(&self.dir);
            if let Err(e) = &result {
                self.inner().dir_changed = true;
                tracing::warn!(error = %e, "syncing the Raft log's directory after a purge");
            }
            result.is_ok()
        };
        if synced && !pooled.is_empty() {
            let mut inner = self.inner();
            for (end, path, len) in pooled {
                inner.pool.put(end, path, len);
            }
        }
        for s in unlinked
            .iter()
            .filter(|s| synced && Arc::strong_count(&s.file) == 1)
        {
            if let Err(e) = release::shrink_to_nothing(&s.file, release::PAUSE) {
                tracing::warn!(path = %s.path.display(), error = %e, "freeing a purged segment");
            }
        }
        failed.map_or(Ok(removed), Err)
    }
}
