//! Availability, beside safety: what each fault cost the clients, and how fast service came
//! back.
//!
//! - **Write probes:** every 100 ms, a put to `avail/<member>/<n>` is sent to every member,
//!   bounded by the call timeout, without waiting for the previous one (a hung call does not
//!   blind the measurement).
//! - **Ops during a fault:** every client call noted by the workloads (`history::AvailOp`)
//!   sent in `[start, end)` of the fault: ok, failed (an error answer) or indeterminate (no
//!   answer in time).
//! - **First write:** for each member that should keep serving (everyone but the killed,
//!   paused or isolated ones; the majority side of a split; everyone under a one-way cut or a
//!   slow disk; nobody during a full crash), the time from the fault's start to the end of its
//!   first successful write (a probe or a workload's put) sent once the fault was in place.
//! - **Heal to full service:** the time from the heal to the moment every member has completed
//!   a successful write (a probe or a workload's put) sent after the heal.
//!
//! Until 2026-11-26 both counted probes only, so they were rounded up to the probe period (up
//! to 100 ms later than the service came back); the workloads' puts reach every member every
//! few milliseconds.
//!
//! [`table`] aggregates these per fault kind over every history of a run, as Markdown.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use concord::pb::etcdserverpb::PutRequest;
use serde::Serialize;
use tokio::task::{JoinHandle, JoinSet};

use crate::client::{bounded, CALL_TIMEOUT};
use crate::history::{CallOutcome, FaultRecord, History, Probe};
use crate::nemesis::Fault;
use crate::workload::Ctx;

/// How often every member gets a probe.
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// The running write probes.
pub struct Prober {
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Prober {
    /// Starts probing every member.
    pub fn start(ctx: Arc<Ctx>) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(probe_loop(ctx, stop.clone()));
        Prober { stop, task }
    }

    /// Stops sending probes and waits for those in flight (each is bounded).
    pub async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
    }
}

async fn probe_loop(ctx: Arc<Ctx>, stop: Arc<AtomicBool>) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_flight = JoinSet::new();
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) && !ctx.aborted() {
        tick.tick().await;
        seq += 1;
        for m in 0..ctx.clients.len() {
            let ctx = ctx.clone();
            in_flight.spawn(async move {
                let req = PutRequest {
                    key: format!("avail/{m}/{seq}").into(),
                    value: "probe".into(),
                    ..Default::default()
                };
                let call = ctx.clock.now();
                let out = bounded(CALL_TIMEOUT, ctx.clients.kv(m).put(req)).await;
                let ret = ctx.clock.now();
                ctx.rec.get().probes.push(Probe {
                    member: m,
                    call,
                    ret,
                    outcome: out.call_outcome(),
                });
            });
        }
        while in_flight.try_join_next().is_some() {}
    }
    while in_flight.join_next().await.is_some() {}
}

/// One serving member's first write after a fault began.
#[derive(Clone, Debug, Serialize)]
pub struct FirstWrite {
    /// The member.
    pub member: usize,
    /// From the fault's start to the end of its first successful probe (`None`: none until
    /// the probes stopped).
    pub ms: Option<u64>,
    /// Whether that write completed before the heal.
    pub during_fault: bool,
}

/// The availability numbers of one fault.
#[derive(Clone, Debug, Serialize)]
pub struct FaultAvail {
    /// The history's seed.
    pub seed: u64,
    /// The fault kind.
    pub kind: String,
    /// The members it hit.
    pub members: Vec<usize>,
    /// Whether anything was injected (not a slow disk on etcd).
    pub injected: bool,
    /// When it began, was in place, and was healed (ms since the history began).
    pub start_ms: u64,
    /// See `start_ms`.
    pub in_place_ms: u64,
    /// See `start_ms`.
    pub end_ms: u64,
    /// Client calls sent during the fault that were answered.
    pub ops_ok: usize,
    /// ... that got an error.
    pub ops_failed: usize,
    /// ... that got no answer in time.
    pub ops_indeterminate: usize,
    /// The first write on each member that should keep serving.
    pub first_write: Vec<FirstWrite>,
    /// From the heal until every member had completed a successful probe sent after the heal
    /// (`None`: never, before the probes stopped).
    pub heal_to_full_service_ms: Option<u64>,
}

