//! Tests of snapshot making, installing and restoring.

use super::*;

fn kv(storage: &Storage) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    Ok(storage.scan(Space::Kv)?)
}

/// Record `i` of a state whose keys start with `prefix`: key `<prefix><i>` put once, with a
/// 300-byte value, at revision `i + 1` (plus 100,000 for "old", so that two states share none).
fn record(prefix: &str, i: usize) -> (Vec<u8>, Vec<u8>) {
    let rev = (i + 1 + if prefix == "old" { 100_000 } else { 0 }) as i64;
    let kv = crate::pb::mvccpb::KeyValue {
        key: format!("{prefix}{i:05}").into_bytes(),
        value: vec![7u8; 300].into(),
        create_revision: rev,
        mod_revision: rev,
        version: 1,
        lease: 0,
    };
    (
        crate::mvcc::Revision::new(rev, 0).to_bytes().to_vec(),
        crate::mvcc::disk::kv_record(false, &kv),
    )
}

fn fill(storage: &Storage, prefix: &str, n: usize) -> io::Result<()> {
    let mut b = storage.batch();
    for i in 0..n {
        let (k, v) = record(prefix, i);
        b.insert(Space::Kv, &k, &v);
    }
    b.insert(Space::Meta, meta_key::REVISION, &(n as i64).to_be_bytes());
    b.commit()?;
    Ok(())
}

fn meta(index: u64) -> Meta {
    Meta {
        last_log_id: Some(openraft::LogId::new(
            openraft::CommittedLeaderId::new(2, 1),
            index,
        )),
        snapshot_id: format!("test-{index}"),
        ..Default::default()
    }
}

#[test]
fn an_install_stopped_half_way_is_finished_at_the_next_start() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
    let a = Storage::open(&a_dir)?;
    fill(&a, "new", 3000)?;
    let sent = SnapshotFiles::new(&a_dir);
    let m = meta(40);
    let mut made = sent.make(&m, &a.view(), &AtomicBool::new(false))?;

    // Member b receives it, marks the install, and stops with half of its old keys
    // removed and part of the new ones written.
    let b = Storage::open(&b_dir)?;
    fill(&b, "old", 2000)?;
    // With the key index's entries of its old records, complete.
    let mut index = b.batch();
    for i in 0..2000 {
        index.insert(Space::Index, &record("old", i).0, b"p");
    }
    index.insert(Space::Meta, meta_key::INDEX_COMPLETE, &[]);
    index.commit()?;
    io::copy(
        &mut made,
        &mut std::fs::File::create(b_dir.join("snapshot.recv"))?,
    )?;
    let mut batch = b.batch();
    batch.insert(
        Space::Meta,
        meta_key::INSTALLING,
        &bincode::serialize(&m).map_err(io::Error::other)?,
    );
    for i in 0..1000 {
        batch.remove(Space::Kv, &record("old", i).0);
    }
    for i in 0..500 {
        let (k, v) = record("new", i);
        batch.insert(Space::Kv, &k, &v);
    }
    batch.commit()?;
    drop(b);

    let b = Storage::open(&b_dir)?;
    let files = SnapshotFiles::new(&b_dir);
    let marked = SnapshotFiles::interrupted_install(&b)?
        .ok_or("no marker")
        .map_err(io::Error::other)?;
    assert_eq!(marked, m);
    files.finish_install(&b, &marked)?;
    assert_eq!(
        kv(&b)?,
        kv(&a)?,
        "exactly the snapshot's state, nothing old"
    );
    assert_eq!(b.get(Space::Meta, meta_key::INSTALLING)?, None);
    // The MVCC store of a, opened, rebuilds its index entries from its records: the install
    // wrote the same ones.
    drop(crate::mvcc::MvccStore::open(a.clone())?);
    assert!(
        b.scan(Space::Index)? == a.scan(Space::Index)?
            && b.get(Space::Meta, meta_key::INDEX_COMPLETE)?.is_some(),
        "the old state's index entries go, the new records' are written beside them"
    );
    assert_eq!(a.scan(Space::Index)?.len(), 3000);
    let applied: Option<openraft::LogId<u64>> =
        bincode::deserialize(&b.get(Space::Meta, meta_key::APPLIED)?.unwrap_or_default())
            .map_err(io::Error::other)?;
    assert_eq!(applied, m.last_log_id);
    assert!(
        !b_dir.join("snapshot.recv").exists(),
        "the installed file goes"
    );
    assert!(
        SnapshotFiles::interrupted_install(&b)?.is_none(),
        "nothing left to finish"
    );
    Ok(())
}

