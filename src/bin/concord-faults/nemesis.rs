//! The nemesis: faults, a schedule of them chosen by the seed, and probes of a cut-off minority.
//!
//! Every fault records when it began (right before the injection), when it was in place, and
//! when it was healed (right after the heal, before the wait for a leader), for the checkers
//! and the availability report. The random draws do not depend on the server or on timing: the
//! same seed gives the same kinds, holds and random targets on Concord and on etcd (the leader,
//! of course, is whichever member won the election).

use std::time::Duration;

use anyhow::Result;

use crate::client::{bounded, Outcome};
use crate::cluster::Cluster;
use crate::history::{FaultRecord, MinorityProbe};
use crate::rng::Rng;
use crate::workload::Ctx;

/// The faults the suite injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `kill -9` of a random member, restarted later.
    KillRandom,
    /// `kill -9` of the leader, restarted later.
    KillLeader,
    /// SIGSTOP of the leader for longer than the election timeout, then SIGCONT.
    PauseLeader,
    /// The leader cut off from everyone else.
    IsolateLeader,
    /// A random minority cut off from the majority.
    SplitMinority,
    /// A one-way cut: one member stops receiving from another (leader ↔ a follower).
    OneWayCut,
    /// `kill -9` of every member at once, then all restarted.
    CrashAll,
    /// Every log fsync of the leader and one follower takes an extra 200–400 ms.
    SlowDisk,
    /// Every member's disk slows down, then every member is killed mid-write and restarted:
    /// acknowledged writes must have been on disk.
    CrashSlowDisk,
}

impl Fault {
    /// Every kind, in declaration order.
    pub const ALL: [Fault; 9] = [
        Fault::KillRandom,
        Fault::KillLeader,
        Fault::PauseLeader,
        Fault::IsolateLeader,
        Fault::SplitMinority,
        Fault::OneWayCut,
        Fault::CrashAll,
        Fault::SlowDisk,
        Fault::CrashSlowDisk,
    ];

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillRandom => "kill-random",
            Fault::KillLeader => "kill-leader",
            Fault::PauseLeader => "pause-leader",
            Fault::IsolateLeader => "isolate-leader",
            Fault::SplitMinority => "split-minority",
            Fault::OneWayCut => "one-way-cut",
            Fault::CrashAll => "crash-all",
            Fault::SlowDisk => "slow-disk",
            Fault::CrashSlowDisk => "crash-slow-disk",
        }
    }
}

/// The kinds that take the leader away or cut the cluster: what availability comparisons
/// measure (no slow disk, which only Concord can inject).
pub const LEADER_FAULTS: [Fault; 7] = [
    Fault::KillRandom,
    Fault::KillLeader,
    Fault::PauseLeader,
    Fault::IsolateLeader,
    Fault::SplitMinority,
    Fault::OneWayCut,
    Fault::CrashAll,
];

/// Which faults a history gets.
#[derive(Clone, Copy, Debug)]
pub enum Plan {
    /// Every kind once, in a seed-chosen order (short mode).
    EveryKind,
    /// This many random picks among every kind (soak mode).
    Random(usize),
    /// This many faults among [`LEADER_FAULTS`], in seed-shuffled rounds of every such kind,
    /// so each kind comes up equally often (availability mode).
    Leader(usize),
    /// This many faults, all of one kind (soak mode with `--only`).
    Only(Fault, usize),
}

/// The faults of one history, drawn from the seed.
pub fn schedule(rng: &mut Rng, plan: Plan) -> Vec<Fault> {
    match plan {
        Plan::EveryKind => {
            let mut all = Fault::ALL.to_vec();
            rng.shuffle(&mut all);
            all
        }
        Plan::Random(n) => (0..n)
            .map(|_| Fault::ALL[rng.below(Fault::ALL.len())])
            .collect(),
        Plan::Leader(n) => {
            let mut out = Vec::with_capacity(n);
            while out.len() < n {
                let mut round = LEADER_FAULTS.to_vec();
                rng.shuffle(&mut round);
                out.extend(round.into_iter().take(n - out.len()));
            }
            out
        }
        Plan::Only(kind, n) => vec![kind; n],
    }
}

