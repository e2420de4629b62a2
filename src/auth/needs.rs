//! What each KV request needs from its user: read or write access to key ranges. One place,
//! used by the RPC edge (reads, watches) and by the apply path (writes, against the auth store
//! at that point of the log). etcd 3.5's rules with its later security fixes (3.5.28 and on):
//! nested txns are checked, and a put inside a txn needs what a plain put needs.

use crate::pb::etcdserverpb::request_op::Request as RequestOp;
use crate::pb::etcdserverpb::{Compare, DeleteRangeRequest, PutRequest, RangeRequest, TxnRequest};

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Range, compare, watch, `prev_kv`.
    Read,
    /// Put, delete.
    Write,
}

/// One access to `[key, range_end)` (etcd's conventions: empty end = the key alone, `\0` = from
/// the key on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// Read or write.
    pub access: Access,
    /// First key.
    pub key: Vec<u8>,
    /// Range end.
    pub range_end: Vec<u8>,
}

fn need(access: Access, key: &[u8], range_end: &[u8]) -> Need {
    Need {
        access,
        key: key.to_vec(),
        range_end: range_end.to_vec(),
    }
}

/// `access` to each of `keys` alone (the keys attached to a lease).
pub fn keys(access: Access, keys: impl IntoIterator<Item = Vec<u8>>) -> Vec<Need> {
    keys.into_iter()
        .map(|key| Need {
            access,
            key,
            range_end: Vec::new(),
        })
        .collect()
}

/// A range.
pub fn range(r: &RangeRequest) -> Vec<Need> {
    vec![need(Access::Read, &r.key, &r.range_end)]
}

/// A put: write the key, read it too with `prev_kv`. (Keys already on the lease it names are
/// checked by the caller, which knows them.)
pub fn put(r: &PutRequest) -> Vec<Need> {
    let mut n = vec![need(Access::Write, &r.key, b"")];
    if r.prev_kv {
        n.push(need(Access::Read, &r.key, b""));
    }
    n
}

/// A delete: write the range, read it too with `prev_kv`.
pub fn delete_range(r: &DeleteRangeRequest) -> Vec<Need> {
    let mut n = vec![need(Access::Write, &r.key, &r.range_end)];
    if r.prev_kv {
        n.push(need(Access::Read, &r.key, &r.range_end));
    }
    n
}

fn compare(c: &Compare) -> Need {
    need(Access::Read, &c.key, &c.range_end)
}

/// A txn: every compare, and every op of both branches whichever runs, nested txns included.
pub fn txn(t: &TxnRequest) -> Vec<Need> {
    let mut n: Vec<Need> = t.compare.iter().map(compare).collect();
    for op in t.success.iter().chain(&t.failure) {
        match &op.request {
            Some(RequestOp::RequestRange(r)) => n.extend(range(r)),
            Some(RequestOp::RequestPut(r)) => n.extend(put(r)),
            Some(RequestOp::RequestDeleteRange(r)) => n.extend(delete_range(r)),
            Some(RequestOp::RequestTxn(t)) => n.extend(txn(t)),
            None => {}
        }
    }
    n
}

/// The leases the puts of a txn (nested ones too) attach keys to.
pub fn txn_leases(t: &TxnRequest) -> Vec<i64> {
    let mut leases = Vec::new();
    for op in t.success.iter().chain(&t.failure) {
        match &op.request {
            Some(RequestOp::RequestPut(p)) if p.lease != 0 => leases.push(p.lease),
            Some(RequestOp::RequestTxn(t)) => leases.extend(txn_leases(t)),
            _ => {}
        }
    }
    leases
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::etcdserverpb::RequestOp as Op;

    #[test]
    fn a_txn_needs_its_compares_both_branches_and_nested_txns() {
        let inner = TxnRequest {
            success: vec![Op {
                request: Some(RequestOp::RequestDeleteRange(DeleteRangeRequest {
                    key: b"d".to_vec(),
                    prev_kv: true,
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        let t = TxnRequest {
            compare: vec![Compare {
                key: b"c".to_vec(),
                ..Default::default()
            }],
            success: vec![Op {
                request: Some(RequestOp::RequestPut(PutRequest {
                    key: b"p".to_vec(),
                    lease: 7,
                    ..Default::default()
                })),
            }],
            failure: vec![Op {
                request: Some(RequestOp::RequestTxn(inner)),
            }],
        };
        let got: Vec<(Access, Vec<u8>)> = txn(&t).into_iter().map(|n| (n.access, n.key)).collect();
        assert_eq!(
            got,
            vec![
                (Access::Read, b"c".to_vec()),
                (Access::Write, b"p".to_vec()),
                (Access::Write, b"d".to_vec()),
                (Access::Read, b"d".to_vec()),
            ]
        );
        assert_eq!(txn_leases(&t), vec![7]);
    }
}
