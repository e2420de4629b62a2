//! MVCC rules as etcd defines them, checked through the apply path: revisions, versions,
//! tombstones, compaction and txn evaluation.

use super::*;
use crate::mvcc::{self, MvccStore};
use crate::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::pb::etcdserverpb::request_op::Request;
use crate::pb::etcdserverpb::response_op::Response;
use crate::pb::etcdserverpb::{
    CompactionRequest, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse,
    RequestOp, TxnRequest,
};
use crate::storage::{Space, Storage};

type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

pub(super) struct Fixture {
    _dir: tempfile::TempDir,
    store: MvccStore,
    pub(super) auth: AuthStore,
}

impl Fixture {
    pub(super) fn new() -> std::result::Result<Self, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let storage = Storage::open(dir.path())?;
        let store = MvccStore::open(storage.clone())?;
        let auth = AuthStore::open(&storage, Default::default())?;
        Ok(Fixture {
            _dir: dir,
            store,
            auth,
        })
    }

    pub(super) fn apply(&self, op: Op) -> Outcome {
        self.apply_cmd(&Command::new(op))
    }

    pub(super) fn apply_cmd(&self, cmd: &Command) -> Outcome {
        let Ok(mut w) = self.store.write() else {
            return Outcome::Error(0);
        };
        let Ok(r) = super::apply(&mut w, &self.auth, 1, cmd) else {
            return Outcome::Error(0);
        };
        if w.commit().is_err() {
            return Outcome::Error(0);
        }
        r.result.unwrap_or(Outcome::Error(0))
    }

    fn put(&self, k: &str, v: &str) -> i64 {
        match self.apply(Op::Put(put_req(k, v))) {
            Outcome::Put(r) => r.header.map_or(-1, |h| h.revision),
            _ => -1,
        }
    }

    fn get(&self, req: RangeRequest) -> crate::error::Result<RangeResponse> {
        mvcc::range(&self.store.read()?, &req)
    }
}

fn put_req(k: &str, v: &str) -> PutRequest {
    PutRequest {
        key: k.into(),
        value: v.into(),
        ..Default::default()
    }
}

fn get_req(k: &str) -> RangeRequest {
    RangeRequest {
        key: k.into(),
        ..Default::default()
    }
}

fn error_of(o: &Outcome) -> Option<Error> {
    match o {
        Outcome::Error(c) => Some(Error::from_code(*c)),
        _ => None,
    }
}

#[test]
fn each_mutation_takes_one_revision_and_versions_count_from_creation() -> TestResult {
    let f = Fixture::new()?;
    assert_eq!(
        f.store.current_revision(),
        1,
        "an empty store is at revision 1"
    );
    assert_eq!(f.put("a", "1"), 2);
    assert_eq!(f.put("a", "2"), 3);
    assert_eq!(f.put("b", "1"), 4);
    let kv = f.get(get_req("a"))?.kvs.remove(0);
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
    Ok(())
}

#[test]
fn a_tombstone_ends_a_generation() -> TestResult {
    let f = Fixture::new()?;
    f.put("a", "1");
    let del = f.apply(Op::DeleteRange(DeleteRangeRequest {
        key: "a".into(),
        prev_kv: true,
        ..Default::default()
    }));
    let Outcome::DeleteRange(d) = del else {
        return Err("delete failed".into());
    };
    assert_eq!((d.deleted, d.prev_kvs.len()), (1, 1));
    assert_eq!(d.header.map(|h| h.revision), Some(3));
    assert_eq!(f.put("a", "2"), 4);
    let kv = f.get(get_req("a"))?.kvs.remove(0);
    assert_eq!((kv.create_revision, kv.version), (4, 1));
    let old = f.get(RangeRequest {
        revision: 3,
        ..get_req("a")
    })?;
    assert!(old.kvs.is_empty());
    Ok(())
}

#[test]
fn deleting_nothing_keeps_the_revision() -> TestResult {
    let f = Fixture::new()?;
    f.put("a", "1");
    let del = f.apply(Op::DeleteRange(DeleteRangeRequest {
        key: "zzz".into(),
        ..Default::default()
    }));
    let Outcome::DeleteRange(d) = del else {
        return Err("delete failed".into());
    };
    assert_eq!((d.deleted, d.header.map(|h| h.revision)), (0, Some(2)));
    assert_eq!(f.store.current_revision(), 2);
    Ok(())
}

