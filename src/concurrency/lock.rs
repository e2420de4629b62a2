//! Distributed locks with fencing tokens, as etcd's `v3lock` (a `clientv3/concurrency.Mutex`).
//!
//! `lock(name, lease)` creates `name/<lease id in hex>` under the lease if it does not exist
//! yet; that key's `create_revision` is the holder's **fencing token**, strictly increasing
//! across holders. The caller then waits for its predecessor only — the key under `name/` with
//! the largest smaller `create_revision` — to be deleted (no thundering herd: one release wakes
//! one waiter), looping until none is left. Before answering it checks that its own key still
//! exists: a lease that expired while waiting is never told it holds the lock (the bug Jepsen
//! found in etcd 3.4).

use crate::error::{Error, Result};
use crate::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::pb::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::pb::etcdserverpb::request_op::Request;
use crate::pb::etcdserverpb::response_op::Response;
use crate::pb::etcdserverpb::{
    Compare, PutRequest, RangeRequest, RequestOp, ResponseHeader, TxnRequest,
};

use super::client::LocalClient;

pub use crate::storage::prefix_end;

/// The lock key of `lease` under lock `name`.
pub fn lock_key(name: &[u8], lease: i64) -> Vec<u8> {
    let mut key = name.to_vec();
    key.push(b'/');
    key.extend(format!("{lease:x}").into_bytes());
    key
}

/// Acquires lock `name` for `lease`; returns the header and the lock key once held.
///
/// # Errors
/// [`Error::LeaseNotFound`] for an unknown lease, [`Error::SessionExpired`] when the lease
/// expired while waiting, or the errors of the underlying requests.
pub async fn lock(
    client: &LocalClient,
    name: &[u8],
    lease: i64,
) -> Result<(ResponseHeader, Vec<u8>)> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    let key = lock_key(name, lease);
    let get_key = RangeRequest {
        key: key.clone(),
        ..Default::default()
    };
    let first_owner = first_created_request(&prefix);
    let op = |r: Request| RequestOp { request: Some(r) };
    let resp = client
        .txn(TxnRequest {
            compare: vec![Compare {
                key: key.clone(),
                target: CompareTarget::Create as i32,
                result: CompareResult::Equal as i32,
                target_union: Some(TargetUnion::CreateRevision(0)),
                ..Default::default()
            }],
            success: vec![
                op(Request::RequestPut(PutRequest {
                    key: key.clone(),
                    lease,
                    ..Default::default()
                })),
                op(Request::RequestRange(first_owner.clone())),
            ],
            failure: vec![
                op(Request::RequestRange(get_key.clone())),
                op(Request::RequestRange(first_owner)),
            ],
        })
        .await?;
    let range_at = |i: usize| match resp.responses.get(i).and_then(|r| r.response.clone()) {
        Some(Response::ResponseRange(r)) => Some(r),
        _ => None,
    };
    let header_rev = resp.header.map_or(0, |h| h.revision);
    let my_rev = if resp.succeeded {
        header_rev
    } else {
        range_at(0)
            .and_then(|r| r.kvs.first().map(|kv| kv.create_revision))
            .ok_or(Error::SessionExpired)?
    };
    let owner = range_at(1).and_then(|r| r.kvs.first().map(|kv| kv.create_revision));
    if owner.is_none() || owner == Some(my_rev) {
        return Ok((resp.header.unwrap_or_default(), key));
    }
    // Our key must still be there: its lease may have expired while we waited.
    let mine = wait_predecessors(client, &prefix, my_rev, &key).await?;
    match mine.kvs.first() {
        Some(kv) if kv.create_revision == my_rev => Ok((mine.header.unwrap_or_default(), key)),
        _ => Err(Error::SessionExpired),
    }
}

/// Waits, one at a time, for every key under `prefix` created before `my_rev` to be deleted:
/// only the immediate predecessor is watched, so one release wakes one waiter. Returns `own_key`
/// as read at the same linearizable point as the last (empty) predecessor check: one read index
/// per hand-off instead of two.
///
/// # Errors
/// Those of the reads and watches.
pub async fn wait_predecessors(
    client: &LocalClient,
    prefix: &[u8],
    my_rev: i64,
    own_key: &[u8],
) -> Result<crate::pb::etcdserverpb::RangeResponse> {
    let predecessor = RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        sort_order: SortOrder::Descend as i32,
        sort_target: SortTarget::Create as i32,
        max_create_revision: my_rev - 1,
        limit: 1,
        ..Default::default()
    };
    let own = RangeRequest {
        key: own_key.to_vec(),
        ..Default::default()
    };
    loop {
        let [pred, mine] = client.ranges([&predecessor, &own]).await?;
        let Some(p) = pred.kvs.first() else {
            return Ok(mine);
        };
        let at = pred.header.map_or(0, |h| h.revision);
        client.wait_delete(&p.key, at).await?;
    }
}

/// The oldest key under `prefix` (the holder or leader), as of a linearizable read.
///
/// # Errors
/// Those of the read.
pub async fn first_created(
    client: &LocalClient,
    prefix: &[u8],
) -> Result<crate::pb::etcdserverpb::RangeResponse> {
    client.range(first_created_request(prefix)).await
}

fn first_created_request(prefix: &[u8]) -> RangeRequest {
    RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        sort_order: SortOrder::Ascend as i32,
        sort_target: SortTarget::Create as i32,
        limit: 1,
        ..Default::default()
    }
}

/// Releases a lock by deleting its key.
///
/// # Errors
/// Those of the delete.
pub async fn unlock(client: &LocalClient, key: &[u8]) -> Result<ResponseHeader> {
    Ok(client.delete(key).await?.header.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_etcd_layout() {
        assert_eq!(lock_key(b"m", 0x694d), b"m/694d".to_vec());
        assert_eq!(prefix_end(b"m/"), b"m0".to_vec());
        assert_eq!(prefix_end(&[0x61, 0xff]), vec![0x62]);
        assert_eq!(prefix_end(&[0xff]), vec![0]);
    }
}
