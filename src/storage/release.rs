//! Freeing a big file's blocks a step at a time, so that the Raft log's fsync does not wait
//! behind one long discard.
//!
//! Deleting a 64 MiB file frees its blocks when the last descriptor closes, in one go; on a
//! filesystem mounted with `discard` (common on cloud disks) the kernel discards them all
//! before the close returns, and the disk serves the Raft log's next writes and flushes only
//! after that discard. Measured here: an fdatasync loop beside the deletion of a 64 MiB file
//! waited up to 42 ms at once (0.3 ms otherwise); with the file cut from its end 1 MiB at a
//! time first, the slowest fsync took 3 ms, and the deletion took no longer in all. On a disk busy
//! with cold reads, a Raft log purge's deletion held every append for 358 ms
//! (benches/RESULTS.md, "Stalls after a cold start"). RocksDB's delete scheduler cuts its
//! deleted files in chunks for the same reason.

use std::fs::File;
use std::io;
use std::time::Duration;

/// How much of a file one step frees.
pub const STEP_BYTES: u64 = 1 << 20;

/// The pause after each step but the last, in which the disk serves other writes (at most
/// 256 MiB freed a second: a 64 MiB Raft log segment in a quarter of a second).
pub const PAUSE: Duration = Duration::from_millis(4);

/// Cuts `file` from its end, [`STEP_BYTES`] at a time with `pause` between steps, to nothing:
/// its blocks are freed (and discarded) a step at a time. Pass only a file whose name is
/// already removed (durably) and that no other descriptor reads; the caller closes it after.
///
/// # Errors
/// When the file's size cannot be read or a cut fails (what was cut stays cut).
pub fn shrink_to_nothing(file: &File, pause: Duration) -> io::Result<()> {
    let mut len = file.metadata()?.len();
    while len > 0 {
        len = len.saturating_sub(STEP_BYTES);
        file.set_len(len)?;
        if len > 0 {
            std::thread::sleep(pause);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_file_is_cut_to_nothing_and_keeps_its_name() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("big");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        let len = 3 * STEP_BYTES + 123;
        file.write_all(&vec![7u8; len as usize])?;
        shrink_to_nothing(&file, Duration::ZERO)?;
        assert_eq!(file.metadata()?.len(), 0);
        assert_eq!(std::fs::metadata(&path)?.len(), 0);
        // An empty file is left empty.
        shrink_to_nothing(&file, PAUSE)?;
        assert_eq!(file.metadata()?.len(), 0);
        Ok(())
    }
}
