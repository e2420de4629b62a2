//! etcd's `Range` semantics over any [`KvTxn`]: revision checks, count, limit and `more`,
//! mod/create revision filters, sorting, keys-only and count-only.

use std::cmp::Ordering;

use super::records::{key_value, stored_key_value};
use super::{KeyRange, KeyRevision, KvTxn};
use crate::error::{Error, Result};
use crate::pb::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::pb::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
use crate::pb::mvccpb::KeyValue;
use crate::storage::{Space, View};

/// Answers `req` as etcd 3.5 does. The header carries only the revision; the RPC layer fills in
/// the rest.
///
/// # Errors
/// [`Error::FutureRevision`], [`Error::Compacted`], [`Error::InvalidSortOption`], or a storage
/// failure.
pub fn range(txn: &impl KvTxn, req: &RangeRequest) -> Result<RangeResponse> {
    match plan(txn, req)? {
        Planned::Done(resp) => Ok(resp),
        Planned::Load(plan) => plan.finish(req, |key, change| txn.load(key, change)),
    }
}

/// What the key index alone decides about a range: the whole answer, or the entries whose
/// values are still to be read.
pub enum Planned<P = RangePlan> {
    /// Nothing to read: a count-only range.
    Done(RangeResponse),
    /// Values to read (then `finish`).
    Load(P),
}

/// A range resolved in the key index, and a view of the keyspaces taken with it, from which
/// its values are read without the state lock (see `MvccStore::range_off_lock`).
pub struct ViewRange {
    plan: RangePlan,
    view: View,
}

impl ViewRange {
    pub(super) fn new(plan: RangePlan, view: View) -> Self {
        Self { plan, view }
    }

    /// Reads the values from the view and completes the answer (see [`RangePlan::finish`]).
    ///
    /// # Errors
    /// A storage failure, or a record missing from the view.
    pub fn finish(self, req: &RangeRequest) -> Result<RangeResponse> {
        let view = self.view;
        self.plan.finish(req, |key, change| {
            stored_key_value(view.get(Space::Kv, &change.rev.to_bytes()), key, change)
        })
    }
}

/// A range resolved in the key index, its values not read yet.
pub struct RangePlan {
    header: Option<ResponseHeader>,
    count: i64,
    matches: Vec<(Vec<u8>, KeyRevision)>,
    order: SortOrder,
    target: SortTarget,
}

