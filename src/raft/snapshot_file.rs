//! The snapshot file: a Raft snapshot of the state as it lies on disk, travels between members
//! (in openraft's chunks) and is saved by `etcdctl snapshot save` (followed there by padding and
//! a SHA-256). Written from a [`View`] and read back as a stream of records, so memory never
//! depends on the state's size.
//!
//! Layout: [`MAGIC`], the bincode `SnapshotMeta`'s length (u32 BE) and bytes, then records
//! `[space: u8][key length: u32 BE][key][value length: u32 BE][value]`, then a 0 byte. Spaces:
//! 1 `kv`, 2 `lease`, 3 `meta` (the revision counters and the replicated `m/` keys only).

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::storage::{meta_key, Space, View};

/// The first bytes of every snapshot file (format 2; format 1 was one bincode blob).
pub const MAGIC: &[u8; 8] = b"CSNAP\0\0\x02";

/// openraft's snapshot metadata.
pub type Meta = openraft::SnapshotMeta<u64, openraft::BasicNode>;

/// Bytes buffered per read or write.
const BUFFER: usize = 1 << 20;

/// Bytes written between syncs while a snapshot file is written.
const SYNC_EVERY: usize = 8 << 20;

/// One record of a snapshot.
pub struct Record {
    /// The keyspace.
    pub space: Space,
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
}

/// The spaces a snapshot carries; a record's tag is its space's place here, plus one (0 ends
/// the records).
const SPACES: [Space; 3] = [Space::Kv, Space::Lease, Space::Meta];

fn space_tag(space: Space) -> u8 {
    SPACES
        .iter()
        .position(|s| *s == space)
        .map_or(0, |i| i as u8 + 1)
}

fn bad(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Whether a `meta` key travels in snapshots: the revision counters and what applied commands
/// wrote (members' attributes, removals, alarms, the auth store), not this member's own
/// bookkeeping (applied index, membership, format).
pub fn carried_meta(key: &[u8]) -> bool {
    key == meta_key::REVISION || key == meta_key::COMPACTED || key.starts_with(meta_key::REPLICATED)
}

/// Writes the snapshot of `view` described by `meta` to `file` from its current position.
/// Returns the bytes written.
///
/// # Errors
/// On an I/O or read failure, or once `cancel` is set.
pub fn write(file: &File, meta: &Meta, view: &View, cancel: &AtomicBool) -> io::Result<u64> {
    let mut out = Synced {
        out: BufWriter::with_capacity(BUFFER, file),
        unsynced: 0,
    };
    let written = encode(&mut out, meta, view, cancel)?;
    out.flush()?;
    Ok(written)
}

/// A file written through a buffer and synced every [`SYNC_EVERY`] bytes, though nothing needs
/// it on disk: gigabytes of dirty pages flushed at once would make the Raft log's own syncs, on
/// the same disk, wait behind them.
struct Synced<'a> {
    out: BufWriter<&'a File>,
    unsynced: usize,
}

