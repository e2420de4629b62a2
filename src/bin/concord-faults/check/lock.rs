//! Lock safety: no two holders at once, fencing tokens that only grow, and a fenced resource
//! whose accepted writes never interleave between holders.

use crate::history::{FencedWrite, LockGrant};

/// What the lock checker found.
#[derive(Debug, Default)]
pub struct LockReport {
    /// Safety violations.
    pub violations: Vec<String>,
    /// Writes attempted by holders whose lease was no longer safe (by their own clock).
    pub expired_writes: usize,
    /// Of those, how many the resource accepted (fencing let them through: nobody newer yet).
    pub expired_accepted: usize,
}

/// Checks lock grants and the fenced resource's log.
pub fn check(grants: &[LockGrant], writes: &[FencedWrite]) -> LockReport {
    let mut r = LockReport::default();
    let mut by_token: Vec<&LockGrant> = grants.iter().collect();
    by_token.sort_by_key(|g| g.token);
    for w in by_token.windows(2) {
        if w[0].token == w[1].token {
            r.violations.push(format!(
                "lock: clients {} and {} were both granted token {}",
                w[0].client, w[1].client, w[0].token
            ));
        }
    }
    // Real-time order: a grant that completed before another began has a smaller token.
    for a in grants {
        for b in grants {
            if a.ret < b.call && a.token >= b.token {
                r.violations.push(format!(
                    "lock: token {} (client {}, granted at {} µs) is not below token {} \
                     (client {}, requested later at {} µs)",
                    a.token, a.client, a.ret, b.token, b.client, b.call
                ));
            }
        }
    }
    // Mutual exclusion while each holder's lease is provably alive.
    let safe = |g: &LockGrant| (g.ret, g.release.min(g.lease_safe_until));
    for (i, a) in grants.iter().enumerate() {
        for b in grants.iter().skip(i + 1) {
            let ((a0, a1), (b0, b1)) = (safe(a), safe(b));
            if a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1 {
                r.violations.push(format!(
                    "lock: two holders at once: client {} (token {}, {a0}..{a1} µs) and client \
                     {} (token {}, {b0}..{b1} µs), both with live leases",
                    a.client, a.token, b.client, b.token
                ));
            }
        }
    }
    // The fenced resource: accepted tokens never decrease.
    let mut highest = i64::MIN;
    for w in writes {
        if w.lease_expired {
            r.expired_writes += 1;
            if w.accepted {
                r.expired_accepted += 1;
            }
        }
        if !w.accepted {
            continue;
        }
        if w.token < highest {
            r.violations.push(format!(
                "fencing: resource accepted token {} from client {} at {} µs after token {}",
                w.token, w.client, w.at, highest
            ));
        }
        highest = highest.max(w.token);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(client: u32, token: i64, call: u64, ret: u64, release: u64) -> LockGrant {
        LockGrant {
            client,
            token,
            call,
            ret,
            release,
            lease_safe_until: u64::MAX,
        }
    }

    fn write(client: u32, token: i64, at: u64) -> FencedWrite {
        FencedWrite {
            client,
            token,
            at,
            accepted: true,
            lease_expired: false,
        }
    }

    #[test]
    fn orderly_handoff_passes() {
        let g = [grant(1, 10, 0, 5, 20), grant(2, 12, 3, 25, 40)];
        let w = [write(1, 10, 10), write(2, 12, 30)];
        let r = check(&g, &w);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
    }

    #[test]
    fn two_holders_are_caught() {
        let g = [grant(1, 10, 0, 5, 20), grant(2, 12, 3, 15, 40)];
        let r = check(&g, &[]);
        assert!(r.violations.iter().any(|v| v.contains("two holders")));
    }

    #[test]
    fn expired_lease_ends_the_hold() {
        // Client 1 held on past its lease; client 2's grant after that is legal.
        let mut a = grant(1, 10, 0, 5, 100);
        a.lease_safe_until = 12;
        let g = [a, grant(2, 12, 3, 15, 40)];
        let r = check(&g, &[]);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
    }

    #[test]
    fn shared_or_decreasing_tokens_are_caught() {
        let r = check(&[grant(1, 10, 0, 5, 6), grant(2, 10, 7, 8, 9)], &[]);
        assert!(r.violations.iter().any(|v| v.contains("both granted")));
        let r = check(&[grant(1, 10, 0, 5, 6), grant(2, 9, 7, 8, 9)], &[]);
        assert!(r.violations.iter().any(|v| v.contains("not below")));
    }

    #[test]
    fn interleaved_fenced_writes_are_caught() {
        let g = [grant(1, 10, 0, 5, 20), grant(2, 12, 21, 25, 40)];
        let w = [write(1, 10, 10), write(2, 12, 30), write(1, 10, 31)];
        let r = check(&g, &w);
        assert!(r.violations.iter().any(|v| v.contains("fencing")));
    }
}
