//! bbolt, the B+tree file format of etcd's database and of the snapshot files `etcdctl snapshot
//! save` writes: read ([`read`]) for importing etcd's data, written as a stream ([`write`]) for
//! `Maintenance.Snapshot`. Only the on-disk layout is implemented here ([`layout`]), from bbolt's
//! documented structures; nothing in this module knows what etcd keeps in its buckets (that is
//! [`crate::etcd_db`]'s business).
//!
//! Every page is read on demand with positioned reads, so memory stays bounded by the tree's
//! depth whatever the file's size, and every length and page id taken from the file is checked
//! against the file: a truncated, corrupt or foreign file is an error, never a panic.

pub mod layout;
pub mod read;
pub mod write;

pub use read::{Bucket, Db};
pub use write::Writer;