#[test]
fn a_made_snapshot_is_described_by_its_view_and_leaves_no_file() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let s = Storage::open(&dir.path().join("data"))?;
    fill(&s, "k", 10)?;
    let m = meta(7);
    applied_batch(&s, &m)?.commit()?;
    let view = s.view();
    let described = meta_of(&view, "test")?;
    assert_eq!(described.last_log_id, m.last_log_id);
    assert_eq!(described.snapshot_id, "test-7");
    let files = SnapshotFiles::new(dir.path());
    let (read, mut reader) =
        Reader::new(files.make(&described, &view, &AtomicBool::new(false))?)?;
    assert_eq!(read, described);
    let mut records = 0;
    while reader.next_record()?.is_some() {
        records += 1;
    }
    assert_eq!(records, 11, "ten keys and the revision");
    let names: Vec<_> = std::fs::read_dir(dir.path())?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("data")]);
    Ok(())
}

#[test]
fn restore_keeps_data_alarms_and_auth_but_not_members() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let s = Storage::open(&dir.path().join("a"))?;
    fill(&s, "k", 10)?;
    let mut b = s.batch();
    b.insert(Space::Meta, b"m/alarm/x", b"");
    b.insert(Space::Meta, b"m/attr/x", b"member");
    b.commit()?;
    let files = SnapshotFiles::new(dir.path());
    let file = files.make(&meta(3), &s.view(), &AtomicBool::new(false))?;
    let fresh = Storage::open(&dir.path().join("b"))?;
    let (revision, records) = restore(&fresh, file)?;
    assert_eq!((revision, records), (10, 10));
    assert_eq!(kv(&fresh)?, kv(&s)?);
    assert!(fresh.get(Space::Meta, b"m/alarm/x")?.is_some());
    assert!(fresh.get(Space::Meta, b"m/attr/x")?.is_none());
    // The records went in with their key-index entries, so the first load reads those.
    let entries = fresh.scan(Space::Index)?;
    assert_eq!(entries.len(), 10);
    for ((rev, record), (entry_rev, entry)) in kv(&s)?.iter().zip(&entries) {
        assert_eq!(rev, entry_rev);
        assert_eq!(&*crate::mvcc::disk::index_entry(rev, record)?, &entry[..]);
    }
    assert!(fresh.get(Space::Meta, meta_key::INDEX_COMPLETE)?.is_some());
    Ok(())
}

#[test]
fn a_restore_of_records_out_of_order_fails_with_an_error() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let fresh = Storage::open(dir.path())?;
    let restored = restore_from(&fresh, |push| {
        for i in [1, 0] {
            let (key, value) = record("k", i);
            push(Record {
                space: Space::Kv,
                key,
                value,
            })?;
        }
        Ok(())
    });
    let err = restored.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("out of order"), "{err}");
    Ok(())
}

/// Member a's state of 3000 records, in `dir`/a, and its snapshot described by `meta(index)`.
fn sent(dir: &Path, index: u64) -> io::Result<(Storage, Meta, std::fs::File)> {
    let a_dir = dir.join("a");
    let a = Storage::open(&a_dir)?;
    fill(&a, "new", 3000)?;
    let m = meta(index);
    let made = SnapshotFiles::new(&a_dir).make(&m, &a.view(), &AtomicBool::new(false))?;
    Ok((a, m, made))
}

/// Member b in `b_dir` with an old state of `old` records, its snapshot files installing in
/// steps of 64 KiB and stopping after `stop` of them, and the file it received `made` into.
fn received(
    b_dir: &Path,
    old: usize,
    made: &mut std::fs::File,
    stop: Option<u32>,
) -> io::Result<(Storage, SnapshotFiles, PathBuf)> {
    let b = Storage::open(b_dir)?;
    fill(&b, "old", old)?;
    let files = SnapshotFiles::new(b_dir).with_install_step(64 << 10, stop);
    let path = files.start_receiving();
    io::copy(made, &mut std::fs::File::create(&path)?)?;
    Ok((b, files, path))
}

/// The names of the snapshot files in `dir`.
pub(in crate::raft) fn snapshot_files(dir: &Path) -> io::Result<Vec<String>> {
    Ok(std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snapshot"))
        .collect())
}

