//! [`ValueSource`]: the Raft log entry being applied, where the values of its puts are found,
//! so that the state journal can refer to them instead of repeating them
//! (`storage::logged`).

use crate::storage::logged::{LogSpan, LOGGED_VALUE_BYTES};

/// The bytes of the log entry being applied (its command, which the entry's stored bytes end
/// with) and its index.
pub struct ValueSource {
    index: u64,
    bytes: bytes::Bytes,
    /// Where the next value is looked for first: values come in the command's order.
    cursor: usize,
}

impl ValueSource {
    /// The entry at `index`, whose stored bytes end with `bytes`.
    pub fn new(index: u64, bytes: bytes::Bytes) -> Self {
        ValueSource {
            index,
            bytes,
            cursor: 0,
        }
    }

    /// Where `value` lies in the entry, if it is large enough to be worth a reference and the
    /// entry holds it. Any place holding the same bytes will do.
    pub fn locate(&mut self, value: &[u8]) -> Option<LogSpan> {
        if value.len() < LOGGED_VALUE_BYTES {
            return None;
        }
        let at = self
            .find_from(self.cursor, value)
            .or_else(|| self.find_from(0, value))?;
        self.cursor = at + value.len();
        Some(LogSpan {
            index: self.index,
            from_end: u32::try_from(self.bytes.len() - at).ok()?,
        })
    }

    /// Where `value` lies at or after `from`: its first bytes are looked for, and the places
    /// they start are compared whole, [`CANDIDATES`] at most. (A search for the whole value
    /// spent more on preparing its searcher than the journal write it saved.)
    fn find_from(&self, from: usize, value: &[u8]) -> Option<usize> {
        let hay = self.bytes.get(from..)?;
        let head = value.get(..PREFIX.min(value.len()))?;
        memchr::memmem::find_iter(hay, head)
            .take(CANDIDATES)
            .find(|&i| hay.get(i..i + value.len()) == Some(value))
            .map(|i| from + i)
    }
}

/// How many of a value's first bytes are searched for.
const PREFIX: usize = 32;

/// How many places holding those bytes are compared with the whole value before giving up (a
/// value of repeated bytes matches its first bytes almost anywhere).
const CANDIDATES: usize = 8;

/// Where a put's value starts in its encoded record (a tag byte, then the `KeyValue` in field
/// order, the value followed only by the lease), if the record holds it there.
pub fn value_offset(record: &[u8], value: &[u8], lease: i64) -> Option<usize> {
    let lease_len = if lease == 0 {
        0
    } else {
        1 + prost::encoding::encoded_len_varint(lease as u64)
    };
    let at = record.len().checked_sub(lease_len + value.len())?;
    (record.get(at..at + value.len())? == value).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::records::{encode_record, key_value};
    use crate::mvcc::{KeyRevision, Revision};

    #[test]
    fn a_value_is_found_in_its_entry_in_order() {
        let a = vec![1u8; LOGGED_VALUE_BYTES];
        let b = vec![2u8; LOGGED_VALUE_BYTES + 10];
        let bytes: Vec<u8> = [b"hdr".as_slice(), &a, b"x", &b, b"x", &a, b"end"].concat();
        let len = bytes.len();
        let mut s = ValueSource::new(9, bytes.into());
        let first = s.locate(&a).map(|span| span.from_end as usize);
        assert_eq!(first, Some(len - 3));
        assert_eq!(
            s.locate(&b).map(|span| span.from_end as usize),
            Some(len - 3 - a.len() - 1)
        );
        // The second `a` is found after `b`, and then again from the start.
        let second = s.locate(&a).map(|span| span.from_end as usize);
        assert_eq!(second, Some(3 + a.len()));
        assert_eq!(s.locate(&a).map(|span| span.from_end as usize), first);
        // Too small to be worth it, or not there.
        assert_eq!(s.locate(b"small"), None);
        assert_eq!(s.locate(&vec![3u8; LOGGED_VALUE_BYTES]), None);
    }

    #[test]
    fn a_records_value_offset_holds_with_and_without_a_lease() {
        let value = vec![5u8; LOGGED_VALUE_BYTES];
        for lease in [0, 1, 7_587_000_000_000_000_000] {
            let change = KeyRevision {
                rev: Revision::new(12, 0),
                create_revision: 3,
                version: 4,
                lease,
            };
            let record = encode_record(false, &key_value(b"k", &change, value.clone().into()));
            let at = value_offset(&record, &value, lease);
            assert!(at.is_some(), "lease {lease}");
            let at = at.unwrap_or_default();
            assert_eq!(&record[at..at + value.len()], &value[..]);
        }
    }
}
