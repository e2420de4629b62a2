//! A member's snapshots, and installing one into the state, all with memory independent of
//! the state's size.
//!
//! The state on disk is itself the snapshot, as etcd's bbolt file is: a Raft snapshot only
//! records how far the state reaches once that is synced (so the log below may go). The bytes
//! a lagging member needs are written when asked for, from a [`View`] taken then, straight into
//! the pieces sent (`raft::snapshot_send`). Those openraft reads itself are written into
//! `snapshot.send-<n>`, a file unlinked as soon as it is created: it takes disk space only while
//! it is read, and a crash leaves nothing behind.
//!
//! A snapshot being received is written to `snapshot.recv-<n>`, one file per transfer (openraft
//! writes its chunks there), and is `snapshot.recv` while it is installed.
//!
//! Installing replaces the state in batches of bounded size, so it cannot be one atomic batch.
//! Instead: the received file is synced, an `installing` marker naming the snapshot is written
//! and synced, the keyspaces are cleared and refilled from the file, one last batch writes the
//! applied index and membership and removes the marker, and the file goes. A member that finds
//! the marker at start (it crashed mid-install) installs that snapshot again before it serves:
//! what it serves is the old state or the new, never a mix.
//!
//! So that a newcomer needs the state's size of disk once, not twice (the file and the state
//! it fills), every 64 MiB of the file installed is made durable in the state, the offset
//! reached is recorded (`install_progress`), and the file's part before it is given back to
//! the file system as a hole. A restart mid-install reads on from the recorded offset, without
//! clearing again. Once the first part is given back the file is `snapshot.recv.partly-
//! installed`: an earlier build, which would read the hole as the records' end, does not find
//! it and refuses to start ("its file is gone") instead of serving half a state.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

pub use super::snapshot_file::Record;
use super::snapshot_file::{self, carried_meta, Meta, Reader};
use crate::storage::{meta_key, Batch, Batches, Ingest, Space, Storage, View};

/// Where earlier builds kept their latest snapshot, built every `--snapshot-count` entries:
/// removed at start, unless an interrupted install still needs it.
const LEGACY_SNAPSHOT: &str = "snapshot.bin";

/// The snapshot files of one data dir.
pub struct SnapshotFiles {
    dir: PathBuf,
    /// Numbers the files of snapshots made and received.
    seq: AtomicU64,
    /// Set from a transfer's first piece until its install is marked on disk: the log store
    /// purges no entries the state on disk does not cover meanwhile.
    receiving: Arc<AtomicBool>,
    /// Bytes of the received file installed between two records of the install's progress.
    install_step: u64,
    /// Tests: an install fails after this many recorded steps, as if the member stopped.
    #[cfg(test)]
    stop_after_steps: Option<u32>,
}

/// Bytes of a received snapshot installed between two records of the install's progress (see
/// the module comment): the received file's disk space lags the install by about this much.
const INSTALL_STEP: u64 = 64 << 20;

impl SnapshotFiles {
    /// The snapshot files of `data_dir`.
    pub fn new(data_dir: &Path) -> Self {
        SnapshotFiles {
            dir: data_dir.to_path_buf(),
            seq: AtomicU64::new(0),
            receiving: Arc::default(),
            install_step: INSTALL_STEP,
            #[cfg(test)]
            stop_after_steps: None,
        }
    }

    /// Tests: records the install's progress every `bytes`, and fails it after `stop_after`
    /// steps when given.
    #[cfg(test)]
    fn with_install_step(mut self, bytes: u64, stop_after: Option<u32>) -> Self {
        self.install_step = bytes;
        self.stop_after_steps = stop_after;
        self
    }

