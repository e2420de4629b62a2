//! MVCC rules as etcd defines them, checked through the apply path: revisions, versions,
//! tombstones, compaction, range options, and a storage failure while applying (txns:
//! `txn_tests`).

use super::*;
use crate::mvcc::{self, MvccStore};
use crate::pb::etcdserverpb::request_op::Request;
use crate::pb::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse, RequestOp,
    TxnRequest,
};
use crate::storage::{Space, Storage};

pub(super) type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

pub(super) struct Fixture {
    _dir: tempfile::TempDir,
    pub(super) store: MvccStore,
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

    pub(super) fn put(&self, k: &str, v: &str) -> i64 {
        match self.apply(Op::Put(put_req(k, v))) {
            Outcome::Put(r) => r.header.map_or(-1, |h| h.revision),
            _ => -1,
        }
    }

    pub(super) fn get(&self, req: RangeRequest) -> crate::error::Result<RangeResponse> {
        mvcc::range(&self.store.read()?, &req)
    }
}

pub(super) fn put_req(k: &str, v: &str) -> PutRequest {
    PutRequest {
        key: k.into(),
        value: v.into(),
        ..Default::default()
    }
}

pub(super) fn get_req(k: &str) -> RangeRequest {
    RangeRequest {
        key: k.into(),
        ..Default::default()
    }
}

pub(super) fn error_of(o: &Outcome) -> Option<Error> {
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

/// A store in `dir`, with its storage and auth store, holding `puts` (one log entry each,
/// committed in one batch).
fn store_with(
    dir: &std::path::Path,
    puts: &[(&str, &str)],
) -> std::result::Result<(Storage, MvccStore, AuthStore), Box<dyn std::error::Error>> {
    let storage = Storage::open(dir)?;
    let store = MvccStore::open(storage.clone())?;
    let auth = AuthStore::open(&storage, Default::default())?;
    let mut w = store.write()?;
    for (index, (k, v)) in (1..).zip(puts) {
        super::apply(&mut w, &auth, index, &Command::new(Op::Put(put_req(k, v))))?;
    }
    w.commit()?;
    Ok((storage, store, auth))
}

#[test]
fn history_and_index_survive_reopen() -> TestResult {
    let dir = tempfile::tempdir()?;
    store_with(dir.path(), &[("a", "1"), ("a", "2")])?;
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

pub(super) fn op(r: Request) -> RequestOp {
    RequestOp { request: Some(r) }
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
            let (storage, store, auth) = store_with(dir.path(), &[("a", "1"), ("b", "1")])?;
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