impl Write for Synced<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.unsynced += n;
        if self.unsynced >= SYNC_EVERY {
            self.out.flush()?;
            self.out.get_ref().sync_data()?;
            self.unsynced = 0;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Writes the snapshot of `view` described by `meta` to `out`. Returns the bytes written.
///
/// # Errors
/// On an I/O or read failure, or once `cancel` is set.
pub fn encode<W: Write>(
    out: &mut W,
    meta: &Meta,
    view: &View,
    cancel: &AtomicBool,
) -> io::Result<u64> {
    let meta_bytes = bincode::serialize(meta).map_err(bad)?;
    out.write_all(MAGIC)?;
    write_len(out, meta_bytes.len())?;
    out.write_all(&meta_bytes)?;
    let mut written = (MAGIC.len() + 4 + meta_bytes.len()) as u64;
    let mut record = |out: &mut W, space: Space, k: &[u8], v: &[u8]| {
        if cancel.load(Ordering::Relaxed) {
            return Err(io::Error::other("snapshot no longer wanted"));
        }
        out.write_all(&[space_tag(space)])?;
        write_len(out, k.len())?;
        out.write_all(k)?;
        write_len(out, v.len())?;
        out.write_all(v)?;
        written += (9 + k.len() + v.len()) as u64;
        Ok::<(), io::Error>(())
    };
    for space in [Space::Kv, Space::Lease] {
        view.for_each(space, b"", |k, v| record(out, space, k, v))?;
    }
    for key in [meta_key::REVISION, meta_key::COMPACTED] {
        if let Some(v) = view.get(Space::Meta, key)? {
            record(out, Space::Meta, key, &v)?;
        }
    }
    view.for_each(Space::Meta, meta_key::REPLICATED, |k, v| {
        record(out, Space::Meta, k, v)
    })?;
    out.write_all(&[0])?;
    Ok(written + 1)
}

fn write_len(out: &mut impl Write, len: usize) -> io::Result<()> {
    let len = u32::try_from(len).map_err(|_| bad("a key or value longer than 4 GiB"))?;
    out.write_all(&len.to_be_bytes())
}

/// Reads a snapshot's records in order.
pub struct Reader<R: Read> {
    input: BufReader<R>,
    done: bool,
    /// Where the records begin: the header's length.
    records_start: u64,
    /// The offset in the input of the next byte to read.
    position: u64,
}

impl Reader<File> {
    /// Opens the snapshot file at `path`: its metadata and a reader of its records.
    ///
    /// # Errors
    /// On an I/O failure, or when the file is not a snapshot of this format.
    pub fn open(path: &Path) -> io::Result<(Meta, Self)> {
        Reader::new(File::open(path)?)
    }

    /// Gives the disk space of the records read so far back to the file system, as a hole:
    /// they read as zeros afterwards. The header is kept. Returns whether the file system could
    /// (not every one punches holes). The file must be open for writing.
    ///
    /// # Errors
    /// On an I/O failure other than the file system's not punching holes.
    pub fn release_read(&self) -> io::Result<bool> {
        use rustix::fs::FallocateFlags;
        const BLOCK: u64 = 4096;
        let from = self.records_start.div_ceil(BLOCK) * BLOCK;
        let to = self.position / BLOCK * BLOCK;
        if to <= from {
            return Ok(true);
        }
        match rustix::fs::fallocate(
            self.input.get_ref(),
            FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
            from,
            to - from,
        ) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::OPNOTSUPP) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

impl<R: Read + io::Seek> Reader<R> {
    /// Skips to `offset`, where a record begins (an offset [`Self::position`] returned for the
    /// same file).
    ///
    /// # Errors
    /// On an I/O failure, or an offset inside the header.
    pub fn skip_to(&mut self, offset: u64) -> io::Result<()> {
        if offset < self.records_start {
            return Err(bad(
                "corrupt install progress: an offset inside the snapshot's header",
            ));
        }
        io::Seek::seek(&mut self.input, io::SeekFrom::Start(offset))?;
        self.position = offset;
        self.done = false;
        Ok(())
    }
}

impl<R: Read> Reader<R> {
    /// Reads the header from `input`: the metadata, and a reader of the records after it.
    ///
    /// # Errors
    /// On an I/O failure, or when `input` is not a snapshot of this format.
    pub fn new(input: R) -> io::Result<(Meta, Self)> {
        let mut input = BufReader::with_capacity(BUFFER, input);
        let mut magic = [0u8; 8];
        input.read_exact(&mut magic)?;
        if &magic != MAGIC {
            return Err(bad(
                "not a snapshot of this Concord version (a file saved by an earlier build, or not a snapshot)",
            ));
        }
        let meta_bytes = read_bytes(&mut input)?;
        let meta: Meta = bincode::deserialize(&meta_bytes).map_err(bad)?;
        let records_start = (MAGIC.len() + 4 + meta_bytes.len()) as u64;
        Ok((
            meta,
            Reader {
                input,
                done: false,
                records_start,
                position: records_start,
            },
        ))
    }

    /// The offset in the input of the next record (or of the end byte): where a reader of the
    /// same file [`Reader::skip_to`]s to read on from here.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The next record, or `None` after the last.
    ///
    /// # Errors
    /// On an I/O failure or a truncated or corrupt file.
    pub fn next_record(&mut self) -> io::Result<Option<Record>> {
        if self.done {
            return Ok(None);
        }
        let mut tag = [0u8; 1];
        self.input.read_exact(&mut tag)?;
        if tag[0] == 0 {
            self.done = true;
            self.position += 1;
            return Ok(None);
        }
        let space = *SPACES
            .get(usize::from(tag[0]) - 1)
            .ok_or_else(|| bad(format!("corrupt snapshot: record type {}", tag[0])))?;
        let key = read_bytes(&mut self.input)?;
        let value = read_bytes(&mut self.input)?;
        if space == Space::Meta && !carried_meta(&key) {
            return Err(bad("corrupt snapshot: an unexpected meta key"));
        }
        self.position += (9 + key.len() + value.len()) as u64;
        Ok(Some(Record { space, key, value }))
    }
}

fn read_bytes(input: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    input.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    let mut bytes = Vec::new();
    // `take` + `read_to_end`, not a buffer of the claimed size: a corrupt length cannot make
    // this allocate more than the file holds.
    input.take(len as u64).read_to_end(&mut bytes)?;
    if bytes.len() != len {
        return Err(bad("truncated snapshot"));
    }
    Ok(bytes)
}

/// The metadata of the snapshot file at `path`.
///
/// # Errors
/// As [`Reader::open`].
pub fn read_meta(path: &Path) -> io::Result<Meta> {
    Reader::open(path).map(|(meta, _)| meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Storage;

    #[test]
    fn a_snapshot_carries_the_state_and_not_the_members_bookkeeping() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let s = Storage::open(&dir.path().join("data"))?;
        let mut b = s.batch();
        b.insert(Space::Kv, b"k1", b"v1");
        b.insert(Space::Kv, b"k2", &vec![7u8; 100_000]);
        b.insert(Space::Lease, b"l", b"ttl");
        b.insert(Space::Meta, meta_key::REVISION, b"rev");
        b.insert(Space::Meta, meta_key::APPLIED, b"own");
        b.insert(Space::Meta, b"m/alarm/x", b"");
        b.commit()?;
        let meta = Meta::default();
        let path = dir.path().join("snap");
        let size = write(
            &File::create(&path)?,
            &meta,
            &s.view(),
            &AtomicBool::new(false),
        )?;
        assert_eq!(size, std::fs::metadata(&path)?.len());
        let (read, mut reader) = Reader::open(&path)?;
        assert_eq!(read, meta);
        let mut records = Vec::new();
        while let Some(r) = reader.next_record()? {
            records.push((space_tag(r.space), r.key, r.value.len()));
        }
        assert_eq!(
            records,
            vec![
                (1, b"k1".to_vec(), 2),
                (1, b"k2".to_vec(), 100_000),
                (2, b"l".to_vec(), 3),
                (3, meta_key::REVISION.to_vec(), 3),
                (3, b"m/alarm/x".to_vec(), 0),
            ]
        );
        Ok(())
    }

    #[test]
    fn truncated_or_foreign_files_are_refused() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let s = Storage::open(&dir.path().join("data"))?;
        let mut b = s.batch();
        b.insert(Space::Kv, b"key", b"value");
        b.commit()?;
        let path = dir.path().join("snap");
        let cancel = AtomicBool::new(false);
        write(&File::create(&path)?, &Meta::default(), &s.view(), &cancel)?;
        let bytes = std::fs::read(&path)?;
        for cut in [3, bytes.len() - 4, bytes.len() - 1] {
            let r = Reader::new(&bytes[..cut]).and_then(|(_, mut r)| {
                while r.next_record()?.is_some() {}
                Ok(())
            });
            assert!(r.is_err(), "cut at {cut} of {}", bytes.len());
        }
        assert!(Reader::new(&b"{\"not\":\"a snapshot\"}"[..]).is_err());
        Ok(())
    }
}
