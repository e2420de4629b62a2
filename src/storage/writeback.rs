//! [`Writeback`]: keeps the state journal's unsynced tail short, without fjall's journal lock.
//!
//! State-machine batches are not synced (the Raft log is the durability point), so the state
//! journal gathers dirty pages until fjall syncs it. fjall does that before every memtable flush
//! (`SyncAll`, fjall issue 329) while holding the journal's writer lock, and every state batch
//! needs that lock: at 7,000 writes/s a flush found ~16 MiB dirty, its fsync took 7–20 ms, and
//! the apply path stood still that long (`perf record -e sched:sched_switch --call-graph dwarf`:
//! apply in `WriteBatch::commit` waiting for the journal mutex, fjall's worker in
//! `journal::writer::Writer::persist`). A thread here syncs the active journal file every few
//! milliseconds through its own descriptor, which takes no lock of fjall's, so fjall's own sync
//! finds little left to write. It adds no durability and takes none away; if fjall's layout
//! ever changes (no `*.jnl` files in the database directory) it simply finds nothing to sync.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How often the journal's dirty tail is written back.
const EVERY: Duration = Duration::from_millis(10);

/// The shared flag between the state database's writers and the writeback thread; the thread
/// ends when the last [`Writeback`] handle is dropped.
pub struct Writeback {
    dirty: AtomicBool,
}

impl Writeback {
    /// Starts the writeback thread for the fjall database in `dir`.
    pub fn start(dir: &Path) -> Arc<Self> {
        let handle = Arc::new(Writeback {
            dirty: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&handle);
        let dir = dir.to_path_buf();
        let spawned = std::thread::Builder::new()
            .name("state-writeback".into())
            .spawn(move || run(&weak, &dir));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no state journal writeback thread");
        }
        handle
    }

    /// Notes that a batch was written to the journal.
    pub fn wrote(&self) {
        self.dirty.store(true, Ordering::Relaxed);
    }
}

fn run(handle: &Weak<Writeback>, dir: &Path) {
    let mut journal: Option<(PathBuf, File)> = None;
    loop {
        std::thread::sleep(EVERY);
        let Some(handle) = handle.upgrade() else {
            return;
        };
        if !handle.dirty.swap(false, Ordering::Relaxed) {
            continue;
        }
        drop(handle);
        let Some(active) = active_journal(dir) else {
            continue;
        };
        if journal.as_ref().is_none_or(|(path, _)| *path != active) {
            journal = File::open(&active).ok().map(|f| (active, f));
        }
        if let Some((path, file)) = &journal {
            if let Err(e) = file.sync_data() {
                tracing::debug!(error = %e, path = %path.display(), "journal writeback failed");
            }
        }
    }
}

/// The newest journal file (`<n>.jnl`, highest `n`) in `dir`.
fn active_journal(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let n: u64 = path
                .file_name()?
                .to_str()?
                .strip_suffix(".jnl")?
                .parse()
                .ok()?;
            Some((n, path))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, path)| path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_active_journal_is_the_highest_numbered() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        assert_eq!(active_journal(dir.path()), None);
        for name in ["2.jnl", "10.jnl", "lock", "version", "9.jnl.tmp"] {
            std::fs::write(dir.path().join(name), b"")?;
        }
        assert_eq!(active_journal(dir.path()), Some(dir.path().join("10.jnl")));
        Ok(())
    }

    #[test]
    fn the_loop_syncs_while_a_handle_lives_and_ends_after_the_last() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("0.jnl"), b"journal")?;
        let handle = Arc::new(Writeback {
            dirty: AtomicBool::new(true),
        });
        let weak = Arc::downgrade(&handle);
        let path = dir.path().to_path_buf();
        let looping = std::thread::spawn(move || run(&weak, &path));
        // The loop takes the dirty mark (and syncs the journal) while the handle lives ...
        while handle.dirty.load(Ordering::Relaxed) {
            std::thread::sleep(EVERY);
        }
        // ... and returns once it is gone.
        drop(handle);
        assert!(looping.join().is_ok());
        Ok(())
    }
}
