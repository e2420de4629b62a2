//! One run (one history): start a cluster, run every workload and the availability probes
//! while the nemesis injects its schedule, heal, let the clients finish, restart the whole
//! cluster, read the final state, and return the history for the checkers and the
//! availability report.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::task::JoinHandle;

use crate::avail::Prober;
use crate::client::{Clients, Outcome};
use crate::cluster::Cluster;
use crate::history::{Clock, History, RegInput, RegOp, RegOutput};
use crate::nemesis::{self, Fault, Plan};
use crate::net::Net;
use crate::rng::Rng;
use crate::server::Server;
use crate::workload::{self, Ctx};
use concord::pb::etcdserverpb::RangeResponse;

/// What one run needs.
pub struct RunConfig {
    /// The seed: schedule, fault targets and client choices all follow from it.
    pub seed: u64,
    /// Cluster size.
    pub members: usize,
    /// Which faults the history gets.
    pub plan: Plan,
    /// The server under test.
    pub server: Server,
    /// Where this run keeps data dirs, logs and (if it fails) its history.
    pub dir: PathBuf,
    /// Keeps concurrent suites' networks apart.
    pub net_id: u32,
}

/// Runs one history; returns it and the faults injected.
pub async fn run(cfg: &RunConfig) -> Result<(History, Vec<Fault>)> {
    let mut rng = Rng::new(cfg.seed);
    let (mut cluster, clients) =
        fresh_cluster(&cfg.dir, cfg.net_id, cfg.members, &cfg.server).await?;
    let ctx = Ctx::new(clients, Clock::start());
    ctx.rec.get().seed = cfg.seed;
    let prober = Prober::start(ctx.clone());

    let mut writers: Vec<JoinHandle<()>> = Vec::new();
    for c in 0..5 {
        writers.push(tokio::spawn(workload::register::run(
            ctx.clone(),
            c,
            rng.fork(),
        )));
    }
    for c in 0..3 {
        writers.push(tokio::spawn(workload::lock::run(
            ctx.clone(),
            100 + c,
            rng.fork(),
        )));
    }
    for c in 0..2 {
        writers.push(tokio::spawn(workload::lease::run(
            ctx.clone(),
            200 + c,
            rng.fork(),
        )));
        writers.push(tokio::spawn(workload::durable::run(
            ctx.clone(),
            300 + c,
            rng.fork(),
        )));
    }
    writers.push(tokio::spawn(workload::watch::writer(
        ctx.clone(),
        rng.fork(),
    )));
    let watchers: Vec<JoinHandle<()>> = (0..4)
        .map(|w| tokio::spawn(workload::watch::watcher(ctx.clone(), w, rng.fork())))
        .collect();

    tokio::time::sleep(Duration::from_secs(2)).await;
    let schedule = nemesis::schedule(&mut rng, cfg.plan);
    for fault in &schedule {
        tracing::info!(fault = fault.name(), "injecting");
        nemesis::inject(&mut cluster, &ctx, *fault, &mut rng).await?;
    }
    cluster.heal_all()?;
    if cluster
        .wait_leader(&ctx.clients, Duration::from_secs(20))
        .await
        .is_err()
    {
        violation(
            &ctx,
            "availability: no leader 20 s after the final heal".into(),
        );
    }

    // Let the clients finish; leases need to be seen expiring.
    tracing::info!("healed; stopping clients");
    ctx.stop();
    finish(&ctx, writers, Duration::from_secs(90), "client").await;
    prober.stop().await;
    tracing::info!("clients stopped; settling watchers");
    settle_watchers(&ctx, &cluster, watchers).await;
    tracing::info!("final restart");

    final_restart(&mut cluster, &ctx).await;
    final_reads(&ctx).await;
    tracing::info!("final reads done; checking convergence");
    converge(&ctx, cluster.size()).await;
    cluster.kill_all()?;
    drop(cluster);
    // Stragglers (a keeper between sleeps) stop at once; the history is complete already.
    ctx.abort();
    let history = std::mem::take(&mut *ctx.rec.get());
    Ok((history, schedule))
}

/// A new cluster of `members` in a fresh `dir` and network, once it has elected a leader, with
/// clients to every member.
pub async fn fresh_cluster(
    dir: &Path,
    net_id: u32,
    members: usize,
    server: &crate::server::Server,
) -> Result<(Cluster, Clients)> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    let net = Net::create(net_id, members).context("building the network")?;
    let cluster = Cluster::start(net, members, server, dir)?;
    let clients = Clients::new(&cluster.client_urls())?;
    cluster
        .wait_leader(&clients, Duration::from_secs(30))
        .await
        .context("the new cluster elected no leader")?;
    Ok((cluster, clients))
}

fn violation(ctx: &Ctx, v: String) {
    ctx.rec.get().harness_violations.push(v);
}

async fn finish(ctx: &Ctx, tasks: Vec<JoinHandle<()>>, limit: Duration, what: &str) {
    let all = futures::future::join_all(tasks);
    if tokio::time::timeout(limit, all).await.is_err() {
        ctx.abort();
        violation(
            ctx,
            format!("harness: {what} tasks did not finish within {limit:?}"),
        );
    }
}

