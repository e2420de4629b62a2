//! Lease time, kept by the leader alone with a monotonic clock.
//!
//! The state machine knows which leases exist and their keys (`mvcc::LeaseTable`); only the
//! leader's [`Lessor`] knows when each expires. Keep-alives reset that deadline; an expired
//! lease is revoked through the Raft log (`LeaseRevoke`), proposed by that leader only and never
//! forwarded, so it commits only in the term whose clock decided it, and every member deletes
//! the same keys at the same revision. The leader checkpoints remaining TTLs through the log
//! every checkpoint interval; a member that becomes leader, once it has applied its term's first
//! entry, gives every lease its checkpointed remaining TTL (or its full TTL) plus an election
//! timeout (etcd's promotion rule), and answers keep-alives only after that. So a leader change
//! never expires a lease early, and a lease outlives its TTL by at most one checkpoint interval
//! plus an election timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// etcd's largest lease TTL, in seconds.
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// When a lease expires, and when its revoke may be proposed again if one is in flight.
#[derive(Clone, Copy)]
struct Deadline {
    at: Instant,
    retry_at: Option<Instant>,
}

/// What a keep-alive found.
#[derive(Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The deadline moved to a full TTL from now.
    Renewed,
    /// The lease expired (its revoke may be in flight): it cannot come back.
    Expired,
    /// This member has not taken over the leases for its current term yet (it was elected a
    /// moment ago); ask again shortly.
    NotReady,
}

/// The deadlines, and the term whose leadership they belong to.
#[derive(Default)]
struct State {
    deadlines: HashMap<i64, Deadline>,
    /// The term this member was promoted for; `None` while it does not lead.
    term: Option<u64>,
}

/// Deadlines of the leases this member expires while it leads.
pub struct Lessor {
    state: Mutex<State>,
    next_id: AtomicU64,
    /// etcd's minimum TTL: 1.5 election timeouts, rounded up to whole seconds.
    pub min_ttl: i64,
    /// Added to every TTL when this member is promoted.
    pub promotion_extension: Duration,
}

