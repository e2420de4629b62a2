//! The Raft log and vote on fjall.
//!
//! Durability: `append` makes entries readable at once and hands the flush callback to the
//! [`Syncer`], a thread that fsyncs once for every batch of waiting appends (group commit) and
//! only then reports the entries flushed. `save_vote`, `truncate` and `purge` sync before they
//! return, so a crash can neither double-vote nor resurrect a truncated entry.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::mpsc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};

use super::TypeConfig;
use crate::storage::Storage;

type Entry = openraft::Entry<TypeConfig>;

const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const PURGED: &str = "purged";

/// The Raft log storage of one member.
#[derive(Clone)]
pub struct LogStore {
    storage: Storage,
    syncer: mpsc::Sender<LogFlushed<TypeConfig>>,
}

impl LogStore {
    /// Opens the log over `storage` and starts its sync thread.
    pub fn new(storage: Storage) -> Self {
        let syncer = Syncer::start(storage.clone());
        LogStore { storage, syncer }
    }

    fn read_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, StorageError<u64>> {
        let bytes = self.storage.get_raft_meta(key).map_err(read_err)?;
        bytes
            .map(|b| bincode::deserialize(&b).map_err(read_err))
            .transpose()
    }

    fn write_meta<T: serde::Serialize>(&self, key: &str, v: &T) -> Result<(), StorageError<u64>> {
        let bytes = bincode::serialize(v).map_err(write_err)?;
        self.storage.put_raft_meta(key, &bytes).map_err(write_err)
    }
}

fn read_err(e: impl std::fmt::Display) -> StorageError<u64> {
    StorageIOError::read_logs(AnyError::error(e.to_string())).into()
}

fn write_err(e: impl std::fmt::Display) -> StorageError<u64> {
    StorageIOError::write_logs(AnyError::error(e.to_string())).into()
}

/// The group-commit thread: one fsync for all appends queued while the previous one ran.
struct Syncer;

impl Syncer {
    fn start(storage: Storage) -> mpsc::Sender<LogFlushed<TypeConfig>> {
        let (tx, rx) = mpsc::channel::<LogFlushed<TypeConfig>>();
        let spawned = std::thread::Builder::new()
            .name("raft-log-sync".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut waiting = vec![first];
                    waiting.extend(rx.try_iter());
                    let result = storage
                        .persist()
                        .map_err(|e| std::io::Error::other(e.to_string()));
                    for cb in waiting {
                        cb.log_io_completed(
                            result
                                .as_ref()
                                .map(|_| ())
                                .map_err(|e| std::io::Error::other(e.to_string())),
                        );
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the raft log sync thread");
        }
        tx
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<u64>> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(x) => x.saturating_add(1),
            Bound::Excluded(x) => *x,
            Bound::Unbounded => u64::MAX,
        };
        let raw = self.storage.log_range(start, end).map_err(read_err)?;
        raw.iter()
            .map(|(_, b)| bincode::deserialize::<Entry>(b).map_err(read_err))
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let last_purged: Option<LogId<u64>> = self.read_meta(PURGED)?;
        let last = match self.storage.last_log().map_err(read_err)? {
            Some((_, b)) => Some(bincode::deserialize::<Entry>(&b).map_err(read_err)?.log_id),
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        self.write_meta(VOTE, vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        self.read_meta(VOTE)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<u64>>,
    ) -> Result<(), StorageError<u64>> {
        self.write_meta(COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        Ok(self.read_meta::<Option<LogId<u64>>>(COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        for e in entries {
            encoded.push((e.log_id.index, bincode::serialize(&e).map_err(write_err)?));
        }
        self.storage.append_log(&encoded).map_err(write_err)?;
        if let Err(mpsc::SendError(cb)) = self.syncer.send(callback) {
            // The sync thread is gone: sync here rather than report an unsynced flush.
            let result = self
                .storage
                .persist()
                .map_err(|e| std::io::Error::other(e.to_string()));
            cb.log_io_completed(result);
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        self.storage
            .remove_log(log_id.index..=u64::MAX)
            .map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        // The applied state must be durable before the entries that rebuild it disappear.
        self.storage.persist().map_err(write_err)?;
        self.write_meta(PURGED, &log_id)?;
        self.storage.remove_log(0..=log_id.index).map_err(write_err)
    }
}