    /// Removes the files of this data dir whose names start with `prefix`.
    fn remove_files(&self, prefix: &str) {
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with(prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// At start, with no install to finish: removes received snapshots no install will use,
    /// snapshots a crash left half made, and an earlier version's kept snapshot.
    pub fn forget_unused(&self) {
        for prefix in ["snapshot.recv", "snapshot.send-", "snapshot.build-"] {
            self.remove_files(prefix);
        }
        let legacy = self.dir.join(LEGACY_SNAPSHOT);
        if legacy.exists() {
            tracing::info!(path = %legacy.display(), "removing a kept snapshot: snapshots are now made when needed");
            let _ = std::fs::remove_file(legacy);
        }
    }

    /// The flag the log store checks before a purge (see [`SnapshotFiles::receiving`]).
    pub fn receiving_flag(&self) -> Arc<AtomicBool> {
        self.receiving.clone()
    }

    /// `snapshot.recv`: the received snapshot being installed.
    pub fn receiving_path(&self) -> PathBuf {
        self.dir.join("snapshot.recv")
    }

    /// `snapshot.recv.partly-installed`: the received snapshot being installed, once its first
    /// part is installed and given back to the disk.
    fn partly_installed_path(&self) -> PathBuf {
        self.dir.join("snapshot.recv.partly-installed")
    }

    /// A transfer begins: the path of a new file for it, `snapshot.recv-<n>`. Each transfer
    /// writes its own, so a new one never overwrites one that arrived whole and waits to be
    /// installed; earlier transfers' files go (a pending install reads through its handle).
    pub fn start_receiving(&self) -> PathBuf {
        self.receiving.store(true, Ordering::Release);
        self.remove_files("snapshot.recv");
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        self.dir.join(format!("snapshot.recv-{n}"))
    }

    /// A transfer's install ended (installed or failed).
    pub fn receiving_ended(&self) {
        self.receiving.store(false, Ordering::Release);
    }

    /// A new file for a snapshot being made, `snapshot.send-<n>`, unlinked as soon as it is
    /// created: it takes disk space only while it is open.
    ///
    /// # Errors
    /// On an I/O failure.
    pub fn create(&self) -> io::Result<std::fs::File> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("snapshot.send-{n}"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        std::fs::remove_file(&path)?;
        Ok(file)
    }

    /// Writes the snapshot of `view` described by `meta` to a new unlinked file and returns it,
    /// positioned at its start. Blocking.
    ///
    /// # Errors
    /// On an I/O or read failure, or once `cancel` is set.
    pub fn make(&self, meta: &Meta, view: &View, cancel: &AtomicBool) -> io::Result<std::fs::File> {
        use std::io::Seek;
        let started = std::time::Instant::now();
        let mut file = self.create()?;
        let bytes = snapshot_file::write(&file, meta, view, cancel)?;
        tracing::info!(
            bytes,
            took_ms = started.elapsed().as_millis() as u64,
            snapshot = %meta.snapshot_id,
            "made snapshot"
        );
        file.rewind()?;
        Ok(file)
    }

    /// Installs the received snapshot described by `meta` into `storage` (see the module
    /// comment). `handle` is what openraft wrote the snapshot to: a `snapshot.recv-<n>`, renamed
    /// to `snapshot.recv`, or any other file holding a snapshot, copied there. Blocking; the
    /// caller keeps readers of the state out meanwhile.
    ///
    /// # Errors
    /// On an I/O or storage failure, or when the received file is not the snapshot `meta`
    /// describes.
    pub fn install_received(
        &self,
        storage: &Storage,
        meta: &Meta,
        mut handle: std::fs::File,
    ) -> io::Result<()> {
        use std::io::Seek;
        use std::os::unix::fs::MetadataExt;
        let received = self.receiving_path();
        let theirs = handle.metadata()?;
        let written = std::fs::read_dir(&self.dir)?.flatten().find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("snapshot.recv-")
                && e.metadata()
                    .is_ok_and(|m| (m.dev(), m.ino()) == (theirs.dev(), theirs.ino()))
        });
        match written {
            Some(entry) => std::fs::rename(entry.path(), &received)?,
            None => {
                handle.rewind()?;
                let mut copy = std::fs::File::create(&received)?;
                io::copy(&mut handle, &mut copy)?;
            }
        }
        drop(handle);
        let file = std::fs::File::open(&received)?;
        let (found, _) = Reader::new(&file)?;
        if found.snapshot_id != meta.snapshot_id || found.last_log_id != meta.last_log_id {
            return Err(io::Error::other(format!(
                "received snapshot {} is not the announced {}",
                found.snapshot_id, meta.snapshot_id
            )));
        }
        file.sync_all()?;
        sync_dir(&self.dir)?;
        let marker = bincode::serialize(meta).map_err(io::Error::other)?;
        let mut batch = storage.batch();
        batch.insert(Space::Meta, meta_key::INSTALLING, &marker);
        batch.remove(Space::Meta, meta_key::INSTALL_PROGRESS);
        batch.commit()?;
        storage.persist_state()?;
        // openraft purges the log up to the snapshot: the values the state journal left to it
        // go to tables first.
        storage.flush_logged()?;
        // From here a restart finishes the install: the log may be purged up to it.
        self.receiving_ended();
        self.refill(storage, &received, meta, None)
    }