/// Injects `fault`, holds it for a seed-chosen time, heals it, and waits for a leader again.
pub async fn inject(cluster: &mut Cluster, ctx: &Ctx, fault: Fault, rng: &mut Rng) -> Result<()> {
    let n = cluster.size();
    // Drawn whether or not a leader is found, so later draws never depend on timing.
    let fallback = rng.below(n);
    let leader = cluster.leader(&ctx.clients).await.unwrap_or(fallback);
    let hold = Duration::from_millis(rng.between(2500, 4500));
    let injected = fault != Fault::SlowDisk || cluster.server().slow_disk();
    let start = ctx.clock.now();
    let in_place;
    let mut members = vec![leader];
    match fault {
        Fault::KillRandom | Fault::KillLeader => {
            let m = if fault == Fault::KillRandom {
                rng.below(n)
            } else {
                leader
            };
            members = vec![m];
            cluster.kill(m)?;
            in_place = ctx.clock.now();
            tokio::time::sleep(hold).await;
            cluster.spawn(m)?;
        }
        Fault::PauseLeader => {
            cluster.pause(leader)?;
            in_place = ctx.clock.now();
            tokio::time::sleep(hold).await;
            cluster.resume(leader)?;
        }
        Fault::IsolateLeader => {
            let rest: Vec<usize> = (0..n).filter(|m| *m != leader).collect();
            cluster.net.partition(&[vec![leader], rest])?;
            in_place = ctx.clock.now();
            probe_minority(ctx, &[leader], hold).await;
            cluster.net.heal()?;
        }
        Fault::SplitMinority => {
            let mut all: Vec<usize> = (0..n).collect();
            rng.shuffle(&mut all);
            let (minority, majority) = all.split_at((n - 1) / 2);
            members = minority.to_vec();
            cluster
                .net
                .partition(&[minority.to_vec(), majority.to_vec()])?;
            in_place = ctx.clock.now();
            probe_minority(ctx, minority, hold).await;
            cluster.net.heal()?;
        }
        Fault::OneWayCut => {
            let follower = (leader + 1 + rng.below(n - 1)) % n;
            let (from, to) = if rng.below(2) == 0 {
                (leader, follower)
            } else {
                (follower, leader)
            };
            members = vec![from, to];
            cluster.net.cut(from, to)?;
            in_place = ctx.clock.now();
            tokio::time::sleep(hold).await;
            cluster.net.heal()?;
        }
        Fault::CrashAll => {
            members = (0..n).collect();
            cluster.kill_all()?;
            in_place = ctx.clock.now();
            tokio::time::sleep(Duration::from_millis(rng.between(200, 1500))).await;
            for m in 0..n {
                cluster.spawn(m)?;
            }
        }
        Fault::SlowDisk => {
            let other = (leader + 1 + rng.below(n - 1)) % n;
            members = vec![leader, other];
            for m in &members {
                cluster.slow_disk(*m, rng.between(200, 400))?;
            }
            in_place = ctx.clock.now();
            tokio::time::sleep(hold).await;
            for m in &members {
                cluster.slow_disk(*m, 0)?;
            }
        }
        Fault::CrashSlowDisk => {
            members = (0..n).collect();
            for m in 0..n {
                cluster.slow_disk(m, rng.between(100, 500))?;
            }
            tokio::time::sleep(Duration::from_millis(rng.between(500, 2000))).await;
            cluster.kill_all()?;
            in_place = ctx.clock.now();
            for m in 0..n {
                cluster.slow_disk(m, 0)?;
                cluster.spawn(m)?;
            }
        }
    }
    let end = ctx.clock.now();
    ctx.rec.get().faults.push(FaultRecord {
        kind: fault.name().into(),
        members,
        start,
        in_place,
        end,
        injected,
    });
    tracing::info!(fault = fault.name(), "healed");
    if cluster
        .wait_leader(&ctx.clients, Duration::from_secs(20))
        .await
        .is_err()
    {
        ctx.rec.get().harness_violations.push(format!(
            "availability: no leader 20 s after healing {}",
            fault.name()
        ));
    }
    tokio::time::sleep(Duration::from_millis(rng.between(1000, 2000))).await;
    Ok(())
}

/// While a partition holds `minority` apart, sends each of its members a put and a
/// linearizable get, each of which must fail before the partition heals.
async fn probe_minority(ctx: &Ctx, minority: &[usize], hold: Duration) {
    let started = tokio::time::Instant::now();
    // Requests already in flight when the cut happened may still complete; probe after that.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let limit = hold.saturating_sub(Duration::from_millis(600));
    // The put and the get run side by side, each bounded by what is left of the hold, so the
    // fault lasts as long on a server whose minority fails fast as on one whose requests wait.
    let probes = minority.iter().map(|m| async move {
        let put = async {
            let call = ctx.clock.now();
            let mut kv = ctx.clients.kv(*m);
            let put = kv.put(concord::pb::etcdserverpb::PutRequest {
                key: format!("minority/{m}/{call}").into(),
                value: "must not commit".into(),
                ..Default::default()
            });
            let ok = matches!(bounded(limit, put).await, Outcome::Ok(_));
            (call, ctx.clock.now(), ok)
        };
        let get = async {
            let call = ctx.clock.now();
            let mut kv = ctx.clients.kv(*m);
            let get = kv.range(concord::pb::etcdserverpb::RangeRequest {
                key: "r/".into(),
                ..Default::default()
            });
            let ok = matches!(bounded(limit, get).await, Outcome::Ok(_));
            (call, ctx.clock.now(), ok)
        };
        let ((put_call, put_ret, put_ok), (get_call, get_ret, get_ok)) =
            futures::future::join(put, get).await;
        let mut h = ctx.rec.get();
        h.minority_probes.push(MinorityProbe {
            member: *m,
            kind: "put".into(),
            call: put_call,
            ret: put_ret,
            succeeded: put_ok,
        });
        h.minority_probes.push(MinorityProbe {
            member: *m,
            kind: "linearizable get".into(),
            call: get_call,
            ret: get_ret,
            succeeded: get_ok,
        });
    });
    futures::future::join_all(probes).await;
    if let Some(rest) = hold.checked_sub(started.elapsed()) {
        tokio::time::sleep(rest).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_schedules_are_leader_faults_in_even_rounds() {
        let s = schedule(&mut Rng::new(3), Plan::Leader(16));
        assert_eq!(s.len(), 16);
        assert!(s.iter().all(|f| LEADER_FAULTS.contains(f)));
        for kind in LEADER_FAULTS {
            let count = s.iter().filter(|f| **f == kind).count();
            assert!((2..=3).contains(&count), "{} {count}", kind.name());
        }
        let again = schedule(&mut Rng::new(3), Plan::Leader(16));
        assert_eq!(s, again, "the same seed gives the same schedule");
    }

    #[test]
    fn short_and_soak_schedules_keep_their_shape() {
        let mut every = schedule(&mut Rng::new(1), Plan::EveryKind);
        every.sort_by_key(|f| f.name());
        let mut all = Fault::ALL.to_vec();
        all.sort_by_key(|f| f.name());
        assert_eq!(every, all);
        assert_eq!(schedule(&mut Rng::new(1), Plan::Random(12)).len(), 12);
    }
}
