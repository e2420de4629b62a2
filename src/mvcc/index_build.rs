//! Building the [`KeyIndex`] from the stored changes (at start and after a snapshot install) in
//! about the memory of the index itself.
//!
//! The changes arrive in revision order, in chunks. Shard bounds are placed from a sample of
//! their keys so that each shard gets about [`SHARD_CHANGES`] changes; the chunks are dealt out
//! to their shards, each freed once dealt; then each shard is sorted by key and built as a
//! B-tree from sorted input (full nodes), two shards at a time on two threads, each shard's
//! changes freed once its tree is built. At its worst this holds the changes not yet built, the
//! trees built so far and two shards in the making. Sorting all the changes at once, as before,
//! held the changes, their sorted copy and the whole tree together: two to three times the
//! index.

use std::collections::BTreeMap;

use smallvec::smallvec;

use super::key_index::{History, Shard};
use super::{KeyIndex, KeyRevision};

/// Changes per chunk as read from disk.
const CHUNK: usize = 1 << 16;
/// Changes per shard that the bounds aim at.
const SHARD_CHANGES: usize = 1 << 16;
/// Keys sampled per shard to place its bounds.
const SAMPLES_PER_SHARD: usize = 16;

/// One change of one key, as read.
type Change = (Box<[u8]>, KeyRevision);

/// One shard's B-tree.
type Tree = BTreeMap<Box<[u8]>, History>;

/// Changes in revision order, held in chunks of bounded size.
#[derive(Default, Debug)]
pub struct Changes {
    chunks: Vec<Vec<Change>>,
    len: usize,
}

impl Changes {
    /// Adds a change later than every change held.
    pub fn push(&mut self, key: Box<[u8]>, change: KeyRevision) {
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < CHUNK => chunk.push((key, change)),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push((key, change));
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    /// Adds `later`, whose changes all come after these.
    pub fn append(&mut self, later: Changes) {
        self.chunks.extend(later.chunks);
        self.len += later.len;
    }

    /// How many changes are held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.chunks.iter().flatten().map(|(key, _)| &**key)
    }
}

impl FromIterator<Change> for Changes {
    fn from_iter<I: IntoIterator<Item = Change>>(changes: I) -> Self {
        let mut all = Changes::default();
        for (key, change) in changes {
            all.push(key, change);
        }
        all
    }
}

impl KeyIndex {
    /// Builds the index from `changes`, in shards of about [`SHARD_CHANGES`] changes.
    pub fn build(changes: Changes) -> Self {
        Self::build_in_shards(changes, SHARD_CHANGES)
    }

    /// Builds the index from `changes`, in shards of about `per_shard` changes.
    pub fn build_in_shards(changes: Changes, per_shard: usize) -> Self {
        let starts = shard_starts(&changes, per_shard);
        let trees = build_trees(deal(changes, &starts));
        let starts = std::iter::once(Box::default()).chain(starts);
        KeyIndex::from_shards(
            starts
                .zip(trees)
                .map(|(start, keys)| Shard { start, keys })
                .collect(),
        )
    }
}

/// The start keys of every shard but the first (which starts at the empty key), strictly
/// increasing, placed at even steps through a sorted sample of the changes' keys (a key changed
/// often is sampled often, so shards hold about as many changes each).
fn shard_starts(changes: &Changes, per_shard: usize) -> Vec<Box<[u8]>> {
    let shards = changes.len().div_ceil(per_shard.max(1));
    if shards <= 1 {
        return Vec::new();
    }
    let stride = (changes.len() / (shards * SAMPLES_PER_SHARD)).max(1);
    let mut sample: Vec<&[u8]> = changes.keys().step_by(stride).collect();
    sample.sort_unstable();
    let mut starts: Vec<Box<[u8]>> = (1..shards)
        .filter_map(|i| sample.get(i * sample.len() / shards))
        .filter(|key| !key.is_empty())
        .map(|key| Box::from(*key))
        .collect();
    starts.dedup();
    starts
}

/// Deals the changes out to the shards starting at the empty key and at each of `starts`,
/// each shard's in revision order; each chunk is freed once dealt.
fn deal(changes: Changes, starts: &[Box<[u8]>]) -> Vec<Vec<Change>> {
    let mut shards: Vec<Vec<Change>> = (0..=starts.len()).map(|_| Vec::new()).collect();
    for chunk in changes.chunks {
        for (key, change) in chunk {
            let at = starts.partition_point(|start| **start <= *key);
            if let Some(shard) = shards.get_mut(at) {
                shard.push((key, change));
            }
        }
    }
    shards
}

/// The trees of the shards' changes, in order, built on two threads.
fn build_trees(mut shards: Vec<Vec<Change>>) -> Vec<Tree> {
    let upper = shards.split_off(shards.len() / 2);
    let (mut lower, upper) = std::thread::scope(|scope| {
        let upper = scope.spawn(move || upper.into_iter().map(tree).collect::<Vec<_>>());
        let lower = shards.into_iter().map(tree).collect::<Vec<_>>();
        (lower, upper.join())
    });
    match upper {
        Ok(upper) => lower.extend(upper),
        // Sorting and building panic only on a bug: let it surface as it would have.
        Err(panic) => std::panic::resume_unwind(panic),
    }
    lower
}