    /// At start: the install a crash interrupted, if any (its marker).
    ///
    /// # Errors
    /// On a read failure or a corrupt marker.
    pub fn interrupted_install(storage: &Storage) -> io::Result<Option<Meta>> {
        storage
            .get(Space::Meta, meta_key::INSTALLING)?
            .map(|marker| bincode::deserialize(&marker).map_err(io::Error::other))
            .transpose()
    }

    /// Finishes the install of `meta` that a crash interrupted. Blocking.
    ///
    /// # Errors
    /// On an I/O or storage failure, or when neither snapshot file is the one being installed.
    pub fn finish_install(&self, storage: &Storage, meta: &Meta) -> io::Result<()> {
        let resume = match storage.get(Space::Meta, meta_key::INSTALL_PROGRESS)? {
            Some(b) => Some(u64::from_be_bytes(
                <[u8; 8]>::try_from(b.as_slice())
                    .map_err(|_| io::Error::other("corrupt install progress: not 8 bytes"))?,
            )),
            None => None,
        };
        tracing::warn!(snapshot = %meta.snapshot_id, resume_at = ?resume, "finishing a snapshot install a stop interrupted");
        for path in [
            self.partly_installed_path(),
            self.receiving_path(),
            self.dir.join(LEGACY_SNAPSHOT),
        ] {
            if snapshot_file::read_meta(&path).is_ok_and(|m| m.snapshot_id == meta.snapshot_id) {
                return self.refill(storage, &path, meta, resume);
            }
        }
        Err(io::Error::other(format!(
            "snapshot {} was being installed, but its file is gone",
            meta.snapshot_id
        )))
    }

    /// Clears the carried keyspaces, fills them from the snapshot at `path`, records its
    /// applied index and membership and drops the marker, then removes the file. With
    /// `resume`, an offset the install's progress recorded, the records before it are in the
    /// state already: it reads on from there, and clears nothing.
    fn refill(
        &self,
        storage: &Storage,
        path: &Path,
        meta: &Meta,
        resume: Option<u64>,
    ) -> io::Result<()> {
        let started = std::time::Instant::now();
        let mut out = Batches::new(storage);
        // Open for writing too: installed records give their disk space back.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let (_, mut reader) = Reader::new(file)?;
        let mut path = path.to_path_buf();
        match resume {
            Some(offset) => reader.skip_to(offset)?,
            None => {
                clear_carried(storage, &mut out)?;
                // Committed before anything is ingested: what an ingestion registers is newer
                // than these removals, never the other way round.
                out.flush()?;
            }
        }
        let mut records = 0u64;
        let mut recorded = reader.position();
        let mut steps = 0u32;
        // The records (in key order, as the sender's view gave them) and their key-index
        // entries go straight into tables; the few others through batches.
        let mut ingest = Ingest::new(storage);
        while let Some(r) = reader.next_record()? {
            if r.space == Space::Kv {
                ingest_record(&mut ingest, &r.key, r.value)?;
            } else {
                out.insert(r.space, &r.key, &r.value)?;
            }
            records += 1;
            if reader.position() - recorded >= self.install_step {
                recorded = reader.position();
                ingest.finish()?;
                self.record_progress(storage, &mut out, &reader, &mut path)?;
                steps += 1;
                #[cfg(test)]
                if self.stop_after_steps == Some(steps) {
                    return Err(io::Error::other("test: the install stops here"));
                }
            }
        }
        ingest.finish()?;
        out.flush()?;
        let mut last = applied_batch(storage, meta)?;
        last.remove(Space::Meta, meta_key::INSTALLING);
        last.remove(Space::Meta, meta_key::INSTALL_PROGRESS);
        // The index's entries were written beside the records: the store's load reads them.
        last.insert(Space::Meta, meta_key::INDEX_COMPLETE, &[]);
        last.commit()?;
        storage.persist_state()?;
        std::fs::remove_file(&path)?;
        tracing::info!(
            records,
            steps,
            took_ms = started.elapsed().as_millis() as u64,
            snapshot = %meta.snapshot_id,
            "installed snapshot"
        );
        Ok(())
    }

