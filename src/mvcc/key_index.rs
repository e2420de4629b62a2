//! The in-memory key index: for every key, the revisions at which it changed, with the metadata
//! a read needs (create revision, version, lease) so that only values come from disk.
//!
//! A key's history is a list of generations, written here as one flat list in which a tombstone
//! ends a generation. For example `put(2); put(3); delete(4); put(5)` gives
//!
//! ```text
//! rev 2.0  create 2  version 1
//! rev 3.0  create 2  version 2
//! rev 4.0  tombstone            <- ends the generation created at 2
//! rev 5.0  create 5  version 1  <- a new generation
//! ```
//!
//! Reading at revision `r` takes the last entry with `main <= r`; a tombstone means "absent".
//! `compact(c)` keeps, per key, the last entry at or below `c` (dropping it too if it is a
//! tombstone) and everything above `c`, so that every read at `r >= c` still gives the same answer.

use std::collections::BTreeMap;
use std::ops::Bound;

use smallvec::{smallvec, SmallVec};

use super::Revision;

/// One change of one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRevision {
    /// Where the change is stored.
    pub rev: Revision,
    /// The `create_revision` of the key's generation (0 for a tombstone).
    pub create_revision: i64,
    /// The key's version after this change (0 for a tombstone).
    pub version: i64,
    /// The lease the key is attached to (0 for none).
    pub lease: i64,
}

impl KeyRevision {
    /// A tombstone at `rev`.
    pub fn tombstone(rev: Revision) -> Self {
        KeyRevision {
            rev,
            create_revision: 0,
            version: 0,
            lease: 0,
        }
    }

    /// Whether this change deleted the key.
    pub fn is_tombstone(&self) -> bool {
        self.version == 0
    }
}

/// Which keys a request names, from etcd's `key`/`range_end` pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyRange {
    /// `range_end` empty: just `key`.
    Single(Vec<u8>),
    /// `range_end == "\0"`: every key `>= key`.
    From(Vec<u8>),
    /// Every key in `[key, range_end)`.
    Between(Vec<u8>, Vec<u8>),
}

impl KeyRange {
    /// Interprets etcd's `key`/`range_end` conventions.
    pub fn new(key: &[u8], range_end: &[u8]) -> Self {
        match range_end {
            [] => KeyRange::Single(key.to_vec()),
            [0] => KeyRange::From(key.to_vec()),
            end => KeyRange::Between(key.to_vec(), end.to_vec()),
        }
    }

    /// Whether `key` is inside the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        match self {
            KeyRange::Single(k) => k.as_slice() == key,
            KeyRange::From(k) => key >= k.as_slice(),
            KeyRange::Between(s, e) => key >= s.as_slice() && key < e.as_slice(),
        }
    }

    fn bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        match self {
            KeyRange::Single(k) => (Bound::Included(k), Bound::Included(k)),
            KeyRange::From(k) => (Bound::Included(k), Bound::Unbounded),
            KeyRange::Between(s, e) => (Bound::Included(s), Bound::Excluded(e)),
        }
    }

    fn is_empty(&self) -> bool {
        matches!(self, KeyRange::Between(s, e) if s >= e)
    }
}

/// One key's changes, oldest first. Most keys have one live revision after compaction, so one
/// is stored inline (no allocation of its own).
pub(super) type History = SmallVec<[KeyRevision; 1]>;

/// The keys of one span of the key space, from `start` (inclusive) to the next shard's start.
#[derive(Default, Debug)]
pub(super) struct Shard {
    pub(super) start: Box<[u8]>,
    pub(super) keys: BTreeMap<Box<[u8]>, History>,
}

/// Key → history, ordered by key.
///
/// The keys are split into shards by key span, each its own B-tree: at start the index is built
/// one shard at a time (see `index_build.rs`), so that building it never holds much more than
/// the index itself. Keys written later go to the shard whose span holds them.
#[derive(Debug)]
pub struct KeyIndex {
    /// In key order; the first starts at the empty key, so every key has a shard.
    shards: Vec<Shard>,
}

impl Default for KeyIndex {
    fn default() -> Self {
        KeyIndex {
            shards: vec![Shard::default()],
        }
    }
}

impl KeyIndex {
    /// An index of `shards`, given in key order, the first starting at the empty key.
    pub(super) fn from_shards(shards: Vec<Shard>) -> Self {
        debug_assert!(shards.first().is_some_and(|s| s.start.is_empty()));
        KeyIndex { shards }
    }

    /// The position of the shard whose span holds `key`.
    fn shard_of(&self, key: &[u8]) -> usize {
        self.shards
            .partition_point(|s| &*s.start <= key)
            .saturating_sub(1)
    }

    /// The state of `key` at main revision `at`, `None` if absent then.
    pub fn get(&self, key: &[u8], at: i64) -> Option<&KeyRevision> {
        visible(self.shards.get(self.shard_of(key))?.keys.get(key)?, at)
    }

