//! etcd's `Range` semantics over any [`KvTxn`]: revision checks, count, limit and `more`,
//! mod/create revision filters, sorting, keys-only and count-only.

use std::cmp::Ordering;

use super::{KeyRange, KvTxn};
use crate::error::{Error, Result};
use crate::pb::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::pb::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
use crate::pb::mvccpb::KeyValue;

/// Answers `req` as etcd 3.5 does. The header carries only the revision; the RPC layer fills in
/// the rest.
///
/// # Errors
/// [`Error::FutureRevision`], [`Error::Compacted`], [`Error::InvalidSortOption`], or a storage
/// failure.
pub fn range(txn: &impl KvTxn, req: &RangeRequest) -> Result<RangeResponse> {
    let order = SortOrder::try_from(req.sort_order).map_err(|_| Error::InvalidSortOption)?;
    let target = SortTarget::try_from(req.sort_target).map_err(|_| Error::InvalidSortOption)?;
    let current = txn.read_revision();
    if req.revision > current {
        return Err(Error::FutureRevision);
    }
    let at = if req.revision <= 0 {
        current
    } else {
        req.revision
    };
    if at < txn.compacted_revision() {
        return Err(Error::Compacted);
    }
    let header = Some(ResponseHeader {
        revision: current,
        ..Default::default()
    });
    let matches = txn.index_range(&KeyRange::new(&req.key, &req.range_end), at);
    let count = matches.len() as i64;
    if req.count_only {
        return Ok(RangeResponse {
            header,
            count,
            ..Default::default()
        });
    }
    let filtered = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    // As etcd: fetch everything when sorting or filtering, else one more than the limit.
    let fetch = if order != SortOrder::None || filtered || req.limit <= 0 {
        matches.len()
    } else {
        usize::try_from(req.limit.saturating_add(1)).unwrap_or(usize::MAX)
    };
    let mut kvs = Vec::with_capacity(fetch.min(matches.len()));
    for (key, change) in matches.iter().take(fetch) {
        kvs.push(txn.load(key, change)?);
    }
    kvs.retain(|kv| {
        (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
            && (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
            && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
            && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
    });
    // Results come sorted by key already; etcd sorts ascending by default for other targets.
    let order = match (order, target) {
        (SortOrder::None, SortTarget::Key) | (SortOrder::Ascend, SortTarget::Key) => {
            SortOrder::None
        }
        (SortOrder::None, _) => SortOrder::Ascend,
        (o, _) => o,
    };
    if order != SortOrder::None {
        kvs.sort_by(|a, b| {
            let ord = compare_by(target, a, b);
            if order == SortOrder::Descend {
                ord.reverse()
            } else {
                ord
            }
        });
    }
    let mut more = false;
    if let Ok(limit) = usize::try_from(req.limit) {
        if limit > 0 && kvs.len() > limit {
            kvs.truncate(limit);
            more = true;
        }
    }
    if req.keys_only {
        for kv in &mut kvs {
            kv.value.clear();
        }
    }
    Ok(RangeResponse {
        header,
        kvs,
        more,
        count,
    })
}

fn compare_by(target: SortTarget, a: &KeyValue, b: &KeyValue) -> Ordering {
    match target {
        SortTarget::Key => a.key.cmp(&b.key),
        SortTarget::Version => a.version.cmp(&b.version),
        SortTarget::Create => a.create_revision.cmp(&b.create_revision),
        SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => a.value.cmp(&b.value),
    }
}
