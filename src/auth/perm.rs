//! Key permissions of one user, merged from all its roles (etcd's range permission cache):
//! sorted, non-overlapping intervals per permission type, so a check is one binary search
//! instead of a scan of the role table.
//!
//! Intervals are half-open `[begin, end)` with `end = None` for "to the end of the keyspace"
//! (etcd's `range_end = "\0"`, "from key"). A permission with an empty `range_end` is the single
//! key `[key, key + "\0")`. A request range is allowed only if the union of the granted
//! intervals covers all of it; touching intervals join (`[a, b)` and `[b, c)` cover `[a, c)`),
//! as etcd's interval tree `Contains` does.

use crate::pb::authpb::permission::Type as PermType;
use crate::pb::authpb::Permission;

/// One half-open key interval; `end == None` reaches past every key.
type Interval = (Vec<u8>, Option<Vec<u8>>);

/// Merged intervals of one permission type: sorted by `begin`, disjoint and not touching.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KeySet {
    intervals: Vec<Interval>,
}

/// The interval a permission or request names: a single key (`range_end` empty), from the key
/// on (`range_end == "\0"`), or `[key, range_end)`.
pub fn interval(key: &[u8], range_end: &[u8]) -> Interval {
    match range_end {
        [] => {
            let mut end = key.to_vec();
            end.push(0);
            (key.to_vec(), Some(end))
        }
        [0] => (key.to_vec(), None),
        end => (key.to_vec(), Some(end.to_vec())),
    }
}

/// Whether `end` (None: infinity) is at or past `other`.
fn end_covers(end: &Option<Vec<u8>>, other: &Option<Vec<u8>>) -> bool {
    match (end, other) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(a), Some(b)) => a >= b,
    }
}

impl KeySet {
    /// The union of `intervals` (empty ones, `begin >= end`, grant nothing).
    pub fn from_intervals(mut intervals: Vec<Interval>) -> Self {
        intervals.retain(|(b, e)| e.as_ref().is_none_or(|e| b < e));
        intervals.sort();
        let mut merged: Vec<Interval> = Vec::with_capacity(intervals.len());
        for (begin, end) in intervals {
            match merged.last_mut() {
                // Overlapping or touching the previous one: extend it.
                Some((_, last_end)) if last_end.as_ref().is_none_or(|le| begin <= *le) => {
                    if !end_covers(last_end, &end) {
                        *last_end = end;
                    }
                }
                _ => merged.push((begin, end)),
            }
        }
        KeySet { intervals: merged }
    }

    /// Whether the request range `key`/`range_end` (etcd's conventions, see [`interval`]) is
    /// entirely granted. Allocation-free: it runs on every checked request.
    pub fn allows(&self, key: &[u8], range_end: &[u8]) -> bool {
        // The last interval starting at or before `key` is the only one that can cover it.
        let at = self.intervals.partition_point(|(b, _)| b.as_slice() <= key);
        let Some((_, end)) = at.checked_sub(1).and_then(|i| self.intervals.get(i)) else {
            return false;
        };
        match (end, range_end) {
            (None, _) => true,
            // A from-key request reaches past every bounded interval.
            (Some(_), [0]) => false,
            // The key alone, `[key, key + "\0")`: covered when the interval ends after `key`.
            (Some(e), []) => e.as_slice() > key,
            (Some(e), end) => e.as_slice() >= end,
        }
    }
}

/// A user's merged read and write permissions.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UserPerms {
    /// Whether the user has the `root` role: everything is allowed.
    pub root: bool,
    /// Keys the user may read.
    pub read: KeySet,
    /// Keys the user may write.
    pub write: KeySet,
}

