//! Purged Raft log segments kept for reuse as new ones, as RocksDB recycles its log files
//! (`recycle_log_file_num`).
//!
//! Why: a new segment's appends allocate blocks as the file grows, and the fdatasync after
//! each must commit that allocation too; a purge frees a whole segment's blocks, which a
//! filesystem mounted with `discard` discards while the log's writes wait at the disk. Writing
//! over blocks a file already holds needs neither. Measured here (pwrite + fdatasync, 2,000
//! times): 16 KiB appends 0.26 ms p50 growing a file, 0.25 ms into `fallocate`d space (what
//! etcd's WAL does), 0.15 ms over written blocks; 100 KiB 0.50, 0.46 and 0.25 ms. After a
//! bulk load, a purge of five segments held the log's fsyncs behind its discards for seconds
//! (benches/RESULTS.md).
//!
//! A purged segment is renamed `<end index, 16 hex digits>.free`, where `end` is one past its
//! last entry, and joins the pool once that rename is durable. A new segment at `first` takes
//! a pooled file whose `end <= first` and is renamed to the segment's name, with a new random
//! salt: a record is read back only at the index its position expects, with a checksum over
//! the name's salt and that index, so no old bytes pass for an entry, not even records a
//! client's values forged (they cannot know the salt); and every old record left in the file
//! has an index below `first` besides.
//! The new name is made durable before anything is written over the old records: otherwise a
//! crash could bring the file back under its pool name holding newer entries than that name
//! says, and a later reuse could leave some of them after its own, where they would read back.
//!
//! An append into a reused file is padded with zeros to the end of its last block: writing
//! part of a block that is not in the page cache makes the kernel read it from the disk first,
//! and after a restart (or once memory is short) every append would wait for such a read
//! behind whatever reads the disk was serving (`benches/large/fsync_over_written.py --cold`).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// The name ending of a pooled file.
const SUFFIX: &str = ".free";

/// How many purged segments the pool keeps (512 MiB of 64 MiB segments); a purge frees the rest.
/// A log that never held more segments than this never frees or allocates blocks once warm.
pub const KEPT: usize = 8;

/// The pool name, in log directory `dir`, of a segment whose entries end before `end`.
pub fn pool_path(dir: &Path, end: u64) -> PathBuf {
    dir.join(format!("{end:016x}{SUFFIX}"))
}

/// The pooled files of one log directory, by the end index in their name.
pub struct Pool {
    dir: PathBuf,
    /// Each file's path and length.
    free: BTreeMap<u64, (PathBuf, u64)>,
}

impl Pool {
    /// The pool found in `dir`: its `.free` files, the newest [`KEPT`]; older ones and names
    /// that do not parse are deleted.
    ///
    /// # Errors
    /// When the directory cannot be read or a file deleted.
    pub fn open(dir: &Path) -> io::Result<Pool> {
        let mut free = BTreeMap::new();
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(hex) = name.strip_suffix(SUFFIX) else {
                continue;
            };
            match u64::from_str_radix(hex, 16) {
                Ok(end) => {
                    let len = std::fs::metadata(&path)?.len();
                    free.insert(end, (path, len));
                }
                Err(_) => std::fs::remove_file(&path)?,
            }
        }
        while free.len() > KEPT {
            if let Some((_, (path, _))) = free.pop_first() {
                std::fs::remove_file(path)?;
            }
        }
        Ok(Pool {
            dir: dir.to_path_buf(),
            free,
        })
    }

    /// The pool name of a segment whose entries end before `end`.
    pub fn path(&self, end: u64) -> PathBuf {
        pool_path(&self.dir, end)
    }

    /// Whether a segment ending before `end` may join the pool beside `pending` others on their
    /// way to it.
    pub fn admits(&self, end: u64, pending: usize) -> bool {
        self.free.len() + pending < KEPT && !self.free.contains_key(&end)
    }

    /// Adds a file of `len` bytes already renamed to [`Pool::path`]`(end)`, durably.
    pub fn put(&mut self, end: u64, path: PathBuf, len: u64) {
        self.free.insert(end, (path, len));
    }

    /// Bytes of the pooled files (on disk, part of the data dir's size).
    pub fn bytes(&self) -> u64 {
        self.free.values().map(|(_, len)| len).sum()
    }

    /// Takes a file to become a segment whose first entry is `first`: the oldest whose old
    /// entries all lie below `first`.
    pub fn take(&mut self, first: u64) -> Option<PathBuf> {
        let end = *self.free.range(..=first).next()?.0;
        self.free.remove(&end).map(|(path, _)| path)
    }

    /// Deletes the files that could hold entries at or above `from` (the log was truncated
    /// below them, so such indexes may be written again).
    ///
    /// # Errors
    /// When a file cannot be deleted.
    pub fn forget_from(&mut self, from: u64) -> io::Result<()> {
        for (_, (path, _)) in self.free.split_off(&from.saturating_add(1)) {
            std::fs::remove_file(path)?;
        }
        Ok(())
    }
}
