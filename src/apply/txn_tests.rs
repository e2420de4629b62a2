//! Txn through the apply path, as etcd 3.5 runs it: compares choose a branch, the chosen path
//! is checked whole before anything is written, writes share one revision, nested txns.

use super::tests::{error_of, get_req, op, put_req, Fixture, TestResult};
use super::*;
use crate::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::pb::etcdserverpb::request_op::Request;
use crate::pb::etcdserverpb::response_op::Response;
use crate::pb::etcdserverpb::{
    CompactionRequest, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

#[test]
fn txn_compares_choose_a_branch_and_writes_share_one_revision() -> TestResult {
    let f = Fixture::new()?;
    f.put("a", "1");
    let txn = TxnRequest {
        compare: vec![Compare {
            key: "a".into(),
            target: CompareTarget::Value as i32,
            result: CompareResult::Equal as i32,
            target_union: Some(TargetUnion::Value("1".into())),
            ..Default::default()
        }],
        success: vec![
            op(Request::RequestPut(put_req("a", "2"))),
            op(Request::RequestPut(put_req("b", "2"))),
            op(Request::RequestRange(get_req("a"))),
        ],
        failure: vec![op(Request::RequestPut(put_req("c", "3")))],
    };
    let Outcome::Txn(t) = f.apply(Op::Txn(txn.clone())) else {
        return Err("txn failed".into());
    };
    assert!(t.succeeded);
    assert_eq!(t.header.map(|h| h.revision), Some(3));
    let Some(Response::ResponseRange(r)) = t.responses.get(2).and_then(|r| r.response.clone())
    else {
        return Err("no range response".into());
    };
    assert_eq!(
        r.kvs.first().map(|kv| kv.value.clone()),
        Some(b"2".to_vec().into())
    );
    let b = f.get(get_req("b"))?.kvs.remove(0);
    assert_eq!(b.mod_revision, 3);
    // The same txn now fails its compare and takes the failure branch.
    let Outcome::Txn(t) = f.apply(Op::Txn(txn)) else {
        return Err("txn failed".into());
    };
    assert!(!t.succeeded);
    assert_eq!(f.get(get_req("c"))?.kvs.len(), 1);
    Ok(())
}

#[test]
fn txn_compare_on_a_missing_key() -> TestResult {
    let f = Fixture::new()?;
    let cmp = |target: CompareTarget, u: TargetUnion| Compare {
        key: "nope".into(),
        target: target as i32,
        result: CompareResult::Equal as i32,
        target_union: Some(u),
        ..Default::default()
    };
    for (c, expect) in [
        (
            cmp(CompareTarget::Create, TargetUnion::CreateRevision(0)),
            true,
        ),
        (cmp(CompareTarget::Version, TargetUnion::Version(0)), true),
        (
            cmp(CompareTarget::Value, TargetUnion::Value(Vec::new())),
            false,
        ),
    ] {
        let Outcome::Txn(t) = f.apply(Op::Txn(TxnRequest {
            compare: vec![c],
            ..Default::default()
        })) else {
            return Err("txn failed".into());
        };
        assert_eq!(t.succeeded, expect);
    }
    Ok(())
}

#[test]
fn a_failing_txn_precondition_writes_nothing() -> TestResult {
    let f = Fixture::new()?;
    let txn = TxnRequest {
        success: vec![
            op(Request::RequestPut(put_req("x", "1"))),
            put_keeping_value("missing"),
        ],
        ..Default::default()
    };
    assert_eq!(error_of(&f.apply(Op::Txn(txn))), Some(Error::KeyNotFound));
    assert_eq!(f.store.current_revision(), 1);
    assert!(f.get(get_req("x"))?.kvs.is_empty());
    Ok(())
}

/// A delete of every key from `k` on (its range ends at "\0").
fn delete_from(k: &str) -> RequestOp {
    op(Request::RequestDeleteRange(DeleteRangeRequest {
        key: k.into(),
        range_end: vec![0],
        ..Default::default()
    }))
}

/// A put of `k` that keeps its current value (so `k` must exist).
fn put_keeping_value(k: &str) -> RequestOp {
    op(Request::RequestPut(PutRequest {
        ignore_value: true,
        ..put_req(k, "")
    }))
}

/// A put that needs its key's previous version, after a delete of that key earlier in the same
/// txn (here a delete whose range ends at "\0", which etcd's duplicate-key check lets through,
/// and on which etcd 3.5 panics while applying), is refused whole: no op of the txn is written.
#[test]
fn a_put_needing_a_key_its_txn_deleted_first_fails_the_whole_txn() -> TestResult {
    let f = Fixture::new()?;
    f.put("b", "1");
    f.put("z", "1");
    let nested = TxnRequest {
        success: vec![
            op(Request::RequestPut(put_req("a", "new"))),
            delete_from("y"),
        ],
        ..Default::default()
    };
    for success in [
        vec![delete_from("c"), put_keeping_value("z")],
        vec![op(Request::RequestTxn(nested)), put_keeping_value("z")],
    ] {
        let txn = TxnRequest {
            success,
            ..Default::default()
        };
        assert_eq!(error_of(&f.apply(Op::Txn(txn))), Some(Error::KeyNotFound));
        assert_eq!(
            f.store.current_revision(),
            3,
            "nothing of the txn is written"
        );
        assert!(f.get(get_req("a"))?.kvs.is_empty());
        assert_eq!(f.get(get_req("z"))?.kvs.len(), 1);
    }
    // In the other order the put finds its key, then the delete removes it.
    let txn = TxnRequest {
        success: vec![put_keeping_value("z"), delete_from("c")],
        ..Default::default()
    };
    let Outcome::Txn(t) = f.apply(Op::Txn(txn)) else {
        return Err("txn failed".into());
    };
    assert!(t.succeeded);
    assert_eq!(f.store.current_revision(), 4);
    assert!(f.get(get_req("z"))?.kvs.is_empty());
    Ok(())
}

/// etcd checks every put of the chosen path before any range's revision, and both before what
/// the txn's own deletes change (bug 10's check comes last).
#[test]
fn txn_checks_come_in_etcds_order() -> TestResult {
    let f = Fixture::new()?;
    f.put("a", "1");
    f.put("a", "2");
    f.put("z", "1");
    let compacted = f.apply(Op::Compaction(CompactionRequest {
        revision: 3,
        ..Default::default()
    }));
    assert!(error_of(&compacted).is_none());
    let old_range = || {
        op(Request::RequestRange(RangeRequest {
            revision: 2,
            ..get_req("a")
        }))
    };
    let unknown_lease = op(Request::RequestPut(PutRequest {
        lease: 7,
        ..put_req("b", "1")
    }));
    for (success, expect) in [
        (vec![old_range(), unknown_lease], Error::LeaseNotFound),
        (
            vec![delete_from("c"), put_keeping_value("z"), old_range()],
            Error::Compacted,
        ),
    ] {
        let txn = TxnRequest {
            success,
            ..Default::default()
        };
        assert_eq!(error_of(&f.apply(Op::Txn(txn))), Some(expect));
    }
    assert_eq!(f.store.current_revision(), 4);
    Ok(())
}

/// etcd answers a nested txn with an empty header, present but all zero.
#[test]
fn a_nested_txn_answers_with_an_empty_header() -> TestResult {
    let f = Fixture::new()?;
    let txn = TxnRequest {
        success: vec![op(Request::RequestTxn(TxnRequest::default()))],
        ..Default::default()
    };
    let Outcome::Txn(t) = f.apply(Op::Txn(txn)) else {
        return Err("txn failed".into());
    };
    let Some(Response::ResponseTxn(nested)) = t.responses.first().and_then(|r| r.response.clone())
    else {
        return Err("no nested txn response".into());
    };
    assert_eq!(nested.header, Some(Default::default()));
    Ok(())
}
