//! Txn as etcd 3.5 runs it: every compare of the chosen path (nested txns included) is evaluated
//! against the state before the txn, the chosen path is checked (put preconditions, range
//! revisions) before anything is written, then its ops run in order, each seeing the earlier ones.
//! All writes share one main revision, with increasing sub-revisions.

use std::cmp::Ordering;

use super::kv;
use crate::error::{Error, Result};
use crate::mvcc::{self, KeyRange, KvTxn};
use crate::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::pb::etcdserverpb::request_op::Request;
use crate::pb::etcdserverpb::response_op::Response;
use crate::pb::etcdserverpb::{
    Compare, RequestOp, ResponseHeader, ResponseOp, TxnRequest, TxnResponse,
};
use crate::pb::mvccpb::KeyValue;

/// Which branch each txn takes: `succeeded` for this level, then one entry per nested txn of
/// the chosen branch, in order.
struct Path {
    succeeded: bool,
    nested: Vec<Path>,
}

/// Whether no branch of the txn (nested ones included) writes.
pub fn is_read_only(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(&req.failure)
        .all(|op| match &op.request {
            Some(Request::RequestPut(_)) | Some(Request::RequestDeleteRange(_)) => false,
            Some(Request::RequestTxn(t)) => is_read_only(t),
            _ => true,
        })
}

/// Runs the txn. The caller ends the request (taking the revision) and sets the top-level header
/// revision from it; nested responses carry their own revision as in etcd.
///
/// # Errors
/// Precondition failures of the chosen path ([`Error::KeyNotFound`], [`Error::LeaseNotFound`],
/// [`Error::FutureRevision`], [`Error::Compacted`]), with nothing written; or a storage failure.
pub fn execute(txn: &mut impl KvTxn, req: &TxnRequest) -> Result<TxnResponse> {
    let path = choose_path(txn, req)?;
    check_path(txn, req, &path)?;
    run(txn, req, &path)
}

fn choose_path(txn: &impl KvTxn, req: &TxnRequest) -> Result<Path> {
    let mut succeeded = true;
    for c in &req.compare {
        if !compare(txn, c)? {
            succeeded = false;
            break;
        }
    }
    let mut nested = Vec::new();
    for op in branch(req, succeeded) {
        if let Some(Request::RequestTxn(t)) = &op.request {
            nested.push(choose_path(txn, t)?);
        }
    }
    Ok(Path { succeeded, nested })
}

fn branch(req: &TxnRequest, succeeded: bool) -> &[RequestOp] {
    if succeeded {
        &req.success
    } else {
        &req.failure
    }
}

/// Checks the chosen path before anything is written, so that no op fails once the first has
/// (a txn is applied whole or not at all). First etcd's checks, in etcd's order: every put (its
/// key for `ignore_value`/`ignore_lease`, its lease) against the state before the txn, then
/// every range's revision. Then, in the order the ops will run, a put that needs its key's
/// previous version after a delete of that key earlier in the txn: etcd's duplicate-key check
/// lets that through when the delete's range ends at "\0" (every key from its start), and etcd
/// then panics while applying it; here it is refused with the error its key's absence means.
fn check_path(txn: &impl KvTxn, req: &TxnRequest, path: &Path) -> Result<()> {
    visit(req, path, &mut |op| match op {
        Request::RequestPut(p) => kv::check_put(txn, p),
        _ => Ok(()),
    })?;
    visit(req, path, &mut |op| match op {
        Request::RequestRange(r) if r.revision > txn.read_revision() => Err(Error::FutureRevision),
        Request::RequestRange(r) if r.revision != 0 && r.revision < txn.compacted_revision() => {
            Err(Error::Compacted)
        }
        _ => Ok(()),
    })?;
    let mut deleted = Vec::new();
    visit(req, path, &mut |op| match op {
        Request::RequestDeleteRange(d) => {
            deleted.push(KeyRange::new(&d.key, &d.range_end));
            Ok(())
        }
        Request::RequestPut(p)
            if kv::needs_key(p) && deleted.iter().any(|r: &KeyRange| r.contains(&p.key)) =>
        {
            Err(Error::KeyNotFound)
        }
        _ => Ok(()),
    })
}

