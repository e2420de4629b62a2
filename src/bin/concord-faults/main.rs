//! `concord-faults`: the fault-injection suite, in the spirit of Jepsen and etcd's robustness
//! tests.
//!
//! It runs real `concord` members, each in its own network namespace, drives concurrent
//! workloads over every member (registers, locks with fencing, watches, leases, unique-key
//! writes) while a nemesis kills (`-9`), pauses (SIGSTOP), partitions (iptables in the
//! namespaces), crashes the whole cluster and slows the disk, then checks the history:
//! linearizability per register key, lock safety and fencing, watch order/gaps/duplicates,
//! lease expiry, durability after a full restart, and that a cut-off minority answered nothing.
//!
//! `--mode short` (CI): every fault kind once per history, two histories. `--mode soak`: a seed
//! sweep of random schedules. `--seed N` replays one history. Needs root, `ip` and `iptables`.

mod check;
mod client;
mod cluster;
mod history;
mod nemesis;
mod net;
mod rng;
mod run;
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
}

/// Command-line flags.
#[derive(Parser, Debug)]
#[command(about = "Concord's fault-injection suite")]
struct Args {
    /// short: every fault kind once per history; soak: random faults per history.
    #[arg(long, value_enum, default_value = "short")]
    mode: Mode,
    /// Replay exactly this seed (one history).
    #[arg(long)]
    seed: Option<u64>,
    /// The first seed of the sweep.
    #[arg(long, default_value_t = 1)]
    first_seed: u64,
    /// Histories to run (default: 2 short, 10 soak).
    #[arg(long)]
    histories: Option<u64>,
    /// Faults per history in soak mode.
    #[arg(long, default_value_t = 12)]
    faults: usize,
    /// Cluster size.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// The concord binary to test.
    #[arg(long, default_value = "target/debug/concord")]
    server: PathBuf,
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
    let server = std::fs::canonicalize(&args.server)?;
    let seeds: Vec<u64> = match args.seed {
        Some(s) => vec![s],
        None => {
            let n = args.histories.unwrap_or(match args.mode {
                Mode::Short => 2,
                Mode::Soak => 10,
            });
            (args.first_seed..args.first_seed + n).collect()
        }
    };
    let faults = match args.mode {
        Mode::Short => None,
        Mode::Soak => Some(args.faults),
    };
    let (mut histories, mut violations, mut lost, mut ops, mut injected) = (0, 0, 0, 0, 0);
    let mut kinds = std::collections::BTreeSet::new();
    for seed in seeds {
        let started = Instant::now();
        let cfg = run::RunConfig {
            seed,
            members: args.members,
            faults,
            server: server.clone(),
            dir: run::run_dir(&args.out, seed),
            net_id: (std::process::id() % 200 + 20) as u32,
        };
        let (history, schedule) = run::run(&cfg).await?;
        let checking = Instant::now();
        let report = check::check(&history);
        tracing::info!(seconds = checking.elapsed().as_secs_f64(), "checked");
        histories += 1;
        violations += report.violations.len();
        lost += report.lost_acked;
        ops += report.ops.values().sum::<usize>();
        injected += schedule.len();
        kinds.extend(schedule.iter().map(|f| f.name()));
        let names: Vec<&str> = schedule.iter().map(|f| f.name()).collect();
        println!(
            "seed {seed}: {} members, {} faults [{}], ops {:?}, {} violations, {} lost acked \
             writes, {} register keys undecided, {} fenced writes after lease expiry ({} \
             accepted) ({:.0} s)",
            args.members,
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
