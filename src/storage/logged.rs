//! Large values the state journal does not repeat: the Raft log already holds them.
//!
//! A put's value reaches the disk in the Raft log (`wal/`), then in the state database's
//! journal when the put is applied, then in a blob file when the memtable is flushed. etcd
//! writes it twice (its WAL and bbolt). For a record whose value the log entry holds, the
//! state journal records a [`reference`] instead: the record with the value cut out, and where
//! the value lies in the log entry (its index, its distance from the end of the entry's bytes,
//! its length and CRC-32C). The memtable holds the whole record as before. If the member stops
//! before the memtable is flushed, fjall replays the journal at the next open and hands each
//! reference to [`resolver`], which reads the value back from the log.
//!
//! So the log must keep an entry while a reference to it may still be replayed: until the
//! memtable that holds its record is flushed (fjall then skips the journal's items, which its
//! tables hold). [`Logged`] counts which references a flush has covered; the log store purges
//! nothing past them, and [`super::Storage::flush_logged`] (before a snapshot is taken, or
//! installed) covers them all.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::wal::Wal;

/// Values of at least this many bytes are journaled as references when the log entry holds
/// them (the same bound as the blob files': a smaller value costs the journal little more than
/// its reference would).
pub const LOGGED_VALUE_BYTES: usize = super::SEPARATED_VALUE_BYTES as usize;

/// The first byte of a reference. The keyspace that holds references (`kv`) tags its own
/// values with other bytes (`mvcc::records`).
pub const REFERENCE_TAG: u8 = b'w';

/// Fixed part of a reference: tag, index (8), distance from the end (4), length (4),
/// CRC-32C (4), where the value goes in the record (4).
const HEADER: usize = 1 + 8 + 4 + 4 + 4 + 4;

/// Where a value lies in the Raft log: the entry at `index`, `from_end` bytes before the end
/// of its bytes as stored, `len` bytes long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogSpan {
    /// The log entry's index.
    pub index: u64,
    /// How far before the end of the entry's stored bytes the value starts.
    pub from_end: u32,
}

/// The journal's stand-in for `record`, whose bytes `at..at + len` the log holds at `span`.
/// `None` when the record or the span is too short for them.
pub fn reference(record: &[u8], at: usize, len: usize, span: LogSpan) -> Option<Vec<u8>> {
    let end = at.checked_add(len)?;
    let value = record.get(at..end)?;
    if (span.from_end as usize) < len {
        return None;
    }
    let mut out = Vec::with_capacity(HEADER + record.len() - value.len());
    out.push(REFERENCE_TAG);
    out.extend_from_slice(&span.index.to_le_bytes());
    out.extend_from_slice(&span.from_end.to_le_bytes());
    out.extend_from_slice(&u32::try_from(value.len()).ok()?.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(value).to_le_bytes());
    out.extend_from_slice(&u32::try_from(at).ok()?.to_le_bytes());
    out.extend_from_slice(&record[..at]);
    out.extend_from_slice(&record[end..]);
    Some(out)
}

/// A reference's fields, and the record around the value (before and after it).
struct Parsed<'a> {
    index: u64,
    from_end: usize,
    len: usize,
    crc: u32,
    head: &'a [u8],
    tail: &'a [u8],
}

fn parse(reference: &[u8]) -> Option<Parsed<'_>> {
    let word = |at: usize| {
        reference
            .get(at..at + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_le_bytes)
    };
    let index = reference
        .get(1..9)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)?;
    let rest = reference.get(HEADER..)?;
    let at = word(21)? as usize;
    Some(Parsed {
        index,
        from_end: word(9)? as usize,
        len: word(13)? as usize,
        crc: word(17)?,
        head: rest.get(..at)?,
        tail: rest.get(at..)?,
    })
}

/// The record a reference stands for, its value read from `entry` (the log entry's stored
/// bytes). An error names what does not match.
fn rebuild(reference: &[u8], entry: &[u8]) -> Result<Vec<u8>, String> {
    let p = parse(reference).ok_or("a malformed log reference in the state journal")?;
    let start = entry
        .len()
        .checked_sub(p.from_end)
        .ok_or_else(|| format!("log entry {} is shorter than its reference", p.index))?;
    let value = entry
        .get(start..start + p.len)
        .ok_or_else(|| format!("log entry {} is shorter than its reference", p.index))?;
    if crc32c::crc32c(value) != p.crc {
        return Err(format!(
            "log entry {} does not hold the value its reference names",
            p.index
        ));
    }
    let mut record = Vec::with_capacity(p.head.len() + value.len() + p.tail.len());
    record.extend_from_slice(p.head);
    record.extend_from_slice(value);
    record.extend_from_slice(p.tail);
    Ok(record)
}

