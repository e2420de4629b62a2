//! openraft's storage conformance suite run on our log store and state machine
//! ("If your implementation passes the tests, Openraft should work well with it").

use std::sync::Arc;

use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;

use super::LogStore;
use crate::mvcc::MvccStore;
use crate::raft::{StateMachine, TypeConfig};
use crate::storage::Storage;

struct FjallBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for FjallBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<u64>> {
        let err = |e: &dyn std::fmt::Display| super::write_err(e.to_string());
        let dir = tempfile::tempdir().map_err(|e| err(&e))?;
        let storage = Storage::open(dir.path()).map_err(|e| err(&e))?;
        let mvcc = Arc::new(MvccStore::open(storage.clone()).map_err(|e| err(&e))?);
        let hub = crate::watch::WatchHub::new(mvcc.current_revision());
        let removed = std::sync::Arc::new(tokio::sync::watch::Sender::new(false));
        let auth = Arc::new(
            crate::auth::AuthStore::open(&storage, Default::default()).map_err(|e| err(&e))?,
        );
        let snapshots = Arc::new(crate::raft::snapshots::SnapshotFiles::new(dir.path()));
        let sm = StateMachine::open(1, storage.clone(), mvcc, auth, hub, snapshots, removed)?;
        Ok((dir, LogStore::new(storage), sm))
    }
}

#[test]
fn passes_openraft_storage_suite() -> Result<(), StorageError<u64>> {
    Suite::test_all(FjallBuilder)
}

/// openraft purges the log up to a received snapshot as soon as it hands it over for
/// installing: while that snapshot is being received and no install is marked on disk, the
/// entries stay (a crash would otherwise leave a member whose log starts after its state).
#[tokio::test]
async fn no_purge_past_the_state_while_a_snapshot_is_received() -> Result<(), StorageError<u64>> {
    use openraft::storage::RaftLogStorage;
    use openraft::{CommittedLeaderId, LogId};
    let err = |e: &dyn std::fmt::Display| super::write_err(e.to_string());
    let dir = tempfile::tempdir().map_err(|e| err(&e))?;
    let storage = Storage::open(dir.path()).map_err(|e| err(&e))?;
    let receiving = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut log = LogStore::new(storage.clone()).watching_installs(receiving.clone());
    let at = LogId::new(CommittedLeaderId::new(1, 0), 10);
    log.purge(at).await?;
    assert_eq!(
        log.get_log_state().await?.last_purged_log_id,
        None,
        "postponed"
    );
    receiving.store(false, std::sync::atomic::Ordering::Release);
    log.purge(at).await?;
    assert_eq!(log.get_log_state().await?.last_purged_log_id, Some(at));
    Ok(())
}

/// A crash after the log resumed past an installed snapshot, before the postponed purge: at
/// the next start the log is purged up to the state's applied id, so openraft never reads the
/// gap below the snapshot.
#[tokio::test]
async fn a_gap_left_below_an_installed_snapshot_is_purged_at_start() -> Result<(), StorageError<u64>>
{
    use openraft::entry::RaftEntry;
    use openraft::storage::RaftLogStorage;
    use openraft::{CommittedLeaderId, Entry, LogId, RaftLogReader};
    let err = |e: &dyn std::fmt::Display| super::write_err(e.to_string());
    let dir = tempfile::tempdir().map_err(|e| err(&e))?;
    let storage = Storage::open(dir.path()).map_err(|e| err(&e))?;
    let entry = |i: u64| {
        let e: Entry<TypeConfig> = Entry::new_blank(LogId::new(CommittedLeaderId::new(1, 0), i));
        bincode::serialize(&e).map(|b| (i, b)).map_err(|x| err(&x))
    };
    // Entries 1..=10, then (after a snapshot at 50 was installed) 51..=55.
    let entries = (1..=10)
        .chain(51..=55)
        .map(entry)
        .collect::<Result<Vec<_>, _>>()?;
    storage.append_log(&entries).map_err(|e| err(&e))?;
    storage.persist_log().map_err(|e| err(&e))?;
    let applied = LogId::new(CommittedLeaderId::new(1, 0), 50);
    let mut b = storage.batch();
    let bytes = bincode::serialize(&Some(applied)).map_err(|e| err(&e))?;
    b.insert(
        crate::storage::Space::Meta,
        crate::storage::meta_key::APPLIED,
        &bytes,
    );
    b.commit().map_err(|e| err(&e))?;

    let mut log = LogStore::new(storage.clone());
    log.purge_below_gap()?;
    assert_eq!(log.get_log_state().await?.last_purged_log_id, Some(applied));
    let read: Vec<u64> = log
        .try_get_log_entries(0..100)
        .await?
        .iter()
        .map(|e| e.log_id.index)
        .collect();
    assert_eq!(read, (51..=55).collect::<Vec<_>>());
    Ok(())
}
