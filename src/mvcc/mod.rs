//! The multi-version store: every change is kept under its [`Revision`] until compacted, so that
//! any revision above the compacted one can be read.
//!
//! Values live on disk in the `kv` keyspace keyed by revision; the [`KeyIndex`] (key → history)
//! lives in memory and is rebuilt on start from the `index` keyspace, which repeats each
//! record's key-index fields without its value. Readers take a [`ReadTxn`], the apply path a
//! [`WriteTxn`]; a write is invisible to readers until its batch has committed.

mod garbage;
mod index_build;
mod index_load;
mod key_index;
mod lease_table;
mod published;
mod range;
mod records;
mod revision;
mod store;
mod value_source;
mod write_txn;

pub use index_build::Changes;
pub use key_index::{KeyIndex, KeyRange, KeyRevision};
pub use lease_table::{LeaseInfo, LeaseTable};
pub use range::{range, PendingRange, RangeStart};
pub use revision::Revision;
pub use store::{KvTxn, MvccStore, ReadTxn};
pub use write_txn::WriteTxn;

/// The store's records as they lie on disk, for tools that convert them from and to another
/// format (`concord snapshot` and etcd's database files).
pub mod disk {
    use super::records;
    use crate::pb::mvccpb::KeyValue;
    use crate::storage::StorageResult;

    /// The record of a change: a put's whole `KeyValue`, or a tombstone (its key and deleting
    /// revision).
    pub fn kv_record(tombstone: bool, kv: &KeyValue) -> Vec<u8> {
        records::encode_record(tombstone, kv).to_vec()
    }

    /// A stored change as etcd keeps it: etcd's `key` bucket key for `rev` and its value (a
    /// put's `KeyValue` as stored, a tombstone's key only).
    ///
    /// # Errors
    /// An empty record, or a tombstone that does not decode.
    pub fn etcd_entry(
        rev: super::Revision,
        bytes: &[u8],
    ) -> StorageResult<(Vec<u8>, std::borrow::Cow<'_, [u8]>)> {
        records::etcd_entry(rev, bytes)
    }

    /// The `index` keyspace's entry for the record `record` of `kv` at revision key `rev_key`
    /// (what the key index needs of it), for a writer of records other than the store: a
    /// snapshot install writes them beside the records, so the store's next load reads these
    /// instead of every value.
    ///
    /// # Errors
    /// A corrupt revision key or record.
    pub fn index_entry(rev_key: &[u8], record: &[u8]) -> StorageResult<crate::storage::Value> {
        super::index_load::index_entry(rev_key, record)
    }

    /// A lease's record: its granted and its checkpointed remaining TTL.
    pub fn lease_record(ttl: i64, remaining: i64) -> Vec<u8> {
        records::encode_lease(ttl, remaining)
    }

    /// A lease record's granted and remaining TTL.
    pub fn decode_lease_record(bytes: &[u8]) -> Option<(i64, i64)> {
        records::decode_lease(bytes)
    }

    /// The meta key recording alarm `alarm` raised by `member`.
    pub fn alarm_key(member: u64, alarm: i32) -> Vec<u8> {
        records::alarm_key(member, alarm)
    }

    /// The member and alarm an alarm key records.
    ///
    /// # Errors
    /// A key of another shape.
    pub fn decode_alarm_key(key: &[u8]) -> StorageResult<(u64, i32)> {
        records::decode_alarm_key(key)
    }
}
