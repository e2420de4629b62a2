//! Durable storage: the only module that imports fjall.
//!
//! The Raft log's entries are segment files in `wal/` (`wal.rs`), written once and synced on
//! every append batch. Two fjall databases, each with its own journal: `log/` holds the vote
//! and the log's other metadata, synced on each change; `db/` holds the state machine and is
//! synced only before log entries are purged (until then the log can rebuild it). Separate
//! files keep a log fsync from stalling state-machine writes (fjall holds a journal's lock
//! while syncing it). The schema:
//!
//! | keyspace    | key                          | value                                   | since |
//! |-------------|------------------------------|-----------------------------------------|-------|
//! | `raft_log`  | log index, u64 big-endian    | bincode openraft `Entry`; empty since v2 (`wal/`) | v1    |
//! | `raft_meta` | `vote`, `committed`, `purged`| bincode openraft types                  | v1    |
//! | `kv`        | [`Revision`] bytes (16)      | record: `p`/`t` + protobuf `KeyValue`   | v1    |
//! | `meta`      | see [`meta_key`]             | state-machine metadata                  | v1    |
//! | `lease`     | lease id, i64 big-endian     | granted, checkpointed TTL: 2 × i64 BE   | v1    |
//! | `index`     | [`Revision`] bytes (16)      | the record's tag + its key-index fields | v3    |
//!
//! A record of `kv` whose value its Raft log entry holds (4 KiB or more) is journaled as a
//! reference to that entry, not whole ([`logged`]); tables always hold whole records. A
//! snapshot install writes `kv` and `index` straight into tables ([`Ingest`]), not through the
//! journal.
//!
//! `index` repeats, for each record of `kv`, what the key index needs (key, create revision,
//! version, lease) without the value, so that a start reads it instead of every value. It is
//! written in the same batch as the record, and trusted only while the `meta` key
//! [`meta_key::INDEX_COMPLETE`] is present (the MVCC layer rebuilds it otherwise).
//!
//! [`Revision`]: crate::mvcc::Revision

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

mod batch;
mod ingest;
pub mod logged;
mod release;
mod view;
mod wal;
mod writeback;

pub use batch::{Batch, Batches, Value};
pub use ingest::Ingest;

pub use view::View;

/// The on-disk format this binary writes. Written at creation; a data dir with a newer format is
/// refused, an older one is upgraded at open. 2: the Raft log's entries in `wal/` (1 kept them in
/// the `raft_log` keyspace; a binary of format 1 refuses a dir of format 2, rather than take its
/// empty `raft_log` for an empty log). 3: the `index` keyspace (a binary of format 2 would write
/// records without their index entries). 4: Raft log segments named with a salt their checksums
/// cover (a binary of format 3 refuses to open such a log: it does not know the names).
pub const FORMAT_VERSION: u32 = 4;

/// Keys of the `meta` keyspace.
pub mod meta_key {
    /// u32 BE: [`super::FORMAT_VERSION`] at creation (since v1).
    pub const FORMAT_VERSION: &[u8] = b"format_version";
    /// bincode `Option<LogId>`: last applied Raft log id (since v1).
    pub const APPLIED: &[u8] = b"applied";
    /// bincode `StoredMembership`: last applied membership (since v1).
    pub const MEMBERSHIP: &[u8] = b"membership";
    /// i64 BE: current main revision (since v1).
    pub const REVISION: &[u8] = b"revision";
    /// i64 BE: last compacted main revision (since v1).
    pub const COMPACTED: &[u8] = b"compacted";
    /// Prefix of the meta keys written by applied commands, which snapshots carry (since v1).
    pub const REPLICATED: &[u8] = b"m/";
    /// + member id (u64 BE) → protobuf `MemberAttributes`: a member's name and client URLs.
    pub const MEMBER_ATTRS: &[u8] = b"m/attr/";
    /// + member id (u64 BE) → empty: a member removed from the cluster, never to return.
    pub const REMOVED: &[u8] = b"m/removed/";
    /// + member id (u64 BE) + alarm type (i32 BE) → empty: a raised alarm.
    pub const ALARM: &[u8] = b"m/alarm/";
    /// bincode `SnapshotMeta`: a snapshot install in progress (since v1; see
    /// `raft::snapshots`).
    pub const INSTALLING: &[u8] = b"installing";
    /// u64 BE: how far into the received snapshot file the install in progress has its
    /// records durably in the state (since v4; see `raft::snapshots`). Not carried.
    pub const INSTALL_PROGRESS: &[u8] = b"install_progress";
    /// Empty: the `index` keyspace holds the index entry of every record of `kv` and nothing
    /// else (since v3). Not carried by snapshots: an install removes it.
    pub const INDEX_COMPLETE: &[u8] = b"index_complete";
}