/// Resolves `req` in the key index of `txn` (revision checks, count, which entries to read).
///
/// # Errors
/// As [`range`], but never a storage failure.
pub fn plan(txn: &impl KvTxn, req: &RangeRequest) -> Result<Planned> {
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
    let mut matches = txn.index_range(&KeyRange::new(&req.key, &req.range_end), at);
    let count = matches.len() as i64;
    if req.count_only {
        return Ok(Planned::Done(RangeResponse {
            header,
            count,
            ..Default::default()
        }));
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
    matches.truncate(fetch);
    Ok(Planned::Load(RangePlan {
        header,
        count,
        matches,
        order,
        target,
    }))
}

impl RangePlan {
    /// Reads the planned entries with `load` (only their keys and metadata for a keys-only range
    /// that does not sort by value) and completes the answer: filters, sort, limit.
    ///
    /// # Errors
    /// The first error of `load`.
    pub fn finish(
        self,
        req: &RangeRequest,
        mut load: impl FnMut(&[u8], &KeyRevision) -> Result<KeyValue>,
    ) -> Result<RangeResponse> {
        let Self {
            header,
            count,
            matches,
            order,
            target,
        } = self;
        let values = !req.keys_only || target == SortTarget::Value;
        let mut kvs = Vec::with_capacity(matches.len());
        for (key, change) in &matches {
            kvs.push(if values {
                load(key, change)?
            } else {
                key_value(key, change, Vec::new())
            });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::MvccStore;
    use crate::storage::Storage;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    fn store() -> std::result::Result<(tempfile::TempDir, MvccStore), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = MvccStore::open(Storage::open(dir.path())?)?;
        Ok((dir, store))
    }

    fn put(store: &MvccStore, key: &[u8], value: &[u8]) -> TestResult {
        let mut w = store.write()?;
        w.put(key, value, 0)?;
        w.end_request();
        w.commit()?;
        Ok(())
    }

    fn get(key: &[u8], range_end: &[u8]) -> RangeRequest {
        RangeRequest {
            key: key.to_vec(),
            range_end: range_end.to_vec(),
            ..Default::default()
        }
    }

    /// Every shape of range answers the same off the lock as under it.
    #[test]
    fn a_range_off_the_lock_answers_as_one_under_it() -> TestResult {
        let (_dir, store) = store()?;
        for i in 0..20u8 {
            put(&store, &[b'k', b'a' + i], &[b'z' - i; 3])?;
        }
        for i in 0..5u8 {
            put(&store, &[b'k', b'a' + i], &[b'0' + i; 2])?;
        }
        let mut w = store.write()?;
        w.delete_range(&KeyRange::new(b"kc", b"ke"), false)?;
        w.end_request();
        w.compact(4)?;
        w.end_request();
        w.commit()?;
        let all = get(b"k", b"l");
        let descend = SortOrder::Descend as i32;
        let cases = [
            get(b"ka", b""),
            get(b"kc", b""),
            all.clone(),
            RangeRequest {
                limit: 3,
                ..all.clone()
            },
            RangeRequest {
                revision: 10,
                ..all.clone()
            },
            RangeRequest {
                revision: 2,
                ..all.clone()
            },
            RangeRequest {
                revision: 1000,
                ..all.clone()
            },
            RangeRequest {
                count_only: true,
                ..all.clone()
            },
            RangeRequest {
                keys_only: true,
                limit: 4,
                ..all.clone()
            },
            RangeRequest {
                keys_only: true,
                sort_target: SortTarget::Value as i32,
                sort_order: descend,
                ..all.clone()
            },
            RangeRequest {
                sort_target: SortTarget::Value as i32,
                sort_order: descend,
                limit: 5,
                ..all.clone()
            },
            RangeRequest {
                sort_target: SortTarget::Create as i32,
                min_mod_revision: 8,
                max_create_revision: 15,
                ..all.clone()
            },
            RangeRequest {
                sort_order: 9,
                ..all.clone()
            },
        ];
        for req in &cases {
            let locked = range(&store.read()?, req);
            assert_eq!(store.range_off_lock(req), locked, "{req:?}");
        }
        let keys_only = store.range_off_lock(&cases[8])?;
        assert_eq!(keys_only.kvs.len(), 4);
        assert!(keys_only.kvs.iter().all(|kv| kv.value.is_empty()));
        Ok(())
    }

    /// A planned range holds no lock: a write and a compaction that deletes the record it will
    /// read both go through meanwhile, and it still reads the value of its view.
    #[test]
    fn a_planned_range_lets_writes_through_and_reads_its_view() -> TestResult {
        let (_dir, store) = store()?;
        put(&store, b"k", b"old")?;
        let req = get(b"k", b"");
        let Planned::Load(planned) = store.plan_range(&req)? else {
            return Err("a get has values to read".into());
        };
        let (done, written) = std::sync::mpsc::channel();
        std::thread::scope(|scope| -> TestResult {
            let writer = scope.spawn(|| -> std::result::Result<(), String> {
                put(&store, b"k", b"new").map_err(|e| e.to_string())?;
                let mut w = store.write().map_err(|e| e.to_string())?;
                w.compact(3).map_err(|e| e.to_string())?;
                w.end_request();
                w.commit().map_err(|e| e.to_string())?;
                let _ = done.send(());
                Ok(())
            });
            let went_through = written
                .recv_timeout(std::time::Duration::from_secs(30))
                .is_ok();
            assert!(went_through, "the write waited for a planned range");
            writer.join().map_err(|_| "writer panicked")??;
            Ok(())
        })?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while store.compaction_pending() > 0 {
            assert!(std::time::Instant::now() < deadline, "compaction never ran");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let resp = planned.finish(&req)?;
        assert_eq!(resp.kvs.len(), 1);
        assert_eq!(resp.kvs[0].value, b"old");
        assert_eq!(resp.kvs[0].mod_revision, 2);
        assert_eq!(store.range_off_lock(&req)?.kvs[0].value, b"new");
        Ok(())
    }
}
