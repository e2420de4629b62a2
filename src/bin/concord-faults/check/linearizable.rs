//! Linearizability of a single register's history: the Wing–Gong search with Lowe's
//! memoisation, as in porcupine. Operations that never answered complete at "never", so the
//! search may place them anywhere after their call (including never applying them, by placing
//! them last).

use std::collections::HashSet;

use crate::history::{RegInput, RegOp, RegOutput};

/// The checker's answer for one key.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Some total order explains every result.
    Linearizable,
    /// No order does; the message names where the search got stuck.
    Violation(String),
    /// The search budget ran out (too many concurrent unknown operations).
    Unknown,
}

/// Search steps per key before giving up with [`Verdict::Unknown`].
const BUDGET: u64 = 20_000_000;

/// The register model: the state after applying `op` to `state`, if its result allows it.
fn step(state: u64, op: &RegOp) -> Option<u64> {
    match (op.input, op.output) {
        (RegInput::Read, RegOutput::Read(v)) => (v == state).then_some(state),
        (RegInput::Read, _) => Some(state),
        (RegInput::Write(v), _) => Some(v),
        (RegInput::Cas(from, to), RegOutput::Cas(true)) => (state == from).then_some(to),
        (RegInput::Cas(from, _), RegOutput::Cas(false)) => (state != from).then_some(state),
        (RegInput::Cas(from, to), _) => Some(if state == from { to } else { state }),
    }
}

const NIL: usize = usize::MAX;

struct Node {
    op: usize,
    call: bool,
    /// For a call: its return node.
    partner: usize,
    prev: usize,
    next: usize,
}

/// A fixed-size bit set of linearized operations.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bits(Vec<u64>);

impl Bits {
    fn set(&mut self, i: usize, on: bool) {
        if let Some(w) = self.0.get_mut(i / 64) {
            if on {
                *w |= 1 << (i % 64);
            } else {
                *w &= !(1 << (i % 64));
            }
        }
    }
}

/// Checks one key's operations (reads that failed should be left out: they observed nothing).
pub fn check(ops: &[&RegOp]) -> Verdict {
    // Node 0 is the head sentinel; then a call and a return node per operation.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
    for (i, op) in ops.iter().enumerate() {
        events.push((op.call, true, i));
        events.push((op.ret.max(op.call), false, i));
    }
    // By time; at equal times calls first (the operations overlap).
    events.sort_by_key(|(t, call, _)| (*t, !*call));
    let mut nodes = vec![Node {
        op: NIL,
        call: false,
        partner: NIL,
        prev: NIL,
        next: NIL,
    }];
    let mut return_node = vec![NIL; ops.len()];
    for (_, call, op) in &events {
        let idx = nodes.len();
        nodes.push(Node {
            op: *op,
            call: *call,
            partner: NIL,
            prev: idx - 1,
            next: NIL,
        });
        nodes[idx - 1].next = idx;
        if !*call {
            return_node[*op] = idx;
        }
    }
    for n in nodes.iter_mut().skip(1) {
        if n.call {
            n.partner = return_node[n.op];
        }
    }

    let lift = |nodes: &mut Vec<Node>, call: usize| {
        for n in [call, nodes[call].partner] {
            let (p, x) = (nodes[n].prev, nodes[n].next);
            nodes[p].next = x;
            if x != NIL {
                nodes[x].prev = p;
            }
        }
    };
    let unlift = |nodes: &mut Vec<Node>, call: usize| {
        for n in [nodes[call].partner, call] {
            let (p, x) = (nodes[n].prev, nodes[n].next);
            nodes[p].next = n;
            if x != NIL {
                nodes[x].prev = n;
            }
        }
    };

    let mut linearized = Bits(vec![0; ops.len().div_ceil(64)]);
    let mut cache: HashSet<(Bits, u64)> = HashSet::new();
    let mut stack: Vec<(usize, u64)> = Vec::new();
    let mut state = 0u64;
    let mut entry = nodes[0].next;
    let mut deepest = 0usize;
    let mut stuck_at = NIL;
    let mut budget = BUDGET;
    while nodes[0].next != NIL {
        budget = match budget.checked_sub(1) {
            Some(b) => b,
            None => return Verdict::Unknown,
        };
        if entry == NIL {
            return Verdict::Violation("search ran off the history".into());
        }
        if nodes[entry].call {
            let op = nodes[entry].op;
            if let Some(next_state) = step(state, ops[op]) {
                let mut next = linearized.clone();
                next.set(op, true);
                if cache.insert((next.clone(), next_state)) {
                    stack.push((entry, state));
                    state = next_state;
                    linearized = next;
                    lift(&mut nodes, entry);
                    if stack.len() > deepest {
                        deepest = stack.len();
                        stuck_at = NIL;
                    }
                    entry = nodes[0].next;
                    continue;
                }
            }
            entry = nodes[entry].next;
        } else {
            if stack.len() == deepest && stuck_at == NIL {
                stuck_at = nodes[entry].op;
            }
            let Some((call, prev_state)) = stack.pop() else {
                return Verdict::Violation(describe(ops, deepest, stuck_at));
            };
            state = prev_state;
            linearized.set(nodes[call].op, false);
            unlift(&mut nodes, call);
            entry = nodes[call].next;
        }
    }
    Verdict::Linearizable
}