/// The tree of one shard's changes, given in revision order.
fn tree(mut changes: Vec<Change>) -> Tree {
    // Stable: each key's changes keep their revision order.
    changes.sort_by(|a, b| a.0.cmp(&b.0));
    let mut grouped: Vec<(Box<[u8]>, History)> = Vec::with_capacity(changes.len());
    for (key, change) in changes {
        match grouped.last_mut() {
            Some((last, history)) if *last == key => history.push(change),
            _ => grouped.push((key, smallvec![change])),
        }
    }
    // Sorted and unique already: the tree is built from the input without another sort.
    grouped.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::key_index::tests::put;
    use crate::mvcc::{KeyRange, Revision};

    /// Changes of 40 keys over 400 revisions: puts, deletes and puts again, some keys often.
    fn history() -> Vec<(Vec<u8>, KeyRevision)> {
        let mut versions: BTreeMap<Vec<u8>, (i64, i64)> = BTreeMap::new();
        (2..402)
            .map(|main: i64| {
                let n = (main * 7919) % 40;
                let key = format!("k{:02}", if n % 3 == 0 { n % 4 } else { n }).into_bytes();
                let (create, version) = versions.get(&key).copied().unwrap_or((0, 0));
                let change = if version > 0 && main % 5 == 0 {
                    versions.remove(&key);
                    KeyRevision::tombstone(Revision::new(main, 0))
                } else {
                    let create = if version == 0 { main } else { create };
                    versions.insert(key.clone(), (create, version + 1));
                    put(main, create, version + 1)
                };
                (key, change)
            })
            .collect()
    }

    fn pushed(changes: &[(Vec<u8>, KeyRevision)]) -> KeyIndex {
        let mut index = KeyIndex::default();
        for (key, change) in changes {
            index.push(key, *change);
        }
        index
    }

    fn built(changes: &[(Vec<u8>, KeyRevision)], per_shard: usize) -> KeyIndex {
        let changes = changes
            .iter()
            .map(|(k, c)| (k.clone().into_boxed_slice(), *c));
        KeyIndex::build_in_shards(changes.collect(), per_shard)
    }

    fn keys(index: &KeyIndex, range: &KeyRange, at: i64) -> Vec<(Vec<u8>, KeyRevision)> {
        index
            .range(range, at)
            .map(|(k, kr)| (k.to_vec(), *kr))
            .collect()
    }

    #[test]
    fn built_in_many_shards_reads_as_pushed() {
        let changes = history();
        let expected = pushed(&changes);
        for per_shard in [1, 7, 50, 1000] {
            let index = built(&changes, per_shard);
            assert!(index.shard_count() > 1 || per_shard == 1000, "{per_shard}");
            assert_eq!(index.len(), expected.len());
            let ranges = [
                KeyRange::From(Vec::new()),
                KeyRange::From(b"k10".to_vec()),
                KeyRange::Between(b"k05".to_vec(), b"k33".to_vec()),
                KeyRange::Between(b"k1".to_vec(), b"k2".to_vec()),
                KeyRange::Single(b"k17".to_vec()),
                KeyRange::Single(b"k99".to_vec()),
            ];
            for at in (1..403).step_by(13) {
                for range in &ranges {
                    assert_eq!(
                        keys(&index, range, at),
                        keys(&expected, range, at),
                        "{range:?} at {at} in shards of {per_shard}"
                    );
                }
            }
        }
    }

    #[test]
    fn writes_and_compaction_after_a_sharded_build_read_as_pushed() {
        let changes = history();
        let (older, newer) = changes.split_at(250);
        let mut index = built(older, 10);
        assert!(index.shard_count() > 5);
        for (key, change) in newer {
            index.push(key, *change);
        }
        index.push(b"a-first", put(402, 402, 1));
        index.push(b"z-last", put(403, 403, 1));
        let mut expected = pushed(&changes);
        expected.push(b"a-first", put(402, 402, 1));
        expected.push(b"z-last", put(403, 403, 1));
        let all = KeyRange::From(Vec::new());
        assert_eq!(keys(&index, &all, 403), keys(&expected, &all, 403));
        assert_eq!(
            index.revisions_through(300),
            expected.revisions_through(300)
        );
        let kept_before = index.revisions_through(300);
        // A few keys at a time, as the background compaction does, with reads between steps.
        let mut removed = Vec::new();
        let mut from: Option<Box<[u8]>> = Some(Box::default());
        let mut steps = 0;
        while let Some(key) = from.take() {
            let (step, next) = index.compact_keys(&key, 300, 7);
            removed.extend(step);
            from = next;
            steps += 1;
            for at in [300, 350, 403] {
                assert_eq!(keys(&index, &all, at), keys(&expected, &all, at), "at {at}");
            }
            assert_eq!(
                index.revisions_through(300),
                kept_before,
                "after step {steps}"
            );
        }
        assert!(steps > 1, "{steps} steps");
        let mut expected_removed = expected.compact(300);
        removed.sort();
        expected_removed.sort();
        assert_eq!(removed, expected_removed);
        // Compacted, each key holds at most its version at 300 at or below it.
        let mut through = index.revisions_through(300);
        let mut all_through: Vec<Revision> = index
            .shards_for_test()
            .flat_map(|history| history.iter().filter(|kr| kr.rev.main <= 300))
            .map(|kr| kr.rev)
            .collect();
        through.sort();
        all_through.sort();
        assert_eq!(through, all_through);
        for at in [300, 350, 403] {
            assert_eq!(keys(&index, &all, at), keys(&expected, &all, at), "at {at}");
        }
        assert_eq!(index.len(), expected.len());
    }

    #[test]
    fn shard_starts_are_increasing_and_few_for_one_hot_key() {
        let hot: Changes = (2..1000)
            .map(|main| (b"hot".to_vec().into_boxed_slice(), put(main, 2, main - 1)))
            .collect();
        assert!(shard_starts(&hot, 10).len() <= 1);
        let changes: Changes = history()
            .into_iter()
            .map(|(k, c)| (k.into_boxed_slice(), c))
            .collect();
        let starts = shard_starts(&changes, 20);
        assert!(starts.windows(2).all(|w| w[0] < w[1]));
        assert!(starts.len() >= 10, "{}", starts.len());
    }
}