/// The members that should keep serving during `f` in a cluster of `n`.
fn serving(f: &FaultRecord, n: usize) -> Vec<usize> {
    match f.kind.as_str() {
        "one-way-cut" | "slow-disk" => (0..n).collect(),
        "crash-all" | "crash-slow-disk" => Vec::new(),
        _ => (0..n).filter(|m| !f.members.contains(m)).collect(),
    }
}

/// The end of member `m`'s first successful write sent at or after `from`: a probe, or a put
/// of the workloads (which go out every few milliseconds, so the times are not rounded up to
/// the next probe).
fn first_ok(h: &History, m: usize, from: u64) -> Option<u64> {
    let probes = h
        .probes
        .iter()
        .filter(|p| p.member == m && p.call >= from && p.outcome == CallOutcome::Ok)
        .map(|p| p.ret);
    let puts = h
        .avail_ops
        .iter()
        .filter(|o| {
            o.member == m && o.kind == "put" && o.call >= from && o.outcome == CallOutcome::Ok
        })
        .map(|o| o.ret);
    probes.chain(puts).min()
}

/// The availability numbers of every fault of history `h` (a cluster of `n` members).
pub fn analyze(h: &History, n: usize) -> Vec<FaultAvail> {
    h.faults
        .iter()
        .map(|f| {
            let during = h
                .avail_ops
                .iter()
                .filter(|o| o.call >= f.start && o.call < f.end);
            let count = |want| during.clone().filter(|o| o.outcome == want).count();
            let first_write = serving(f, n)
                .into_iter()
                .map(|m| {
                    let ret = first_ok(h, m, f.in_place);
                    FirstWrite {
                        member: m,
                        ms: ret.map(|r| r.saturating_sub(f.start) / 1000),
                        during_fault: ret.is_some_and(|r| r < f.end),
                    }
                })
                .collect();
            let full: Option<Vec<u64>> = (0..n).map(|m| first_ok(h, m, f.end)).collect();
            FaultAvail {
                seed: h.seed,
                kind: f.kind.clone(),
                members: f.members.clone(),
                injected: f.injected,
                start_ms: f.start / 1000,
                in_place_ms: f.in_place / 1000,
                end_ms: f.end / 1000,
                ops_ok: count(CallOutcome::Ok),
                ops_failed: count(CallOutcome::Failed),
                ops_indeterminate: count(CallOutcome::Timeout),
                first_write,
                heal_to_full_service_ms: full
                    .and_then(|t| t.into_iter().max())
                    .map(|t| t.saturating_sub(f.end) / 1000),
            }
        })
        .collect()
}

/// The numbers of one fault kind over a whole run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KindRow {
    /// The fault kind.
    pub kind: String,
    /// How many faults of this kind were scheduled.
    pub faults: usize,
    /// How many of them injected something (the rest are "n/a").
    pub injected: usize,
    /// Client calls during those faults: answered, ...
    pub ops_ok: usize,
    /// ... error answers, ...
    pub ops_failed: usize,
    /// ... no answer in time.
    pub ops_indeterminate: usize,
    /// Answered calls in percent of all (`None`: no calls).
    pub ops_ok_percent: Option<f64>,
    /// Median and max of the first write on each serving member (ms).
    pub first_write_median_ms: Option<u64>,
    /// See `first_write_median_ms`.
    pub first_write_max_ms: Option<u64>,
    /// Serving members that never completed a write (before the probes stopped).
    pub first_write_never: usize,
    /// Median and max of heal to full service (ms).
    pub heal_median_ms: Option<u64>,
    /// See `heal_median_ms`.
    pub heal_max_ms: Option<u64>,
    /// Faults after which full service never came back (before the probes stopped).
    pub heal_never: usize,
}

