//! The multi-version store: every change is kept under its [`Revision`] until compacted, so that
//! any revision above the compacted one can be read.
//!
//! Values live on disk in the `kv` keyspace keyed by revision; the [`KeyIndex`] (key → history)
//! lives in memory and is rebuilt from disk on start. Readers take a [`ReadTxn`], the apply path a
//! [`WriteTxn`]; a write is invisible to readers until its batch has committed.

mod garbage;
mod index_build;
mod key_index;
mod lease_table;
mod published;
mod range;
mod records;
mod revision;
mod store;
mod write_txn;

pub use index_build::Changes;
pub use key_index::{KeyIndex, KeyRange, KeyRevision};
pub use lease_table::{LeaseInfo, LeaseTable};
pub use range::range;
pub use revision::Revision;
pub use store::{KvTxn, MvccStore, ReadTxn};
pub use write_txn::WriteTxn;
