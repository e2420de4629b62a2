//! The segment log's appends, reads, truncations, purges and recovery after a torn write.

use super::*;

fn entries(range: std::ops::Range<u64>) -> Vec<(u64, Vec<u8>)> {
    range
        .map(|i| {
            (
                i,
                format!("entry {i}").repeat(i as usize % 7 + 1).into_bytes(),
            )
        })
        .collect()
}

/// The files in `dir` whose names end in `.<extension>`, sorted.
fn files_ending(dir: &Path, extension: &str) -> io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == extension))
        .collect();
    files.sort();
    Ok(files)
}

fn segment_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    files_ending(dir, "seg")
}

fn pool_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    files_ending(dir, "free")
}

/// Bytes of every file in `dir`.
fn dir_bytes(dir: &Path) -> io::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        total += entry?.metadata()?.len();
    }
    Ok(total)
}

/// A log in a new directory holding `range`'s entries, synced and closed.
fn written(range: std::ops::Range<u64>, segment_bytes: u64) -> io::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    let wal = Wal::open_with(dir.path(), segment_bytes)?;
    wal.append(&entries(range))?;
    wal.sync()?;
    Ok(dir)
}

#[test]
fn appends_are_read_back_across_segments_and_after_reopening() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let wal = Wal::open_with(dir.path(), 200)?;
    let all = entries(1..60);
    wal.append(&all[..10])?;
    wal.append(&all[10..])?;
    wal.sync()?;
    assert!(segment_files(dir.path())?.len() > 3, "small segments roll");
    assert_eq!(wal.read(1, 60)?, all);
    assert_eq!(wal.read(17, 23)?, all[16..22].to_vec());
    assert_eq!(wal.last()?, all.last().cloned());
    drop(wal);
    let wal = Wal::open_with(dir.path(), 200)?;
    assert_eq!(wal.read(0, 100)?, all);
    wal.append(&entries(60..61))?;
    assert_eq!(wal.last()?.map(|(i, _)| i), Some(60));
    Ok(())
}

#[test]
fn a_torn_tail_is_cut_and_appends_go_on_after_it() -> io::Result<()> {
    let dir = written(1..4, SEGMENT_BYTES)?;
    // A crash in the middle of the fourth record's write.
    let path = segment_files(dir.path())?
        .pop()
        .ok_or(io::ErrorKind::NotFound)?;
    let mut f = std::fs::OpenOptions::new().append(true).open(&path)?;
    std::io::Write::write_all(
        &mut f,
        &[9, 0, 0, 0, 1, 2, 3, 4, 4, 0, 0, 0, 0, 0, 0, 0, b'x'],
    )?;
    drop(f);
    let wal = Wal::open(dir.path())?;
    assert_eq!(wal.read(1, 10)?, entries(1..4));
    wal.append(&entries(4..6))?;
    drop(wal);
    let wal = Wal::open(dir.path())?;
    assert_eq!(wal.read(1, 10)?, entries(1..6));
    Ok(())
}

#[test]
fn truncation_is_durable_and_the_log_continues_from_it() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let wal = Wal::open_with(dir.path(), 150)?;
    wal.append(&entries(1..40))?;
    wal.truncate(25)?;
    assert_eq!(wal.last()?.map(|(i, _)| i), Some(24));
    assert!(
        wal.append(&entries(20..21)).is_err(),
        "an append never overwrites"
    );
    drop(wal);
    let wal = Wal::open_with(dir.path(), 150)?;
    assert_eq!(wal.read(1, 100)?, entries(1..25));
    let replaced: Vec<_> = (25..30).map(|i| (i, b"new term".to_vec())).collect();
    wal.append(&replaced)?;
    assert_eq!(wal.read(24, 100)?[1..], replaced[..]);
    wal.truncate(0)?;
    assert!(wal.is_empty());
    assert!(segment_files(dir.path())?.is_empty());
    Ok(())
}

#[test]
fn a_purge_removes_whole_segments_and_an_append_may_leave_a_gap() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let wal = Wal::open_with(dir.path(), 150)?;
    wal.append(&entries(1..40))?;
    let removed = wal.purge(20)?;
    assert!(removed > 0 && removed <= 20, "removed {removed}");
    let left = wal.read(0, 100)?;
    assert!(left.first().is_some_and(|(i, _)| *i <= 21));
    assert_eq!(left.last().map(|(i, _)| *i), Some(39));
    // A snapshot past the log's end: everything goes, and the log resumes after the gap.
    assert_eq!(wal.purge(100)? + removed, 39);
    wal.append(&entries(101..105))?;
    wal.sync()?;
    drop(wal);
    let wal = Wal::open_with(dir.path(), 150)?;
    assert_eq!(wal.read(0, 200)?, entries(101..105));
    Ok(())
}