impl UserPerms {
    /// Merges the permissions of a user's roles.
    pub fn merge<'a>(root: bool, perms: impl IntoIterator<Item = &'a Permission>) -> Self {
        let (mut read, mut write) = (Vec::new(), Vec::new());
        for p in perms {
            let ivl = interval(&p.key, &p.range_end);
            match PermType::try_from(p.perm_type) {
                Ok(PermType::Read) => read.push(ivl),
                Ok(PermType::Write) => write.push(ivl),
                Ok(PermType::Readwrite) => {
                    read.push(ivl.clone());
                    write.push(ivl);
                }
                Err(_) => {}
            }
        }
        UserPerms {
            root,
            read: KeySet::from_intervals(read),
            write: KeySet::from_intervals(write),
        }
    }

    /// Whether the user may read `key`/`range_end`.
    pub fn can_read(&self, key: &[u8], range_end: &[u8]) -> bool {
        self.root || self.read.allows(key, range_end)
    }

    /// Whether the user may write `key`/`range_end`.
    pub fn can_write(&self, key: &[u8], range_end: &[u8]) -> bool {
        self.root || self.write.allows(key, range_end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perm(t: PermType, key: &str, end: &str) -> Permission {
        Permission {
            perm_type: t as i32,
            key: key.as_bytes().to_vec(),
            range_end: end.as_bytes().to_vec(),
        }
    }

    fn set(perms: &[(&str, &str)]) -> KeySet {
        KeySet::from_intervals(
            perms
                .iter()
                .map(|(k, e)| interval(k.as_bytes(), e.as_bytes()))
                .collect(),
        )
    }

    #[test]
    fn single_keys_ranges_prefixes_and_from_key() {
        let s = set(&[("a", ""), ("c", "e"), ("x", "\0")]);
        assert!(s.allows(b"a", b""));
        assert!(!s.allows(b"a", b"b"), "the key a alone, not [a, b)");
        assert!(s.allows(b"a", b"a\0"), "[a, a\\0) is the key a");
        assert!(!s.allows(b"ab", b""));
        assert!(s.allows(b"c", b""));
        assert!(s.allows(b"c", b"e"));
        assert!(s.allows(b"d", b"dz"));
        assert!(!s.allows(b"d", b"f"), "past the end");
        assert!(!s.allows(b"e", b""), "end excluded");
        assert!(!s.allows(b"b", b"d"), "before the begin");
        assert!(s.allows(b"x", b"\0"), "from key");
        assert!(s.allows(b"zzz", b""));
        assert!(s.allows(b"y", b"\0"));
        assert!(!s.allows(b"w", b"\0"));
        assert!(!s.allows(b"", b"\0"), "not the whole keyspace");
    }

    #[test]
    fn overlapping_and_touching_grants_join() {
        let s = set(&[("a", "c"), ("c", "e"), ("b", "d"), ("e", "")]);
        assert!(s.allows(b"a", b"e"));
        assert!(s.allows(b"a", b"e\0"), "the single key e joins too");
        assert!(!s.allows(b"a", b"f"));
        let gap = set(&[("a", "c"), ("d", "e")]);
        assert!(!gap.allows(b"a", b"e"));
        assert!(!gap.allows(b"c", b""));
        let all = set(&[("", "\0")]);
        assert!(all.allows(b"", b"\0") && all.allows(b"anything", b""));
    }

    #[test]
    fn empty_and_inverted_grants_allow_nothing() {
        let s = set(&[("b", "a"), ("c", "c")]);
        assert!(!s.allows(b"b", b"") && !s.allows(b"c", b""));
    }

    #[test]
    fn read_write_and_readwrite_go_to_their_sets() {
        let u = UserPerms::merge(
            false,
            &[
                perm(PermType::Read, "r", ""),
                perm(PermType::Write, "w", ""),
                perm(PermType::Readwrite, "rw/", "rw0"),
            ],
        );
        assert!(u.can_read(b"r", b"") && !u.can_write(b"r", b""));
        assert!(u.can_write(b"w", b"") && !u.can_read(b"w", b""));
        assert!(u.can_read(b"rw/x", b"") && u.can_write(b"rw/", b"rw0"));
        let root = UserPerms::merge(true, &[]);
        assert!(root.can_read(b"", b"\0") && root.can_write(b"k", b""));
    }

    /// Random grants and requests: a request is allowed exactly when every key it names (over a
    /// small alphabet, so all can be listed) lies in some grant.
    #[test]
    fn random_requests_are_never_allowed_beyond_the_grants() {
        let keys: Vec<Vec<u8>> = {
            let mut v = vec![Vec::new()];
            for a in b"abc" {
                v.push(vec![*a]);
                for b in b"abc" {
                    v.push(vec![*a, *b]);
                }
            }
            v.sort();
            v
        };
        let in_ivl = |k: &[u8], (b, e): &Interval| {
            k >= b.as_slice() && e.as_ref().is_none_or(|e| k < e.as_slice())
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let ends = |i: usize, keys: &[Vec<u8>]| -> Vec<u8> {
            match i % 4 {
                0 => Vec::new(),
                1 => vec![0],
                _ => keys.get(i % keys.len()).cloned().unwrap_or_default(),
            }
        };
        for _ in 0..2000 {
            let grants: Vec<Interval> = (0..1 + next(4))
                .map(|_| {
                    let k = keys[next(keys.len())].clone();
                    interval(&k, &ends(next(keys.len() * 4), &keys))
                })
                .collect();
            let s = KeySet::from_intervals(grants.clone());
            let k = keys[next(keys.len())].clone();
            let e = ends(next(keys.len() * 4), &keys);
            let req = interval(&k, &e);
            // Every listed key the request names, plus the request's own begin (a request
            // reaching past the last listed key is checked by its end against the grants').
            let named: Vec<&Vec<u8>> = keys.iter().filter(|x| in_ivl(x, &req)).collect();
            let covered = named.iter().all(|x| grants.iter().any(|g| in_ivl(x, g)));
            if s.allows(&k, &e) {
                assert!(covered, "allowed {req:?} beyond {grants:?}");
            }
        }
    }
}
