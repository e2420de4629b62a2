//! Lease guarantees: a key attached to a lease is never gone before the lease's TTL has run
//! out since its last confirmed keep-alive, and it does vanish once keep-alives stop.

use crate::history::LeaseRecord;

/// Checks every lease record.
pub fn check(leases: &[LeaseRecord]) -> Vec<String> {
    let mut violations = Vec::new();
    for l in leases {
        if let Some((call, ret, _)) = l
            .reads
            .iter()
            .find(|(_, ret, present)| !present && *ret < l.safe_until)
        {
            violations.push(format!(
                "lease {:x}: key {} was gone in a read ({call}..{ret} µs) before the lease could \
                 expire ({} µs, TTL {} s)",
                l.lease, l.key, l.safe_until, l.ttl
            ));
        }
        if !l.vanished {
            violations.push(format!(
                "lease {:x}: key {} never vanished after its keep-alives stopped (TTL + 20 s after the \
                 faults ended)",
                l.lease, l.key
            ));
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(reads: Vec<(u64, u64, bool)>, vanished: bool) -> LeaseRecord {
        LeaseRecord {
            lease: 1,
            ttl: 3,
            key: "l/1".into(),
            safe_until: 3_000_000,
            reads,
            vanished,
        }
    }

    #[test]
    fn expiry_after_ttl_passes() {
        let r = record(
            vec![(2_000_000, 2_100_000, true), (3_500_000, 3_600_000, false)],
            true,
        );
        assert!(check(&[r]).is_empty());
    }

    #[test]
    fn early_expiry_is_caught() {
        let r = record(
            vec![(1_000_000, 1_100_000, true), (2_000_000, 2_100_000, false)],
            true,
        );
        assert!(check(&[r])[0].contains("before the lease could expire"));
    }

    #[test]
    fn immortal_lease_is_caught() {
        let r = record(vec![(5_000_000, 5_100_000, true)], false);
        assert!(check(&[r])[0].contains("never vanished"));
    }
}