/// The median of `v` (the mean of the two middle values for an even count).
fn median(v: &mut [u64]) -> Option<u64> {
    v.sort_unstable();
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => v.get(n / 2).copied(),
        _ => Some((v.get(n / 2 - 1)? + v.get(n / 2)?) / 2),
    }
}

/// One row per fault kind (in the suite's order), over every fault of `all`.
pub fn aggregate(all: &[FaultAvail]) -> Vec<KindRow> {
    let mut by_kind: BTreeMap<usize, KindRow> = BTreeMap::new();
    let mut writes: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    let mut heals: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for f in all {
        let order = Fault::ALL
            .iter()
            .position(|k| k.name() == f.kind)
            .unwrap_or(Fault::ALL.len());
        let row = by_kind.entry(order).or_insert_with(|| KindRow {
            kind: f.kind.clone(),
            ..Default::default()
        });
        row.faults += 1;
        if !f.injected {
            continue;
        }
        row.injected += 1;
        row.ops_ok += f.ops_ok;
        row.ops_failed += f.ops_failed;
        row.ops_indeterminate += f.ops_indeterminate;
        for w in &f.first_write {
            match w.ms {
                Some(ms) => writes.entry(order).or_default().push(ms),
                None => row.first_write_never += 1,
            }
        }
        match f.heal_to_full_service_ms {
            Some(ms) => heals.entry(order).or_default().push(ms),
            None => row.heal_never += 1,
        }
    }
    for (order, row) in by_kind.iter_mut() {
        let total = row.ops_ok + row.ops_failed + row.ops_indeterminate;
        row.ops_ok_percent = (total > 0).then(|| 100.0 * row.ops_ok as f64 / total as f64);
        if let Some(w) = writes.get_mut(order) {
            row.first_write_median_ms = median(w);
            row.first_write_max_ms = w.iter().max().copied();
        }
        if let Some(h) = heals.get_mut(order) {
            row.heal_median_ms = median(h);
            row.heal_max_ms = h.iter().max().copied();
        }
    }
    by_kind.into_values().collect()
}

fn ms(v: Option<u64>) -> String {
    v.map_or_else(|| "—".into(), |v| v.to_string())
}

fn max_with_never(max: Option<u64>, never: usize) -> String {
    match (max, never) {
        (_, 0) => ms(max),
        (None, k) => format!("never ({k})"),
        (Some(m), k) => format!("{m}, never ({k})"),
    }
}