#[test]
fn a_long_install_gives_the_received_file_back_and_resumes_where_it_stopped() -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir()?;
    let b_dir = dir.path().join("b");
    let (a, m, mut made) = sent(dir.path(), 40)?;

    // Member b, with an old state, receives the snapshot and stops eight steps of 64 KiB into
    // its install.
    let (b, files, path) = received(&b_dir, 2000, &mut made, Some(8))?;
    let size = std::fs::metadata(&path)?.len();
    let stopped = files.install_received(&b, &m, std::fs::File::open(&path)?);
    assert!(stopped.is_err(), "the test hook stops the install");
    drop(b);

    let partly = b_dir.join("snapshot.recv.partly-installed");
    assert!(
        !b_dir.join("snapshot.recv").exists() && partly.exists(),
        "renamed, out of an earlier build's sight, before the first hole"
    );
    let on_disk = std::fs::metadata(&partly)?.blocks() * 512;
    assert_eq!(
        std::fs::metadata(&partly)?.len(),
        size,
        "holes keep the size"
    );
    assert!(
        on_disk + (400 << 10) < size,
        "the installed half million bytes went back to the disk: {on_disk} of {size} held"
    );

    let b = Storage::open(&b_dir)?;
    let progress = b.get(Space::Meta, meta_key::INSTALL_PROGRESS)?;
    let progress = u64::from_be_bytes(
        <[u8; 8]>::try_from(progress.unwrap_or_default().as_slice()).map_err(io::Error::other)?,
    );
    assert!(
        progress >= 8 * (64 << 10) && progress < size,
        "progress {progress} of {size}"
    );
    let marked = SnapshotFiles::interrupted_install(&b)?
        .ok_or("no marker")
        .map_err(io::Error::other)?;
    SnapshotFiles::new(&b_dir).finish_install(&b, &marked)?;
    assert_eq!(
        kv(&b)?,
        kv(&a)?,
        "exactly the snapshot's state, nothing old"
    );
    assert_eq!(b.get(Space::Meta, meta_key::INSTALL_PROGRESS)?, None);
    assert!(SnapshotFiles::interrupted_install(&b)?.is_none());
    assert!(!partly.exists(), "the installed file goes");
    Ok(())
}

#[test]
fn an_uninterrupted_install_records_progress_and_leaves_none() -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let b_dir = dir.path().join("b");
    let (a, m, mut made) = sent(dir.path(), 41)?;
    let (b, files, path) = received(&b_dir, 100, &mut made, None)?;
    files.install_received(&b, &m, std::fs::File::open(&path)?)?;
    assert_eq!(kv(&b)?, kv(&a)?);
    assert_eq!(b.get(Space::Meta, meta_key::INSTALL_PROGRESS)?, None);
    assert_eq!(SnapshotFiles::interrupted_install(&b)?, None);
    let left = snapshot_files(&b_dir)?;
    assert!(left.is_empty(), "no snapshot file left: {left:?}");
    Ok(())
}

/// A member behind holds older versions of the same revisions, and some the snapshot lacks:
/// the install's removals never hide what it ingests, before a restart or after (when the
/// state journal, removals included, is replayed).
#[test]
fn an_install_over_the_same_revisions_keeps_the_snapshots_records_across_a_restart(
) -> io::Result<()> {
    let dir = tempfile::tempdir()?;
    let b_dir = dir.path().join("b");
    let (a, m, mut made) = sent(dir.path(), 42)?;
    let b = Storage::open(&b_dir)?;
    let mut old = b.batch();
    // Revisions 1..=3500 with other values: 3000 the snapshot has too, 500 it does not.
    for i in 0..3500 {
        let (k, mut v) = record("new", i);
        v.push(1);
        old.insert(Space::Kv, &k, &v);
        old.insert(Space::Index, &k, b"stale");
    }
    old.commit()?;
    let files = SnapshotFiles::new(&b_dir).with_install_step(64 << 10, None);
    let path = files.start_receiving();
    io::copy(&mut made, &mut std::fs::File::create(&path)?)?;
    files.install_received(&b, &m, std::fs::File::open(&path)?)?;
    drop(crate::mvcc::MvccStore::open(a.clone())?);
    assert_eq!(kv(&b)?, kv(&a)?, "exactly the snapshot's records");
    assert!(b.scan(Space::Index)? == a.scan(Space::Index)?);
    drop(b);
    let b = Storage::open(&b_dir)?;
    assert_eq!(kv(&b)?, kv(&a)?, "and again after a restart");
    assert!(b.scan(Space::Index)? == a.scan(Space::Index)?);
    Ok(())
}