    /// Every key of `range` present at `at`, in key order.
    pub fn range<'a>(
        &'a self,
        range: &'a KeyRange,
        at: i64,
    ) -> impl Iterator<Item = (&'a [u8], &'a KeyRevision)> + 'a {
        let (low, high) = range.bounds();
        let first = match low {
            Bound::Included(k) | Bound::Excluded(k) => self.shard_of(k),
            Bound::Unbounded => 0,
        };
        let shards = if range.is_empty() {
            &[][..]
        } else {
            self.shards.get(first..).unwrap_or_default()
        };
        shards
            .iter()
            .take_while(move |s| match high {
                Bound::Included(end) => &*s.start <= end,
                Bound::Excluded(end) => &*s.start < end,
                Bound::Unbounded => true,
            })
            .flat_map(move |s| s.keys.range::<[u8], _>((low, high)))
            .filter_map(move |(k, h)| visible(h, at).map(|kr| (&k[..], kr)))
    }

    /// Records a change of `key`; revisions must arrive in increasing order.
    pub fn push(&mut self, key: &[u8], change: KeyRevision) {
        let at = self.shard_of(key);
        let Some(shard) = self.shards.get_mut(at) else {
            return;
        };
        match shard.keys.get_mut(key) {
            Some(history) => history.push(change),
            None => {
                shard.keys.insert(key.into(), smallvec![change]);
            }
        }
    }

    /// Drops history that no read at `>= at` can see; returns the revisions whose records can
    /// be deleted from disk.
    pub fn compact(&mut self, at: i64) -> Vec<Revision> {
        self.compact_keys(b"", at, usize::MAX).0
    }

    /// [`KeyIndex::compact`] of at most `limit` keys from `from` on, in key order: a compaction
    /// done a step at a time, so that writers wait for one step at most. Returns the compacted
    /// revisions and the key to go on from (`None` once the last key is done).
    pub fn compact_keys(
        &mut self,
        from: &[u8],
        at: i64,
        limit: usize,
    ) -> (Vec<Revision>, Option<Box<[u8]>>) {
        let mut removed = Vec::new();
        let mut done = 0;
        let first = self.shard_of(from);
        for shard in self.shards.iter_mut().skip(first) {
            let mut emptied = Vec::new();
            let mut next = None;
            let span = (Bound::Included(from), Bound::Unbounded);
            for (key, history) in shard.keys.range_mut::<[u8], _>(span) {
                if done == limit {
                    next = Some(key.clone());
                    break;
                }
                let keep_from = compaction_keeps_from(history, at);
                removed.extend(history.drain(..keep_from).map(|kr| kr.rev));
                if history.is_empty() {
                    emptied.push(key.clone());
                }
                done += 1;
            }
            for key in emptied {
                shard.keys.remove(&key);
            }
            if next.is_some() {
                return (removed, next);
            }
        }
        (removed, None)
    }

    /// Every revision at or below `at` that a compaction at `at` keeps (at most one per key:
    /// its version at `at`), whether or not the index has been compacted yet.
    pub fn revisions_through(&self, at: i64) -> Vec<Revision> {
        self.shards
            .iter()
            .flat_map(|s| s.keys.values())
            .filter_map(|history| visible(history, at))
            .map(|kr| kr.rev)
            .collect()
    }

    /// Number of keys with any history (live or tombstoned).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.keys.len()).sum()
    }

    /// Whether no key has history.
    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| s.keys.is_empty())
    }

    /// How many shards the keys are split into.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Every key's history, shard after shard.
    #[cfg(test)]
    pub(super) fn shards_for_test(&self) -> impl Iterator<Item = &[KeyRevision]> {
        self.shards
            .iter()
            .flat_map(|s| s.keys.values())
            .map(|h| h.as_slice())
    }
}

/// The position of `history`'s last change at or below `at`, if any.
fn last_through(history: &[KeyRevision], at: i64) -> Option<usize> {
    history
        .partition_point(|kr| kr.rev.main <= at)
        .checked_sub(1)
}

/// Where the part of `history` that a compaction at `at` keeps begins: at its version at `at`,
/// or after it when that is a tombstone.
fn compaction_keeps_from(history: &[KeyRevision], at: i64) -> usize {
    last_through(history, at).map_or(0, |pos| {
        pos + usize::from(history.get(pos).is_some_and(KeyRevision::is_tombstone))
    })
}

