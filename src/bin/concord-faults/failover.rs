//! `--mode failover`: a pass/fail check of leader failover for CI.
//!
//! Three scenarios, one after the other, on one cluster under a light load (two register
//! clients): (a) SIGSTOP of the leader, (b) the leader isolated by a partition, both ways, (c) a
//! follower isolated. Each waits for an agreed leader, injects the fault and holds it for 3
//! election timeouts. Before the hold ends, two things must happen:
//! - (a, b) every other member's `Maintenance.Status` names the same new leader, one of them
//!   (so the new leader names itself);
//! - a put through each of the other members succeeds (a put is sent to each every 100 ms,
//!   without waiting for the previous one).
//!
//! Then the fault is healed and the cluster must agree on a leader again within 20 s. In (c)
//! that leader must be the one from before, in the same term, two election timeouts after the
//! heal: a member back from a partition does not depose a healthy leader (etcd's PreVote).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use concord::pb::etcdserverpb::PutRequest;
use futures::stream::{FuturesUnordered, StreamExt};
use serde::Serialize;
use tokio::time::Instant;

use crate::client::{bounded, Clients, Outcome};
use crate::cluster::{Cluster, ELECTION_MS};
use crate::history::Clock;
use crate::rng::Rng;
use crate::server::Server;
use crate::workload::{self, Ctx};

/// What the failover check needs.
pub struct Config {
    /// Seeds the background clients.
    pub seed: u64,
    /// Cluster size.
    pub members: usize,
    /// The server under test.
    pub server: Server,
    /// Where data dirs and logs go.
    pub dir: PathBuf,
    /// Keeps concurrent suites' networks apart.
    pub net_id: u32,
}

/// The ways a member is taken away.
#[derive(Clone, Copy, Debug)]
enum Scenario {
    Pause,
    Isolate,
    RejoinFollower,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Pause => "pause-leader",
            Scenario::Isolate => "isolate-leader",
            Scenario::RejoinFollower => "rejoin-follower",
        }
    }
}

/// One member's first successful write during the hold.
#[derive(Clone, Debug, Serialize)]
pub struct Write {
    /// The member.
    pub member: usize,
    /// From the fault's start to that put's answer (`None`: none before the hold ended).
    pub ms: Option<u64>,
}

/// The outcome of one scenario.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioResult {
    /// `pause-leader`, `isolate-leader` or `rejoin-follower`.
    pub scenario: &'static str,
    /// The member that was taken away.
    pub faulted: Option<usize>,
    /// Whether it passed.
    pub passed: bool,
    /// The new leader every other member agreed on.
    pub new_leader: Option<usize>,
    /// From the fault's start until that agreement was seen.
    pub new_leader_ms: Option<u64>,
    /// The first write through each other member.
    pub writes: Vec<Write>,
    /// Why it failed.
    pub failures: Vec<String>,
}

/// Runs both scenarios on one new cluster.
pub async fn run(cfg: &Config) -> Result<Vec<ScenarioResult>> {
    let (mut cluster, clients) =
        crate::run::fresh_cluster(&cfg.dir, cfg.net_id, cfg.members, &cfg.server).await?;
    let ids = member_ids(&clients, cfg.members).await?;
    let ctx = Ctx::new(clients, Clock::start());
    let mut rng = Rng::new(cfg.seed);
    let load: Vec<_> = (0..2)
        .map(|c| tokio::spawn(workload::register::run(ctx.clone(), c, rng.fork())))
        .collect();
    let mut results = Vec::new();
    for s in [Scenario::Pause, Scenario::Isolate, Scenario::RejoinFollower] {
        tracing::info!(scenario = s.name(), "failover scenario");
        results.push(scenario(&mut cluster, &ctx, &ids, s).await?);
    }
    ctx.stop();
    let all = futures::future::join_all(load);
    if tokio::time::timeout(Duration::from_secs(10), all)
        .await
        .is_err()
    {
        ctx.abort();
    }
    cluster.kill_all()?;
    Ok(results)
}

