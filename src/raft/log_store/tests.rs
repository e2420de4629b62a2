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
        let dir = tempfile::tempdir().map_err(|e| super::write_err(e.to_string()))?;
        let (_, log, sm) = open_at(dir.path())?;
        Ok((dir, log, sm))
    }
}

/// The storage, log store and state machine of a member whose data dir is `dir`.
fn open_at(dir: &std::path::Path) -> Result<(Storage, LogStore, StateMachine), StorageError<u64>> {
    let err = |e: &dyn std::fmt::Display| super::write_err(e.to_string());
    let storage = Storage::open(dir).map_err(|e| err(&e))?;
    let mvcc = Arc::new(MvccStore::open(storage.clone()).map_err(|e| err(&e))?);
    let hub = crate::watch::WatchHub::new(mvcc.current_revision());
    let removed = std::sync::Arc::new(tokio::sync::watch::Sender::new(false));
    let auth =
        Arc::new(crate::auth::AuthStore::open(&storage, Default::default()).map_err(|e| err(&e))?);
    let snapshots = Arc::new(crate::raft::snapshots::SnapshotFiles::new(dir));
    let sm = StateMachine::open(1, storage.clone(), mvcc, auth, hub, snapshots, removed)?;
    Ok((storage.clone(), LogStore::new(storage), sm))
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

/// A large put's value reaches the state journal as a reference to its log entry
/// (`storage::logged`): after a stop before any flush, the state comes back with the value read
/// from the log; the log is not purged past an unflushed value; a flush lets it go.
#[tokio::test]
async fn a_value_left_to_the_log_comes_back_from_it_and_holds_the_log_until_flushed(
) -> Result<(), StorageError<u64>> {
    use crate::apply::{Command, EncodedCommand, Op};
    use crate::pb::etcdserverpb::{PutRequest, RangeRequest};
    use openraft::storage::{RaftLogStorage, RaftStateMachine};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
    let err = |e: &dyn std::fmt::Display| super::write_err(e.to_string());
    let dir = tempfile::tempdir().map_err(|e| err(&e))?;
    let value: Vec<u8> = (0..16_384u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let leased = b"leased".to_vec();
    let log_id = |i: u64| LogId::new(CommittedLeaderId::new(1, 0), i);
    {
        let (_, mut log, mut sm) = open_at(dir.path())?;
        // Two puts of the same value in one entry (a batch), one of them under a lease.
        let put = |key: &[u8], lease: i64| {
            Command::new(Op::Put(PutRequest {
                key: key.to_vec(),
                value: value.clone(),
                lease,
                ..Default::default()
            }))
        };
        let grant = Command::new(Op::LeaseGrant(crate::pb::etcdserverpb::LeaseGrantRequest {
            ttl: 60,
            id: 5,
        }));
        let batch = Command::new(Op::Batch(crate::pb::concordpb::CommandBatch {
            commands: vec![put(b"plain", 0), put(&leased, 5)],
        }));
        let mut entries = Vec::new();
        for (i, cmd) in [(1, grant), (2, batch)] {
            let e: Entry<TypeConfig> = Entry {
                log_id: log_id(i),
                payload: EntryPayload::Normal(EncodedCommand::encode(&cmd)),
            };
            let stored = bincode::serialize(&e).map_err(|x| err(&x))?;
            log.storage
                .append_log(&[(i, stored)])
                .map_err(|x| err(&x))?;
            entries.push(e);
        }
        log.storage.persist_log().map_err(|x| err(&x))?;
        sm.apply(entries).await?;
        // The journal holds references, not the values.
        let journals: Vec<u8> = std::fs::read_dir(dir.path().join("db"))
            .map_err(|x| err(&x))?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".jnl"))
            .filter_map(|e| std::fs::read(e.path()).ok())
            .flatten()
            .collect();
        assert!(!journals.is_empty());
        assert_eq!(memchr::memmem::find(&journals, &value[..1024]), None);
        log.purge(log_id(2)).await?;
        assert_eq!(
            log.get_log_state().await?.last_purged_log_id,
            None,
            "postponed while the values are only in the log"
        );
    }
    // Reopened without a flush: the values come from the log.
    let storage = Storage::open(dir.path()).map_err(|e| err(&e))?;
    let mvcc = MvccStore::open(storage.clone()).map_err(|e| err(&e))?;
    for key in [b"plain".to_vec(), leased] {
        let req = RangeRequest {
            key: key.clone(),
            ..Default::default()
        };
        let read = mvcc.read().map_err(|x| err(&x))?;
        let got = crate::mvcc::range(&read, &req).map_err(|x| err(&x))?;
        let kv = got.kvs.first().cloned().unwrap_or_default();
        assert_eq!(kv.value.as_ref(), value.as_slice(), "{key:?}");
        assert_eq!(kv.lease, if key == b"leased" { 5 } else { 0 });
    }
    let mut log = LogStore::new(storage.clone());
    log.purge(log_id(2)).await?;
    assert_eq!(log.get_log_state().await?.last_purged_log_id, None);
    storage.flush_logged().map_err(|x| err(&x))?;
    log.purge(log_id(2)).await?;
    assert_eq!(
        log.get_log_state().await?.last_purged_log_id,
        Some(log_id(2))
    );
    Ok(())
}

