//! openraft's storage conformance suite run on our fjall log store and state machine
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