/// Sets the watchers' target (the prefix's last revision), waits for them to reach it, and
/// records the reference history from one fresh watch.
async fn settle_watchers(ctx: &Ctx, cluster: &Cluster, watchers: Vec<JoinHandle<()>>) {
    let n = cluster.size();
    // The writer never deletes: the newest mod_revision is the prefix's last event.
    let target = read_prefix(ctx, workload::watch::PREFIX)
        .await
        .map(|r| last_mod_revision(&r).unwrap_or(0));
    let Some(target) = target else {
        violation(
            ctx,
            "availability: could not read the watched prefix after healing".into(),
        );
        ctx.abort();
        finish(ctx, watchers, Duration::from_secs(10), "watcher").await;
        return;
    };
    ctx.set_watch_target(target.max(1));
    finish(ctx, watchers, Duration::from_secs(60), "watcher").await;
    let prefix = workload::watch::PREFIX;
    match prefix_history(ctx, n, prefix, target).await {
        Some(events) => ctx.rec.get().watch_reference = events,
        None => violation(
            ctx,
            "watch: no member delivered the reference history".into(),
        ),
    }
}

/// The full event history under `prefix` through revision `target`, from any member.
async fn prefix_history(
    ctx: &Ctx,
    n: usize,
    prefix: &str,
    target: i64,
) -> Option<Vec<crate::history::WatchEvent>> {
    for attempt in 0..10 {
        if let Some(events) = workload::watch::history(ctx, attempt % n, prefix, target).await {
            return Some(events);
        }
    }
    None
}

/// Every key under `prefix` (keys only), asking each member in turn for up to ten seconds.
async fn read_prefix(ctx: &Ctx, prefix: &str) -> Option<RangeResponse> {
    for attempt in 0..50 {
        if let Outcome::Ok(r) = ctx.range_prefix(attempt % ctx.clients.len(), prefix).await {
            return Some(r);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// The newest mod_revision among the keys of `r`.
fn last_mod_revision(r: &RangeResponse) -> Option<i64> {
    r.kvs.iter().map(|kv| kv.mod_revision).max()
}

/// Crashes every member at once and restarts them: acknowledged writes must survive.
async fn final_restart(cluster: &mut Cluster, ctx: &Ctx) {
    let steps = async {
        cluster.kill_all()?;
        for m in 0..cluster.size() {
            cluster.spawn(m)?;
        }
        cluster
            .wait_leader(&ctx.clients, Duration::from_secs(30))
            .await
    };
    if let Err(e) = steps.await {
        violation(ctx, format!("availability: after the final restart: {e}"));
    }
}

/// Reads every unique key, and every register once more (as one more client).
async fn final_reads(ctx: &Ctx) {
    let n = ctx.clients.len();
    match read_prefix(ctx, workload::durable::PREFIX).await {
        Some(r) => {
            ctx.rec.get().durable_present = r
                .kvs
                .iter()
                .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
                .collect()
        }
        None => violation(
            ctx,
            "availability: the final read of unique keys failed".into(),
        ),
    }
    // The registers' whole revision history: which timed-out writes took effect. Registers
    // are never deleted, so the newest mod_revision is the prefix's last event.
    match read_prefix(ctx, "r/").await.map(|r| last_mod_revision(&r)) {
        Some(Some(t)) => match prefix_history(ctx, n, "r/", t).await {
            Some(events) => ctx.rec.get().register_history = events,
            None => violation(
                ctx,
                "register: no member delivered the registers' history".into(),
            ),
        },
        Some(None) => {}
        None => violation(ctx, "availability: cannot read the registers".into()),
    }
    let mut keys: Vec<String> = ctx
        .rec
        .get()
        .registers
        .iter()
        .map(|o| o.key.clone())
        .collect();
    keys.sort();
    keys.dedup();
    for (i, key) in keys.into_iter().enumerate() {
        let call = ctx.clock.now();
        let output = workload::register::execute(ctx, i % n, &key, RegInput::Read).await;
        if output != RegOutput::Unknown {
            let ret = ctx.clock.now();
            ctx.rec.get().registers.push(RegOp {
                client: 999,
                key,
                call,
                ret,
                input: RegInput::Read,
                output,
            });
        }
    }
}

/// Waits until every member holds the same revision and the same keys (serializable reads).
async fn converge(ctx: &Ctx, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut states = Vec::new();
        for m in 0..n {
            let req = concord::pb::etcdserverpb::RangeRequest {
                key: vec![0],
                range_end: vec![0],
                serializable: true,
                ..Default::default()
            };
            if let Outcome::Ok(r) =
                crate::client::bounded(Duration::from_secs(5), ctx.clients.kv(m).range(req)).await
            {
                let rev = r.header.map_or(0, |h| h.revision);
                let kvs: Vec<(Vec<u8>, i64, Vec<u8>)> = r
                    .kvs
                    .into_iter()
                    .map(|kv| (kv.key, kv.mod_revision, kv.value.to_vec()))
                    .collect();
                states.push((rev, kvs));
            }
        }
        if states.len() == n && states.windows(2).all(|w| w[0] == w[1]) {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let revs: Vec<i64> = states.iter().map(|s| s.0).collect();
            violation(
                ctx,
                format!("convergence: members still differ 20 s after the final restart (revisions {revs:?})"),
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Where a run's files go.
pub fn run_dir(out: &Path, seed: u64) -> PathBuf {
    out.join(format!("seed-{seed}"))
}