fn describe(ops: &[&RegOp], deepest: usize, stuck_at: usize) -> String {
    let key = ops.first().map_or("?", |o| o.key.as_str());
    match ops.get(stuck_at) {
        Some(op) => format!(
            "key {key}: {} operations are not linearizable; at most {deepest} could be ordered, \
             and then client {} {:?} -> {:?} (called {} µs, returned {} µs) could not be placed",
            ops.len(),
            op.client,
            op.input,
            op.output,
            op.call,
            op.ret
        ),
        None => format!("key {key}: {} operations are not linearizable", ops.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::NEVER;

    fn op(client: u32, call: u64, ret: u64, input: RegInput, output: RegOutput) -> RegOp {
        RegOp {
            client,
            key: "k".into(),
            call,
            ret,
            input,
            output,
        }
    }

    fn verdict(ops: &[RegOp]) -> Verdict {
        check(&ops.iter().collect::<Vec<_>>())
    }

    #[test]
    fn sequential_history_is_linearizable() {
        let h = [
            op(1, 0, 10, RegInput::Write(1), RegOutput::Written),
            op(2, 20, 30, RegInput::Read, RegOutput::Read(1)),
            op(1, 40, 50, RegInput::Cas(1, 2), RegOutput::Cas(true)),
            op(2, 60, 70, RegInput::Cas(1, 3), RegOutput::Cas(false)),
            op(3, 80, 90, RegInput::Read, RegOutput::Read(2)),
        ];
        assert_eq!(verdict(&h), Verdict::Linearizable);
    }

    #[test]
    fn concurrent_read_may_see_either_value() {
        for seen in [0, 1] {
            let h = [
                op(1, 0, 100, RegInput::Write(1), RegOutput::Written),
                op(2, 10, 20, RegInput::Read, RegOutput::Read(seen)),
                op(3, 30, 40, RegInput::Read, RegOutput::Read(seen)),
            ];
            assert_eq!(verdict(&h), Verdict::Linearizable, "seen {seen}");
        }
    }

    #[test]
    fn stale_read_is_caught() {
        let h = [
            op(1, 0, 10, RegInput::Write(1), RegOutput::Written),
            op(1, 20, 30, RegInput::Write(2), RegOutput::Written),
            op(2, 40, 50, RegInput::Read, RegOutput::Read(1)),
        ];
        assert!(matches!(verdict(&h), Verdict::Violation(_)));
    }

    #[test]
    fn lost_write_is_caught() {
        let h = [
            op(1, 0, 10, RegInput::Write(7), RegOutput::Written),
            op(2, 20, 30, RegInput::Read, RegOutput::Read(0)),
        ];
        let Verdict::Violation(msg) = verdict(&h) else {
            panic!("a lost write must be a violation");
        };
        assert!(msg.contains("key k"), "{msg}");
    }

    #[test]
    fn non_monotonic_reads_are_caught() {
        // Two readers see the write, then the old value again, while the write is in flight.
        let h = [
            op(1, 0, 1000, RegInput::Write(1), RegOutput::Written),
            op(2, 10, 20, RegInput::Read, RegOutput::Read(1)),
            op(3, 30, 40, RegInput::Read, RegOutput::Read(0)),
        ];
        assert!(matches!(verdict(&h), Verdict::Violation(_)));
    }

    #[test]
    fn unknown_write_may_or_may_not_apply() {
        for seen in [0, 5] {
            let h = [
                op(1, 0, NEVER, RegInput::Write(5), RegOutput::Unknown),
                op(2, 100, 110, RegInput::Read, RegOutput::Read(seen)),
                op(2, 120, 130, RegInput::Read, RegOutput::Read(seen)),
            ];
            assert_eq!(verdict(&h), Verdict::Linearizable, "seen {seen}");
        }
        // But once seen it cannot be unseen.
        let h = [
            op(1, 0, NEVER, RegInput::Write(5), RegOutput::Unknown),
            op(2, 100, 110, RegInput::Read, RegOutput::Read(5)),
            op(2, 120, 130, RegInput::Read, RegOutput::Read(0)),
        ];
        assert!(matches!(verdict(&h), Verdict::Violation(_)));
    }

    #[test]
    fn double_applied_cas_is_caught() {
        // Both CASes from 1 claim success: only one can have seen 1.
        let h = [
            op(1, 0, 10, RegInput::Write(1), RegOutput::Written),
            op(2, 20, 30, RegInput::Cas(1, 2), RegOutput::Cas(true)),
            op(3, 40, 50, RegInput::Cas(1, 3), RegOutput::Cas(true)),
        ];
        assert!(matches!(verdict(&h), Verdict::Violation(_)));
    }

    /// A history produced by a real register: each operation takes effect at a random point
    /// inside its interval, and results follow from that order.
    fn simulated(seed: u64, clients: u32, per_client: u64) -> Vec<RegOp> {
        let mut rng = crate::rng::Rng::new(seed);
        let mut planned = Vec::new();
        let mut next_value = 1;
        for c in 0..clients {
            let mut t = rng.between(0, 20);
            for _ in 0..per_client {
                let (call, ret) = (t, t + rng.between(1, 40));
                let point = rng.between(call, ret);
                let input = match rng.below(3) {
                    0 => RegInput::Read,
                    1 => {
                        next_value += 1;
                        RegInput::Write(next_value)
                    }
                    _ => {
                        next_value += 1;
                        RegInput::Cas(rng.between(0, next_value), next_value)
                    }
                };
                planned.push((point, c, call, ret, input));
                t = ret + rng.between(0, 10);
            }
        }
        planned.sort_by_key(|p| p.0);
        let mut state = 0;
        let mut h = Vec::new();
        for (i, (_, c, call, ret, input)) in planned.into_iter().enumerate() {
            let output = match input {
                RegInput::Read => RegOutput::Read(state),
                RegInput::Write(v) => {
                    state = v;
                    RegOutput::Written
                }
                RegInput::Cas(from, to) => {
                    let ok = state == from;
                    if ok {
                        state = to;
                    }
                    RegOutput::Cas(ok)
                }
            };
            // Every 40th write never answers.
            let unknown = i % 40 == 7 && matches!(input, RegInput::Write(_));
            h.push(op(
                c,
                call,
                if unknown { NEVER } else { ret },
                input,
                if unknown { RegOutput::Unknown } else { output },
            ));
        }
        h
    }

    #[test]
    fn long_concurrent_histories_are_checked_both_ways() {
        for seed in 0..5 {
            let mut h = simulated(seed, 4, 150);
            assert_eq!(verdict(&h), Verdict::Linearizable, "seed {seed}");
            // Corrupt one read in the middle: it returns a value nobody wrote.
            let reads: Vec<usize> = (0..h.len())
                .filter(|i| h[*i].input == RegInput::Read)
                .collect();
            let victim = reads[reads.len() / 2];
            h[victim].output = RegOutput::Read(u64::MAX - 1);
            assert!(matches!(verdict(&h), Verdict::Violation(_)), "seed {seed}");
        }
    }
}