#[test]
fn compaction_rejects_old_reads_and_keeps_newer_ones() -> TestResult {
    let f = Fixture::new()?;
    for i in 0..5 {
        f.put("k", &i.to_string());
    }
    let c = f.apply(Op::Compaction(CompactionRequest {
        revision: 4,
        physical: false,
    }));
    assert!(matches!(c, Outcome::Compaction(_)));
    let old = RangeRequest {
        revision: 3,
        ..get_req("k")
    };
    assert_eq!(f.get(old).err(), Some(Error::Compacted));
    let at4 = f.get(RangeRequest {
        revision: 4,
        ..get_req("k")
    })?;
    assert_eq!(
        at4.kvs.first().map(|kv| kv.value.clone()),
        Some(b"2".to_vec().into())
    );
    // HashKV hashes at the compacted revision itself, as etcd's (only below it is compacted).
    assert!(f.store.hash_kv(4).is_ok());
    assert_eq!(f.store.hash_kv(3).err(), Some(Error::Compacted));
    let again = f.apply(Op::Compaction(CompactionRequest {
        revision: 4,
        physical: true,
    }));
    assert_eq!(error_of(&again), Some(Error::Compacted));
    let future = f.apply(Op::Compaction(CompactionRequest {
        revision: 100,
        physical: false,
    }));
    assert_eq!(error_of(&future), Some(Error::FutureRevision));
    let future_read = RangeRequest {
        revision: 100,
        ..get_req("k")
    };
    assert_eq!(f.get(future_read).err(), Some(Error::FutureRevision));
    Ok(())
}

#[test]
fn history_and_index_survive_reopen() -> TestResult {
    let dir = tempfile::tempdir()?;
    {
        let storage = Storage::open(dir.path())?;
        let store = MvccStore::open(storage.clone())?;
        let auth = AuthStore::open(&storage, Default::default())?;
        let mut w = store.write()?;
        super::apply(&mut w, &auth, 1, &Command::new(Op::Put(put_req("a", "1"))))?;
        super::apply(&mut w, &auth, 2, &Command::new(Op::Put(put_req("a", "2"))))?;
        w.commit()?;
    }
    let store = MvccStore::open(Storage::open(dir.path())?)?;
    assert_eq!(store.current_revision(), 3);
    let r = mvcc::range(
        &store.read()?,
        &RangeRequest {
            revision: 2,
            ..get_req("a")
        },
    )?;
    assert_eq!(
        r.kvs.first().map(|kv| kv.value.clone()),
        Some(b"1".to_vec().into())
    );
    Ok(())
}

#[test]
fn put_flags_follow_etcd() -> TestResult {
    let f = Fixture::new()?;
    let missing = f.apply(Op::Put(PutRequest {
        ignore_value: true,
        ..put_req("a", "")
    }));
    assert_eq!(error_of(&missing), Some(Error::KeyNotFound));
    let lease = f.apply(Op::Put(PutRequest {
        lease: 7,
        ..put_req("a", "x")
    }));
    assert_eq!(error_of(&lease), Some(Error::LeaseNotFound));
    // Both wrong: a put of its own is checked for its lease first, as etcd's applier does.
    let both = f.apply(Op::Put(PutRequest {
        ignore_value: true,
        lease: 7,
        ..put_req("a", "")
    }));
    assert_eq!(error_of(&both), Some(Error::LeaseNotFound));
    assert_eq!(f.store.current_revision(), 1, "failed puts change nothing");
    f.put("a", "keep");
    let r = f.apply(Op::Put(PutRequest {
        ignore_value: true,
        prev_kv: true,
        ..put_req("a", "")
    }));
    let Outcome::Put(p) = r else {
        return Err("put failed".into());
    };
    assert_eq!(p.prev_kv.map(|kv| kv.value), Some(b"keep".to_vec().into()));
    let kv = f.get(get_req("a"))?.kvs.remove(0);
    assert_eq!((kv.value, kv.version), (b"keep".to_vec().into(), 2));
    Ok(())
}

fn op(r: Request) -> RequestOp {
    RequestOp { request: Some(r) }
}

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

