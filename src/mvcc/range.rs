//! etcd's `Range` semantics over any [`KvTxn`]: revision checks, count, limit and `more`,
//! mod/create revision filters, sorting, keys-only and count-only.

use std::cmp::Ordering;

use super::records::key_value;
use super::store::stored_key_value;
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
        Planned::Load(plan) => finish(&plan, req, |key, change| txn.load(key, change)),
    }
}

/// A range's answer once the index is read: complete (a count), or the values to load.
pub(super) enum Planned {
    /// Nothing to load.
    Done(RangeResponse),
    /// The matching keys' index entries, their values still to load (see [`finish`]).
    Load(Plan),
}

/// What the index gave a range: its header, its count and the matches to load.
pub(super) struct Plan {
    header: Option<ResponseHeader>,
    count: i64,
    matches: Vec<(Vec<u8>, KeyRevision)>,
    order: SortOrder,
    target: SortTarget,
}

impl Plan {
    /// How many values finishing the range would read (none for a keys-only range that does not
    /// sort by value).
    pub(super) fn values_to_read(&self, req: &RangeRequest) -> usize {
        if reads_values(req, self.target) {
            self.matches.len()
        } else {
            0
        }
    }
}

/// Whether a range reads values: a keys-only answer that does not sort by value needs none (the
/// metadata comes from the index), so none is read (a disk read each, when not cached).
fn reads_values(req: &RangeRequest, target: SortTarget) -> bool {
    !req.keys_only || target == SortTarget::Value
}

/// A range begun by [`super::MvccStore::range_start`].
pub enum RangeStart {
    /// Answered.
    Done(RangeResponse),
    /// Its values still to read.
    Pending(PendingRange),
}

/// A range whose key-index part is done, its values to read from the view of the store taken
/// with it (no lock held).
pub struct PendingRange {
    plan: Plan,
    view: View,
}

impl PendingRange {
    pub(super) fn new(plan: Plan, view: View) -> Self {
        PendingRange { plan, view }
    }

    /// How many values [`Self::finish`] reads for `req`.
    pub fn values(&self, req: &RangeRequest) -> usize {
        self.plan.values_to_read(req)
    }

    /// Reads the values and answers the range as [`range`] does. The view stays with `self`:
    /// where it is dropped, fjall's snapshot tracker takes a lock, so a thread of low priority
    /// should hand it back rather than drop it.
    ///
    /// # Errors
    /// A storage failure.
    pub fn finish(&self, req: &RangeRequest) -> Result<RangeResponse> {
        finish(&self.plan, req, |key, change| {
            let read = self.view.get_shared(Space::Kv, &change.rev.to_bytes());
            stored_key_value(read, key, change)
        })
    }
}

/// The part of a range that reads the key index (under the state's lock, in `txn`).
pub(super) fn plan(txn: &impl KvTxn, req: &RangeRequest) -> Result<Planned> {
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
    let range = KeyRange::new(&req.key, &req.range_end);
    let filtered = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    // As etcd: fetch everything when sorting or filtering, else one more than the limit (and
    // only count the rest); nothing but the count for count-only.
    let (count, matches) = if req.count_only {
        txn.index_page(&range, at, 0)
    } else if order != SortOrder::None || filtered || req.limit <= 0 {
        let all = txn.index_range(&range, at);
        (all.len(), all)
    } else {
        let take = usize::try_from(req.limit.saturating_add(1)).unwrap_or(usize::MAX);
        txn.index_page(&range, at, take)
    };
    let count = i64::try_from(count).unwrap_or(i64::MAX);
    if req.count_only {
        return Ok(Planned::Done(RangeResponse {
            header,
            count,
            ..Default::default()
        }));
    }
    Ok(Planned::Load(Plan {
        header,
        count,
        matches,
        order,
        target,
    }))
}