/// A storage failure while an entry is applied (bug 11: a record lost from the disk, read back
/// for `prev_kv` after the txn's first put) is an error to openraft, which stops the member:
/// the batch is not committed, neither the txn's first put nor the applied index, so the
/// reopened state is the one before the entry.
#[tokio::test]
async fn a_storage_failure_while_applying_is_fatal_and_commits_nothing(
) -> Result<(), StorageError<u64>> {
    use crate::apply::{Command, EncodedCommand, Op};
    use crate::pb::etcdserverpb::request_op::Request;
    use crate::pb::etcdserverpb::{PutRequest, RangeRequest, RequestOp, TxnRequest};
    use openraft::storage::RaftStateMachine;
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
    let err = |e: &dyn std::fmt::Display| super::write_err(e.to_string());
    let dir = tempfile::tempdir().map_err(|e| err(&e))?;
    let log_id = |i: u64| LogId::new(CommittedLeaderId::new(1, 0), i);
    let put = |key: &str, prev_kv: bool| PutRequest {
        key: key.into(),
        value: b"v".to_vec(),
        prev_kv,
        ..Default::default()
    };
    let entry = |i: u64, op: Op| Entry::<TypeConfig> {
        log_id: log_id(i),
        payload: EntryPayload::Normal(EncodedCommand::encode(&Command::new(op))),
    };
    {
        let (storage, _, mut sm) = open_at(dir.path())?;
        sm.apply([entry(1, Op::Put(put("b", false)))]).await?;
        let mut lose = storage.batch();
        lose.remove(
            crate::storage::Space::Kv,
            &crate::mvcc::Revision::new(2, 0).to_bytes(),
        );
        lose.commit().map_err(|x| err(&x))?;
        let txn = TxnRequest {
            success: [put("x", false), put("b", true)]
                .map(|p| RequestOp {
                    request: Some(Request::RequestPut(p)),
                })
                .to_vec(),
            ..Default::default()
        };
        let failed = sm.apply([entry(2, Op::Txn(txn))]).await;
        assert!(failed.is_err(), "answered {failed:?}");
    }
    {
        let (_, _, mut sm) = open_at(dir.path())?;
        assert_eq!(sm.applied_state().await?.0, Some(log_id(1)));
    }
    let storage = Storage::open(dir.path()).map_err(|e| err(&e))?;
    let mvcc = MvccStore::open(storage).map_err(|e| err(&e))?;
    assert_eq!(mvcc.current_revision(), 2);
    let read = mvcc.read().map_err(|x| err(&x))?;
    let x = RangeRequest {
        key: b"x".to_vec(),
        ..Default::default()
    };
    let got = crate::mvcc::range(&read, &x).map_err(|x| err(&x))?;
    assert!(got.kvs.is_empty(), "the txn's first put was committed");
    Ok(())
}