#[test]
fn a_purged_segment_a_reader_still_holds_is_not_cut_under_it() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let wal = Wal::open_with(dir.path(), 150)?;
    wal.append(&entries(1..40))?;
    // What a read takes under the lock before it reads outside it.
    let (held, len, key) = {
        let inner = wal.inner();
        let first = inner
            .segments
            .values()
            .next()
            .ok_or_else(|| io::Error::other("empty"))?;
        (first.file.clone(), first.len, first.first)
    };
    assert!(wal.purge(20)? > 0);
    assert!(!wal.inner().segments.contains_key(&key), "not purged");
    assert_eq!(
        held.metadata()?.len(),
        len,
        "the purge cut a segment being read"
    );
    Ok(())
}

#[test]
fn a_corrupt_record_is_an_error_not_an_entry() -> io::Result<()> {
    let dir = written(1..20, 100)?;
    // Flip a payload byte in the first (sealed) segment.
    let first = segment_files(dir.path())?.remove(0);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&first)?;
    f.write_all_at(b"#", HEADER as u64 + 2)?;
    drop(f);
    let wal = Wal::open_with(dir.path(), 100)?;
    let err = wal.read(1, 3).err().map(|e| e.kind());
    assert_eq!(err, Some(io::ErrorKind::InvalidData));
    assert_eq!(wal.read(10, 12)?, entries(10..12), "the rest still reads");
    Ok(())
}

#[test]
fn an_empty_segment_left_by_a_crash_is_removed_and_never_blocks_appends() -> io::Result<()> {
    let dir = written(1..6, SEGMENT_BYTES)?;
    // A roll to index 100 (after a gap) whose first record never reached the disk.
    std::fs::File::create(segment_path(dir.path(), 100, new_salt()))?;
    let wal = Wal::open(dir.path())?;
    assert_eq!(segment_files(dir.path())?.len(), 1);
    assert_eq!(wal.after_gap(), None);
    wal.append(&entries(6..8))?;
    assert_eq!(wal.read(0, 200)?, entries(1..8));
    wal.append(&entries(20..22))?;
    assert_eq!(wal.after_gap(), Some(20), "a gap below 20");
    Ok(())
}

fn inode(path: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata(path)?.ino())
}

#[test]
fn purged_segments_are_written_over_as_new_ones_and_their_old_records_never_read() -> io::Result<()>
{
    let dir = tempfile::tempdir()?;
    // Segments of several blocks, so old records outlive the padding of the first append.
    let wal = Wal::open_with(dir.path(), 3 * 4096)?;
    // Long entries first, so a recycled file holds old records well past the new ones.
    let long: Vec<_> = (1..40).map(|i| (i, vec![i as u8; 1000])).collect();
    wal.append(&long)?;
    wal.sync()?;
    let purged = wal
        .inner()
        .segments
        .values()
        .filter(|s| s.end() <= 21)
        .count();
    assert!(wal.purge(20)? > 0);
    let pooled = pool_files(dir.path())?;
    assert_eq!(pooled.len(), purged.min(recycle::KEPT));
    let pooled: Vec<u64> = pooled.iter().map(|p| inode(p)).collect::<io::Result<_>>()?;
    // Short entries after a gap: new segments take the pooled files.
    let short = entries(100..600);
    wal.append(&short)?;
    wal.sync()?;
    assert!(
        pool_files(dir.path())?.is_empty(),
        "every pooled file reused"
    );
    let segments: Vec<u64> = segment_files(dir.path())?
        .iter()
        .map(|p| inode(p))
        .collect::<io::Result<_>>()?;
    assert!(pooled.iter().all(|i| segments.contains(i)));
    assert_eq!(wal.read(100, 600)?, short);
    drop(wal);
    // A start refuses old bytes in any segment but the last, and cuts them there.
    let wal = Wal::open_with(dir.path(), 3 * 4096)?;
    assert_eq!(wal.read(100, 600)?, short);
    assert_eq!(wal.read(21, 40)?, long[20..].to_vec());
    wal.append(&entries(600..610))?;
    assert_eq!(wal.read(599, 700)?, entries(599..610));
    Ok(())
}

#[test]
fn the_pool_hands_out_only_files_whose_old_entries_lie_below_the_new_first() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(recycle::pool_path(dir.path(), 10), b"old")?;
    let mut pool = recycle::Pool::open(dir.path())?;
    assert_eq!(pool.take(9), None);
    assert_eq!(pool.take(10), Some(recycle::pool_path(dir.path(), 10)));
    Ok(())
}