/// Every member's id, from its own Status.
async fn member_ids(clients: &Clients, n: usize) -> Result<Vec<u64>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut ids = vec![0; n];
    while ids.contains(&0) {
        if Instant::now() > deadline {
            return Err(anyhow!("members did not report their ids: {ids:?}"));
        }
        for (m, id) in ids.iter_mut().enumerate() {
            if *id == 0 {
                if let Some((member, _)) = clients.status(m, Duration::from_millis(500)).await {
                    *id = member;
                }
            }
        }
    }
    Ok(ids)
}

async fn scenario(
    cluster: &mut Cluster,
    ctx: &Arc<Ctx>,
    ids: &[u64],
    s: Scenario,
) -> Result<ScenarioResult> {
    let mut result = ScenarioResult {
        scenario: s.name(),
        faulted: None,
        passed: false,
        new_leader: None,
        new_leader_ms: None,
        writes: Vec::new(),
        failures: Vec::new(),
    };
    // Let the last scenario's leader catch its followers up under the load.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let Ok(leader) = cluster
        .wait_leader(&ctx.clients, Duration::from_secs(20))
        .await
    else {
        result
            .failures
            .push("no agreed leader before the fault".into());
        return Ok(result);
    };
    let n = cluster.size();
    let target = match s {
        Scenario::RejoinFollower => (leader + 1) % n,
        _ => leader,
    };
    result.faulted = Some(target);
    let term_before = ctx
        .clients
        .status_term(leader, Duration::from_secs(1))
        .await;
    let others: Vec<usize> = (0..n).filter(|m| *m != target).collect();
    let hold = Duration::from_millis(3 * ELECTION_MS);
    let start = Instant::now();
    match s {
        Scenario::Pause => cluster.pause(target)?,
        Scenario::Isolate | Scenario::RejoinFollower => {
            cluster.net.partition(&[vec![target], others.clone()])?
        }
    }
    let deadline = start + hold;
    let writes = others.iter().map(|m| first_write(ctx, *m, start, deadline));
    let elect = async {
        match s {
            Scenario::RejoinFollower => None,
            _ => new_leader(&ctx.clients, ids, leader, &others, start, deadline).await,
        }
    };
    let (agreed, writes) = tokio::join!(elect, futures::future::join_all(writes));
    tokio::time::sleep_until(deadline).await;
    match s {
        Scenario::Pause => cluster.resume(target)?,
        Scenario::Isolate | Scenario::RejoinFollower => cluster.net.heal()?,
    }
    let hold_ms = hold.as_millis();
    match (s, agreed) {
        (Scenario::RejoinFollower, _) => {
            tokio::time::sleep(Duration::from_millis(2 * ELECTION_MS)).await;
            let kept = kept_leader(&ctx.clients, ids, leader, term_before, n).await;
            if let Err(e) = kept {
                result.failures.push(e);
            }
        }
        (_, Some((m, ms))) => {
            result.new_leader = Some(m);
            result.new_leader_ms = Some(ms);
        }
        (_, None) => result.failures.push(format!(
            "no new leader agreed on by every other member within {hold_ms} ms"
        )),
    }
    for (m, ms) in others.iter().zip(writes) {
        if ms.is_none() {
            result
                .failures
                .push(format!("no write through m{m} within {hold_ms} ms"));
        }
        result.writes.push(Write { member: *m, ms });
    }
    if cluster
        .wait_leader(&ctx.clients, Duration::from_secs(20))
        .await
        .is_err()
    {
        result
            .failures
            .push("no agreed leader 20 s after healing".into());
    }
    result.passed = result.failures.is_empty();
    Ok(result)
}

