//! The last appended entries, decoded, for the readers that come right after an append.
//!
//! openraft reads each entry back right after appending it (to apply it, and once per follower
//! to replicate it), and a read from the log's files plus bincode decoding cost more than a
//! clone. The entries kept are bounded by count and by bytes: an entry carries a whole batch of
//! proposals (up to about twice `--max-request-bytes`), and 256 batches of 100 KiB puts held
//! 175 MiB for nothing once every follower had them.

use std::collections::BTreeMap;

use super::Entry;

/// Most entries kept.
const MAX_ENTRIES: usize = 256;
/// Most bytes of commands kept; the newest entry is kept whatever its size.
const MAX_BYTES: u64 = 16 << 20;

/// The last appended entries, contiguous by index.
#[derive(Default)]
pub(super) struct Recent {
    entries: BTreeMap<u64, Entry>,
    /// The sum of their [`size`]s.
    bytes: u64,
}

impl Recent {
    /// The entries `start..end` if every one of them is here.
    pub(super) fn get(&self, start: u64, end: u64) -> Option<Vec<Entry>> {
        let first = *self.entries.keys().next()?;
        let last = *self.entries.keys().next_back()?;
        if start < first || end > last.saturating_add(1) || start >= end {
            return None;
        }
        Some(
            self.entries
                .range(start..end)
                .map(|(_, e)| e.clone())
                .collect(),
        )
    }

    /// The entries from `start` (before `end`) while their sizes add up to at most `budget`,
    /// and at least one, if `start` is here: an AppendEntries' worth (`limit.rs`). The entries
    /// here are the log's newest, so none after them is missed.
    pub(super) fn get_within(&self, start: u64, end: u64, budget: u64) -> Option<Vec<Entry>> {
        if start >= end || !self.entries.contains_key(&start) {
            return None;
        }
        let mut total = 0u64;
        let mut out = Vec::new();
        for (_, e) in self.entries.range(start..end) {
            total = total.saturating_add(size(e));
            if total > budget && !out.is_empty() {
                break;
            }
            out.push(e.clone());
        }
        Some(out)
    }

    /// Keeps `e`, just appended: it replaces any entry at or after its index, and an entry
    /// that leaves a gap (never expected: openraft appends contiguously) starts afresh. The
    /// oldest entries go while the bounds are exceeded.
    pub(super) fn appended(&mut self, e: Entry) {
        let index = e.log_id.index;
        if self
            .entries
            .keys()
            .next_back()
            .is_some_and(|last| last.saturating_add(1) < index)
        {
            self.entries.clear();
            self.bytes = 0;
        }
        self.truncate(index);
        self.bytes += size(&e);
        self.entries.insert(index, e);
        while self.entries.len() > MAX_ENTRIES || (self.bytes > MAX_BYTES && self.entries.len() > 1)
        {
            if let Some((_, old)) = self.entries.pop_first() {
                self.bytes -= size(&old);
            }
        }
    }

    /// Drops the entries at and after `index` (a truncated log).
    pub(super) fn truncate(&mut self, index: u64) {
        let dropped = self.entries.split_off(&index);
        self.bytes -= dropped.values().map(size).sum::<u64>();
    }

    /// Drops the entries at and below `index` (a purged log).
    pub(super) fn purge(&mut self, index: u64) {
        let kept = self.entries.split_off(&index.saturating_add(1));
        let dropped = std::mem::replace(&mut self.entries, kept);
        self.bytes -= dropped.values().map(size).sum::<u64>();
    }
}

/// About the bytes an entry takes, in memory and in an AppendEntries: its command's encoding.
fn size(entry: &Entry) -> u64 {
    match &entry.payload {
        openraft::EntryPayload::Normal(cmd) => cmd.bytes().len() as u64,
        openraft::EntryPayload::Blank | openraft::EntryPayload::Membership(_) => 64,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

    use super::{size, Recent, MAX_BYTES, MAX_ENTRIES};
    use crate::apply::{Command, EncodedCommand, Op};
    use crate::pb::etcdserverpb::PutRequest;
    use crate::raft::TypeConfig;

    /// Entry `index`: a put of a `len`-byte value (its command a few bytes more).
    pub(crate) fn sized(index: u64, len: usize) -> Entry<TypeConfig> {
        let cmd = Command::new(Op::Put(PutRequest {
            key: index.to_be_bytes().to_vec(),
            value: vec![7; len],
            ..Default::default()
        }));
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
            payload: EntryPayload::Normal(EncodedCommand::encode(&cmd)),
        }
    }

    /// The bytes `Recent` counts for entries `indexes` of `len`-byte values.
    fn bytes_of(indexes: impl IntoIterator<Item = u64>, len: usize) -> u64 {
        indexes.into_iter().map(|i| size(&sized(i, len))).sum()
    }

    fn indexes(r: &Recent) -> Vec<u64> {
        r.entries.keys().copied().collect()
    }

    #[test]
    fn keeps_the_newest_entries_within_a_count_and_a_size() {
        let mut r = Recent::default();
        for i in 1..=(MAX_ENTRIES as u64 + 10) {
            r.appended(sized(i, 10));
        }
        assert_eq!(
            indexes(&r),
            (11..=MAX_ENTRIES as u64 + 10).collect::<Vec<_>>()
        );
        // Entries of about a quarter of the bytes: four fit, the fifth pushes the oldest out.
        let quarter = (MAX_BYTES / 4) as usize - 100;
        let mut r = Recent::default();
        for i in 1..=6 {
            r.appended(sized(i, quarter));
        }
        assert_eq!(indexes(&r), vec![3, 4, 5, 6]);
        assert_eq!(r.bytes, bytes_of(3..=6, quarter));
        // One entry over the bound is kept alone.
        r.appended(sized(7, 2 * MAX_BYTES as usize));
        assert_eq!(indexes(&r), vec![7]);
        assert_eq!(r.bytes, bytes_of([7], 2 * MAX_BYTES as usize));
    }

    #[test]
    fn truncation_purge_and_gaps_keep_the_count_of_bytes() {
        let mut r = Recent::default();
        for i in 1..=10 {
            r.appended(sized(i, 100));
        }
        r.truncate(8);
        r.purge(3);
        assert_eq!(indexes(&r), vec![4, 5, 6, 7]);
        assert_eq!(r.bytes, bytes_of(4..=7, 100));
        // Appending at 6 replaces 6 and 7.
        r.appended(sized(6, 50));
        assert_eq!(indexes(&r), vec![4, 5, 6]);
        assert_eq!(r.bytes, bytes_of(4..=5, 100) + bytes_of([6], 50));
        assert!(r.get(4, 7).is_some() && r.get(3, 5).is_none() && r.get(5, 8).is_none());
        // An AppendEntries' worth: by bytes, at least one entry, none when `start` is not here.
        let within = |r: &Recent, start, budget| {
            r.get_within(start, 100, budget)
                .map(|es| es.iter().map(|e| e.log_id.index).collect::<Vec<_>>())
        };
        assert_eq!(within(&r, 4, bytes_of(4..=5, 100)), Some(vec![4, 5]));
        assert_eq!(within(&r, 4, 1), Some(vec![4]));
        assert_eq!(within(&r, 5, u64::MAX), Some(vec![5, 6]));
        assert_eq!(within(&r, 3, u64::MAX), None);
        // A gap starts afresh.
        r.appended(sized(20, 30));
        assert_eq!(indexes(&r), vec![20]);
        assert_eq!(r.bytes, bytes_of([20], 30));
    }
}
