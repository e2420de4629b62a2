//! Put and DeleteRange as etcd applies them, alone or inside a txn.

use crate::error::{Error, Result};
use crate::mvcc::{KeyRange, KvTxn};
use crate::pb::etcdserverpb::{
    DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, ResponseHeader,
};

/// Checks that a put can succeed before anything is written, in etcd's order inside a txn:
/// `ignore_value`/`ignore_lease` need the key to exist, then a lease must exist.
///
/// # Errors
/// [`Error::KeyNotFound`] or [`Error::LeaseNotFound`].
pub fn check_put(txn: &impl KvTxn, req: &PutRequest) -> Result<()> {
    if needs_key(req) && current(txn, &req.key).is_none() {
        return Err(Error::KeyNotFound);
    }
    check_lease(txn, req)
}

/// Whether the put keeps something of its key's current version (which must then exist).
pub(super) fn needs_key(req: &PutRequest) -> bool {
    req.ignore_value || req.ignore_lease
}

fn check_lease(txn: &impl KvTxn, req: &PutRequest) -> Result<()> {
    if req.lease != 0 && !txn.lease_exists(req.lease) {
        return Err(Error::LeaseNotFound);
    }
    Ok(())
}

fn current(txn: &impl KvTxn, key: &[u8]) -> Option<crate::mvcc::KeyRevision> {
    let at = txn.read_revision();
    txn.index_range(&KeyRange::Single(key.to_vec()), at)
        .into_iter()
        .next()
        .map(|(_, kr)| kr)
}

/// Applies a put; the header holds the revision of the write.
///
/// # Errors
/// Those of [`check_put`], or a storage failure. A put of its own is checked for its lease
/// first, as etcd's applier does (in a txn, [`check_put`]'s order: the key first).
pub fn put(txn: &mut impl KvTxn, req: &PutRequest) -> Result<PutResponse> {
    check_lease(txn, req)?;
    let mut value = req.value.as_slice();
    let mut lease = req.lease;
    // The previous version is looked up only when the request needs it (the index lookup
    // copies the key; a plain put's index update finds the previous version itself).
    let prev_revision = (needs_key(req) || req.prev_kv)
        .then(|| current(txn, &req.key))
        .flatten();
    if needs_key(req) && prev_revision.is_none() {
        return Err(Error::KeyNotFound);
    }
    let prev = match prev_revision {
        Some(kr) => Some(txn.load(&req.key, &kr)?),
        None => None,
    };
    let kept;
    if let Some(p) = &prev {
        if req.ignore_value {
            kept = p.value.clone();
            value = &kept;
        }
        if req.ignore_lease {
            lease = p.lease;
        }
    }
    txn.put(&req.key, value, lease)?;
    Ok(PutResponse {
        header: Some(ResponseHeader {
            revision: txn.read_revision(),
            ..Default::default()
        }),
        prev_kv: prev.filter(|_| req.prev_kv),
    })
}

/// Applies a delete; the header holds the revision (unchanged if nothing was deleted).
///
/// # Errors
/// A storage failure.
pub fn delete_range(txn: &mut impl KvTxn, req: &DeleteRangeRequest) -> Result<DeleteRangeResponse> {
    let deleted = txn.delete_range(&KeyRange::new(&req.key, &req.range_end), req.prev_kv)?;
    Ok(DeleteRangeResponse {
        header: Some(ResponseHeader {
            revision: txn.read_revision(),
            ..Default::default()
        }),
        deleted: deleted.len() as i64,
        prev_kvs: if req.prev_kv { deleted } else { Vec::new() },
    })
}
