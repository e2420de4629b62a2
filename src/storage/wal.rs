//! [`Wal`]: the Raft log as append-only segment files, as etcd keeps its WAL. Each entry is
//! written once, where an LSM tree wrote it to its journal and again to its tables when its
//! memtable was flushed (and large values, 100 KiB say, dominate what a member writes).
//!
//! - `wal/<first index, 16 hex digits>-<salt, 16 hex digits>.seg`: the entries from that index
//!   on, each a record `[payload length: u32 LE][CRC-32C of salt, index and payload: u32 LE]
//!   [index: u64 LE][payload]`, indexes consecutive within a segment. The salt is random, new
//!   with every segment and never written inside a file, so no bytes a file held before it
//!   took this name (a reused file's old records, values written to them by clients) can pass
//!   for one of its records. Segments named `<first index>.seg` (written before salts) are
//!   read with the checksum over index and payload alone. The last segment takes appends; past
//!   [`SEGMENT_BYTES`] it is synced and a new one begins. An append after a gap (the log was
//!   purged past its end to a snapshot) begins a new segment too.
//! - Appends are readable at once and durable after [`Wal::sync`] (the caller groups many
//!   appends under one sync). A truncation is synced before it returns. A purge removes whole
//!   segments: a few are renamed into a pool of files that new segments are written over
//!   ([`recycle`]), the rest deleted, their names first, synced, and then their blocks, a step
//!   at a time, so a crash brings back whole segments or none; what it brings back lies below
//!   the purged index, which the log store records durably and never reads below.
//! - Opening reads every record header (not the payloads) to index the segments; the last
//!   segment is read whole and cut after its last intact record (a write torn by a crash was
//!   never reported durable). Payloads of other segments are checked when they are read.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

mod purge;
mod recycle;

/// A segment's size past which the next append begins a new one.
const SEGMENT_BYTES: u64 = 64 << 20;
const HEADER: usize = 16;
const SUFFIX: &str = ".seg";

/// One segment file: entries `first..first + offsets.len()`.
struct Segment {
    file: Arc<File>,
    path: PathBuf,
    first: u64,
    /// The salt in its name (0 for a segment named without one).
    salt: u64,
    /// Where each entry's record begins.
    offsets: Vec<u64>,
    /// Bytes of whole records (where the next one goes).
    len: u64,
    /// A recycled file's length and block size while its old bytes lie past the records (so
    /// the length is above `len`): an append ending inside them is padded to the end of its
    /// block, since writing part of an uncached block makes the kernel read the block first (a
    /// disk read on every append, behind whatever reads the disk is serving).
    old: Option<(u64, u64)>,
}

impl Segment {
    /// The file's length on disk, old bytes included.
    fn file_len(&self) -> u64 {
        self.old.map_or(self.len, |(old_len, _)| old_len)
    }

    /// The index after the last entry.
    fn end(&self) -> u64 {
        self.first.saturating_add(self.offsets.len() as u64)
    }

    /// Where entry `index`'s record lies: (offset, length).
    fn span(&self, index: u64) -> Option<(u64, u64)> {
        let i = usize::try_from(index.checked_sub(self.first)?).ok()?;
        let start = *self.offsets.get(i)?;
        let end = self.offsets.get(i + 1).copied().unwrap_or(self.len);
        Some((start, end - start))
    }
}

struct Inner {
    /// By first index.
    segments: BTreeMap<u64, Segment>,
    /// A segment was created or removed since the directory was last synced.
    dir_changed: bool,
    /// Counts truncations: a sync that began before one does not vouch for what it cut.
    truncations: u64,
    /// Purged segments kept to be written over as new ones.
    pool: recycle::Pool,
}

impl Inner {
    /// The segments that may hold entries with `from <= index < to`, in order.
    fn holding(&self, from: u64, to: u64) -> impl Iterator<Item = &Segment> {
        let start = self
            .segments
            .range(..=from)
            .next_back()
            .map_or(from, |(k, _)| *k);
        self.segments.range(start..to).map(|(_, s)| s)
    }
}

/// The Raft log's segment files in one directory.
pub struct Wal {
    dir: PathBuf,
    /// [`SEGMENT_BYTES`], smaller in tests.
    segment_bytes: u64,
    inner: Mutex<Inner>,
    /// Held shared by a read for its whole length (it reads outside `inner`), and exclusively
    /// by a truncation: a read never sees a record cut or rewritten under it.
    truncating: std::sync::RwLock<()>,
    /// Every entry below this index is synced (see [`Wal::synced_end`]).
    synced_end: std::sync::atomic::AtomicU64,
}

