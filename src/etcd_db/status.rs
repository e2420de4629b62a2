//! What `etcdutl snapshot status` reports of an etcd database.

use std::io;

use super::{bad, bucket};
use crate::bbolt::read::Entry;
use crate::bbolt::Db;
use crate::mvcc::Revision;

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
                let (rev, _) = Revision::from_etcd_key(k)
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
