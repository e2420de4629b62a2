//! The checkers: each reads the history and lists violations. Every checker has unit tests
//! that feed it a deliberately broken history, so we know it can fail.

pub mod lease;
pub mod linearizable;
pub mod lock;
pub mod watch;

use std::collections::{BTreeMap, HashSet};

use crate::history::{History, RegInput, RegOp, RegOutput};

/// The verdict on one history.
#[derive(Debug, Default)]
pub struct Report {
    /// Every violation found, one line each.
    pub violations: Vec<String>,
    /// Acknowledged writes missing at the end.
    pub lost_acked: usize,
    /// Register keys whose search ran out of budget (neither proven nor refuted).
    pub unknown_keys: usize,
    /// Operations checked, by workload.
    pub ops: BTreeMap<&'static str, usize>,
    /// Fenced writes made after the writer's lease could have expired, and how many of those
    /// the resource accepted (nobody newer had written yet).
    pub expired_lease_writes: (usize, usize),
}

/// Runs every checker over `h`.
pub fn check(h: &History) -> Report {
    let mut r = Report::default();
    r.violations.extend(h.harness_violations.iter().cloned());

    // Registers, one key at a time.
    let resolved = resolve_unknown(&h.registers, &h.register_history);
    let mut by_key: BTreeMap<&str, Vec<&RegOp>> = BTreeMap::new();
    for op in &resolved {
        by_key.entry(op.key.as_str()).or_default().push(op);
    }
    r.ops
        .insert("register", by_key.values().map(Vec::len).sum());
    for ops in by_key.values() {
        match linearizable::check(ops) {
            linearizable::Verdict::Linearizable => {}
            linearizable::Verdict::Unknown => r.unknown_keys += 1,
            linearizable::Verdict::Violation(v) => r.violations.push(format!("register: {v}")),
        }
    }

    let locks = lock::check(&h.lock_grants, &h.fenced_writes);
    r.violations.extend(locks.violations);
    r.expired_lease_writes = (locks.expired_writes, locks.expired_accepted);
    r.ops.insert("lock", h.lock_grants.len());
    r.ops.insert("fenced write", h.fenced_writes.len());

    let (watch_violations, watch_lost) =
        watch::check(&h.watches, &h.watch_reference, &h.watched_puts);
    r.violations.extend(watch_violations);
    r.lost_acked += watch_lost;
    r.ops.insert(
        "watch event",
        h.watches.iter().map(|w| w.events.len()).sum(),
    );

    r.violations.extend(lease::check(&h.leases));
    r.ops.insert("lease", h.leases.len());

    // Durability: every acknowledged unique key is there after the final restart.
    let present: HashSet<&str> = h.durable_present.iter().map(String::as_str).collect();
    for p in &h.durable_puts {
        if !present.contains(p.key.as_str()) {
            r.lost_acked += 1;
            r.violations.push(format!(
                "durability: acknowledged put {} (revision {}) is gone after the final restart",
                p.key, p.revision
            ));
        }
    }
    r.ops.insert("durable put", h.durable_puts.len());

    // A minority serves no write and no linearizable read.
    for p in h.minority_probes.iter().filter(|p| p.succeeded) {
        r.violations.push(format!(
            "minority: member {} answered a {} while cut off in a minority ({}..{} µs)",
            p.member, p.kind, p.call, p.ret
        ));
    }
    r.ops.insert("minority probe", h.minority_probes.len());
    r
}

/// Settles what can be settled about operations that never answered, using the store's own
/// revision history of the registers (values are unique, so a value in that history was
/// written by exactly one operation):
/// - a failed read observed nothing: dropped;
/// - a timed-out put or txn whose value never appears in the history never took effect:
///   dropped (were the history lying and the write applied after all, a read of its value
///   would have no writer, and the check fails: dropping never hides a violation);
/// - a timed-out txn whose value does appear succeeded: it stays open-ended, as a success.
///
/// Without this, every open-ended operation doubles the search space of its key.
fn resolve_unknown(ops: &[RegOp], history: &[crate::history::WatchEvent]) -> Vec<RegOp> {
    let written: HashSet<(&str, &str)> = history
        .iter()
        .filter(|e| !e.delete)
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    let took_effect =
        |op: &RegOp, v: u64| written.contains(&(op.key.as_str(), v.to_string().as_str()));
    ops.iter()
        .filter_map(|op| match (op.input, op.output) {
            (RegInput::Read, RegOutput::Unknown) => None,
            (RegInput::Write(v), RegOutput::Unknown) => took_effect(op, v).then(|| op.clone()),
            (RegInput::Cas(_, v), RegOutput::Unknown) => took_effect(op, v).then(|| RegOp {
                output: RegOutput::Cas(true),
                ..op.clone()
            }),
            _ => Some(op.clone()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{AckedPut, MinorityProbe};

    #[test]
    fn lost_durable_write_and_minority_answer_are_caught() {
        let mut h = History::default();
        h.durable_puts.push(AckedPut {
            key: "d/1".into(),
            value: "x".into(),
            revision: 4,
            at: 0,
        });
        h.durable_puts.push(AckedPut {
            key: "d/2".into(),
            value: "x".into(),
            revision: 5,
            at: 0,
        });
        h.durable_present.push("d/1".into());
        h.minority_probes.push(MinorityProbe {
            member: 2,
            kind: "put".into(),
            call: 1,
            ret: 2,
            succeeded: true,
        });
        let r = check(&h);
        assert_eq!(r.lost_acked, 1);
        assert_eq!(r.violations.len(), 2, "{:?}", r.violations);
    }

    #[test]
    fn unknown_operations_are_settled_by_the_store_history() {
        use crate::history::{WatchEvent, NEVER};
        let op = |input, output, ret| RegOp {
            client: 1,
            key: "k".into(),
            call: 0,
            ret,
            input,
            output,
        };
        let ops = [
            op(RegInput::Write(1), RegOutput::Written, 10),
            op(RegInput::Write(2), RegOutput::Unknown, NEVER),
            op(RegInput::Cas(1, 3), RegOutput::Unknown, NEVER),
            op(RegInput::Read, RegOutput::Unknown, NEVER),
        ];
        let history = [1, 3].map(|v| WatchEvent {
            revision: v as i64 + 1,
            key: "k".into(),
            value: v.to_string(),
            delete: false,
        });
        let settled = resolve_unknown(&ops, &history);
        assert_eq!(
            settled.len(),
            2,
            "the unapplied write and the failed read are dropped"
        );
        assert_eq!(settled[1].output, RegOutput::Cas(true));
        assert_eq!(settled[1].ret, NEVER);
        // A read of a value the history says was never written cannot be explained.
        let mut ops = ops.to_vec();
        ops.push(op(RegInput::Read, RegOutput::Read(2), 20));
        let h = History {
            registers: ops,
            register_history: history.to_vec(),
            ..Default::default()
        };
        assert_eq!(check(&h).violations.len(), 1);
    }

    #[test]
    fn clean_history_passes() {
        let r = check(&History::default());
        assert!(r.violations.is_empty());
        assert_eq!(r.lost_acked, 0);
    }
}
