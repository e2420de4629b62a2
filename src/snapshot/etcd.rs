//! etcd's database, as `etcdctl snapshot save` writes it from etcd: which bucket holds what,
//! and how each record maps to Concord's. Import reads the buckets in order and hands Concord's
//! records on one at a time; [`status`] answers as `etcdutl snapshot status` does.
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

use prost::Message;

use crate::bbolt::read::Entry;
use crate::bbolt::{Bucket, Db};
use crate::mvcc::{disk, Revision};
use crate::pb::authpb::{Role, User};
use crate::pb::etcdserverpb::AlarmMember;
use crate::pb::mvccpb::KeyValue;
use crate::raft::snapshots::Record;
use crate::storage::{meta_key, Space};

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
}

/// etcd's `meta` keys for the compaction revisions.
const FINISHED_COMPACT: &[u8] = b"finishedCompactRev";
const SCHEDULED_COMPACT: &[u8] = b"scheduledCompactRev";
/// etcd's `auth` keys.
const AUTH_ENABLED: &[u8] = b"authEnabled";
const AUTH_REVISION: &[u8] = b"authRevision";

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

fn bad(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("not an etcd database: {what}"),
    )
}

/// Parses a `key` bucket key: the revision, and whether it is a tombstone.
pub fn parse_revision_key(k: &[u8]) -> Option<(Revision, bool)> {
    let tombstone = match k.len() {
        17 => false,
        18 if k.get(17) == Some(&b't') => true,
        _ => return None,
    };
    if k.get(8) != Some(&b'_') {
        return None;
    }
    let main = i64::from_be_bytes(k.get(..8)?.try_into().ok()?);
    let sub = i64::from_be_bytes(k.get(9..17)?.try_into().ok()?);
    Some((Revision::new(main, sub), tombstone))
}

/// The `key` bucket key of `rev`.
pub fn revision_key(rev: Revision, tombstone: bool) -> Vec<u8> {
    let mut k = Vec::with_capacity(18);
    k.extend(rev.main.to_be_bytes());
    k.push(b'_');
    k.extend(rev.sub.to_be_bytes());
    if tombstone {
        k.push(b't');
    }
    k
}

/// What an import found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Imported {
    /// The store's revision (etcd's rule: the newest change's, or the compaction's if later).
    pub revision: i64,
    /// The compacted revision (0: never compacted).
    pub compacted: i64,
    /// Changes (revisions) imported.
    pub changes: u64,
}

fn required(db: &Db, name: &[u8]) -> io::Result<Bucket> {
    db.bucket(name)?.ok_or_else(|| {
        bad(format!(
            "no {:?} bucket (a bbolt file, but not etcd's)",
            String::from_utf8_lossy(name)
        ))
    })
}

/// A visitor of a bucket's keys and values.
type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> io::Result<()> + 'a;

fn values(db: &Db, bucket: &Bucket, visit: &mut Visit) -> io::Result<()> {
    db.for_each(bucket, &mut |k, entry| match entry {
        Entry::Value(v) => visit(k, v),
        Entry::Bucket(_) => Err(bad("a nested bucket")),
    })
}

