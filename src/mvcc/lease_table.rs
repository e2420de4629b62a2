//! The leases of the state machine: granted TTLs and the keys attached to each. Part of the
//! MVCC state so that a lease and its keys change together, in one atomic batch, at one
//! revision. Lease *time* is not here: only the leader keeps it (`crate::lease`).

use std::collections::{BTreeMap, BTreeSet};

/// One lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The granted TTL, in seconds.
    pub ttl: i64,
    /// The remaining TTL at the last checkpoint, in seconds (0: none since the grant).
    pub remaining: i64,
    /// The keys attached to it.
    pub keys: BTreeSet<Vec<u8>>,
}

impl LeaseInfo {
    /// The TTL a leader starts this lease with: the last checkpointed remaining TTL, or the
    /// granted one.
    pub fn resume_ttl(&self) -> i64 {
        if self.remaining > 0 {
            self.remaining
        } else {
            self.ttl
        }
    }
}

/// Lease id → lease.
#[derive(Debug, Default)]
pub struct LeaseTable {
    leases: BTreeMap<i64, LeaseInfo>,
}

impl LeaseTable {
    /// Whether the lease exists.
    pub fn contains(&self, id: i64) -> bool {
        self.leases.contains_key(&id)
    }

    /// The lease, if it exists.
    pub fn get(&self, id: i64) -> Option<&LeaseInfo> {
        self.leases.get(&id)
    }

    /// Every lease id with the TTL a new leader should give it: the last checkpointed
    /// remaining TTL, or the granted one.
    pub fn all(&self) -> Vec<(i64, i64)> {
        self.leases
            .iter()
            .map(|(id, l)| (*id, l.resume_ttl()))
            .collect()
    }

    /// Adds a lease with no keys.
    pub fn grant(&mut self, id: i64, ttl: i64, remaining: i64) {
        self.leases.insert(
            id,
            LeaseInfo {
                ttl,
                remaining,
                keys: BTreeSet::new(),
            },
        );
    }

    /// Records a checkpointed remaining TTL; returns the granted TTL if the lease exists.
    pub fn checkpoint(&mut self, id: i64, remaining: i64) -> Option<i64> {
        let l = self.leases.get_mut(&id)?;
        l.remaining = remaining;
        Some(l.ttl)
    }

    /// Removes a lease, returning it.
    pub fn remove(&mut self, id: i64) -> Option<LeaseInfo> {
        self.leases.remove(&id)
    }

    /// Attaches `key` to lease `id` (ignored if the lease is gone).
    pub fn attach(&mut self, id: i64, key: &[u8]) {
        if let Some(l) = self.leases.get_mut(&id) {
            l.keys.insert(key.to_vec());
        }
    }

    /// Detaches `key` from lease `id`.
    pub fn detach(&mut self, id: i64, key: &[u8]) {
        if let Some(l) = self.leases.get_mut(&id) {
            l.keys.remove(key);
        }
    }
}