/// The smallest key after every key starting with `prefix`; `[0]` (etcd's "to the end") when
/// there is none.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A value fjall read, shared when large, copied when small (see [`SHARED_VALUE_BYTES`]).
fn shared_bytes(v: fjall::Slice) -> bytes::Bytes {
    if v.len() < SHARED_VALUE_BYTES {
        bytes::Bytes::copy_from_slice(&v)
    } else {
        bytes::Bytes::from_owner(v)
    }
}

/// Raft-meta key of the member identity.
const IDENTITY_KEY: &str = "identity";

/// A storage failure. Fatal for the member: it stops serving rather than risk divergence.
#[derive(Debug, thiserror::Error)]
#[error("storage: {0}")]
pub struct StorageError(pub String);

impl From<fjall::Error> for StorageError {
    fn from(e: fjall::Error) -> Self {
        StorageError(e.to_string())
    }
}

impl From<std::io::Error> for StorageError {
    fn from(e: std::io::Error) -> Self {
        StorageError(e.to_string())
    }
}

impl From<StorageError> for std::io::Error {
    fn from(e: StorageError) -> Self {
        std::io::Error::other(e.0)
    }
}

/// Result of a storage operation.
pub type StorageResult<T> = Result<T, StorageError>;

/// The keyspaces of one member's data dir.
#[derive(Clone)]
pub struct Storage {
    log_db: Database,
    db: Database,
    /// The Raft log's entries (`wal/`).
    wal: Arc<wal::Wal>,
    /// Where data dirs of earlier versions kept the Raft log's entries: moved to `wal/` when
    /// such a dir is opened.
    raft_log: Keyspace,
    raft_meta: Keyspace,
    kv: Keyspace,
    meta: Keyspace,
    lease: Keyspace,
    index: Keyspace,
    /// Writes the state journal back in the background (see [`writeback`]).
    writeback: std::sync::Arc<writeback::Writeback>,
    /// Which values the state journal left to the Raft log are not in tables yet (see
    /// [`logged`]).
    logged: Arc<logged::Logged>,
}

/// The keyspaces a [`Batch`] can write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Space {
    /// MVCC records by revision.
    Kv,
    /// State-machine metadata.
    Meta,
    /// Leases: id → granted TTL.
    Lease,
    /// The key index's fields of each MVCC record, by revision (derived from `Kv`).
    Index,
}

/// Journal bytes per database before fjall flushes memtables to free the oldest journal (fjall's
/// minimum; its default, 512 MiB, made a restart replay up to that much).
const MAX_JOURNALS: u64 = 64 * 1024 * 1024;
/// Memtable size per keyspace (fjall's default is 64 MiB): memtables are most of the resident
/// memory after a bulk load, and a restart rebuilds them from the journal.
const MEMTABLE_BYTES: u64 = 16 * 1024 * 1024;