impl Lessor {
    /// A lessor for member `member_id` with the cluster's election timeout.
    pub fn new(member_id: u64, election: Duration) -> Self {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        // etcd's id generator layout: member bits on top, then time, then a counter.
        let seed = ((member_id & 0xffff) << 48) | ((now_ms << 8) & 0x0000_ffff_ffff_ff00);
        let min_ttl_ms = election.as_millis() as i64 * 3 / 2;
        Lessor {
            state: Mutex::new(State::default()),
            next_id: AtomicU64::new(seed),
            min_ttl: (min_ttl_ms + 999) / 1000,
            promotion_extension: election,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A fresh, positive lease id.
    pub fn next_id(&self) -> i64 {
        loop {
            let id = (self.next_id.fetch_add(1, Ordering::Relaxed) & (i64::MAX as u64)) as i64;
            if id != 0 {
                return id;
            }
        }
    }

    /// The TTL a grant asking for `ttl` gets: at least the minimum.
    pub fn granted_ttl(&self, ttl: i64) -> i64 {
        ttl.max(self.min_ttl)
    }

    /// The term this member took the leases over for, if it leads.
    pub fn term(&self) -> Option<u64> {
        self.state().term
    }

    /// Takes the leases over as leader of `term`: every lease (id, TTL to resume from) gets its
    /// TTL plus an election timeout from now (etcd's promotion rule), whatever deadlines an
    /// earlier leadership left behind.
    pub fn promote(&self, term: u64, leases: &[(i64, i64)]) {
        let at = Instant::now() + self.promotion_extension;
        let mut s = self.state();
        s.deadlines = leases
            .iter()
            .map(|(id, ttl)| {
                let d = Deadline {
                    at: at + secs(*ttl),
                    retry_at: None,
                };
                (*id, d)
            })
            .collect();
        s.term = Some(term);
    }

    /// Resets a lease's deadline to `ttl` from now, if this member was promoted for `term`. An
    /// expired lease stays expired while its revoke is in flight: renewing it then would promise
    /// a TTL the revoke is about to break (found by the fault suite, seed 1008). A renewal before
    /// the promotion would be overwritten by it (with a checkpointed, shorter TTL: seed 5003), so
    /// it waits for it.
    pub fn renew(&self, id: i64, ttl: i64, term: u64) -> Renewal {
        let now = Instant::now();
        let mut s = self.state();
        if s.term != Some(term) {
            return Renewal::NotReady;
        }
        if s.deadlines.get(&id).is_some_and(|e| e.at <= now) {
            return Renewal::Expired;
        }
        s.deadlines.insert(
            id,
            Deadline {
                at: now + secs(ttl),
                retry_at: None,
            },
        );
        Renewal::Renewed
    }

    /// Time left before the lease expires, if this member tracks it.
    pub fn remaining(&self, id: i64) -> Option<Duration> {
        let s = self.state();
        s.deadlines
            .get(&id)
            .map(|e| e.at.saturating_duration_since(Instant::now()))
    }

    /// Called while leading with every existing lease: tracks new leases (full TTL from now),
    /// forgets revoked ones, and returns up to `max` expired leases, whose deadlines move
    /// `retry` ahead while their revoke is in flight (the deadline itself stays in the past, so
    /// the lease cannot be renewed).
    pub fn expired(&self, leases: &[(i64, i64)], max: usize, retry: Duration) -> Vec<i64> {
        let now = Instant::now();
        let mut s = self.state();
        let live: std::collections::HashSet<i64> = leases.iter().map(|(id, _)| *id).collect();
        s.deadlines.retain(|id, _| live.contains(id));
        for (id, ttl) in leases {
            s.deadlines.entry(*id).or_insert(Deadline {
                at: now + secs(*ttl),
                retry_at: None,
            });
        }
        let mut out = Vec::new();
        for (id, e) in s.deadlines.iter_mut() {
            if out.len() >= max {
                break;
            }
            if e.at <= now && e.retry_at.is_none_or(|r| r <= now) {
                out.push(*id);
                e.retry_at = Some(now + retry);
            }
        }
        out
    }

    /// Every tracked lease with its remaining whole seconds (rounded up), for a checkpoint.
    pub fn remaining_all(&self) -> Vec<(i64, i64)> {
        let now = Instant::now();
        self.state()
            .deadlines
            .iter()
            .map(|(id, e)| {
                let left = e.at.saturating_duration_since(now).as_millis() as i64;
                (*id, (left + 999) / 1000)
            })
            .filter(|(_, secs)| *secs > 0)
            .collect()
    }

    /// Forgets every deadline (on losing leadership).
    pub fn demote(&self) {
        let mut s = self.state();
        s.deadlines.clear();
        s.term = None;
    }
}

fn secs(ttl: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimum_ttl_follows_the_election_timeout() {
        let l = Lessor::new(7, Duration::from_millis(1000));
        assert_eq!(l.min_ttl, 2);
        assert_eq!(l.granted_ttl(1), 2);
        assert_eq!(l.granted_ttl(60), 60);
        assert!(l.next_id() > 0);
        assert_ne!(l.next_id(), l.next_id());
    }

    #[test]
    fn promotion_extends_and_expiry_is_reported_once() {
        let l = Lessor::new(1, Duration::from_millis(1000));
        l.promote(3, &[]);
        assert!(l.expired(&[(5, 0)], 10, Duration::from_secs(3)) == vec![5]);
        // In flight: not reported again until the retry delay passes.
        assert!(l.expired(&[(5, 0)], 10, Duration::from_secs(3)).is_empty());
        // Promotion: full TTL plus the election timeout, so nothing expires at once.
        l.promote(4, &[(5, 0)]);
        assert!(l.expired(&[(5, 0)], 10, Duration::from_secs(3)).is_empty());
        assert!(l
            .remaining(5)
            .is_some_and(|r| r > Duration::from_millis(900)));
        // A revoked lease is forgotten.
        assert!(l.expired(&[], 10, Duration::from_secs(3)).is_empty());
        assert_eq!(l.remaining(5), None);
    }

    #[test]
    fn a_renewal_waits_for_the_promotion_of_its_term() {
        let l = Lessor::new(1, Duration::from_millis(1000));
        assert_eq!(l.renew(5, 10, 2), Renewal::NotReady);
        // Promoted with a checkpointed 1 s left: the renewal after it gives the full TTL.
        l.promote(2, &[(5, 1)]);
        assert_eq!(l.renew(5, 10, 2), Renewal::Renewed);
        assert!(l.remaining(5).is_some_and(|r| r > Duration::from_secs(9)));
        // A renewal judged in another term is not applied to this one's deadlines.
        assert_eq!(l.renew(5, 10, 3), Renewal::NotReady);
        l.demote();
        assert_eq!(l.term(), None);
        assert_eq!(l.remaining(5), None);
    }

    #[test]
    fn an_expired_lease_cannot_be_renewed_while_its_revoke_is_in_flight() {
        let l = Lessor::new(1, Duration::from_millis(1000));
        l.promote(1, &[]);
        assert_eq!(l.expired(&[(5, 0)], 10, Duration::from_millis(50)), [5]);
        // The revoke is in flight: a keep-alive must not bring the lease back.
        assert_eq!(l.renew(5, 10, 1), Renewal::Expired);
        assert_eq!(l.remaining(5), Some(Duration::ZERO));
        // If the revoke did not take effect, it is proposed again after the retry delay.
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(l.expired(&[(5, 0)], 10, Duration::from_millis(50)), [5]);
        // A live lease renews normally.
        assert!(l.expired(&[(6, 10)], 10, Duration::from_secs(3)).is_empty());
        assert_eq!(l.renew(6, 10, 1), Renewal::Renewed);
        // A revoked lease is forgotten.
        assert!(l.expired(&[], 10, Duration::from_secs(3)).is_empty());
        assert_eq!(l.remaining(5), None);
    }
}
