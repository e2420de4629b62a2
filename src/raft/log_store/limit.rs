//! How much one AppendEntries carries: a budget of bytes besides openraft's count of entries.
//!
//! openraft sends up to `max_payload_entries` (300) entries per AppendEntries, whatever their
//! size: 300 puts of 16 KiB are 4.8 MiB in one message, and of 100 KiB 30 MiB. A follower far
//! behind (a new member, one back from a stop) was sent such messages back to back; each had to
//! be answered within a heartbeat interval, took longer (the follower's fsync of it), timed out
//! and was sent again, and the follower held the copies meanwhile. etcd bounds its appends by
//! bytes (`MaxSizePerMsg`, 1 MiB); so does Concord, and the count still bounds small entries.

use std::collections::BTreeMap;

use openraft::{RaftLogReader, StorageError};

use super::{Entry, LogStore};

/// Bytes of entries one AppendEntries carries at most, and at least one entry however large
/// it is (etcd's `MaxSizePerMsg`).
pub(super) const APPEND_BYTES: u64 = 1 << 20;

impl LogStore {
    /// The entries of one AppendEntries from `start` (before `end`): at most `budget` bytes of
    /// them, and at least one. A follower keeping up is sent the newest entries, which the
    /// recent cache holds decoded; one further behind is sent entries sized by where they are
    /// (the write-behind buffer, or the log's record lengths) before any is read.
    pub(super) async fn entries_within(
        &mut self,
        start: u64,
        end: u64,
        budget: u64,
    ) -> Result<Vec<Entry>, StorageError<u64>> {
        if let Some(entries) = self.shared.recent().get_within(start, end, budget) {
            return Ok(entries);
        }
        let end = self.end_within(start, end, budget);
        self.try_get_log_entries(start..end).await
    }

    /// The end of the run of entries from `start` (before `end`) whose stored sizes add up to
    /// at most `budget`, with at least one entry. Every entry is in the write-behind buffer or
    /// the log's files; one in neither (below the purged index) ends the count, and the range
    /// is then left as asked.
    fn end_within(&self, start: u64, end: u64, budget: u64) -> u64 {
        if end.saturating_sub(start) <= 1 {
            return end;
        }
        let mut sizes: BTreeMap<u64, u64> = self
            .storage
            .log_record_lens(start, end)
            .into_iter()
            .collect();
        for (i, (_, bytes)) in self.shared.buffer().range(start..end) {
            sizes.insert(*i, bytes.len() as u64);
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

    /// Ten puts of 300 KiB, then two of 2 MiB and twenty small ones, the last 22 also among the
    /// recent entries: an append carries at most 1 MiB of them, and one entry however large,
    /// whether read from the files or the cache; small entries are bounded by openraft's count
    /// alone.
    #[tokio::test]
    async fn an_append_carries_at_most_a_mebibyte_and_at_least_one_entry(
    ) -> Result<(), StorageError<u64>> {
        let err = |e: &dyn std::fmt::Display| write_err(e.to_string());
        let dir = tempfile::tempdir().map_err(|e| err(&e))?;
        let storage = Storage::open(dir.path()).map_err(|e| err(&e))?;
        let len = |i| match i {
            1..=10 => 300 << 10,
            11 | 12 => 2 << 20,
            _ => 100,
        };
        let on_disk = (1..=32)
            .map(|i| bincode::serialize(&put(i, len(i))).map(|b| (i, b)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| err(&e))?;
        storage.append_log(&on_disk).map_err(|e| err(&e))?;
        storage.persist_log().map_err(|e| err(&e))?;
        let mut log = LogStore::new(storage);
        {
            // The newest entries are also kept decoded (as appending them does).
            let mut recent = log.shared.recent();
            for i in 11..=32 {
                recent.appended(put(i, len(i)));
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