/// A record that cannot be read back while a request is applied (here removed from the disk
/// behind the store's back) fails the apply, whether the request wrote before the failure (a
/// txn, a delete range part-way) or not (a put reading its previous value first): nothing of
/// it is committed, and the restarted store holds the state before the request. A request that
/// had changed the state in memory leaves the store refusing every read until then.
/// (Before, the request answered an error with its earlier writes committed, and the other
/// members, whose disks read, applied it whole.)
#[test]
fn a_storage_failure_while_applying_commits_nothing_and_stops_reads() -> TestResult {
    let with_prev = |k: &str| PutRequest {
        prev_kv: true,
        ..put_req(k, "new")
    };
    let requests = [
        (
            Op::Txn(TxnRequest {
                success: vec![
                    op(Request::RequestPut(put_req("x", "1"))),
                    op(Request::RequestPut(with_prev("b"))),
                ],
                ..Default::default()
            }),
            true,
        ),
        (
            Op::DeleteRange(DeleteRangeRequest {
                key: "a".into(),
                range_end: "c".into(),
                prev_kv: true,
            }),
            true,
        ),
        (Op::Put(with_prev("b")), false),
    ];
    for (request, wrote_first) in requests {
        let dir = tempfile::tempdir()?;
        {
            let storage = Storage::open(dir.path())?;
            let store = MvccStore::open(storage.clone())?;
            let auth = AuthStore::open(&storage, Default::default())?;
            let mut w = store.write()?;
            super::apply(&mut w, &auth, 1, &Command::new(Op::Put(put_req("a", "1"))))?;
            super::apply(&mut w, &auth, 2, &Command::new(Op::Put(put_req("b", "1"))))?;
            w.commit()?;
            // b's record (revision 3) lost.
            let mut lose = storage.batch();
            lose.remove(Space::Kv, &mvcc::Revision::new(3, 0).to_bytes());
            lose.commit()?;

            let mut w = store.write()?;
            let applied = super::apply(&mut w, &auth, 3, &Command::new(request.clone()));
            assert!(applied.is_err(), "{request:?} answered {applied:?}");
            drop(w);
            let refused = wrote_first.then_some(Error::Storage);
            assert_eq!(store.read().err(), refused, "{request:?}");
        }
        let store = MvccStore::open(Storage::open(dir.path())?)?;
        assert_eq!(store.current_revision(), 3, "{request:?}");
        let read = store.read()?;
        assert!(mvcc::range(&read, &get_req("x"))?.kvs.is_empty());
        assert_eq!(mvcc::range(&read, &get_req("a"))?.kvs.len(), 1);
    }
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

#[test]
fn range_options_limit_sort_and_filters() -> TestResult {
    use crate::pb::etcdserverpb::range_request::{SortOrder, SortTarget};
    let f = Fixture::new()?;
    f.put("k1", "c");
    f.put("k2", "b");
    f.put("k3", "a");
    f.put("k2", "bb");
    let all = |extra: RangeRequest| RangeRequest {
        key: "k".into(),
        range_end: "l".into(),
        ..extra
    };
    let r = f.get(all(RangeRequest {
        limit: 2,
        ..Default::default()
    }))?;
    assert_eq!((r.kvs.len(), r.more, r.count), (2, true, 3));
    let r = f.get(all(RangeRequest {
        sort_target: SortTarget::Value as i32,
        sort_order: SortOrder::Descend as i32,
        ..Default::default()
    }))?;
    let vals: Vec<_> = r.kvs.iter().map(|kv| kv.value.clone()).collect();
    assert_eq!(vals, vec![b"c".to_vec(), b"bb".to_vec(), b"a".to_vec()]);
    let r = f.get(all(RangeRequest {
        min_mod_revision: 4,
        keys_only: true,
        ..Default::default()
    }))?;
    assert_eq!(r.kvs.len(), 2);
    assert!(r.kvs.iter().all(|kv| kv.value.is_empty()));
    let r = f.get(all(RangeRequest {
        count_only: true,
        ..Default::default()
    }))?;
    assert_eq!((r.kvs.len(), r.count), (0, 3));
    let r = f.get(all(RangeRequest {
        count_only: true,
        limit: 1,
        ..Default::default()
    }))?;
    assert_eq!(
        (r.kvs.len(), r.count, r.more),
        (0, 3, false),
        "a limit does not cut the count"
    );
    let r = f.get(all(RangeRequest {
        limit: 3,
        ..Default::default()
    }))?;
    assert_eq!(
        (r.kvs.len(), r.more, r.count),
        (3, false, 3),
        "a limit at the count: no more"
    );
    let r = f.get(RangeRequest {
        key: "k2".into(),
        range_end: vec![0],
        ..Default::default()
    })?;
    assert_eq!(r.count, 2, "range_end \\0 means every key from key on");
    let bad = f.get(all(RangeRequest {
        sort_order: 9,
        ..Default::default()
    }));
    assert_eq!(bad.err(), Some(Error::InvalidSortOption));
    Ok(())
}