/// Hands `out` Concord's records for everything in etcd's database `db` that a restored member
/// keeps: every stored revision, the leases, the compaction and current revisions, the auth
/// store and the alarms.
///
/// # Errors
/// A read failure, a file that is not etcd's database, a record that does not decode, or what
/// `out` returns.
pub fn import(db: &Db, out: &mut dyn FnMut(Record) -> io::Result<()>) -> io::Result<Imported> {
    let mut found = Imported::default();
    let mut push = |space, key: Vec<u8>, value: Vec<u8>| out(Record { space, key, value });
    values(db, &required(db, bucket::KEY)?, &mut |k, v| {
        let (rev, tombstone) = parse_revision_key(k)
            .ok_or_else(|| bad(format!("a key bucket key of {} bytes", k.len())))?;
        let kv = KeyValue::decode(v).map_err(|e| bad(format!("revision {rev:?}: {e}")))?;
        let kv = if tombstone {
            KeyValue {
                key: kv.key,
                mod_revision: rev.main,
                ..Default::default()
            }
        } else {
            kv
        };
        found.revision = found.revision.max(rev.main);
        found.changes += 1;
        push(
            Space::Kv,
            rev.to_bytes().to_vec(),
            disk::kv_record(tombstone, &kv),
        )
    })?;
    let compaction = |k: &[u8]| -> io::Result<i64> {
        let mut rev = 0;
        values(db, &required(db, bucket::META)?, &mut |key, v| {
            if key == k {
                rev = parse_revision_key(v)
                    .ok_or_else(|| bad("a corrupt compaction revision"))?
                    .0
                    .main;
            }
            Ok(())
        })?;
        Ok(rev)
    };
    // An interrupted compaction (scheduled, not finished) is redone when the member opens.
    found.compacted = compaction(FINISHED_COMPACT)?.max(compaction(SCHEDULED_COMPACT)?);
    found.revision = found.revision.max(found.compacted).max(1);
    if let Some(b) = db.bucket(bucket::LEASE)? {
        values(db, &b, &mut |k, v| {
            let lease = Lease::decode(v).map_err(|e| bad(format!("a lease: {e}")))?;
            if k != lease.id.to_be_bytes() {
                return Err(bad("a lease stored under another id"));
            }
            push(
                Space::Lease,
                k.to_vec(),
                disk::lease_record(lease.ttl, lease.remaining_ttl),
            )
        })?;
    }
    if let Some(b) = db.bucket(bucket::AUTH)? {
        values(db, &b, &mut |k, v| match k {
            AUTH_ENABLED => push(
                Space::Meta,
                crate::auth::state::key::ENABLED.to_vec(),
                vec![u8::from(v.first() == Some(&1))],
            ),
            AUTH_REVISION if v.len() == 8 => push(
                Space::Meta,
                crate::auth::state::key::REVISION.to_vec(),
                v.to_vec(),
            ),
            AUTH_REVISION => Err(bad("a corrupt auth revision")),
            _ => Ok(()),
        })?;
    }
    for (name, prefix) in [
        (bucket::AUTH_USERS, crate::auth::state::key::USER),
        (bucket::AUTH_ROLES, crate::auth::state::key::ROLE),
    ] {
        if let Some(b) = db.bucket(name)? {
            values(db, &b, &mut |k, v| {
                let valid = if name == bucket::AUTH_USERS {
                    User::decode(v).is_ok_and(|u| u.name == k)
                } else {
                    Role::decode(v).is_ok_and(|r| r.name == k)
                };
                if !valid {
                    return Err(bad("a corrupt user or role"));
                }
                push(Space::Meta, [prefix, k].concat(), v.to_vec())
            })?;
        }
    }
    if let Some(b) = db.bucket(bucket::ALARM)? {
        values(db, &b, &mut |k, _| {
            let alarm = AlarmMember::decode(k).map_err(|e| bad(format!("an alarm: {e}")))?;
            push(
                Space::Meta,
                disk::alarm_key(alarm.member_id, alarm.alarm),
                Vec::new(),
            )
        })?;
    }
    push(
        Space::Meta,
        meta_key::REVISION.to_vec(),
        found.revision.to_be_bytes().to_vec(),
    )?;
    if found.compacted > 0 {
        push(
            Space::Meta,
            meta_key::COMPACTED.to_vec(),
            found.compacted.to_be_bytes().to_vec(),
        )?;
    }
    Ok(found)
}

/// What `etcdutl snapshot status` reports of an etcd database file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// CRC-32C of every bucket's name, then its keys and values, in order.
    pub hash: u32,
    /// The newest revision in the `key` bucket.
    pub revision: i64,
    /// Keys in all buckets (etcd 3.5 counts every bucket's entries).
    pub total_keys: u64,
    /// The database's size (pages in use times the page size).
    pub total_size: u64,
}

/// The status of etcd's database `db`, as `etcdutl snapshot status` computes it.
///
/// # Errors
/// A read failure, or a corrupt file.
pub fn status(db: &Db) -> io::Result<Status> {
    let mut s = Status {
        total_size: db.size(),
        ..Status::default()
    };
    let mut buckets = Vec::new();
    db.for_each(&db.root(), &mut |name, entry| match entry {
        Entry::Bucket(b) => {
            buckets.push((name.to_vec(), b));
            Ok(())
        }
        Entry::Value(_) => Err(bad("a top-level key that is not a bucket")),
    })?;
    let mut crc = 0u32;
    for (name, b) in buckets {
        crc = crc32c::crc32c_append(crc, &name);
        let is_key = name == bucket::KEY;
        db.for_each(&b, &mut |k, entry| {
            crc = crc32c::crc32c_append(crc, k);
            if let Entry::Value(v) = entry {
                crc = crc32c::crc32c_append(crc, v);
            }
            if is_key {
                let (rev, _) = parse_revision_key(k)
                    .ok_or_else(|| bad(format!("a key bucket key of {} bytes", k.len())))?;
                s.revision = rev.main;
            }
            s.total_keys += 1;
            Ok(())
        })?;
    }
    s.hash = crc;
    Ok(s)
}
