//! `concord-faults`: the fault-injection suite, in the spirit of Jepsen and etcd's robustness
//! tests.
//!
//! It runs real `concord` members (or reference etcd members, `--etcd PATH`, with the same seed
//! and schedule), each in its own network namespace, drives concurrent workloads over every
//! member (registers, locks with fencing, watches, leases, unique-key writes) while a nemesis
//! kills (`-9`), pauses (SIGSTOP), partitions (iptables in the namespaces), crashes the whole
//! cluster and slows the disk, then checks the history: linearizability per register key, lock
//! safety and fencing, watch order/gaps/duplicates, lease expiry, durability after a full
//! restart, and that a cut-off minority answered nothing. It also measures availability per
//! fault (calls answered, failed or timed out; time to the first write on every member that
//! should serve; heal to full service) and prints it as a Markdown table per fault kind.
//!
//! `--mode short` (CI): every fault kind once per history, two histories. `--mode soak`: a seed
//! sweep of random schedules. `--mode availability`: only the leader-focused faults, each kind
//! equally often. `--mode failover`: pass/fail, a new leader and a write through every other
//! member within 3 election timeouts of pausing or isolating the leader. `--seed N` replays one
//! history. Needs root, `ip` and `iptables`.

mod avail;
mod check;
mod client;
mod cluster;
mod failover;
mod history;
mod nemesis;
mod net;
mod rng;
mod run;
mod server;
mod workload;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    /// Every fault kind once per history (CI).
    Short,
    /// Random schedules over a seed sweep.
    Soak,
    /// Leader-focused faults only, every such kind equally often (comparison runs).
    Availability,
    /// Pass/fail: failover within 3 election timeouts of pausing or isolating the leader.
    Failover,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Short => "short",
            Mode::Soak => "soak",
            Mode::Availability => "availability",
            Mode::Failover => "failover",
        }
    }
}

