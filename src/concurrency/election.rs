//! Leader election, as etcd's `v3election` (a `clientv3/concurrency.Election`).
//!
//! A candidate puts `name/<lease id in hex>` under its lease (or finds it already there) and
//! waits until every key under `name/` created before it is gone: the oldest key is the leader.
//! Proclaim and resign act only while the candidate's key still has the creation revision it
//! campaigned with (`election: not leader` otherwise). Observe streams the leader's key-value
//! each time leadership or the leader's value changes.

use tokio::sync::mpsc;

use super::client::LocalClient;
use super::lock::{first_created, lock_key, wait_predecessors};
use crate::error::{Error, Result};
use crate::mvcc::KeyRange;
use crate::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::pb::etcdserverpb::request_op::Request;
use crate::pb::etcdserverpb::response_op::Response;
use crate::pb::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, ResponseHeader, TxnRequest,
};
use crate::pb::mvccpb::event::EventType;
use crate::pb::v3electionpb::{LeaderKey, LeaderResponse};

fn prefix_of(name: &[u8]) -> Vec<u8> {
    let mut p = name.to_vec();
    p.push(b'/');
    p
}

fn op(r: Request) -> RequestOp {
    RequestOp { request: Some(r) }
}

fn create_rev_is(key: &[u8], rev: i64) -> Compare {
    Compare {
        key: key.to_vec(),
        target: CompareTarget::Create as i32,
        result: CompareResult::Equal as i32,
        target_union: Some(TargetUnion::CreateRevision(rev)),
        ..Default::default()
    }
}

/// Campaigns for leadership of `name` with `value`; returns once this candidate leads.
///
/// # Errors
/// [`Error::LeaseNotFound`], [`Error::SessionExpired`] if the lease expired while waiting, or
/// the errors of the underlying requests.
pub async fn campaign(
    client: &LocalClient,
    name: &[u8],
    lease: i64,
    value: &[u8],
) -> Result<(ResponseHeader, LeaderKey)> {
    let key = lock_key(name, lease);
    let put = PutRequest {
        key: key.clone(),
        value: value.to_vec(),
        lease,
        ..Default::default()
    };
    let resp = client
        .txn(TxnRequest {
            compare: vec![create_rev_is(&key, 0)],
            success: vec![op(Request::RequestPut(put))],
            failure: vec![op(Request::RequestRange(RangeRequest {
                key: key.clone(),
                ..Default::default()
            }))],
        })
        .await?;
    let header = resp.header.unwrap_or_default();
    let mut leader = LeaderKey {
        name: name.to_vec(),
        key: key.clone(),
        rev: header.revision,
        lease,
    };
    if !resp.succeeded {
        let existing = match resp.responses.first().and_then(|r| r.response.clone()) {
            Some(Response::ResponseRange(r)) => r.kvs.into_iter().next(),
            _ => None,
        }
        .ok_or(Error::SessionExpired)?;
        leader.rev = existing.create_revision;
        if existing.value != value {
            proclaim(client, &leader, value).await?;
        }
    }
    let mine = wait_predecessors(client, &prefix_of(name), leader.rev, &key).await?;
    match mine.kvs.first() {
        Some(kv) if kv.create_revision == leader.rev => Ok((header, leader)),
        _ => Err(Error::SessionExpired),
    }
}

/// Updates the leader's value, only while `leader` still leads.
///
/// # Errors
/// [`Error::ElectionNotLeader`] otherwise.
pub async fn proclaim(
    client: &LocalClient,
    leader: &LeaderKey,
    value: &[u8],
) -> Result<ResponseHeader> {
    let resp = client
        .txn(TxnRequest {
            compare: vec![create_rev_is(&leader.key, leader.rev)],
            success: vec![op(Request::RequestPut(PutRequest {
                key: leader.key.clone(),
                value: value.to_vec(),
                lease: leader.lease,
                ..Default::default()
            }))],
            failure: Vec::new(),
        })
        .await?;
    if !resp.succeeded {
        return Err(Error::ElectionNotLeader);
    }
    Ok(resp.header.unwrap_or_default())
}

/// Gives up leadership (deletes the leader key if it is still this candidate's).
///
/// # Errors
/// Those of the txn.
pub async fn resign(client: &LocalClient, leader: &LeaderKey) -> Result<ResponseHeader> {
    let resp = client
        .txn(TxnRequest {
            compare: vec![create_rev_is(&leader.key, leader.rev)],
            success: vec![op(Request::RequestDeleteRange(DeleteRangeRequest {
                key: leader.key.clone(),
                ..Default::default()
            }))],
            failure: Vec::new(),
        })
        .await?;
    Ok(resp.header.unwrap_or_default())
}

/// The current leader's key-value.
///
/// # Errors
/// [`Error::ElectionNoLeader`] when nobody leads.
pub async fn leader(client: &LocalClient, name: &[u8]) -> Result<LeaderResponse> {
    let resp = first_created(client, &prefix_of(name)).await?;
    let kv = resp.kvs.into_iter().next().ok_or(Error::ElectionNoLeader)?;
    Ok(LeaderResponse {
        header: resp.header,
        kv: Some(kv),
    })
}

/// Streams the leader of `name`: its key-value whenever leadership or its value changes, each
/// with the revision of that change. Ends when the receiver is dropped or a read fails.
pub fn observe(client: LocalClient, name: Vec<u8>) -> mpsc::Receiver<Result<LeaderResponse>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        if let Err(e) = observe_loop(&client, &name, &tx).await {
            let _ = tx.send(Err(e)).await;
        }
    });
    rx
}

async fn observe_loop(
    client: &LocalClient,
    name: &[u8],
    tx: &mpsc::Sender<Result<LeaderResponse>>,
) -> Result<()> {
    let prefix = prefix_of(name);
    loop {
        let first = first_created(client, &prefix).await?;
        let mut header = first.header.unwrap_or_default();
        let kv = match first.kvs.into_iter().next() {
            Some(kv) => kv,
            None => {
                // Nobody leads: wait for the first put under the prefix.
                let range = KeyRange::new(&prefix, &super::lock::prefix_end(&prefix));
                let mut w = client.watch(range, header.revision + 1);
                loop {
                    let events = w.next().await?.ok_or(Error::Compacted)?;
                    if let Some(kv) = events
                        .into_iter()
                        .find(|e| e.r#type == EventType::Put as i32)
                        .and_then(|e| e.kv)
                    {
                        header.revision = kv.mod_revision;
                        break kv;
                    }
                }
            }
        };
        let key = kv.key.clone();
        if tx
            .send(Ok(LeaderResponse {
                header: Some(header),
                kv: Some(kv),
            }))
            .await
            .is_err()
        {
            return Ok(());
        }
        // Follow the leader's key until it is deleted.
        let mut w = client.watch(KeyRange::Single(key), header.revision + 1);
        'leader: loop {
            let Some(events) = w.next().await? else {
                break 'leader;
            };
            for e in events {
                if e.r#type == EventType::Delete as i32 {
                    break 'leader;
                }
                let rev = e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                let resp = LeaderResponse {
                    header: Some(ResponseHeader {
                        revision: rev,
                        ..Default::default()
                    }),
                    kv: e.kv,
                };
                if tx.send(Ok(resp)).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
}