/// Which log references are in memtables not flushed yet.
#[derive(Debug, Default)]
pub struct Logged {
    /// The highest log index a committed reference names (applies commit in log order, so
    /// every reference at or below it is committed once this is read).
    written: AtomicU64,
    /// Every reference at or below this index is in a flushed table.
    flushed: AtomicU64,
}

impl Logged {
    /// Notes that references up to log index `upto` were committed.
    pub fn wrote(&self, upto: u64) {
        self.written.fetch_max(upto, Ordering::AcqRel);
    }

    /// The highest index a committed reference names, read before a flush.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// Notes that a flush begun after [`Logged::written`] returned `upto` has finished.
    pub fn flushed(&self, upto: u64) {
        self.flushed.fetch_max(upto, Ordering::AcqRel);
    }

    /// Whether the log entries up to `index` may go: no reference to one of them can be
    /// replayed from the journal any more.
    pub fn covers(&self, index: u64) -> bool {
        let flushed = self.flushed.load(Ordering::Acquire);
        index <= flushed || self.written() <= flushed
    }
}

/// fjall's journal value resolver for the state database: turns the references of the `kv`
/// keyspace back into records, reading the log; leaves every other value as it is. Notes the
/// references it resolved in `logged` (they are in memtables again, not flushed).
pub fn resolver(wal: Arc<Wal>, logged: Arc<Logged>) -> fjall::JournalValueResolver {
    Arc::new(move |keyspace, _key, value| {
        if keyspace != "kv" || value.first() != Some(&REFERENCE_TAG) {
            return Ok(value);
        }
        let index = parse(&value)
            .ok_or("a malformed log reference in the state journal")?
            .index;
        let entries = wal
            .read(index, index.saturating_add(1))
            .map_err(|e| format!("reading log entry {index} for the state journal: {e}"))?;
        let Some((_, entry)) = entries.into_iter().find(|(i, _)| *i == index) else {
            return Err(format!(
                "the state journal names log entry {index}, which the log no longer holds"
            ));
        };
        let record = rebuild(&value, &entry)?;
        logged.wrote(index);
        Ok(record.into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry_with(value: &[u8], after: &[u8]) -> Vec<u8> {
        let mut entry = b"entry header".to_vec();
        entry.extend_from_slice(value);
        entry.extend_from_slice(after);
        entry
    }

    #[test]
    fn a_reference_rebuilds_its_record_from_the_entry() {
        let value = vec![7u8; 5000];
        let record = [b"head".as_slice(), &value, b"tail"].concat();
        let entry = entry_with(&value, b"rest of the entry");
        let span = LogSpan {
            index: 42,
            from_end: (value.len() + b"rest of the entry".len()) as u32,
        };
        let r = reference(&record, 4, value.len(), span).unwrap_or_default();
        assert!(r.len() < 64, "a reference is small: {}", r.len());
        assert_eq!(rebuild(&r, &entry), Ok(record));
        // Another entry's bytes at that place are refused, not taken for the value.
        let other = entry_with(&vec![8u8; 5000], b"rest of the entry");
        assert!(rebuild(&r, &other).is_err());
        assert!(rebuild(&r, b"short").is_err());
    }

    #[test]
    fn no_reference_when_the_record_or_the_span_is_too_short() {
        let record = [b"head".as_slice(), &[7u8; 100]].concat();
        let span = LogSpan {
            index: 1,
            from_end: 100,
        };
        assert!(reference(&record, 5, 100, span).is_none());
        assert!(reference(&record, 4, 100, span).is_some());
        let short = LogSpan {
            index: 1,
            from_end: 99,
        };
        assert!(reference(&record, 4, 100, short).is_none());
    }

    #[test]
    fn flushed_references_let_their_entries_go() {
        let l = Logged::default();
        assert!(l.covers(10), "nothing written: everything may go");
        l.wrote(5);
        assert!(!l.covers(5));
        assert!(
            !l.covers(3),
            "entry 5's reference is not flushed, 3's may not be either"
        );
        let before = l.written();
        l.wrote(9);
        l.flushed(before);
        assert!(l.covers(5));
        assert!(!l.covers(9));
        l.flushed(l.written());
        assert!(l.covers(100));
    }
}
