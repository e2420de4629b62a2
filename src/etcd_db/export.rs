//! A consistent view of a member's state → etcd's database, streamed: a first pass over the
//! view measures the file (bbolt's metas, which come first, name its last pages), a second
//! writes it in order to any [`Write`], so neither memory nor disk grows with the state.

use std::collections::{BTreeSet, HashSet};
use std::io::{self, Write};

use prost::Message;

use super::{bucket, key, Lease};
use crate::auth::state::key as auth_key;
use crate::bbolt::write::Layout;
use crate::bbolt::Writer;
use crate::mvcc::{disk, Revision};
use crate::pb::etcdserverpb::AlarmMember;
use crate::storage::{meta_key, Space, StorageError, View};

/// The cluster version written to the `cluster` bucket (what Concord reports).
const CLUSTER_VERSION: &[u8] = b"3.5.0";

/// What an export wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exported {
    /// The database's size in bytes.
    pub size: u64,
    /// Revisions written to the `key` bucket.
    pub changes: u64,
}

fn storage_error(e: StorageError) -> io::Error {
    io::Error::other(e.to_string())
}

/// A consistent view of a member's state, measured as etcd's database and ready to be written.
pub struct Export {
    view: View,
    applied: (u64, u64),
    kept: Option<HashSet<Revision>>,
    layout: Layout,
}

impl Export {
    /// Measures `view` as etcd's database (a pass over the whole view that writes nothing).
    /// `applied` is the Raft index and term the view was applied through (etcd's
    /// `consistent_index` and `term`). `kept`, when a compaction's background deletion is still
    /// under way, names the revisions at or below the compacted one that the compaction keeps
    /// (the others, still on disk, are left out as etcd would have deleted them); `None` when
    /// none is left over.
    ///
    /// # Errors
    /// A read failure, or a corrupt record.
    pub fn plan(
        view: View,
        applied: (u64, u64),
        kept: Option<HashSet<Revision>>,
    ) -> io::Result<Export> {
        let (_, layout, _) = write_db(&view, applied, kept.as_ref(), Writer::planning())?;
        Ok(Export {
            view,
            applied,
            kept,
            layout,
        })
    }

    /// The database's size in bytes.
    pub fn size(&self) -> u64 {
        self.layout.size()
    }

    /// Writes the database to `out`, in order; returns `out` (flushed) and what was written.
    ///
    /// # Errors
    /// A read or write failure, or a corrupt record.
    pub fn write_to<W: Write>(&self, out: W) -> io::Result<(W, Exported)> {
        let out = Writer::new(out, self.layout)?;
        let (out, layout, changes) = write_db(&self.view, self.applied, self.kept.as_ref(), out)?;
        Ok((
            out,
            Exported {
                size: layout.size(),
                changes,
            },
        ))
    }
}

/// One pass of the view into `out`; returns the output, the layout and the revisions written.
fn write_db<W: Write>(
    view: &View,
    applied: (u64, u64),
    kept: Option<&HashSet<Revision>>,
    mut out: Writer<W>,
) -> io::Result<(W, Layout, u64)> {
    let mut changes = 0u64;
    let read_i64 = |k: &[u8]| -> io::Result<Option<i64>> {
        Ok(view
            .get(Space::Meta, k)
            .map_err(storage_error)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map(i64::from_be_bytes))
    };
    let compacted = read_i64(meta_key::COMPACTED)?.unwrap_or(-1);

    let mut b = out.bucket(bucket::KEY);
    view.for_each(Space::Kv, b"", |k, v| {
        let rev = Revision::from_bytes(k)
            .ok_or_else(|| io::Error::other(format!("corrupt kv record key {k:?}")))?;
        if rev.main <= compacted && kept.is_some_and(|kept| !kept.contains(&rev)) {
            return Ok(());
        }
        let (key, value) = disk::etcd_entry(rev, v).map_err(storage_error)?;
        changes += 1;
        b.put(&key, &value)
    })?;
    b.finish()?;

    let mut b = out.bucket(bucket::META);
    b.put(key::CONSISTENT_INDEX, &applied.0.to_be_bytes())?;
    if compacted > 0 {
        let rev = Revision::new(compacted, 0).to_etcd_key(false);
        b.put(key::FINISHED_COMPACT, &rev)?;
        b.put(key::SCHEDULED_COMPACT, &rev)?;
    }
    b.put(key::TERM, &applied.1.to_be_bytes())?;
    b.finish()?;

    let mut b = out.bucket(bucket::LEASE);
    view.for_each(Space::Lease, b"", |k, v| {
        let id = <[u8; 8]>::try_from(k)
            .map(i64::from_be_bytes)
            .map_err(|_| io::Error::other(format!("corrupt lease record key {k:?}")))?;
        let (ttl, remaining_ttl) = disk::decode_lease_record(v)
            .ok_or_else(|| io::Error::other(format!("corrupt lease record {id:x}")))?;
        let lease = Lease {
            id,
            ttl,
            remaining_ttl,
        };
        b.put(k, &lease.encode_to_vec())
    })?;
    b.finish()?;

    let mut alarms = BTreeSet::new();
    view.for_each(Space::Meta, meta_key::ALARM, |k, _| {
        let (member_id, alarm) = disk::decode_alarm_key(k).map_err(storage_error)?;
        alarms.insert(AlarmMember { member_id, alarm }.encode_to_vec());
        Ok::<(), io::Error>(())
    })?;
    let mut b = out.bucket(bucket::ALARM);
    for alarm in alarms {
        b.put(&alarm, b"")?;
    }
    b.finish()?;

    let mut b = out.bucket(bucket::AUTH);
    let enabled = view
        .get(Space::Meta, auth_key::ENABLED)
        .map_err(storage_error)?;
    b.put(
        key::AUTH_ENABLED,
        &[u8::from(enabled.is_some_and(|v| v.first() == Some(&1)))],
    )?;
    let revision = view
        .get(Space::Meta, auth_key::REVISION)
        .map_err(storage_error)?;
    b.put(
        key::AUTH_REVISION,
        revision.as_deref().unwrap_or(&1u64.to_be_bytes()),
    )?;
    b.finish()?;
    for (name, prefix) in [
        (bucket::AUTH_USERS, auth_key::USER),
        (bucket::AUTH_ROLES, auth_key::ROLE),
    ] {
        let mut b = out.bucket(name);
        view.for_each(Space::Meta, prefix, |k, v| {
            b.put(k.get(prefix.len()..).unwrap_or_default(), v)
        })?;
        b.finish()?;
    }

    let mut b = out.bucket(bucket::CLUSTER);
    b.put(key::CLUSTER_VERSION, CLUSTER_VERSION)?;
    b.finish()?;
    for name in [bucket::MEMBERS, bucket::MEMBERS_REMOVED] {
        out.bucket(name).finish()?;
    }
    let (out, layout) = out.finish()?;
    Ok((out, layout, changes))
}
