//! Checks made before anything is proposed, exactly as etcd's `checkXRequest` functions: nothing
//! invalid enters the Raft log.

use std::collections::HashSet;

use crate::error::{Error, Result};
use crate::pb::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::pb::etcdserverpb::request_op::Request;
use crate::pb::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

/// etcd's `checkRangeRequest`.
///
/// # Errors
/// [`Error::EmptyKey`], [`Error::InvalidSortOption`].
pub fn range(r: &RangeRequest) -> Result<()> {
    if r.key.is_empty() {
        return Err(Error::EmptyKey);
    }
    if SortOrder::try_from(r.sort_order).is_err() || SortTarget::try_from(r.sort_target).is_err() {
        return Err(Error::InvalidSortOption);
    }
    Ok(())
}

/// etcd's `checkPutRequest`.
///
/// # Errors
/// [`Error::EmptyKey`], [`Error::ValueProvided`], [`Error::LeaseProvided`].
pub fn put(r: &PutRequest) -> Result<()> {
    if r.key.is_empty() {
        return Err(Error::EmptyKey);
    }
    if r.ignore_value && !r.value.is_empty() {
        return Err(Error::ValueProvided);
    }
    if r.ignore_lease && r.lease != 0 {
        return Err(Error::LeaseProvided);
    }
    Ok(())
}

/// etcd's `checkDeleteRequest`.
///
/// # Errors
/// [`Error::EmptyKey`].
pub fn delete_range(r: &DeleteRangeRequest) -> Result<()> {
    if r.key.is_empty() {
        return Err(Error::EmptyKey);
    }
    Ok(())
}

/// etcd's `checkTxnRequest` followed by its duplicate-write check (`checkIntervals`).
///
/// # Errors
/// [`Error::TooManyOps`], [`Error::EmptyKey`], [`Error::DuplicateKey`], and the errors of the
/// nested requests' checks.
pub fn txn(r: &TxnRequest, max_txn_ops: usize) -> Result<()> {
    check_txn(r, max_txn_ops)?;
    intervals(&r.success)?;
    intervals(&r.failure)?;
    Ok(())
}

fn check_txn(r: &TxnRequest, max_txn_ops: usize) -> Result<()> {
    let ops = r.compare.len().max(r.success.len()).max(r.failure.len());
    if ops > max_txn_ops {
        return Err(Error::TooManyOps);
    }
    if r.compare.iter().any(|c| c.key.is_empty()) {
        return Err(Error::EmptyKey);
    }
    for op in r.success.iter().chain(&r.failure) {
        match &op.request {
            Some(Request::RequestRange(q)) => range(q)?,
            Some(Request::RequestPut(q)) => put(q)?,
            Some(Request::RequestDeleteRange(q)) => delete_range(q)?,
            Some(Request::RequestTxn(t)) => check_txn(t, max_txn_ops - ops)?,
            None => return Err(Error::KeyNotFound),
        }
    }
    Ok(())
}

/// A deleted interval `[start, end)`, or a single key when `end` is empty.
struct Deleted {
    start: Vec<u8>,
    end: Vec<u8>,
}

impl Deleted {
    fn covers(&self, key: &[u8]) -> bool {
        if self.end.is_empty() {
            self.start == key
        } else {
            self.start.as_slice() <= key && key < self.end.as_slice()
        }
    }
}

/// Returns the keys put and the intervals deleted by `ops` (nested txns included); fails when a
/// key is put twice or put and deleted in one possible execution.
fn intervals(ops: &[RequestOp]) -> Result<(HashSet<Vec<u8>>, Vec<Deleted>)> {
    let mut dels: Vec<Deleted> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(Request::RequestDeleteRange(d)) => Some(Deleted {
                start: d.key.clone(),
                end: d.range_end.clone(),
            }),
            _ => None,
        })
        .collect();
    let deleted = |dels: &[Deleted], k: &[u8]| dels.iter().any(|d| d.covers(k));
    let mut puts: HashSet<Vec<u8>> = HashSet::new();
    for op in ops {
        let Some(Request::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = intervals(&t.success)?;
        let (puts_else, dels_else) = intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || deleted(&dels, k) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        for k in puts_else {
            // Then and else exclude each other, so a key in both is fine.
            if (puts.contains(&k) && !puts_then.contains(&k)) || deleted(&dels, &k) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(k);
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let Some(Request::RequestPut(p)) = &op.request else {
            continue;
        };
        if puts.contains(&p.key) || deleted(&dels, &p.key) {
            return Err(Error::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_op(k: &str) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: k.into(),
                ..Default::default()
            })),
        }
    }

    fn del_op(k: &str, end: &str) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
                key: k.into(),
                range_end: end.into(),
                ..Default::default()
            })),
        }
    }

    fn txn_of(success: Vec<RequestOp>, failure: Vec<RequestOp>) -> TxnRequest {
        TxnRequest {
            compare: vec![],
            success,
            failure,
        }
    }

    #[test]
    fn duplicate_writes_are_rejected_as_in_etcd() {
        let cases = [
            (vec![put_op("a"), put_op("a")], Err(Error::DuplicateKey)),
            (vec![put_op("a"), put_op("b")], Ok(())),
            (
                vec![del_op("a", "c"), put_op("b")],
                Err(Error::DuplicateKey),
            ),
            (vec![del_op("a", ""), del_op("a", "")], Ok(())),
            (vec![del_op("a", ""), put_op("b")], Ok(())),
        ];
        for (ops, want) in cases {
            assert_eq!(txn(&txn_of(ops, vec![]), 128), want);
        }
        let nested = RequestOp {
            request: Some(Request::RequestTxn(txn_of(
                vec![put_op("x")],
                vec![put_op("x")],
            ))),
        };
        assert_eq!(txn(&txn_of(vec![nested.clone()], vec![]), 128), Ok(()));
        assert_eq!(
            txn(&txn_of(vec![nested, put_op("x")], vec![]), 128),
            Err(Error::DuplicateKey)
        );
    }

    #[test]
    fn limits_and_empty_keys() {
        let many: Vec<_> = (0..3).map(|i| put_op(&i.to_string())).collect();
        assert_eq!(txn(&txn_of(many, vec![]), 2), Err(Error::TooManyOps));
        assert_eq!(
            txn(&txn_of(vec![put_op("")], vec![]), 8),
            Err(Error::EmptyKey)
        );
        let empty_op = RequestOp { request: None };
        assert_eq!(
            txn(&txn_of(vec![empty_op], vec![]), 8),
            Err(Error::KeyNotFound)
        );
        assert_eq!(
            put(&PutRequest {
                key: "k".into(),
                value: "v".into(),
                ignore_value: true,
                ..Default::default()
            }),
            Err(Error::ValueProvided)
        );
    }
}