/// Whether every member names `leader` in the term it had before the fault.
async fn kept_leader(
    clients: &Clients,
    ids: &[u64],
    leader: usize,
    before: Option<(u64, u64, u64)>,
    n: usize,
) -> std::result::Result<(), String> {
    let (_, _, term) = before.ok_or("the leader's term before the fault is unknown")?;
    let id = ids.get(leader).copied().unwrap_or(0);
    for m in 0..n {
        match clients.status_term(m, Duration::from_secs(1)).await {
            Some((_, l, t)) if l == id && t == term => {}
            Some((_, l, t)) => {
                return Err(format!(
                "after the heal m{m} names leader {l:x} in term {t}; before: {id:x} in term {term}"
            ))
            }
            None => return Err(format!("m{m} did not answer Status after the heal")),
        }
    }
    Ok(())
}

/// Polls every member of `others` until they all name the same leader, one of them (not
/// `old`); returns it and the ms since `start`.
async fn new_leader(
    clients: &Clients,
    ids: &[u64],
    old: usize,
    others: &[usize],
    start: Instant,
    deadline: Instant,
) -> Option<(usize, u64)> {
    let old_id = ids.get(old).copied().unwrap_or(0);
    while Instant::now() < deadline {
        let limit = deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(500));
        let named =
            futures::future::join_all(others.iter().map(|m| clients.status(*m, limit))).await;
        let leaders: Option<Vec<u64>> = named.into_iter().map(|s| s.map(|(_, l)| l)).collect();
        if let Some(leaders) = leaders {
            let first = leaders.first().copied().unwrap_or(0);
            let winner = others.iter().find(|m| ids.get(**m) == Some(&first));
            if first != 0 && first != old_id && leaders.iter().all(|l| *l == first) {
                if let Some(w) = winner {
                    if Instant::now() <= deadline {
                        return Some((*w, start.elapsed().as_millis() as u64));
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Sends a put through member `m` every 100 ms until one succeeds; returns the ms from `start`
/// to its answer, or `None` if none succeeded before `deadline`.
async fn first_write(ctx: &Ctx, m: usize, start: Instant, deadline: Instant) -> Option<u64> {
    let mut in_flight = FuturesUnordered::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut seq = 0u32;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let limit = deadline.saturating_duration_since(Instant::now());
                if limit.is_zero() {
                    continue;
                }
                seq += 1;
                let mut kv = ctx.clients.kv(m);
                let req = PutRequest {
                    key: format!("failover/{m}/{seq}").into(),
                    value: "probe".into(),
                    ..Default::default()
                };
                in_flight.push(async move { matches!(bounded(limit, kv.put(req)).await, Outcome::Ok(_)) });
            }
            Some(ok) = in_flight.next() => {
                if ok && Instant::now() <= deadline {
                    return Some(start.elapsed().as_millis() as u64);
                }
            }
            _ = tokio::time::sleep_until(deadline) => return None,
        }
    }
}

/// Prints one line per scenario and the final `N passed, M failed`; whether all passed.
pub fn report(results: &[ScenarioResult], server: &str) -> bool {
    let ms = |v: Option<u64>| v.map_or_else(|| "—".to_string(), |v| format!("{v} ms"));
    for r in results {
        let faulted = r.faulted.map_or_else(|| "?".into(), |m| format!("m{m}"));
        let leader = match (r.new_leader, r.new_leader_ms) {
            (Some(m), Some(t)) => format!("new leader m{m} after {t} ms"),
            _ => "no new leader".into(),
        };
        let writes: Vec<String> = r
            .writes
            .iter()
            .map(|w| format!("m{} {}", w.member, ms(w.ms)))
            .collect();
        let verdict = if r.passed { "PASS" } else { "FAIL" };
        println!(
            "{server} {} ({faulted} taken away): {verdict}: {leader}; first write {}",
            r.scenario,
            writes.join(", ")
        );
        for f in &r.failures {
            println!("  {f}");
        }
    }
    let passed = results.iter().filter(|r| r.passed).count();
    println!("{passed} passed, {} failed", results.len() - passed);
    passed == results.len()
}