/// The part of a range that reads values (with `load`, which needs no lock of the state),
/// filters, sorts and limits.
pub(super) fn finish(
    plan: &Plan,
    req: &RangeRequest,
    load: impl Fn(&[u8], &KeyRevision) -> Result<KeyValue>,
) -> Result<RangeResponse> {
    let (order, target) = (plan.order, plan.target);
    let values = reads_values(req, target);
    let mut kvs = Vec::with_capacity(plan.matches.len());
    for (key, change) in &plan.matches {
        kvs.push(if values {
            load(key, change)?
        } else {
            key_value(key, change, bytes::Bytes::new())
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
        header: plan.header,
        kvs,
        more,
        count: plan.count,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::MvccStore;
    use crate::storage::Storage;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

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

    /// A large range (and a page of it) answers every key with its own value, in key order,
    /// as single-key gets do; a page counts the keys after it without returning them.
    #[test]
    fn a_large_range_and_its_pages_keep_every_value_in_order() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = MvccStore::open(Storage::open(dir.path())?)?;
        let key = |i: u32| format!("k{i:05}").into_bytes();
        for i in 0..700u32 {
            put(&store, &key(i), format!("value of {i}").as_bytes())?;
        }
        for i in (0..700u32).step_by(3) {
            put(&store, &key(i), format!("second value of {i}").as_bytes())?;
        }
        let whole = range(&store.read()?, &get(b"k", b"l"))?;
        assert_eq!(whole.count, 700);
        assert_eq!(whole.kvs.len(), 700);
        for (i, kv) in (0..700u32).zip(&whole.kvs) {
            let single = range(&store.read()?, &get(&key(i), b""))?;
            assert_eq!(Some(kv), single.kvs.first(), "key {i}");
        }
        let page = range(
            &store.read()?,
            &RangeRequest {
                limit: 500,
                ..get(&key(100), b"l")
            },
        )?;
        assert_eq!((page.kvs.len(), page.more, page.count), (500, true, 600));
        assert_eq!(page.kvs[..], whole.kvs[100..600]);
        Ok(())
    }

    /// A keys-only range reads no values, yet answers as the same range with values does, its
    /// values left empty: in every shape (limits, revisions, sorts, filters, errors).
    #[test]
    fn a_keys_only_range_answers_as_the_full_one_without_values() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = MvccStore::open(Storage::open(dir.path())?)?;
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
                limit: 4,
                ..all.clone()
            },
            RangeRequest {
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
        let read = store.read()?;
        for full in &cases {
            let keys_only = RangeRequest {
                keys_only: true,
                ..full.clone()
            };
            let expected = range(&read, full).map(|mut resp| {
                for kv in &mut resp.kvs {
                    kv.value.clear();
                }
                resp
            });
            assert_eq!(range(&read, &keys_only), expected, "{keys_only:?}");
        }
        let limited = range(
            &read,
            &RangeRequest {
                keys_only: true,
                ..cases[8].clone()
            },
        )?;
        assert_eq!(limited.kvs.len(), 4);
        assert!(limited.kvs.iter().all(|kv| kv.value.is_empty()));
        drop(read);
        // Read off the state's lock (values from a snapshot), each answer is the same, whether
        // the range is answered at once or left pending.
        for req in &cases {
            let expected = range(&store.read()?, req);
            for pending_from in [0, 1, 3, usize::MAX] {
                let got = store.range_start(req, pending_from).and_then(|s| match s {
                    crate::mvcc::RangeStart::Done(resp) => Ok(resp),
                    crate::mvcc::RangeStart::Pending(p) => p.finish(req),
                });
                assert_eq!(got, expected, "{req:?} pending from {pending_from}");
            }
        }
        Ok(())
    }

    #[test]
    fn a_pending_range_reads_what_it_started_at_even_once_compacted_and_small_ones_answer_at_once(
    ) -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = MvccStore::open(Storage::open(dir.path())?)?;
        for i in 0..5u8 {
            put(&store, &[b'k', i], b"old")?;
        }
        let all = get(b"k", b"l");
        assert!(matches!(store.range_start(&all, 6)?, RangeStart::Done(r) if r.kvs.len() == 5));
        let RangeStart::Pending(pending) = store.range_start(&all, 5)? else {
            return Err("five values to read, pending from five: not left pending".into());
        };
        assert_eq!(pending.values(&all), 5);
        // Overwritten, added, then compacted and the old records deleted: the pending range
        // reads them through its view all the same.
        put(&store, b"k\x02", b"new")?;
        put(&store, b"k\x09", b"added")?;
        let mut w = store.write()?;
        w.compact(w.read_revision())?;
        w.commit()?;
        crate::mvcc::garbage::tests::wait_drained(&store)?;
        let at_start = RangeRequest {
            revision: 6,
            ..all.clone()
        };
        assert_eq!(
            range(&store.read()?, &at_start),
            Err(Error::Compacted),
            "the live store no longer holds that revision"
        );
        let resp = pending.finish(&all)?;
        assert_eq!(
            resp.kvs.len(),
            5,
            "a key added after the start is not in it"
        );
        assert!(resp.kvs.iter().all(|kv| kv.value.as_ref() == b"old"));
        assert_eq!(resp.header.map(|h| h.revision), Some(6));
        Ok(())
    }
}