/// Bytes of memtables (active and sealed, not yet flushed) that a bulk writer ([`Batches`]) lets
/// pile up before it waits for flushes: fjall bounds them by nothing else, and an install or a
/// rebuild writes faster than they flush (a 2 GiB install of 16 KiB values held 650 MiB).
const BULK_WRITE_BUFFER: u64 = 8 * MEMTABLE_BYTES;
/// The longest a bulk writer waits for flushes before it writes on (a flush that failed has
/// poisoned the store: the next write reports it).
const BULK_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// A bulk writer's pause: sleeps while `busy` says so, at most [`BULK_WAIT_MAX`] (past that the
/// writer goes on, slower writes being better than none).
fn bulk_wait(busy: impl Fn() -> bool) {
    let started = std::time::Instant::now();
    while busy() && started.elapsed() < BULK_WAIT_MAX {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// The state database's block cache by default (`--storage-cache-bytes`): fjall's blocks are
/// also in the kernel's page cache, as bbolt's are for etcd, so this cache only saves the
/// copies and decompression of the hottest blocks.
pub const DEFAULT_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// The Raft log database's block cache: the log is read back only by lagging followers, and its
/// newest entries are still in the memtable.
const LOG_CACHE_BYTES: u64 = 8 * 1024 * 1024;

fn keyspace_options() -> KeyspaceCreateOptions {
    KeyspaceCreateOptions::default().max_memtable_size(MEMTABLE_BYTES)
}

/// Options of the `index` keyspace: its entries are a few dozen bytes, a smaller memtable holds
/// as many of them as the others hold records.
fn index_options() -> KeyspaceCreateOptions {
    KeyspaceCreateOptions::default().max_memtable_size(MEMTABLE_BYTES / 4)
}

/// Values read with [`Storage::get_shared`] at least this large are shared with the buffer
/// fjall read them into; smaller ones are copied out of it. A small value is read as a part of a
/// cached table block (4 KiB or more), and a value kept a while (an event waiting for a slow
/// watcher) must not keep a whole block alive: sharing is bounded to a few times the value's
/// own size.
pub const SHARED_VALUE_BYTES: usize = 1024;

/// Values of at least this many bytes live in blob files beside the tables of the keyspace
/// that holds them (the MVCC records): written once when the memtable is flushed, never again
/// by compactions, which move only their keys and pointers.
const SEPARATED_VALUE_BYTES: u32 = 4096;

/// Options of a keyspace that may hold large values (see [`SEPARATED_VALUE_BYTES`]). They take
/// effect when the keyspace is created: fjall keeps a keyspace's options in its data dir.
fn large_value_options() -> KeyspaceCreateOptions {
    let blobs = fjall::KvSeparationOptions::default()
        .separation_threshold(SEPARATED_VALUE_BYTES)
        .compression(fjall::CompressionType::None);
    keyspace_options().with_kv_separation(Some(blobs))
}

impl Storage {
    /// Opens (or creates) the data dir with the default cache, checking its format version.
    ///
    /// # Errors
    /// When fjall cannot open the directory or the format is newer than this binary.
    pub fn open(dir: &Path) -> StorageResult<Self> {
        Self::open_with_cache(dir, DEFAULT_CACHE_BYTES)
    }

    /// Opens (or creates) the data dir with a block cache of `cache_bytes` for the state
    /// database (`--storage-cache-bytes`), checking its format version.
    ///
    /// # Errors
    /// When fjall cannot open the directory, the format is newer than this binary, or the
    /// thread opening the Raft log database panicked.
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> StorageResult<Self> {
        std::fs::create_dir_all(dir).map_err(|e| StorageError(e.to_string()))?;
        // The log first: replaying the state journal reads the values it left to the log.
        let wal = Arc::new(wal::Wal::open(&dir.join("wal"))?);
        let logged = Arc::new(logged::Logged::default());
        let resolver = logged::resolver(wal.clone(), logged.clone());
        // The two databases replay their journals side by side: a restart serves sooner.
        let (db, log_db) = std::thread::scope(|s| {
            let log_db = s.spawn(|| {
                Database::builder(dir.join("log"))
                    .journal_compression(fjall::CompressionType::None)
                    .max_journaling_size(MAX_JOURNALS)
                    .cache_size(LOG_CACHE_BYTES)
                    .open()
            });
            // Not compressed (fjall compresses values over 4 KiB by default): a compression
            // per journal per put cost more CPU than the disk bandwidth it saved.
            let db = Database::builder(dir.join("db"))
                .journal_compression(fjall::CompressionType::None)
                .max_journaling_size(MAX_JOURNALS)
                .cache_size(cache_bytes)
                .with_journal_value_resolver(resolver)
                .open();
            let log_db = log_db
                .join()
                .map_err(|_| StorageError("opening the Raft log database panicked".into()));
            (db, log_db)
        });
        let (db, log_db) = (db?, log_db??);
        let storage = Storage {
            wal,
            raft_log: log_db.keyspace("raft_log", keyspace_options)?,
            raft_meta: log_db.keyspace("raft_meta", keyspace_options)?,
            log_db,
            kv: db.keyspace("kv", large_value_options)?,
            meta: db.keyspace("meta", keyspace_options)?,
            lease: db.keyspace("lease", keyspace_options)?,
            index: db.keyspace("index", index_options)?,
            db,
            writeback: writeback::Writeback::start(&dir.join("db")),
            logged,
        };
        let found = match storage.meta.get(meta_key::FORMAT_VERSION)? {
            None => None,
            Some(v) => Some(
                <[u8; 4]>::try_from(&v[..])
                    .map(u32::from_be_bytes)
                    .map_err(|_| StorageError("corrupt data dir format version".into()))?,
            ),
        };
        match found {
            Some(FORMAT_VERSION) => {}
            // Format 2 lacks only `index`, which the MVCC layer builds when its marker is absent;
            // format 3's segments, named without salts, are read as they are.
            None | Some(1) | Some(2) | Some(3) => {
                if found == Some(1) {
                    storage.move_log_to_wal()?;
                }
                storage
                    .meta
                    .insert(meta_key::FORMAT_VERSION, FORMAT_VERSION.to_be_bytes())?;
                storage.persist_state()?;
            }
            Some(other) => {
                return Err(StorageError(format!(
                    "data dir format {other} is not supported (this binary writes {FORMAT_VERSION})"
                )));
            }
        }
        Ok(storage)
    }

    /// Moves the Raft log of a data dir written by an earlier version (entries in the log
    /// database's `raft_log` keyspace) to `wal/`. Done again from the start if a crash
    /// interrupts it: the keyspace is emptied only once the segments are synced.
    fn move_log_to_wal(&self) -> StorageResult<()> {
        if self.raft_log.first_key_value().is_none() {
            return Ok(());
        }
        self.wal.clear()?;
        let mut moved = 0u64;
        let mut batch = Vec::new();
        for guard in self.raft_log.iter() {
            let (k, v) = guard.into_inner()?;
            batch.push((decode_index(&k)?, v.to_vec()));
            if batch.len() == 4096 {
                self.wal.append(&std::mem::take(&mut batch))?;
            }
            moved += 1;
        }
        self.wal.append(&batch)?;
        self.wal.sync()?;
        // One batch, so atomic: were the keyspace emptied in parts, a crash part way would
        // leave some entries there, and the next start would move only those, over the whole
        // copy.
        let mut b = self.log_db.batch();
        for guard in self.raft_log.iter() {
            b.remove(&self.raft_log, guard.key()?);
        }
        b.commit()?;
        self.log_db.persist(PersistMode::SyncData)?;
        tracing::info!(entries = moved, "moved the Raft log to its segment files");
        Ok(())
    }

    fn space(&self, space: Space) -> &Keyspace {
        match space {
            Space::Kv => &self.kv,
            Space::Meta => &self.meta,
            Space::Lease => &self.lease,
            Space::Index => &self.index,
        }
    }

    /// Syncs the state machine's journal.
    ///
    /// # Errors
    /// When the sync fails.
    pub fn persist_state(&self) -> StorageResult<()> {
        self.db.persist(PersistMode::SyncData)?;
        Ok(())
    }

    /// Flushes the memtables that hold values the state journal left to the Raft log (see
    /// [`logged`]), and waits for the flush: afterwards the log entries those values came from
    /// may be purged. Blocking; does nothing when no such value was written since the last.
    ///
    /// # Errors
    /// When the flush fails.
    pub fn flush_logged(&self) -> StorageResult<()> {
        let upto = self.logged.written();
        if self.logged.covers(upto) {
            return Ok(());
        }
        self.kv.rotate_memtable_and_wait()?;
        self.logged.flushed(upto);
        Ok(())
    }

    /// Whether the Raft log's entries up to `index` may be purged as far as the state is
    /// concerned: no value the state journal left to the log lies in them unflushed.
    pub fn log_purgeable(&self, index: u64) -> bool {
        self.logged.covers(index)
    }

    /// For bulk writers ([`Batches`]): waits while the memtables not yet flushed hold more than
    /// [`BULK_WRITE_BUFFER`], so that a bulk write's memory is bounded by how fast its memtables
    /// flush, not by its size. Blocking.
    fn wait_for_flushes(&self) {
        bulk_wait(|| self.db.write_buffer_size() > BULK_WRITE_BUFFER);
    }

    /// For bulk ingestion ([`Ingest`]): waits while `keyspace` has `runs` or more sorted runs
    /// in its first level, so that its compaction keeps up and fjall never stalls the writes
    /// that follow. Blocking.
    fn wait_for_compactions(&self, keyspace: &Keyspace, runs: usize) {
        use fjall::AbstractTree;
        bulk_wait(|| keyspace.tree.l0_run_count() >= runs);
    }

    /// Starts an atomic state-machine batch.
    pub fn batch(&self) -> Batch {
        Batch {
            inner: self.db.batch(),
            storage: self.clone(),
            logged_upto: None,
        }
    }

    /// Reads one value of a state-machine keyspace.
    ///
    /// # Errors
    /// On a read failure.
    pub fn get(&self, space: Space, key: &[u8]) -> StorageResult<Option<Vec<u8>>> {
        Ok(self.space(space).get(key)?.map(|v| v.to_vec()))
    }

    /// Reads one value of a state-machine keyspace without copying it, if it is of
    /// [`SHARED_VALUE_BYTES`] or more: the bytes fjall read (from its cache or a table or blob
    /// file) are shared with whoever keeps a part of them. A smaller value is copied out.
    ///
    /// # Errors
    /// On a read failure.
    pub fn get_shared(&self, space: Space, key: &[u8]) -> StorageResult<Option<bytes::Bytes>> {
        Ok(self.space(space).get(key)?.map(shared_bytes))
    }

    /// Entries of a state-machine keyspace with `start <= key < end`, in key order.
    ///
    /// # Errors
    /// On a read failure.
    pub fn scan_range(
        &self,
        space: Space,
        start: &[u8],
        end: &[u8],
    ) -> StorageResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        for guard in self.space(space).range(start..end) {
            let (k, v) = guard.into_inner()?;
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    /// Every entry of a state-machine keyspace, in key order.
    ///
    /// # Errors
    /// On a read failure.
    pub fn scan(&self, space: Space) -> StorageResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        for guard in self.space(space).iter() {
            let (k, v) = guard.into_inner()?;
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    /// Calls `visit` with every `(key, value)` of `space` with `from <= key < to` (no upper
    /// bound without `to`), in key order, without copying them (the start-up scan reads a
    /// million records this way).
    ///
    /// # Errors
    /// On a read failure, or the first error `visit` returns.
    pub fn for_each_in(
        &self,
        space: Space,
        from: &[u8],
        to: Option<&[u8]>,
        mut visit: impl FnMut(&[u8], &[u8]) -> StorageResult<()>,
    ) -> StorageResult<()> {
        let end = to.map_or(Bound::Unbounded, Bound::Excluded);
        for guard in self
            .space(space)
            .range::<&[u8], _>((Bound::Included(from), end))
        {
            let (k, v) = guard.into_inner()?;
            visit(&k, &v)?;
        }
        Ok(())
    }

    /// Appends Raft log entries `(index, bytes)`: readable at once, durable after the next
    /// [`Storage::persist_log`] (the caller syncs, so that many appends share one fsync).
    ///
    /// # Errors
    /// On a write failure, or an index at or below the log's end (truncate first).
    pub fn append_log(&self, entries: &[(u64, Vec<u8>)]) -> StorageResult<()> {
        Ok(self.wal.append(entries)?)
    }

    /// Log entries with `from <= index < to`, in order.
    ///
    /// # Errors
    /// On a read failure or a corrupt entry.
    pub fn log_range(&self, from: u64, to: u64) -> StorageResult<Vec<(u64, Vec<u8>)>> {
        if from >= to {
            return Ok(Vec::new());
        }
        Ok(self.wal.read(from, to)?)
    }

    /// The stored length of each log entry with `from <= index < to` the log holds, by index,
    /// without reading them.
    pub fn log_record_lens(&self, from: u64, to: u64) -> Vec<(u64, u64)> {
        if from >= to {
            return Vec::new();
        }
        self.wal.record_lens(from, to)
    }

    /// The last log entry, if any.
    ///
    /// # Errors
    /// On a read failure or a corrupt entry.
    pub fn last_log(&self) -> StorageResult<Option<(u64, Vec<u8>)>> {
        Ok(self.wal.last()?)
    }

    /// Removes log entries at or below `upto`, whole segments at a time (see [`wal::Wal::purge`];
    /// a segment a crash brings back is whole, below the purged index, never read, and removed
    /// by the next purge). Returns how many entries were removed.
    ///
    /// # Errors
    /// On an I/O failure.
    pub fn remove_log_prefix(&self, upto: u64) -> StorageResult<u64> {
        Ok(self.wal.purge(upto)?)
    }

    /// Removes every log entry at or above `from`; synced before returning.
    ///
    /// # Errors
    /// On a write or fsync failure.
    pub fn truncate_log(&self, from: u64) -> StorageResult<()> {
        Ok(self.wal.truncate(from)?)
    }

    /// The first index of the log's contiguous end when an earlier part lies before a gap (see
    /// [`wal::Wal::after_gap`]).
    pub fn log_after_gap(&self) -> Option<u64> {
        self.wal.after_gap()
    }

    /// Syncs the Raft log (`fdatasync`, as etcd's WAL does: the data and the file size, which is
    /// what reading it back needs).
    ///
    /// # Errors
    /// When the sync fails.
    #[tracing::instrument(name = "fsync", level = "debug", skip_all)]
    pub fn persist_log(&self) -> StorageResult<()> {
        Ok(self.wal.sync()?)
    }

    /// Writes a Raft metadata value (vote, purged) and syncs it.
    ///
    /// # Errors
    /// On a write or fsync failure.
    pub fn put_raft_meta(&self, key: &str, value: &[u8]) -> StorageResult<()> {
        self.raft_meta.insert(key, value)?;
        self.log_db.persist(PersistMode::SyncData)?;
        Ok(())
    }

    /// Every entry of `space` whose key starts with `prefix`.
    ///
    /// # Errors
    /// On a read failure.
    pub fn scan_prefix(
        &self,
        space: Space,
        prefix: &[u8],
    ) -> StorageResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let end = prefix_end(prefix);
        if end == [0] {
            return Ok(self
                .scan(space)?
                .into_iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .collect());
        }
        self.scan_range(space, prefix, &end)
    }

    /// This member's identity (member id, cluster id), fixed when its data dir was created.
    ///
    /// # Errors
    /// On a read failure or a corrupt record.
    pub fn identity(&self) -> StorageResult<Option<(u64, u64)>> {
        let Some(v) = self.get_raft_meta(IDENTITY_KEY)? else {
            return Ok(None);
        };
        let word = |r: std::ops::Range<usize>| {
            v.get(r)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_be_bytes)
        };
        match (word(0..8), word(8..16)) {
            (Some(member), Some(cluster)) => Ok(Some((member, cluster))),
            _ => Err(StorageError("corrupt member identity".into())),
        }
    }

    /// Records this member's identity, durably.
    ///
    /// # Errors
    /// On a write or fsync failure.
    pub fn save_identity(&self, member_id: u64, cluster_id: u64) -> StorageResult<()> {
        let mut v = member_id.to_be_bytes().to_vec();
        v.extend(cluster_id.to_be_bytes());
        self.put_raft_meta(IDENTITY_KEY, &v)
    }

    /// Reads a Raft metadata value.
    ///
    /// # Errors
    /// On a read failure.
    pub fn get_raft_meta(&self, key: &str) -> StorageResult<Option<Vec<u8>>> {
        Ok(self.raft_meta.get(key)?.map(|v| v.to_vec()))
    }

    /// Approximate bytes on disk, log and state together.
    pub fn disk_space(&self) -> u64 {
        self.db.disk_space().unwrap_or(0)
            + self.log_db.disk_space().unwrap_or(0)
            + self.wal.disk_space()
    }

    /// The size of the state (etcd's backend size, `Status.dbSize`, what the space quota
    /// counts): the state keyspaces' tables plus their memtables, journals aside. Like etcd's
    /// bbolt file it does not shrink when history is compacted, only after [`Self::defragment`].
    /// The `index` keyspace is left out, as etcd's key index, in memory, is: the quota counts
    /// the same data on both.
    pub fn state_size(&self) -> u64 {
        let tables: u64 = [&self.kv, &self.meta, &self.lease]
            .iter()
            .map(|ks| ks.disk_space())
            .sum();
        tables + self.db.write_buffer_size()
    }

    /// Reclaims the space of deleted and compacted entries (etcd's defragment): writes the
    /// memtables out and rewrites every state table, dropping what was removed.
    ///
    /// # Errors
    /// On an I/O failure.
    pub fn defragment(&self) -> StorageResult<()> {
        for ks in [&self.kv, &self.meta, &self.lease, &self.index] {
            ks.rotate_memtable_and_wait()?;
            ks.major_compact()?;
        }
        Ok(())
    }
}

fn decode_index(k: &[u8]) -> StorageResult<u64> {
    <[u8; 8]>::try_from(k)
        .map(u64::from_be_bytes)
        .map_err(|_| StorageError(format!("corrupt raft log key {k:?}")))
}

#[cfg(test)]
mod tests;