fn corrupt(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// A record's checksum in a segment named with `salt` (0: named without one).
fn checksum(salt: u64, index: u64, payload: &[u8]) -> u32 {
    let seed = if salt == 0 {
        crc32c::crc32c(&index.to_le_bytes())
    } else {
        crc32c::crc32c_append(crc32c::crc32c(&salt.to_le_bytes()), &index.to_le_bytes())
    };
    crc32c::crc32c_append(seed, payload)
}

fn segment_path(dir: &Path, first: u64, salt: u64) -> PathBuf {
    if salt == 0 {
        dir.join(format!("{first:016x}{SUFFIX}"))
    } else {
        dir.join(format!("{first:016x}-{salt:016x}{SUFFIX}"))
    }
}

/// A new segment's salt: random, never 0.
fn new_salt() -> u64 {
    rand::random::<u64>() | 1
}

/// The first index and salt a segment's file name gives, if it names a segment.
/// Exactly as [`segment_path`] spells them: 16 lowercase hex digits, then `-` and 16 more for a
/// salt that is not 0, or nothing.
fn parse_segment_name(name: &str) -> Option<io::Result<(u64, u64)>> {
    let stem = name.strip_suffix(SUFFIX)?;
    let hex = |h: &str| {
        (h.len() == 16
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .then(|| u64::from_str_radix(h, 16).ok())
        .flatten()
    };
    let parsed = match stem.split_once('-') {
        None => hex(stem).map(|first| (first, 0)),
        Some((first, salt)) => hex(first).zip(hex(salt)).filter(|(_, salt)| *salt != 0),
    };
    Some(parsed.ok_or_else(|| corrupt(format!("unexpected file {name} in the Raft log"))))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A record header: (payload length, checksum, index).
fn parse_header(h: &[u8; HEADER]) -> (u64, u32, u64) {
    let word = |r: std::ops::Range<usize>| {
        let mut b = [0u8; 8];
        b[..r.len()].copy_from_slice(&h[r]);
        u64::from_le_bytes(b)
    };
    (word(0..4), word(4..8) as u32, word(8..16))
}

impl Wal {
    /// Opens (or creates) the log in `dir`, indexing its segments and cutting a torn tail.
    ///
    /// # Errors
    /// On an I/O failure, or a segment that is corrupt other than at the log's very end.
    pub fn open(dir: &Path) -> io::Result<Wal> {
        Self::open_with(dir, SEGMENT_BYTES)
    }

    fn open_with(dir: &Path, segment_bytes: u64) -> io::Result<Wal> {
        if !dir.exists() {
            std::fs::create_dir_all(dir)?;
            if let Some(parent) = dir.parent() {
                sync_dir(parent)?;
            }
        }
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if let Some(parsed) = parse_segment_name(&name) {
                names.push(parsed?);
            }
        }
        names.sort_unstable();
        if names.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(corrupt("two Raft log segments begin at one index".into()));
        }
        let mut segments = BTreeMap::new();
        let count = names.len();
        let mut removed_empty = false;
        for (n, (first, salt)) in names.into_iter().enumerate() {
            let segment = Self::index_segment(dir, first, salt, n + 1 == count)?;
            if segment.offsets.is_empty() {
                // Created and never written (a crash right after a roll): nothing to keep, and
                // it would stand in the way of appends below its index.
                std::fs::remove_file(&segment.path)?;
                removed_empty = true;
                continue;
            }
            if let Some((_, before)) = segments.last_key_value() {
                let before: &Segment = before;
                if before.end() > first {
                    return Err(corrupt(format!(
                        "Raft log segments overlap at index {first}"
                    )));
                }
            }
            segments.insert(first, segment);
        }
        if removed_empty {
            sync_dir(dir)?;
        }
        let pool = recycle::Pool::open(dir)?;
        Ok(Wal {
            dir: dir.to_path_buf(),
            segment_bytes,
            truncating: std::sync::RwLock::new(()),
            // What a start finds was not necessarily synced: the first sync vouches for it.
            synced_end: std::sync::atomic::AtomicU64::new(0),
            inner: Mutex::new(Inner {
                segments,
                dir_changed: false,
                truncations: 0,
                pool,
            }),
        })
    }

    /// Reads segment `first`'s record headers; the `last` segment's records whole, cut after
    /// the last intact one.
    fn index_segment(dir: &Path, first: u64, salt: u64, last: bool) -> io::Result<Segment> {
        let path = segment_path(dir, first, salt);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)?;
        let size = file.metadata()?.len();
        let mut reader = BufReader::with_capacity(256 << 10, &file);
        let (mut offsets, mut at) = (Vec::new(), 0u64);
        let mut payload = Vec::new();
        // Whether the file begins with a record from before its name (an index below `first`).
        let mut starts_stale = false;
        // Where the records stop: what is there, and whether it is a write of ours a crash tore
        // (a header cut short, or the next index's record) rather than other bytes (a recycled
        // file's old records, or a header the crash tore too).
        let torn = loop {
            if at == size {
                break None;
            }
            let mut h = [0u8; HEADER];
            if size - at < HEADER as u64 || reader.read_exact(&mut h).is_err() {
                break Some(("a torn record header", true));
            }
            let (len, sum, index) = parse_header(&h);
            // A segment's indexes must stay below u64::MAX (a damaged name could say otherwise).
            let expected = first.checked_add(offsets.len() as u64 + 1).map(|e| e - 1);
            if expected != Some(index) {
                starts_stale = at == 0 && index < first;
                break Some(("a record out of place", false));
            }
            if size - at - (HEADER as u64) < len {
                break Some(("a record cut short", true));
            }
            if last {
                payload.resize(len as usize, 0);
                if reader.read_exact(&mut payload).is_err()
                    || checksum(salt, index, &payload) != sum
                {
                    break Some(("a record whose checksum does not match", true));
                }
            } else {
                reader.seek_relative(len as i64)?;
            }
            offsets.push(at);
            at += HEADER as u64 + len;
        };
        drop(reader);
        if let Some((what, ours)) = torn {
            if last {
                if ours {
                    tracing::warn!(path = %path.display(), offset = at, "cutting a torn Raft log tail: {what}");
                } else {
                    tracing::info!(path = %path.display(), offset = at, "the last Raft log segment's records end here; cutting the bytes after them (a recycled file's old records or padding, or a write a crash tore)");
                }
                file.set_len(at)?;
                file.sync_data()?;
            } else if !starts_stale {
                return Err(corrupt(format!(
                    "Raft log segment {} has {what} at offset {at}",
                    path.display()
                )));
            }
            // Otherwise a reused file renamed as a segment that no record reached (its old
            // records from the start), behind a later one a crash brought back too: returned
            // empty, for the caller to remove.
        }
        Ok(Segment {
            file: Arc::new(file),
            path,
            first,
            salt,
            offsets,
            len: at,
            old: None,
        })
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends `(index, payload)` entries in order: each must follow the log's last entry, or
    /// leave a gap after it (never overwrite: truncate first). Readable at once, durable after
    /// the next [`Wal::sync`].
    ///
    /// # Errors
    /// On an I/O failure or an index at or below the log's end.
    pub fn append(&self, entries: &[(u64, Vec<u8>)]) -> io::Result<()> {
        let mut inner = self.inner();
        let mut i = 0;
        while i < entries.len() {
            let first = entries[i].0;
            // A segment named without a salt (format 3) takes no more records: its file may have
            // been reused with old bytes no salt sets apart.
            let fits = inner.segments.last_key_value().and_then(|(_, s)| {
                (s.end() == first && s.len < self.segment_bytes && s.salt != 0).then_some(s.first)
            });
            let key = match fits {
                Some(key) => key,
                None => self.begin_segment(&mut inner, first)?,
            };
            let segment = inner
                .segments
                .get_mut(&key)
                .ok_or_else(|| io::Error::other("Raft log segment vanished"))?;
            // Up to the segment's limit, as one write.
            let mut buf = Vec::new();
            let mut offsets = Vec::new();
            while let Some((index, payload)) = entries.get(i) {
                if *index != segment.end() + offsets.len() as u64
                    || (!offsets.is_empty() && segment.len + buf.len() as u64 >= self.segment_bytes)
                {
                    break;
                }
                let len = u32::try_from(payload.len())
                    .map_err(|_| io::Error::other("Raft log entry over 4 GiB"))?;
                offsets.push(segment.len + buf.len() as u64);
                buf.extend_from_slice(&len.to_le_bytes());
                buf.extend_from_slice(&checksum(segment.salt, *index, payload).to_le_bytes());
                buf.extend_from_slice(&index.to_le_bytes());
                buf.extend_from_slice(payload);
                i += 1;
            }
            let end = segment.len + buf.len() as u64;
            if let Some((old_len, block)) = segment.old {
                if end < old_len {
                    let padded = end.next_multiple_of(block).min(old_len);
                    buf.resize(buf.len() + (padded - end) as usize, 0);
                } else {
                    segment.old = None;
                }
            }
            segment.file.write_all_at(&buf, segment.len)?;
            segment.len = end;
            segment.offsets.extend(offsets);
        }
        Ok(())
    }

    /// Starts a segment at `first` after the last one, which is synced first (so only the last
    /// segment can ever hold unsynced records). Returns its key.
    fn begin_segment(&self, inner: &mut Inner, first: u64) -> io::Result<u64> {
        let empty = inner
            .segments
            .last_key_value()
            .filter(|(_, s)| s.offsets.is_empty())
            .map(|(k, _)| *k);
        if let Some(key) = empty {
            // Created and never written: nothing to keep.
            if let Some(s) = inner.segments.remove(&key) {
                std::fs::remove_file(&s.path)?;
            }
        }
        if let Some((_, last)) = inner.segments.iter_mut().next_back() {
            if first < last.end() {
                return Err(io::Error::other(format!(
                    "Raft log append at {first} would overwrite up to {}",
                    last.end()
                )));
            }
            // A recycled file's old records past the new ones go (or a failed write's bytes):
            // only the last segment may end in bytes that are not records.
            if last.file.metadata()?.len() > last.len {
                last.file.set_len(last.len)?;
            }
            last.old = None;
            last.file.sync_data()?;
        }
        let salt = new_salt();
        let path = segment_path(&self.dir, first, salt);
        let recycled = match inner.pool.take(first) {
            Some(free) => match std::fs::rename(&free, &path) {
                // Durable before anything is written over the old records: a crash must never
                // bring the file back under its pool name holding indexes past that name's end.
                Ok(()) => {
                    sync_dir(&self.dir)?;
                    true
                }
                Err(e) => {
                    tracing::warn!(path = %free.display(), error = %e, "reusing a purged Raft log segment");
                    false
                }
            },
            None => false,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(!recycled)
            .open(&path)?;
        let old = if recycled {
            use std::os::unix::fs::MetadataExt;
            let meta = file.metadata()?;
            // Padding beyond 64 KiB would cost more than the read it saves (some network file
            // systems report blocks of megabytes).
            Some((meta.len(), meta.blksize().clamp(512, 64 << 10)))
        } else {
            None
        };
        inner.segments.insert(
            first,
            Segment {
                file: Arc::new(file),
                path,
                first,
                salt,
                offsets: Vec::new(),
                len: 0,
                old,
            },
        );
        inner.dir_changed = true;
        Ok(first)
    }

    /// Makes every append so far durable: the last segment's data, and the directory if
    /// segments came or went.
    ///
    /// # Errors
    /// On an fsync failure.
    pub fn sync(&self) -> io::Result<()> {
        let (file, dir_changed, end, truncations) = {
            let mut inner = self.inner();
            let last = inner.segments.last_key_value().map(|(_, s)| s);
            let (file, end) = (last.map(|s| s.file.clone()), last.map_or(0, Segment::end));
            let dir_changed = std::mem::take(&mut inner.dir_changed);
            (file, dir_changed, end, inner.truncations)
        };
        if let Some(file) = file {
            file.sync_data()?;
        }
        if dir_changed {
            if let Err(e) = sync_dir(&self.dir) {
                self.inner().dir_changed = true;
                return Err(e);
            }
        }
        let inner = self.inner();
        if inner.truncations == truncations {
            self.synced_end
                .fetch_max(end, std::sync::atomic::Ordering::AcqRel);
        }
        Ok(())
    }

    /// Every entry below this index has been synced by [`Wal::sync`] since the log was opened
    /// (and not truncated since): a crash of the machine cannot take it away.
    pub fn synced_end(&self) -> u64 {
        self.synced_end.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The length of each record with `from <= index < to` that the log holds, by index: what
    /// a read of them would take, without reading them.
    pub fn record_lens(&self, from: u64, to: u64) -> Vec<(u64, u64)> {
        let inner = self.inner();
        let mut lens = Vec::new();
        for s in inner.holding(from, to) {
            for index in from.max(s.first)..to.min(s.end()) {
                if let Some((_, len)) = s.span(index) {
                    lens.push((index, len));
                }
            }
        }
        lens
    }

    /// The entries with `from <= index < to` that the log holds, in order.
    ///
    /// # Errors
    /// On a read failure or a corrupt record.
    pub fn read(&self, from: u64, to: u64) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let _no_truncation = self.truncating.read().unwrap_or_else(|p| p.into_inner());
        // Where each lies, taken under the lock; read outside it.
        let mut spans = Vec::new();
        {
            let inner = self.inner();
            for s in inner.holding(from, to) {
                let (lo, hi) = (from.max(s.first), to.min(s.end()));
                if lo >= hi {
                    continue;
                }
                let (begin, _) = s.span(lo).ok_or_else(|| io::Error::other("index"))?;
                let (last_start, last_len) =
                    s.span(hi - 1).ok_or_else(|| io::Error::other("index"))?;
                spans.push((s.file.clone(), s.salt, lo, begin, last_start + last_len));
            }
        }
        let mut out = Vec::new();
        for (file, salt, mut index, begin, end) in spans {
            let mut bytes = vec![0u8; usize::try_from(end - begin).map_err(io::Error::other)?];
            file.read_exact_at(&mut bytes, begin)?;
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let h: &[u8; HEADER] = rest
                    .get(..HEADER)
                    .and_then(|h| h.try_into().ok())
                    .ok_or_else(|| corrupt(format!("Raft log entry {index} cut short")))?;
                let (len, sum, found) = parse_header(h);
                let payload = rest
                    .get(HEADER..HEADER + len as usize)
                    .ok_or_else(|| corrupt(format!("Raft log entry {index} cut short")))?;
                if found != index || checksum(salt, index, payload) != sum {
                    return Err(corrupt(format!("Raft log entry {index} is corrupt")));
                }
                out.push((index, payload.to_vec()));
                rest = &rest[HEADER + len as usize..];
                index += 1;
            }
        }
        Ok(out)
    }

    /// The last entry, if the log holds any.
    ///
    /// # Errors
    /// On a read failure or a corrupt record.
    pub fn last(&self) -> io::Result<Option<(u64, Vec<u8>)>> {
        let end = {
            let inner = self.inner();
            let last = inner
                .segments
                .values()
                .rev()
                .find(|s| !s.offsets.is_empty());
            match last {
                Some(s) => s.end(),
                None => return Ok(None),
            }
        };
        Ok(self.read(end - 1, end)?.pop())
    }

    /// Removes every entry at or above `from`, durably.
    ///
    /// # Errors
    /// On an I/O failure.
    pub fn truncate(&self, from: u64) -> io::Result<()> {
        // Waits out the reads under way; later ones wait for the cut (lock order: this, then
        // `inner`, as in a read).
        let _no_reads = self.truncating.write().unwrap_or_else(|p| p.into_inner());
        let mut inner = self.inner();
        inner.truncations += 1;
        self.synced_end
            .fetch_min(from, std::sync::atomic::Ordering::AcqRel);
        inner.pool.forget_from(from)?;
        // Newest first: a crash part way leaves a shorter log, never one with a hole.
        let doomed: Vec<u64> = inner
            .segments
            .range(from..)
            .map(|(k, _)| *k)
            .rev()
            .collect();
        for key in doomed {
            // Out of the map only once its file is gone: a file left behind on an error must
            // not sit beside a new segment at the same index.
            if let Some(s) = inner.segments.get(&key) {
                std::fs::remove_file(&s.path)?;
                inner.segments.remove(&key);
            }
        }
        if let Some((_, s)) = inner.segments.range_mut(..from).next_back() {
            if let Some((cut, _)) = s.span(from) {
                s.file.set_len(cut)?;
                s.file.sync_data()?;
                s.len = cut;
                s.old = None;
                s.offsets.truncate((from - s.first) as usize);
            }
        }
        sync_dir(&self.dir)?;
        inner.dir_changed = false;
        Ok(())
    }

    /// Whether the log holds no entry.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.inner().segments.values().all(|s| s.offsets.is_empty())
    }

    /// The first index of the log's contiguous end, if an earlier part lies before a gap (the
    /// log resumed after a snapshot past its end, and the purge of what came before has not
    /// happened yet).
    pub fn after_gap(&self) -> Option<u64> {
        let inner = self.inner();
        let mut segments = inner.segments.values().rev();
        let mut start = segments.next()?.first;
        for s in segments {
            if s.end() != start {
                return Some(start);
            }
            start = s.first;
        }
        None
    }

    /// Bytes of the segment files and of the pooled ones waiting to be reused.
    pub fn disk_space(&self) -> u64 {
        let inner = self.inner();
        inner.segments.values().map(Segment::file_len).sum::<u64>() + inner.pool.bytes()
    }

    /// Deletes every segment, durably (a new log begins; used when an older data dir's log is
    /// moved here).
    ///
    /// # Errors
    /// On an I/O failure.
    pub fn clear(&self) -> io::Result<()> {
        self.truncate(0)
    }
}

#[cfg(test)]
mod tests;
