//! Watch guarantees: every watcher's events are the final history's events from its start
//! revision on — in order, without duplicates, without gaps — across its reconnections; and
//! every acknowledged put under the watched prefix is in that history at its revision.

use std::collections::HashSet;

use crate::history::{AckedPut, WatchEvent, WatchLog};

/// Checks the watchers against the reference history. Returns the violations and how many
/// acknowledged puts are missing from the history.
pub fn check(
    watches: &[WatchLog],
    reference: &[WatchEvent],
    acked: &[AckedPut],
) -> (Vec<String>, usize) {
    let mut violations = Vec::new();
    for pair in reference.windows(2) {
        if pair[1].revision < pair[0].revision || pair[0] == pair[1] {
            violations.push(format!(
                "watch: the reference history itself is out of order at revision {}",
                pair[1].revision
            ));
        }
    }
    for w in watches {
        if let Some(v) = check_one(w, reference) {
            violations.push(v);
        }
    }
    let present: HashSet<(i64, &str, &str)> = reference
        .iter()
        .filter(|e| !e.delete)
        .map(|e| (e.revision, e.key.as_str(), e.value.as_str()))
        .collect();
    let mut lost = 0;
    for p in acked {
        if !present.contains(&(p.revision, p.key.as_str(), p.value.as_str())) {
            lost += 1;
            violations.push(format!(
                "watch: acknowledged put {}={} at revision {} is not in the history",
                p.key, p.value, p.revision
            ));
        }
    }
    (violations, lost)
}

fn check_one(w: &WatchLog, reference: &[WatchEvent]) -> Option<String> {
    let last = w.events.last()?.revision;
    let expected: Vec<&WatchEvent> = reference
        .iter()
        .filter(|e| e.revision >= w.start_revision && e.revision <= last)
        .collect();
    let prefix = format!(
        "watch: watcher {} (from revision {})",
        w.watcher, w.start_revision
    );
    for (i, got) in w.events.iter().enumerate() {
        if i > 0 && got.revision < w.events[i - 1].revision {
            return Some(format!(
                "{prefix} got revision {} after {}: reordered",
                got.revision,
                w.events[i - 1].revision
            ));
        }
        if w.events[..i].contains(got) {
            return Some(format!(
                "{prefix} got {} at revision {} twice",
                got.key, got.revision
            ));
        }
    }
    for (i, got) in w.events.iter().enumerate() {
        match expected.get(i) {
            Some(want) if *want == got => {}
            Some(want) if want.revision < got.revision => {
                return Some(format!(
                    "{prefix} missed {} at revision {} (next it got revision {}): a gap",
                    want.key, want.revision, got.revision
                ));
            }
            Some(want) => {
                return Some(format!(
                    "{prefix} got {:?} where the history has {:?}",
                    got, want
                ));
            }
            None => {
                return Some(format!(
                    "{prefix} got {:?}, which is not in the history",
                    got
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(revision: i64, key: &str) -> WatchEvent {
        WatchEvent {
            revision,
            key: key.into(),
            value: format!("v{revision}"),
            delete: false,
        }
    }

    fn log(start: i64, events: Vec<WatchEvent>) -> WatchLog {
        WatchLog {
            watcher: 1,
            start_revision: start,
            events,
            reconnects: 0,
        }
    }

    fn reference() -> Vec<WatchEvent> {
        vec![ev(2, "a"), ev(3, "b"), ev(5, "a"), ev(6, "c")]
    }

    #[test]
    fn faithful_watchers_pass() {
        let w = [
            log(1, reference()),
            log(4, vec![ev(5, "a"), ev(6, "c")]),
            log(3, vec![ev(3, "b")]),
        ];
        let (v, lost) = check(&w, &reference(), &[]);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(lost, 0);
    }

    #[test]
    fn gap_duplicate_and_reorder_are_caught() {
        let cases = [
            (vec![ev(2, "a"), ev(5, "a")], "gap"),
            (vec![ev(2, "a"), ev(3, "b"), ev(3, "b")], "twice"),
            (vec![ev(3, "b"), ev(2, "a")], "reordered"),
            (
                vec![ev(2, "a"), ev(3, "b"), ev(5, "zz")],
                "where the history has",
            ),
            (
                vec![ev(2, "a"), ev(3, "b"), ev(5, "a"), ev(6, "c"), ev(7, "zz")],
                "not in the history",
            ),
        ];
        for (events, what) in cases {
            let (v, _) = check(&[log(1, events)], &reference(), &[]);
            assert!(v.iter().any(|m| m.contains(what)), "{what}: {v:?}");
        }
    }

    #[test]
    fn lost_acknowledged_put_is_counted() {
        let acked = [
            AckedPut {
                key: "a".into(),
                value: "v5".into(),
                revision: 5,
                at: 0,
            },
            AckedPut {
                key: "d".into(),
                value: "v7".into(),
                revision: 7,
                at: 0,
            },
        ];
        let (v, lost) = check(&[], &reference(), &acked);
        assert_eq!(lost, 1, "{v:?}");
    }
}