/// `history`'s version at `at`, unless the key was deleted then (or did not exist yet).
fn visible(history: &[KeyRevision], at: i64) -> Option<&KeyRevision> {
    let kr = history.get(last_through(history, at)?)?;
    (!kr.is_tombstone()).then_some(kr)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A put at main revision `main` of a key created at `create`, now at `version`.
    pub(in crate::mvcc) fn put(main: i64, create: i64, version: i64) -> KeyRevision {
        KeyRevision {
            rev: Revision::new(main, 0),
            create_revision: create,
            version,
            lease: 0,
        }
    }

    fn sample() -> KeyIndex {
        let mut idx = KeyIndex::default();
        idx.push(b"a", put(2, 2, 1));
        idx.push(b"a", put(3, 2, 2));
        idx.push(b"a", KeyRevision::tombstone(Revision::new(4, 0)));
        idx.push(b"a", put(5, 5, 1));
        idx.push(b"b", put(3, 3, 1));
        idx
    }

    #[test]
    fn reads_follow_generations_and_tombstones() {
        let idx = sample();
        assert_eq!(idx.get(b"a", 1), None);
        assert_eq!(idx.get(b"a", 2).map(|k| k.version), Some(1));
        assert_eq!(idx.get(b"a", 3).map(|k| k.version), Some(2));
        assert_eq!(idx.get(b"a", 4), None, "a tombstone hides the key");
        assert_eq!(idx.get(b"a", 9).map(|k| k.create_revision), Some(5));
    }

    #[test]
    fn ranges_follow_etcd_conventions() {
        let idx = sample();
        let keys = |r: KeyRange, at| {
            idx.range(&r, at)
                .map(|(k, _)| k.to_vec())
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(KeyRange::new(b"a", b""), 3), vec![b"a".to_vec()]);
        assert_eq!(keys(KeyRange::new(b"a", b"\0"), 4), vec![b"b".to_vec()]);
        assert_eq!(keys(KeyRange::new(b"a", b"c"), 3).len(), 2);
        assert!(keys(KeyRange::new(b"c", b"a"), 3).is_empty());
    }

    #[test]
    fn compaction_keeps_every_read_at_or_above_it() {
        let mut idx = sample();
        let before: Vec<_> = (3..=6).map(|r| idx.get(b"a", r).copied()).collect();
        let removed = idx.compact(3);
        assert_eq!(removed, vec![Revision::new(2, 0)]);
        let after: Vec<_> = (3..=6).map(|r| idx.get(b"a", r).copied()).collect();
        assert_eq!(before, after);
        let removed = idx.compact(4);
        assert_eq!(removed, vec![Revision::new(3, 0), Revision::new(4, 0)]);
        assert_eq!(idx.get(b"a", 5).map(|k| k.version), Some(1));
    }

    #[test]
    fn building_from_changes_equals_pushing_them() {
        let changes = vec![
            (b"b".to_vec(), put(2, 2, 1)),
            (b"a".to_vec(), put(3, 3, 1)),
            (b"b".to_vec(), KeyRevision::tombstone(Revision::new(4, 0))),
            (b"a".to_vec(), put(5, 3, 2)),
            (b"b".to_vec(), put(6, 6, 1)),
        ];
        let mut pushed = KeyIndex::default();
        for (k, c) in &changes {
            pushed.push(k, *c);
        }
        let built = KeyIndex::build(
            changes
                .into_iter()
                .map(|(k, c)| (k.into_boxed_slice(), c))
                .collect(),
        );
        for at in 1..=7 {
            for key in [b"a", b"b"] {
                assert_eq!(built.get(key, at), pushed.get(key, at), "{key:?} at {at}");
            }
        }
        assert_eq!(built.len(), 2);
    }

    #[test]
    fn merging_two_spans_equals_pushing_them() {
        let changes = vec![
            (b"b".to_vec(), put(2, 2, 1)),
            (b"a".to_vec(), put(3, 3, 1)),
            (b"c".to_vec(), put(4, 4, 1)),
            (b"b".to_vec(), KeyRevision::tombstone(Revision::new(5, 0))),
            (b"a".to_vec(), put(6, 3, 2)),
            (b"d".to_vec(), put(7, 7, 1)),
            (b"b".to_vec(), put(8, 8, 1)),
        ];
        let mut pushed = KeyIndex::default();
        for (k, c) in &changes {
            pushed.push(k, *c);
        }
        let boxed = |span: &[(Vec<u8>, KeyRevision)]| {
            span.iter()
                .map(|(k, c)| (k.clone().into_boxed_slice(), *c))
                .collect::<crate::mvcc::Changes>()
        };
        let (older, newer) = changes.split_at(3);
        let mut built = boxed(older);
        built.append(boxed(newer));
        let built = KeyIndex::build(built);
        for at in 1..=9 {
            for key in [b"a", b"b", b"c", b"d"] {
                assert_eq!(built.get(key, at), pushed.get(key, at), "{key:?} at {at}");
            }
        }
        assert_eq!(built.len(), 4);
    }

    #[test]
    fn compaction_forgets_deleted_keys() {
        let mut idx = KeyIndex::default();
        idx.push(b"x", put(2, 2, 1));
        idx.push(b"x", KeyRevision::tombstone(Revision::new(3, 0)));
        assert_eq!(idx.compact(3).len(), 2);
        assert!(idx.is_empty());
    }
}