    /// Makes the records `reader` has read durable in the state, records its position as the
    /// install's progress, then gives their part of the received file at `path` back to the
    /// disk: renamed first to `snapshot.recv.partly-installed`, which a build that does not
    /// know the progress (and would read the holes as the records' end) does not look for.
    fn record_progress(
        &self,
        storage: &Storage,
        out: &mut Batches,
        reader: &Reader<std::fs::File>,
        path: &mut PathBuf,
    ) -> io::Result<()> {
        out.flush()?;
        let mut progress = storage.batch();
        let upto = reader.position();
        progress.insert(Space::Meta, meta_key::INSTALL_PROGRESS, &upto.to_be_bytes());
        progress.commit()?;
        storage.persist_state()?;
        let partly = self.partly_installed_path();
        if *path != partly {
            std::fs::rename(&*path, &partly)?;
            sync_dir(&self.dir)?;
            *path = partly;
        }
        if !reader.release_read()? {
            tracing::debug!("the file system punches no holes: the received snapshot keeps its disk space until installed");
        }
        Ok(())
    }
}

/// Writes an MVCC record (revision `key`, `record`) and its key-index entry straight into
/// tables, so that the store's next load reads the entry instead of the record.
fn ingest_record(ingest: &mut Ingest, key: &[u8], record: Vec<u8>) -> io::Result<()> {
    let entry = crate::mvcc::disk::index_entry(key, &record)?;
    ingest.insert(Space::Index, key, entry)?;
    ingest.insert(Space::Kv, key, record.into())?;
    Ok(())
}

/// Removes what a snapshot replaces: the carried keyspaces and meta keys, and the key index's
/// entries (the old state's; the install writes the new records' beside them, and marks the
/// index complete again in its last batch).
fn clear_carried(storage: &Storage, out: &mut Batches) -> io::Result<()> {
    out.remove(Space::Meta, meta_key::INDEX_COMPLETE)?;
    let view = storage.view();
    for space in [Space::Kv, Space::Lease, Space::Index] {
        view.for_each(space, b"", |k, _| out.remove(space, k))?;
    }
    view.for_each(Space::Meta, b"", |k, _| {
        if carried_meta(k) {
            out.remove(Space::Meta, k)?;
        }
        Ok::<(), io::Error>(())
    })?;
    Ok(())
}

/// Writes the state a snapshot file carries into an empty `storage`, for a member of a new
/// cluster (`concord snapshot restore`): keys with their history, leases, the revision
/// counters, alarms and the auth store; not the old cluster's members. `input` is the file
/// from its start; what follows the snapshot's end (padding, checksum) is not read. Returns
/// (revision, MVCC records).
///
/// # Errors
/// A corrupt snapshot, or an I/O or storage failure.
pub fn restore(storage: &Storage, input: impl io::Read) -> io::Result<(i64, u64)> {
    let (_, mut reader) = Reader::new(input)?;
    restore_from(storage, |push| {
        while let Some(r) = reader.next_record()? {
            push(r)?;
        }
        Ok(())
    })
}

