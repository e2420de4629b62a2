//! etcd's database file (what `etcdctl snapshot save` writes from etcd): which bucket holds
//! what, and how each record maps to Concord's, both ways. [`import`] reads the buckets in order
//! and hands Concord's records on one at a time; [`Export`] streams a consistent view of a
//! member's state as etcd's database, in two passes; [`status`] answers as `etcdutl snapshot
//! status` does. Memory never depends on the database's size (see [`crate::bbolt`]).
//!
//! etcd's layout (its `schema` package): `key` maps a revision (8-byte main, `_`, 8-byte sub,
//! all big-endian, and a `t` after a tombstone) to a `mvccpb.KeyValue` (a tombstone's holds
//! only the key); `lease` maps an 8-byte big-endian id to a `leasepb.Lease`; `meta` holds the
//! compaction revisions (`finishedCompactRev`, `scheduledCompactRev`, both revision keys);
//! `auth` the enabled flag (`authEnabled`, one byte) and `authRevision` (8 bytes big-endian);
//! `authUsers` and `authRoles` a protobuf per name; `alarm` a marshalled `AlarmMember` per
//! alarm. `members`, `members_removed` and `cluster` describe the old cluster and are left
//! behind, as `etcdutl snapshot restore` leaves them.

use std::io;

mod export;
mod import;
mod status;

pub use export::{Export, Exported};
pub use import::import;
pub use status::{status, Status};

/// etcd's bucket names.
pub mod bucket {
    /// Revisions → `mvccpb.KeyValue`.
    pub const KEY: &[u8] = b"key";
    /// Lease ids → `leasepb.Lease`.
    pub const LEASE: &[u8] = b"lease";
    /// Consistent index, term, compaction revisions.
    pub const META: &[u8] = b"meta";
    /// The auth enabled flag and revision.
    pub const AUTH: &[u8] = b"auth";
    /// User names → `authpb.User`.
    pub const AUTH_USERS: &[u8] = b"authUsers";
    /// Role names → `authpb.Role`.
    pub const AUTH_ROLES: &[u8] = b"authRoles";
    /// Marshalled `AlarmMember`s.
    pub const ALARM: &[u8] = b"alarm";
    /// Old members' ids (hex) → their attributes.
    pub const MEMBERS: &[u8] = b"members";
    /// Removed members' ids.
    pub const MEMBERS_REMOVED: &[u8] = b"members_removed";
    /// The cluster version.
    pub const CLUSTER: &[u8] = b"cluster";
}

/// etcd's keys inside its buckets.
mod key {
    /// `meta`: the last finished compaction's revision key.
    pub const FINISHED_COMPACT: &[u8] = b"finishedCompactRev";
    /// `meta`: the last scheduled compaction's revision key.
    pub const SCHEDULED_COMPACT: &[u8] = b"scheduledCompactRev";
    /// `meta`: the last applied Raft index (u64 BE).
    pub const CONSISTENT_INDEX: &[u8] = b"consistent_index";
    /// `meta`: its term (u64 BE).
    pub const TERM: &[u8] = b"term";
    /// `auth`: one byte, 1 when enabled.
    pub const AUTH_ENABLED: &[u8] = b"authEnabled";
    /// `auth`: the auth revision (u64 BE).
    pub const AUTH_REVISION: &[u8] = b"authRevision";
    /// `cluster`: the cluster version.
    pub const CLUSTER_VERSION: &[u8] = b"clusterVersion";
}

/// etcd's `leasepb.Lease`, as its `lease` bucket stores it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Lease {
    /// The lease id.
    #[prost(int64, tag = "1")]
    pub id: i64,
    /// The granted TTL, in seconds.
    #[prost(int64, tag = "2")]
    pub ttl: i64,
    /// The checkpointed remaining TTL (0: none).
    #[prost(int64, tag = "3")]
    pub remaining_ttl: i64,
}

pub(crate) fn bad(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("not an etcd database: {what}"),
    )
}
