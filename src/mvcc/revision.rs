//! A revision names one change in the store: `main` is the revision of the request that made it
//! (one per mutating request, cluster-wide), `sub` its position inside that request (a txn that
//! writes three keys makes `{main, 0}`, `{main, 1}`, `{main, 2}`).
//!
//! On disk a revision is 16 bytes, `main` then `sub`, both big-endian, so that fjall's byte order
//! is revision order.

/// A `{main, sub}` revision pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision {
    /// The request's revision, as clients see it (`mod_revision`, header `revision`).
    pub main: i64,
    /// The change's index inside its request.
    pub sub: i64,
}

impl Revision {
    /// Builds a revision.
    pub fn new(main: i64, sub: i64) -> Self {
        Revision { main, sub }
    }

    /// The 16-byte big-endian key of this revision.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.main.to_be_bytes());
        out[8..].copy_from_slice(&self.sub.to_be_bytes());
        out
    }

    /// etcd's key for this revision in its `key` bucket: `main`, `_`, `sub` (big-endian), and a
    /// `t` after a tombstone. HashKV hashes it; etcd's database files are keyed by it.
    pub fn to_etcd_key(self, tombstone: bool) -> Vec<u8> {
        let mut k = Vec::with_capacity(18);
        k.extend(self.main.to_be_bytes());
        k.push(b'_');
        k.extend(self.sub.to_be_bytes());
        if tombstone {
            k.push(b't');
        }
        k
    }

    /// Parses etcd's key (see [`Self::to_etcd_key`]): the revision and whether it is a
    /// tombstone; `None` for another shape.
    pub fn from_etcd_key(k: &[u8]) -> Option<(Self, bool)> {
        let tombstone = match k.len() {
            17 => false,
            18 if k.get(17) == Some(&b't') => true,
            _ => return None,
        };
        if k.get(8) != Some(&b'_') {
            return None;
        }
        let main = i64::from_be_bytes(k.get(..8)?.try_into().ok()?);
        let sub = i64::from_be_bytes(k.get(9..17)?.try_into().ok()?);
        Some((Revision { main, sub }, tombstone))
    }

    /// Parses a 16-byte key; `None` if it has another length.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let main = bytes.get(..8)?.try_into().ok().map(i64::from_be_bytes)?;
        let sub = bytes.get(8..16)?.try_into().ok().map(i64::from_be_bytes)?;
        (bytes.len() == 16).then_some(Revision { main, sub })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_keep_order() {
        let a = Revision::new(2, 7);
        let b = Revision::new(3, 0);
        assert_eq!(Revision::from_bytes(&a.to_bytes()), Some(a));
        assert!(a.to_bytes() < b.to_bytes());
        assert_eq!(Revision::from_bytes(&[0; 15]), None);
    }

    #[test]
    fn etcd_keys_round_trip_and_mark_tombstones() {
        let r = Revision::new(5, 2);
        for tombstone in [false, true] {
            let k = r.to_etcd_key(tombstone);
            assert_eq!(k.len(), 17 + usize::from(tombstone));
            assert_eq!(Revision::from_etcd_key(&k), Some((r, tombstone)));
        }
        assert_eq!(Revision::from_etcd_key(&r.to_bytes()), None);
        let mut bad = r.to_etcd_key(true);
        bad[17] = b'x';
        assert_eq!(Revision::from_etcd_key(&bad), None);
    }
}
