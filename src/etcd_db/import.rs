//! etcd's database → Concord's records.

use std::io;

use prost::Message;

use super::{bad, bucket, key, Lease};
use crate::bbolt::read::Entry;
use crate::bbolt::{Bucket, Db};
use crate::mvcc::{disk, Revision};
use crate::pb::authpb::{Role, User};
use crate::pb::etcdserverpb::AlarmMember;
use crate::pb::mvccpb::KeyValue;
use crate::storage::{meta_key, Space};

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

/// Where imported records go: (space, key, value).
pub type Out<'a> = dyn FnMut(Space, Vec<u8>, Vec<u8>) -> io::Result<()> + 'a;

/// Hands `out` Concord's records for everything in etcd's database `db` that a restored member
/// keeps: every stored revision, the leases, the compaction and current revisions, the auth
/// store and the alarms.
///
/// # Errors
/// A read failure, a file that is not etcd's database, a record that does not decode, or what
/// `out` returns.
pub fn import(db: &Db, out: &mut Out) -> io::Result<()> {
    // The store's revision: etcd's rule, the newest change's or the compaction's if later.
    let mut revision = 1;
    let mut push = |space, key: Vec<u8>, value: Vec<u8>| out(space, key, value);
    values(db, &required(db, bucket::KEY)?, &mut |k, v| {
        let (rev, tombstone) = Revision::from_etcd_key(k)
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
        revision = revision.max(rev.main);
        push(
            Space::Kv,
            rev.to_bytes().to_vec(),
            disk::kv_record(tombstone, &kv),
        )
    })?;
    // The later of the finished and the scheduled compaction: an interrupted one is redone
    // when the member opens.
    let mut compacted = 0;
    values(db, &required(db, bucket::META)?, &mut |k, v| {
        if k == key::FINISHED_COMPACT || k == key::SCHEDULED_COMPACT {
            let (rev, _) =
                Revision::from_etcd_key(v).ok_or_else(|| bad("a corrupt compaction revision"))?;
            compacted = compacted.max(rev.main);
        }
        Ok(())
    })?;
    revision = revision.max(compacted);
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
            key::AUTH_ENABLED => push(
                Space::Meta,
                crate::auth::state::key::ENABLED.to_vec(),
                vec![u8::from(v.first() == Some(&1))],
            ),
            key::AUTH_REVISION if v.len() == 8 => push(
                Space::Meta,
                crate::auth::state::key::REVISION.to_vec(),
                v.to_vec(),
            ),
            key::AUTH_REVISION => Err(bad("a corrupt auth revision")),
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
        revision.to_be_bytes().to_vec(),
    )?;
    if compacted > 0 {
        push(
            Space::Meta,
            meta_key::COMPACTED.to_vec(),
            compacted.to_be_bytes().to_vec(),
        )?;
    }
    Ok(())
}
