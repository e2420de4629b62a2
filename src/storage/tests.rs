//! Storage tests: the Raft log beside the state, the format version, and writes that must not
//! wait for fjall's table changes (memtable and journal rotations among them).

use super::*;

#[test]
fn format_version_is_written_and_checked() -> StorageResult<()> {
    let dir = tempfile::tempdir().map_err(|e| StorageError(e.to_string()))?;
    {
        let s = Storage::open(dir.path())?;
        s.append_log(&[(1, b"a".to_vec()), (2, b"b".to_vec()), (3, b"c".to_vec())])?;
        s.truncate_log(3)?;
    }
    let s = Storage::open(dir.path())?;
    assert_eq!(
        s.get(Space::Meta, meta_key::FORMAT_VERSION)?,
        Some(FORMAT_VERSION.to_be_bytes().to_vec())
    );
    assert_eq!(s.last_log()?.map(|(i, _)| i), Some(2));
    assert_eq!(s.log_range(1, 3)?.len(), 2);
    // A dir of format 2 is upgraded (its `index` keyspace is the MVCC layer's to fill); one of
    // a format newer than this binary's is refused.
    drop(s);
    for (found, opens) in [(2u32, true), (FORMAT_VERSION + 1, false)] {
        {
            let s = Storage::open(dir.path())?;
            s.meta
                .insert(meta_key::FORMAT_VERSION, found.to_be_bytes())?;
            s.persist_state()?;
        }
        let reopened = Storage::open(dir.path());
        assert_eq!(reopened.is_ok(), opens, "format {found}");
        if let Ok(r) = reopened {
            let written = r.get(Space::Meta, meta_key::FORMAT_VERSION)?;
            assert_eq!(written, Some(FORMAT_VERSION.to_be_bytes().to_vec()));
        }
    }
    Ok(())
}

#[test]
fn a_log_kept_in_fjall_by_an_earlier_version_moves_to_the_segment_files() -> StorageResult<()> {
    let dir = tempfile::tempdir().map_err(|e| StorageError(e.to_string()))?;
    let entries: Vec<(u64, Vec<u8>)> = (5..=30).map(|i| (i, vec![i as u8; 100])).collect();
    {
        let s = Storage::open(dir.path())?;
        let mut b = s.log_db.batch();
        for (i, v) in &entries {
            b.insert(&s.raft_log, i.to_be_bytes(), v.as_slice());
        }
        b.commit()?;
        s.log_db.persist(PersistMode::SyncAll)?;
        // As a binary of format 1 left it.
        s.meta
            .insert(meta_key::FORMAT_VERSION, 1u32.to_be_bytes())?;
        s.persist_state()?;
    }
    let s = Storage::open(dir.path())?;
    assert_eq!(s.log_range(0, 100)?, entries);
    assert_eq!(
        s.get(Space::Meta, meta_key::FORMAT_VERSION)?,
        Some(FORMAT_VERSION.to_be_bytes().to_vec())
    );
    assert!(s.raft_log.first_key_value().is_none(), "moved, not copied");
    drop(s);
    let s = Storage::open(dir.path())?;
    assert_eq!(
        s.log_range(0, 100)?,
        entries,
        "and still there after a reopen"
    );
    Ok(())
}

/// The vendored lsm-tree's patch (vendor/lsm-tree/CONCORD-PATCH.md): a state write does
/// not wait for the version history's write lock, which a table change holds across its
/// fsyncs. The lock is held here until the write is done (or 30 s have passed, and then the
/// write waited for it).
#[test]
fn a_state_write_does_not_wait_for_a_table_change() -> StorageResult<()> {
    let dir = tempfile::tempdir().map_err(|e| StorageError(e.to_string()))?;
    let s = Storage::open(dir.path())?;
    let done = done_while_the_version_history_is_held(&s, || {
        let mut batch = s.batch();
        batch.insert(Space::Kv, b"key", b"value");
        batch.commit()
    })?;
    assert!(done, "the write waited for the version history's lock");
    assert_eq!(s.get(Space::Kv, b"key")?, Some(b"value".to_vec()));
    Ok(())
}

/// Runs `write` on a thread while the Kv keyspace's version history lock is held here (as a
/// table change holds it); lets the lock go once `write` is done, or after 30 s. Whether
/// `write` was done before the lock went.
fn done_while_the_version_history_is_held(
    s: &Storage,
    write: impl FnOnce() -> StorageResult<()> + Send,
) -> StorageResult<bool> {
    use fjall::AbstractTree;
    let history = s.kv.tree.get_version_history_lock();
    let (done, written) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let committed = write();
            let _ = done.send(());
            committed
        });
        let waited = written.recv_timeout(std::time::Duration::from_secs(30));
        drop(history);
        writer
            .join()
            .map_err(|_| StorageError("writer panicked".into()))??;
        Ok(waited.is_ok())
    })
}