/// The Markdown table of `rows`, for a run against `server` (`concord` or `etcd`).
pub fn table(rows: &[KindRow], server: &str) -> String {
    let mut out = String::from(
        "| fault | faults | ops ok | ops failed | ops indeterminate | % ok | first write, median (ms) \
         | first write, max (ms) | heal → full service, median (ms) | heal → full service, max (ms) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut footnote = false;
    for r in rows {
        if r.injected == 0 {
            out.push_str(&format!(
                "| {} | {} (not injected on {server}) | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a |\n",
                r.kind, r.faults
            ));
            continue;
        }
        let mut kind = r.kind.clone();
        if kind == "crash-slow-disk" && server == "etcd" {
            kind.push('*');
            footnote = true;
        }
        out.push_str(&format!(
            "| {kind} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.faults,
            r.ops_ok,
            r.ops_failed,
            r.ops_indeterminate,
            r.ops_ok_percent
                .map_or_else(|| "—".into(), |p| format!("{p:.1}")),
            ms(r.first_write_median_ms),
            max_with_never(r.first_write_max_ms, r.first_write_never),
            ms(r.heal_median_ms),
            max_with_never(r.heal_max_ms, r.heal_never),
        ));
    }
    if footnote {
        out.push_str("\n\\* etcd has no slow-disk failpoint: only the crash was injected.\n");
    }
    out
}

/// What `--availability-json` writes.
#[derive(Serialize)]
pub struct Report<'a> {
    /// `concord` or `etcd`.
    pub server: &'a str,
    /// The suite's mode.
    pub mode: &'a str,
    /// Cluster size.
    pub members: usize,
    /// The seeds of the histories.
    pub seeds: &'a [u64],
    /// Every fault's numbers.
    pub faults: &'a [FaultAvail],
    /// The aggregate per kind (the printed table).
    pub by_kind: &'a [KindRow],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{AvailOp, FaultRecord, Probe};

    fn probe(member: usize, call: u64, ret: u64, ok: bool) -> Probe {
        Probe {
            member,
            call,
            ret,
            outcome: if ok {
                CallOutcome::Ok
            } else {
                CallOutcome::Timeout
            },
        }
    }

    #[test]
    fn first_write_and_heal_to_full_service() {
        let mut h = History::default();
        h.faults.push(FaultRecord {
            kind: "kill-leader".into(),
            members: vec![0],
            start: 1_000_000,
            in_place: 1_010_000,
            end: 4_000_000,
            injected: true,
        });
        h.probes = vec![
            // Sent before the kill landed: does not count.
            probe(1, 1_005_000, 1_008_000, true),
            probe(1, 1_100_000, 3_100_000, false),
            probe(1, 2_000_000, 2_500_000, true),
            probe(2, 2_100_000, 2_200_000, true),
            // After the heal: member 0 comes back last.
            probe(0, 4_000_000, 4_900_000, true),
            probe(1, 4_100_000, 4_150_000, true),
            probe(2, 4_100_000, 4_120_000, true),
        ];
        let op = |call, outcome| AvailOp {
            member: 1,
            kind: "put",
            call,
            ret: call + 1,
            outcome,
        };
        h.avail_ops = vec![
            op(999_999, CallOutcome::Failed),
            op(1_000_000, CallOutcome::Ok),
            op(2_000_000, CallOutcome::Failed),
            op(3_000_000, CallOutcome::Timeout),
            op(4_000_000, CallOutcome::Timeout),
        ];
        // A workload's put counts as a write, ahead of the next probe; a read does not.
        let other = |kind, call| AvailOp {
            member: 2,
            kind,
            call,
            ret: call + 10_000,
            outcome: CallOutcome::Ok,
        };
        h.avail_ops.push(other("get", 1_020_000));
        h.avail_ops.push(other("put", 1_050_000));
        h.avail_ops.push(other("put", 4_010_000));
        let a = analyze(&h, 3);
        let f = &a[0];
        assert_eq!(
            (f.ops_ok, f.ops_failed, f.ops_indeterminate),
            (3, 1, 1),
            "only calls in [start, end)"
        );
        let w: Vec<(usize, Option<u64>)> = f.first_write.iter().map(|w| (w.member, w.ms)).collect();
        assert_eq!(w, vec![(1, Some(1500)), (2, Some(60))]);
        assert_eq!(f.heal_to_full_service_ms, Some(900));
        let rows = aggregate(&a);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].first_write_median_ms, Some(780));
        assert_eq!(rows[0].first_write_max_ms, Some(1500));
        assert!(table(&rows, "concord")
            .contains("| kill-leader | 1 | 3 | 1 | 1 | 60.0 | 780 | 1500 | 900 | 900 |"));
    }

    #[test]
    fn a_fault_that_injected_nothing_is_not_applicable() {
        let f = FaultAvail {
            seed: 1,
            kind: "slow-disk".into(),
            members: vec![0, 1],
            injected: false,
            start_ms: 0,
            in_place_ms: 0,
            end_ms: 1,
            ops_ok: 5,
            ops_failed: 0,
            ops_indeterminate: 0,
            first_write: Vec::new(),
            heal_to_full_service_ms: Some(3),
        };
        let rows = aggregate(&[f]);
        assert_eq!(
            (rows[0].faults, rows[0].injected, rows[0].ops_ok),
            (1, 0, 0)
        );
        assert!(table(&rows, "etcd").contains("n/a"));
    }
}