/// Calls `f` on each op of the chosen path in the order the ops will run (a nested txn's ops
/// where the nested txn stands), stopping at the first error.
fn visit(req: &TxnRequest, path: &Path, f: &mut impl FnMut(&Request) -> Result<()>) -> Result<()> {
    let mut nested = path.nested.iter();
    for op in branch(req, path.succeeded) {
        match &op.request {
            Some(Request::RequestTxn(t)) => {
                if let Some(p) = nested.next() {
                    visit(t, p, f)?;
                }
            }
            Some(r) => f(r)?,
            None => {}
        }
    }
    Ok(())
}

fn run(txn: &mut impl KvTxn, req: &TxnRequest, path: &Path) -> Result<TxnResponse> {
    let mut nested = path.nested.iter();
    let mut responses = Vec::new();
    for op in branch(req, path.succeeded) {
        let response = match &op.request {
            Some(Request::RequestRange(r)) => Some(Response::ResponseRange(mvcc::range(txn, r)?)),
            Some(Request::RequestPut(p)) => Some(Response::ResponsePut(kv::put(txn, p)?)),
            Some(Request::RequestDeleteRange(d)) => {
                Some(Response::ResponseDeleteRange(kv::delete_range(txn, d)?))
            }
            Some(Request::RequestTxn(t)) => match nested.next() {
                Some(p) => {
                    // etcd answers a nested txn with an empty header (present, all zero).
                    let mut resp = run(txn, t, p)?;
                    resp.header = Some(ResponseHeader::default());
                    Some(Response::ResponseTxn(resp))
                }
                None => None,
            },
            None => None,
        };
        responses.push(ResponseOp { response });
    }
    Ok(TxnResponse {
        header: Some(ResponseHeader {
            revision: txn.read_revision(),
            ..Default::default()
        }),
        succeeded: path.succeeded,
        responses,
    })
}

/// Evaluates one compare against every key of its range, as etcd's `applyCompare`.
fn compare(txn: &impl KvTxn, c: &Compare) -> Result<bool> {
    let at = txn.read_revision();
    let keys = txn.index_range(&KeyRange::new(&c.key, &c.range_end), at);
    let target = CompareTarget::try_from(c.target).unwrap_or(CompareTarget::Version);
    if keys.is_empty() {
        // A missing key has no value to compare; other targets compare against zero.
        return Ok(target != CompareTarget::Value && compare_kv(c, target, &KeyValue::default()));
    }
    for (key, change) in &keys {
        let kv = if target == CompareTarget::Value {
            txn.load(key, change)?
        } else {
            KeyValue {
                key: key.clone(),
                create_revision: change.create_revision,
                mod_revision: change.rev.main,
                version: change.version,
                value: bytes::Bytes::new(),
                lease: change.lease,
            }
        };
        if !compare_kv(c, target, &kv) {
            return Ok(false);
        }
    }
    Ok(true)
}

fn compare_kv(c: &Compare, target: CompareTarget, kv: &KeyValue) -> bool {
    let ord = match (target, &c.target_union) {
        (CompareTarget::Value, Some(TargetUnion::Value(v))) => kv.value[..].cmp(v),
        (CompareTarget::Value, _) => kv.value[..].cmp(&[][..]),
        (CompareTarget::Version, u) => kv.version.cmp(&int_of(u, |u| match u {
            TargetUnion::Version(v) => Some(*v),
            _ => None,
        })),
        (CompareTarget::Create, u) => kv.create_revision.cmp(&int_of(u, |u| match u {
            TargetUnion::CreateRevision(v) => Some(*v),
            _ => None,
        })),
        (CompareTarget::Mod, u) => kv.mod_revision.cmp(&int_of(u, |u| match u {
            TargetUnion::ModRevision(v) => Some(*v),
            _ => None,
        })),
        (CompareTarget::Lease, u) => kv.lease.cmp(&int_of(u, |u| match u {
            TargetUnion::Lease(v) => Some(*v),
            _ => None,
        })),
    };
    match CompareResult::try_from(c.result) {
        Ok(CompareResult::Equal) => ord == Ordering::Equal,
        Ok(CompareResult::NotEqual) => ord != Ordering::Equal,
        Ok(CompareResult::Greater) => ord == Ordering::Greater,
        Ok(CompareResult::Less) => ord == Ordering::Less,
        Err(_) => true,
    }
}

fn int_of(u: &Option<TargetUnion>, pick: impl Fn(&TargetUnion) -> Option<i64>) -> i64 {
    u.as_ref().and_then(pick).unwrap_or(0)
}