/// The memtable rotation a write asks for (once the memtable passes its size) waits for a
/// table change without holding the journal's lock, so the writes after it go on meanwhile
/// (fjall's worker used to wait with that lock held, and every write stalled behind the
/// table change's fsyncs); the rotation happens once the table change is over.
#[test]
fn writes_go_on_while_a_rotation_waits_for_a_table_change() -> StorageResult<()> {
    use fjall::AbstractTree;
    let dir = tempfile::tempdir().map_err(|e| StorageError(e.to_string()))?;
    let s = Storage::open(dir.path())?;
    let first = s.kv.tree.active_memtable().id();
    let done = done_while_the_version_history_is_held(&s, || {
        // Twice the memtable's size: the write that passes it asks for a rotation.
        let value = vec![7u8; 64 << 10];
        for i in 0..2 * MEMTABLE_BYTES / (64 << 10) {
            let mut batch = s.batch();
            batch.insert(Space::Kv, format!("key{i:04}").as_bytes(), &value);
            batch.commit()?;
        }
        Ok(())
    })?;
    assert!(
        done,
        "the writes waited while a rotation waited for the version history's lock"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while s.kv.tree.active_memtable().id() == first {
        assert!(
            std::time::Instant::now() < deadline,
            "the memtable was never rotated"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(s.get(Space::Kv, b"key0000")?, Some(vec![7u8; 64 << 10]));
    Ok(())
}

/// A journal rotation (fjall's flush worker, with the journal's lock held, once the journal
/// passes 64 MB) reads every keyspace's highest memtable sequence number, and the journal
/// maintenance after it every keyspace's highest persisted one. Both read the latest version
/// without the version history's lock (lsm-tree patch 4), so the journal rotates, and writes go
/// on, while a table change in another keyspace holds that lock (they stalled behind its fsyncs
/// before).
#[test]
fn writes_go_on_while_a_journal_rotation_meets_a_table_change() -> StorageResult<()> {
    let dir = tempfile::tempdir().map_err(|e| StorageError(e.to_string()))?;
    let s = Storage::open(dir.path())?;
    let mut batch = s.batch();
    batch.insert(Space::Kv, b"key", b"value");
    batch.commit()?;
    let value = vec![3u8; 64 << 10];
    let done = done_while_the_version_history_is_held(&s, || {
        // Another keyspace's memtables rotate and flush; the flush worker rotates the journal
        // once it has passed 64 MB (past that, the writes slow down to give it the time).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut i = 0u64;
        while s.db.journal_count() < 2 {
            if std::time::Instant::now() > deadline {
                return Err(StorageError("the journal never rotated".into()));
            }
            let mut batch = s.batch();
            batch.insert(Space::Lease, format!("lease{i:05}").as_bytes(), &value);
            batch.commit()?;
            i += 1;
            if i * (64 << 10) > MAX_JOURNALS {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        Ok(())
    })?;
    assert!(
        done,
        "the journal rotation (and the writes) waited for the version history's lock"
    );
    assert_eq!(s.get(Space::Kv, b"key")?, Some(b"value".to_vec()));
    assert_eq!(s.get(Space::Lease, b"lease00000")?, Some(value));
    Ok(())
}

/// A shared read lends a large value (the bytes fjall read) and copies a small one out, so that
/// a small value kept a while does not keep the block it was read with alive.
#[test]
fn a_shared_read_lends_large_values_and_copies_small_ones() -> StorageResult<()> {
    let dir = tempfile::tempdir().map_err(|e| StorageError(e.to_string()))?;
    let s = Storage::open(dir.path())?;
    let sizes = [10, SHARED_VALUE_BYTES - 1, SHARED_VALUE_BYTES, 5000];
    let mut batch = s.batch();
    for size in sizes {
        batch.insert(Space::Kv, &size.to_be_bytes(), &vec![7; size]);
    }
    batch.commit()?;
    for size in sizes {
        let read = s
            .get_shared(Space::Kv, &size.to_be_bytes())?
            .ok_or_else(|| StorageError(format!("{size} bytes: not found")))?;
        assert_eq!(read[..], vec![7; size][..], "{size} bytes");
        assert_eq!(
            read.is_unique(),
            size < SHARED_VALUE_BYTES,
            "{size} bytes: copied out only when small"
        );
    }
    assert_eq!(s.get_shared(Space::Kv, b"absent")?, None);
    Ok(())
}

/// The state journal's bytes, all journal files together.
fn journal_bytes(dir: &Path) -> StorageResult<Vec<u8>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir.join("db"))?.flatten() {
        if e.file_name().to_string_lossy().ends_with(".jnl") {
            out.extend(std::fs::read(e.path())?);
        }
    }
    Ok(out)
}

/// A record whose value the Raft log holds is journaled as a reference only once the log has
/// synced that entry; replayed at the next open, the reference reads the value back from the
/// log, and a log that lost the entry fails the open instead of yielding a wrong record.
#[test]
fn a_value_is_left_to_the_log_only_once_the_log_synced_it() -> StorageResult<()> {
    use logged::LogSpan;
    let dir = tempfile::tempdir()?;
    let value: Vec<u8> = (0..8192u32).map(|i| (i % 253) as u8).collect();
    let other: Vec<u8> = (0..8192u32).map(|i| (i % 241) as u8).collect();
    let entry = |v: &[u8]| [b"entry head".as_slice(), v, b"entry tail"].concat();
    let record = |v: &[u8]| [b"record head".as_slice(), v, b"record tail"].concat();
    let span = |index| LogSpan {
        index,
        from_end: (value.len() + b"entry tail".len()) as u32,
    };
    let write = |s: &Storage, key: &[u8], v: &[u8], index: u64| -> StorageResult<()> {
        let mut b = s.batch();
        b.insert_logged(key, record(v).into(), 11, v.len(), span(index));
        b.commit()
    };
    {
        let s = Storage::open(dir.path())?;
        s.append_log(&[(1, entry(&value))])?;
        // Not synced yet: journaled whole.
        write(&s, b"unsynced", &value, 1)?;
        assert!(memchr::memmem::find(&journal_bytes(dir.path())?, &value).is_some());
        s.persist_log()?;
        s.append_log(&[(2, entry(&other))])?;
        s.persist_log()?;
        write(&s, b"synced", &other, 2)?;
        assert!(memchr::memmem::find(&journal_bytes(dir.path())?, &other).is_none());
        assert!(!s.log_purgeable(2));
    }
    {
        let s = Storage::open(dir.path())?;
        assert_eq!(s.get(Space::Kv, b"unsynced")?, Some(record(&value)));
        assert_eq!(s.get(Space::Kv, b"synced")?, Some(record(&other)));
        assert!(
            !s.log_purgeable(2),
            "a replayed reference holds its entry again"
        );
        // The log loses the entry while the journal still names it (what the purge's check
        // prevents): the next open fails rather than serve another record.
        s.truncate_log(2)?;
    }
    let reopened = Storage::open(dir.path());
    assert!(reopened.is_err(), "opened without the value");
    Ok(())
}

/// Once the values left to the log are flushed to tables, the log may lose their entries.
#[test]
fn flushed_values_let_their_log_entries_go() -> StorageResult<()> {
    use logged::LogSpan;
    let dir = tempfile::tempdir()?;
    let value = vec![9u8; 8192];
    {
        let s = Storage::open(dir.path())?;
        s.append_log(&[(1, [b"h".as_slice(), &value].concat())])?;
        s.persist_log()?;
        let mut b = s.batch();
        let span = LogSpan {
            index: 1,
            from_end: value.len() as u32,
        };
        b.insert_logged(b"k", value.clone().into(), 0, value.len(), span);
        b.commit()?;
        assert!(!s.log_purgeable(1));
        s.flush_logged()?;
        assert!(s.log_purgeable(1));
        s.truncate_log(0)?;
    }
    let s = Storage::open(dir.path())?;
    assert_eq!(s.get(Space::Kv, b"k")?, Some(value));
    Ok(())
}

#[test]
fn an_ingestion_is_seen_once_finished_and_refuses_keys_out_of_order() -> StorageResult<()> {
    let dir = tempfile::tempdir()?;
    let s = Storage::open(dir.path())?;
    let mut ingest = Ingest::new(&s);
    ingest.insert(Space::Kv, b"a", vec![1u8; 10_000].into())?;
    ingest.insert(Space::Index, b"a", b"i".to_vec().into())?;
    ingest.insert(Space::Kv, b"b", b"small".to_vec().into())?;
    assert_eq!(
        s.get(Space::Kv, b"a")?,
        None,
        "not seen before it is finished"
    );
    ingest.finish()?;
    assert_eq!(s.get(Space::Kv, b"a")?, Some(vec![1u8; 10_000]));
    assert_eq!(s.get(Space::Kv, b"b")?, Some(b"small".to_vec()));
    assert_eq!(s.get(Space::Index, b"a")?, Some(b"i".to_vec()));

    // A corrupt input is an error, not a panic: a key not above the one before, or empty.
    let mut ingest = Ingest::new(&s);
    ingest.insert(Space::Kv, b"c", b"v".to_vec().into())?;
    let error = |r: StorageResult<()>| r.err().map(|e| e.0).unwrap_or_default();
    let repeated = error(ingest.insert(Space::Kv, b"c", b"v".to_vec().into()));
    assert!(repeated.contains("duplicate key"), "{repeated}");
    let earlier = error(ingest.insert(Space::Kv, b"b", b"v".to_vec().into()));
    assert!(earlier.contains("out of order"), "{earlier}");
    assert!(ingest
        .insert(Space::Lease, b"", b"v".to_vec().into())
        .is_err());
    ingest.finish()?;
    assert_eq!(s.get(Space::Kv, b"c")?, Some(b"v".to_vec()));
    Ok(())
}
