//! How much one AppendEntries carries: a budget of bytes besides openraft's count of entries.
//!
//! openraft sends up to `max_payload_entries` (300) entries per AppendEntries, whatever their
//! size: 300 puts of 16 KiB are 4.8 MiB in one message, and of 100 KiB 30 MiB. A follower far
//! behind (a new member, one back from a stop) was sent such messages back to back; each had to
//! be answered within a heartbeat interval, took longer (the follower's fsync of it), timed out
//! and was sent again, and the follower held the copies meanwhile. etcd bounds its appends by
//! bytes (`MaxSizePerMsg`, 1 MiB); so does Concord, and the count still bounds small entries.

use std::collections::BTreeMap;

use super::LogStore;

/// Bytes of entries one AppendEntries carries at most, and at least one entry however large
/// it is (etcd's `MaxSizePerMsg`).
pub(super) const APPEND_BYTES: u64 = 1 << 20;

impl LogStore {
    /// The end of the run of entries from `start` (before `end`) whose sizes add up to at most
    /// `budget`, with at least one entry. The sizes come from where each entry is: the decoded
    /// recent entries, the write-behind buffer, or the log's record lengths; an entry found in
    /// none of them (below the purged index) ends the count, and the range is left as asked.
    pub(super) fn end_within(&self, start: u64, end: u64, budget: u64) -> u64 {
        if end.saturating_sub(start) <= 1 {
            return end;
        }
        let mut sizes: BTreeMap<u64, u64> = self.shared.recent().sizes(start, end).collect();
        // The common case (a follower keeping up): every entry is among the recent ones.
        let covered = sizes.len() as u64 == end - start;
        if !covered {
            let buffer = self.shared.buffer();
            for (i, (_, bytes)) in buffer.range(start..end) {
                sizes.entry(*i).or_insert(bytes.len() as u64);
            }
            drop(buffer);
            for (i, len) in self.storage.log_record_lens(start, end) {
                sizes.entry(i).or_insert(len);
            }
        }
        let mut total = 0u64;
        for index in start..end {
            let Some(len) = sizes.get(&index) else {
                return if index == start { end } else { index };
            };
            total = total.saturating_add(*len);
            if total > budget && index > start {
                return index;
            }
        }
        end
    }
}

#[cfg(test)]
mod tests {
    use openraft::{RaftLogReader, StorageError};

    use super::super::recent::tests::sized as put;
    use super::super::{write_err, LogStore};
    use crate::storage::Storage;

    async fn sent(log: &mut LogStore, start: u64, end: u64) -> Result<Vec<u64>, StorageError<u64>> {
        let entries = log.limited_get_log_entries(start, end).await?;
        Ok(entries.iter().map(|e| e.log_id.index).collect())
    }

    /// Ten puts of 300 KiB in the log's files, then two of 2 MiB and twenty small ones among
    /// the recent entries: an append carries at most 1 MiB of them, and one entry however
    /// large; small entries are bounded by openraft's count alone.
    #[tokio::test]
    async fn an_append_carries_at_most_a_mebibyte_and_at_least_one_entry(
    ) -> Result<(), StorageError<u64>> {
        let err = |e: &dyn std::fmt::Display| write_err(e.to_string());
        let dir = tempfile::tempdir().map_err(|e| err(&e))?;
        let storage = Storage::open(dir.path()).map_err(|e| err(&e))?;
        let on_disk = (1..=10)
            .map(|i| bincode::serialize(&put(i, 300 << 10)).map(|b| (i, b)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| err(&e))?;
        storage.append_log(&on_disk).map_err(|e| err(&e))?;
        storage.persist_log().map_err(|e| err(&e))?;
        let mut log = LogStore::new(storage);
        {
            let mut recent = log.shared.recent();
            recent.appended(put(11, 2 << 20));
            for i in 12..=32 {
                recent.appended(put(i, if i == 12 { 2 << 20 } else { 100 }));
            }
        }
        assert_eq!(sent(&mut log, 1, 33).await?, vec![1, 2, 3]);
        assert_eq!(sent(&mut log, 4, 11).await?, vec![4, 5, 6]);
        assert_eq!(
            sent(&mut log, 10, 33).await?,
            vec![10],
            "300 KiB, then 2 MiB"
        );
        assert_eq!(
            sent(&mut log, 11, 33).await?,
            vec![11],
            "one entry over the budget"
        );
        assert_eq!(sent(&mut log, 13, 33).await?, (13..=32).collect::<Vec<_>>());
        assert_eq!(sent(&mut log, 32, 33).await?, vec![32]);
        Ok(())
    }
}