#[test]
fn only_names_spelled_as_the_log_spells_them_are_segments() {
    let salted = format!("{:016x}-{:016x}.seg", 5, 7);
    assert_eq!(
        parse_segment_name(&salted).and_then(Result::ok),
        Some((5, 7))
    );
    assert_eq!(
        parse_segment_name("0000000000000005.seg").and_then(Result::ok),
        Some((5, 0))
    );
    assert!(parse_segment_name("0000000000000005.free").is_none());
    for bad in [
        "0000000000000005-0000000000000000.seg",
        "0000000000000005-.seg",
        "000000000000000A.seg",
        "+000000000000005.seg",
        "5.seg",
        "0000000000000005-7.seg",
    ] {
        assert!(
            matches!(parse_segment_name(bad), Some(Err(_))),
            "{bad} is not a segment's name"
        );
    }
}

#[test]
fn a_reused_file_no_record_reached_is_dropped_even_behind_a_later_segment() -> io::Result<()> {
    let old = written(1..5, SEGMENT_BYTES)?;
    let dir = written(60..65, SEGMENT_BYTES)?;
    // Renamed as segment 50 (its old entries all below 50), then a crash before any write.
    let files = segment_files(old.path())?;
    let file = files.first().ok_or(io::ErrorKind::NotFound)?;
    let stale = segment_path(dir.path(), 50, new_salt());
    std::fs::copy(file, &stale)?;
    let wal = Wal::open(dir.path())?;
    assert_eq!(wal.read(0, 100)?, entries(60..65));
    assert!(!stale.exists());
    Ok(())
}

#[test]
fn a_truncation_below_pooled_files_deletes_them() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let wal = Wal::open_with(dir.path(), 150)?;
    wal.append(&entries(1..40))?;
    wal.sync()?;
    wal.purge(20)?;
    assert!(!pool_files(dir.path())?.is_empty());
    // The pooled files count in the log's size.
    assert_eq!(wal.disk_space(), dir_bytes(dir.path())?);
    drop(wal);
    // The pool survives a restart.
    let wal = Wal::open_with(dir.path(), 150)?;
    assert!(!pool_files(dir.path())?.is_empty());
    assert_eq!(wal.disk_space(), dir_bytes(dir.path())?);
    // The same indexes again: no pooled file may hold them.
    wal.clear()?;
    assert!(pool_files(dir.path())?.is_empty());
    wal.append(&entries(1..3))?;
    wal.sync()?;
    drop(wal);
    let wal = Wal::open_with(dir.path(), 150)?;
    assert_eq!(wal.read(0, 100)?, entries(1..3));
    Ok(())
}

#[test]
fn a_pooled_file_that_may_hold_the_indexes_to_come_is_never_reused() -> io::Result<()> {
    // A pooled file holding entries 1..10, as a log cleared and restarted could leave; each
    // record a whole 4 KiB block, so the padding of an append leaves the next old one whole.
    let long: Vec<_> = (1..10).map(|i| (i, vec![i as u8; 4096 - HEADER])).collect();
    let old = tempfile::tempdir()?;
    let log = Wal::open(old.path())?;
    log.append(&long)?;
    log.sync()?;
    drop(log);
    let dir = tempfile::tempdir()?;
    let written = segment_files(old.path())?;
    let segment = written.first().ok_or(io::ErrorKind::NotFound)?;
    std::fs::copy(segment, recycle::pool_path(dir.path(), 10))?;
    let wal = Wal::open(dir.path())?;
    // The same entries 1 and 2 again, at the same places: were that file written over without
    // a new salt and without the pool's index rule, its 3..10 would read back.
    wal.append(&long[..2])?;
    wal.sync()?;
    drop(wal);
    let wal = Wal::open(dir.path())?;
    assert_eq!(wal.read(0, 100)?, long[..2].to_vec());
    Ok(())
}

#[test]
fn a_read_never_sees_a_truncation_half_done() -> io::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir()?;
    let wal = Arc::new(Wal::open_with(dir.path(), 1 << 20)?);
    // Two versions of entries 20..40, of different lengths, written over each other.
    let version = |v: u8| -> Vec<(u64, Vec<u8>)> {
        (20..40)
            .map(|i| (i, vec![v; 1 + 300 * usize::from(v - 1) + (i as usize % 5)]))
            .collect()
    };
    wal.append(&entries(1..20))?;
    wal.append(&version(1))?;
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (wal, done) = (Arc::clone(&wal), Arc::clone(&done));
        std::thread::spawn(move || -> io::Result<usize> {
            let mut reads = 0;
            while !done.load(Ordering::Relaxed) {
                for (index, payload) in wal.read(20, 40)? {
                    let v = payload.first().copied().unwrap_or(0);
                    assert!(v == 1 || v == 2, "entry {index}: {payload:?}");
                }
                reads += 1;
            }
            Ok(reads)
        })
    };
    for round in 0..300u32 {
        wal.truncate(20)?;
        wal.append(&version(1 + (round % 2) as u8))?;
    }
    done.store(true, Ordering::Relaxed);
    let reads = reader
        .join()
        .map_err(|_| io::Error::other("reader panicked"))??;
    assert!(reads > 0);
    Ok(())
}