/// As [`restore`], from the records `produce` hands to the function it is given (another
/// format's, converted: `concord snapshot restore` of an etcd database). The `kv` records must
/// come in ascending key order, each key once (they go straight into tables).
///
/// # Errors
/// What `produce` returns, `kv` records out of order or repeated, or a storage failure.
pub fn restore_from(
    storage: &Storage,
    produce: impl FnOnce(&mut dyn FnMut(Record) -> io::Result<()>) -> io::Result<()>,
) -> io::Result<(i64, u64)> {
    let mut out = Batches::new(storage);
    // The records come in key order (a view's scan, or etcd's key bucket, whose revision keys
    // map to ours in the same order): they and their key-index entries go straight into
    // tables, as an install writes them; out of order, the restore fails.
    let mut ingest = Ingest::new(storage);
    let mut revision = 1;
    let mut records = 0;
    produce(&mut |r: Record| {
        let keep = match r.space {
            Space::Kv => {
                ingest_record(&mut ingest, &r.key, r.value)?;
                records += 1;
                return Ok(());
            }
            Space::Lease => true,
            // Written beside each record above.
            Space::Index => false,
            Space::Meta if r.key == meta_key::REVISION => {
                if let Ok(b) = <[u8; 8]>::try_from(r.value.as_slice()) {
                    revision = i64::from_be_bytes(b);
                }
                true
            }
            Space::Meta => {
                r.key == meta_key::COMPACTED
                    || r.key.starts_with(meta_key::ALARM)
                    || r.key.starts_with(crate::auth::state::key::PREFIX)
            }
        };
        if keep {
            out.insert(r.space, &r.key, &r.value)?;
        }
        Ok(())
    })?;
    ingest.finish()?;
    // The store's first load reads the index's entries, not every record.
    out.insert(Space::Meta, meta_key::INDEX_COMPLETE, &[])?;
    out.flush()?;
    storage.persist_state()?;
    Ok((revision, records))
}

/// After [`restore`], for a founder of the new cluster with `members` (id → peer URL): makes
/// the restored state the starting point of the cluster's Raft log, as etcd's restore writes a
/// snapshot into its new WAL. The state counts as applied up to one entry per founder, that
/// log is purged: so every founder restored from the same file starts from the same place, and
/// a member added later is sent the restored state as a snapshot, not just the log entries that
/// came after it.
///
/// # Errors
/// On an I/O or storage failure.
pub fn seal_restore(
    storage: &Storage,
    members: &std::collections::BTreeMap<u64, String>,
) -> io::Result<()> {
    let at = openraft::LogId::new(openraft::CommittedLeaderId::new(1, 0), members.len() as u64);
    let nodes: std::collections::BTreeMap<u64, openraft::BasicNode> = members
        .iter()
        .map(|(id, url)| (*id, openraft::BasicNode::new(url)))
        .collect();
    let voters = nodes.keys().copied().collect();
    let meta = Meta {
        last_log_id: Some(at),
        last_membership: openraft::StoredMembership::new(
            Some(at),
            openraft::Membership::new(vec![voters], nodes),
        ),
        snapshot_id: format!("restored-{}", at.index),
    };
    applied_batch(storage, &meta)?.commit()?;
    storage.persist_state()?;
    super::log_store::mark_purged(storage, at)?;
    Ok(())
}

/// The metadata of a snapshot of `view`: its applied log id and membership, and an id made of
/// `origin` and the applied index.
///
/// # Errors
/// On a read failure or corrupt metadata.
pub fn meta_of(view: &View, origin: &str) -> io::Result<Meta> {
    let decode = |key: &[u8]| -> io::Result<Option<Vec<u8>>> { Ok(view.get(Space::Meta, key)?) };
    let last_log_id: Option<openraft::LogId<u64>> = match decode(meta_key::APPLIED)? {
        Some(b) => bincode::deserialize(&b).map_err(io::Error::other)?,
        None => None,
    };
    let last_membership = match decode(meta_key::MEMBERSHIP)? {
        Some(b) => bincode::deserialize(&b).map_err(io::Error::other)?,
        None => openraft::StoredMembership::default(),
    };
    Ok(Meta {
        snapshot_id: format!("{origin}-{}", last_log_id.map_or(0, |l| l.index)),
        last_log_id,
        last_membership,
    })
}

/// A batch recording the state as applied up to `meta`'s log id, with its membership.
fn applied_batch(storage: &Storage, meta: &Meta) -> io::Result<Batch> {
    let mut batch = storage.batch();
    let applied = bincode::serialize(&meta.last_log_id).map_err(io::Error::other)?;
    batch.insert(Space::Meta, meta_key::APPLIED, &applied);
    let membership = bincode::serialize(&meta.last_membership).map_err(io::Error::other)?;
    batch.insert(Space::Meta, meta_key::MEMBERSHIP, &membership);
    Ok(batch)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
pub(super) mod tests;