/// Command-line flags.
#[derive(Parser, Debug)]
#[command(about = "Concord's fault-injection suite")]
struct Args {
    /// short: every fault kind once per history; soak: random faults per history;
    /// availability: leader-focused faults only; failover: the CI failover check.
    #[arg(long, value_enum, default_value = "short")]
    mode: Mode,
    /// Replay exactly this seed (one history).
    #[arg(long)]
    seed: Option<u64>,
    /// The first seed of the sweep.
    #[arg(long, default_value_t = 1)]
    first_seed: u64,
    /// Histories to run (default: 2 short and availability, 10 soak; failover runs one cluster).
    #[arg(long)]
    histories: Option<u64>,
    /// Faults per history (soak: 12 by default; availability: 7, each leader-focused kind once).
    #[arg(long)]
    faults: Option<usize>,
    /// Soak mode: draw every fault of this one kind (its name as in the reports, e.g.
    /// `crash-slow-disk`), to chase a bug that one kind exposes.
    #[arg(long)]
    only: Option<String>,
    /// Cluster size.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// The concord binary to test.
    #[arg(long, default_value = "target/debug/concord")]
    server: PathBuf,
    /// Test this reference etcd binary instead of concord (same seeds, same schedules).
    #[arg(long)]
    etcd: Option<PathBuf>,
    /// Also write the availability numbers (every fault, and the table) as JSON here.
    #[arg(long)]
    availability_json: Option<PathBuf>,
    /// Where runs keep their files; a failing run's directory is kept for replay.
    #[arg(long, default_value = "target/faults")]
    out: PathBuf,
    /// Keep every run's directory, not only failing ones.
    #[arg(long)]
    keep: bool,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    net::available()?;
    let server = match &args.etcd {
        Some(etcd) => server::Server::etcd(etcd)?,
        None => server::Server::concord(&args.server)?,
    };
    let net_id = std::process::id() % 200 + 20;
    if let Mode::Failover = args.mode {
        let cfg = failover::Config {
            seed: args.seed.unwrap_or(args.first_seed),
            members: args.members,
            server: server.clone(),
            dir: args.out.join("failover"),
            net_id,
        };
        let results = failover::run(&cfg).await?;
        if let Some(path) = &args.availability_json {
            let json = serde_json::json!({
                "server": server.name(),
                "mode": "failover",
                "members": args.members,
                "scenarios": results,
            });
            std::fs::write(path, serde_json::to_vec_pretty(&json)?)?;
        }
        let passed = failover::report(&results, server.name());
        if passed && !args.keep {
            std::fs::remove_dir_all(&cfg.dir)?;
        } else {
            println!("kept {} (member logs)", cfg.dir.display());
        }
        if !passed {
            std::process::exit(1);
        }
        return Ok(());
    }
    let seeds: Vec<u64> = match args.seed {
        Some(s) => vec![s],
        None => {
            let n = args.histories.unwrap_or(match args.mode {
                Mode::Soak => 10,
                _ => 2,
            });
            (args.first_seed..args.first_seed + n).collect()
        }
    };
    let only = match args.only.as_deref() {
        Some(name) => Some(
            nemesis::Fault::ALL
                .into_iter()
                .find(|f| f.name() == name)
                .ok_or_else(|| anyhow::anyhow!("no fault kind named {name}"))?,
        ),
        None => None,
    };
    let plan = match (args.mode, only) {
        (Mode::Soak, Some(kind)) => nemesis::Plan::Only(kind, args.faults.unwrap_or(12)),
        (Mode::Soak, None) => nemesis::Plan::Random(args.faults.unwrap_or(12)),
        (Mode::Availability, _) => {
            nemesis::Plan::Leader(args.faults.unwrap_or(nemesis::LEADER_FAULTS.len()))
        }
        (Mode::Short | Mode::Failover, _) => nemesis::Plan::EveryKind,
    };
    let (mut histories, mut violations, mut lost, mut ops, mut injected) = (0, 0, 0, 0, 0);
    let mut kinds = std::collections::BTreeSet::new();
    let mut availability = Vec::new();
    for &seed in &seeds {
        let started = Instant::now();
        let cfg = run::RunConfig {
            seed,
            members: args.members,
            plan,
            server: server.clone(),
            dir: run::run_dir(&args.out, seed),
            net_id,
        };
        let (history, schedule) = run::run(&cfg).await?;
        let checking = Instant::now();
        let report = check::check(&history);
        tracing::info!(seconds = checking.elapsed().as_secs_f64(), "checked");
        availability.extend(avail::analyze(&history, args.members));
        histories += 1;
        violations += report.violations.len();
        lost += report.lost_acked;
        ops += report.ops.values().sum::<usize>();
        injected += schedule.len();
        kinds.extend(schedule.iter().map(|f| f.name()));
        let names: Vec<&str> = schedule.iter().map(|f| f.name()).collect();
        println!(
            "seed {seed}: {} {} members, {} faults [{}], ops {:?}, {} violations, {} lost acked \
             writes, {} register keys undecided, {} fenced writes after lease expiry ({} \
             accepted) ({:.0} s)",
            args.members,
            server.name(),
            schedule.len(),
            names.join(" "),
            report.ops,
            report.violations.len(),
            report.lost_acked,
            report.unknown_keys,
            report.expired_lease_writes.0,
            report.expired_lease_writes.1,
            started.elapsed().as_secs_f64()
        );
        for v in &report.violations {
            println!("  VIOLATION {v}");
        }
        if report.violations.is_empty() && !args.keep {
            std::fs::remove_dir_all(&cfg.dir)?;
        } else {
            let file = cfg.dir.join("history.json");
            std::fs::write(&file, serde_json::to_vec_pretty(&history)?)?;
            println!(
                "  kept {} (history and member logs); replay with --seed {seed}",
                cfg.dir.display()
            );
        }
    }
    let rows = avail::aggregate(&availability);
    println!(
        "\navailability ({}, {} members, --mode {}, seeds {}): calls sent during each fault; \
         first write = fault start to the first successful probe write on each member that \
         should serve; full service = every member wrote again after the heal\n",
        server.name(),
        args.members,
        args.mode.name(),
        seeds
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    println!("{}", avail::table(&rows, server.name()));
    if let Some(path) = &args.availability_json {
        let report = avail::Report {
            server: server.name(),
            mode: args.mode.name(),
            members: args.members,
            seeds: &seeds,
            faults: &availability,
            by_kind: &rows,
        };
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    println!(
        "fault kinds exercised: {} of {}",
        kinds.len(),
        nemesis::Fault::ALL.len()
    );
    println!("{ops} operations, {injected} faults");
    println!("{histories} histories, {violations} violations, {lost} lost acked writes");
    if violations > 0 || lost > 0 {
        std::process::exit(1);
    }
    Ok(())
}