#[test]
fn appends_over_a_recycled_file_end_on_a_block_boundary() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let wal = Wal::open_with(dir.path(), 3 * 4096)?;
    let long: Vec<_> = (1..40).map(|i| (i, vec![0xAB; 1000])).collect();
    wal.append(&long)?;
    wal.sync()?;
    assert!(wal.purge(20)? > 0);
    // One short entry after a gap: a pooled file becomes the segment.
    wal.append(&entries(100..101))?;
    let (path, len, block) = {
        let inner = wal.inner();
        let s = inner
            .segments
            .values()
            .next_back()
            .ok_or(io::ErrorKind::NotFound)?;
        let (_, block) = s
            .old
            .ok_or(io::Error::other("the segment is not a recycled file"))?;
        (s.path.clone(), s.len, block)
    };
    // The file system's block, as the kernel reports it (within the padding's bounds).
    let reported = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&path)?.blksize().clamp(512, 64 << 10)
    };
    assert_eq!(block, reported);
    let bytes = std::fs::read(&path)?;
    let boundary = usize::try_from(len.next_multiple_of(block))
        .map_err(io::Error::other)?
        .min(bytes.len());
    let len = usize::try_from(len).map_err(io::Error::other)?;
    // Zeros from the records' end to their block's end, the old bytes after it.
    assert!(bytes[len..boundary].iter().all(|b| *b == 0));
    assert!(bytes[boundary..].contains(&0xAB));
    // The whole file counts in the log's size.
    assert_eq!(wal.disk_space(), dir_bytes(dir.path())?);
    wal.append(&entries(101..110))?;
    wal.sync()?;
    assert_eq!(wal.read(100, 110)?, entries(100..110));
    drop(wal);
    let wal = Wal::open_with(dir.path(), 3 * 4096)?;
    assert_eq!(wal.read(100, 110)?, entries(100..110));
    Ok(())
}

/// Records as [`Wal::append`] writes them into a segment named with `salt`.
fn records(salt: u64, entries: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (index, payload) in entries {
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&checksum(salt, *index, payload).to_le_bytes());
        out.extend_from_slice(&index.to_le_bytes());
        out.extend_from_slice(payload);
    }
    out
}

#[test]
fn records_a_reused_file_held_before_never_pass_for_entries() -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir()?;
    let block =
        usize::try_from(std::fs::metadata(dir.path())?.blksize()).map_err(io::Error::other)?;
    // A pooled file whose old bytes are records of entries 100..103 as they will be written,
    // as values clients put could hold them: checksums without a salt.
    let first = vec![7u8; block - HEADER];
    let forged = [
        (100, first.clone()),
        (101, b"forged".to_vec()),
        (102, b"forged too".to_vec()),
    ];
    std::fs::write(recycle::pool_path(dir.path(), 100), records(0, &forged))?;
    let wal = Wal::open(dir.path())?;
    // Entry 100 fills the file's first block; a crash comes before 101 is written.
    wal.append(&[(100, first.clone())])?;
    wal.sync()?;
    drop(wal);
    let wal = Wal::open(dir.path())?;
    assert_eq!(wal.read(0, 200)?, vec![(100, first)]);
    Ok(())
}

#[test]
fn segments_named_without_a_salt_are_read_and_appended_to() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(segment_path(dir.path(), 1, 0), records(0, &entries(1..5)))?;
    let wal = Wal::open(dir.path())?;
    assert_eq!(wal.read(0, 10)?, entries(1..5));
    wal.append(&entries(5..8))?;
    wal.sync()?;
    // The old segment takes no more records: 5..8 went to a new, salted one.
    let names = segment_files(dir.path())?;
    assert_eq!(names.len(), 2);
    assert_eq!(
        names.get(1),
        Some(&segment_path(dir.path(), 5, wal.inner().segments[&5].salt))
    );
    drop(wal);
    let wal = Wal::open(dir.path())?;
    assert_eq!(wal.read(0, 10)?, entries(1..8));
    Ok(())
}
