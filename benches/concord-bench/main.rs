//! `concord-bench`: a load generator for the etcd v3 API, in the spirit of etcd's `benchmark`
//! tool. It drives Concord and reference etcd alike (it only speaks the public gRPC API), and
//! reports throughput, latency percentiles (p50/p90/p99/p99.9 from an HDR histogram) and,
//! given the server's pids, their peak resident memory and CPU time during the run.
//!
//! ```sh
//! cargo run --release --bin concord-bench -- --endpoints http://127.0.0.1:2379 put
//! concord-bench --clients 64 --conns 8 --duration 10s range --serializable
//! concord-bench --rate 2000 txn-cas          # fixed offered load: latency without saturation
//! concord-bench --watchers 1000 watch        # 1 writer, 1000 watchers
//! concord-bench --watchers 1000 watch-keys   # 16 writers, 1000 watchers of a key each
//! concord-bench --endpoints https://127.0.0.1:2379 --cacert ca.crt --cert c.crt --key c.key put
//! concord-bench --user alice:secret range    # auth on: log in, a token with every request
//! concord-bench snapshot                     # stream a snapshot, check its digest, keep nothing
//! ```
//!
//! `benches/compare.py` runs every workload against Concord and reference etcd, alternating.

/// mimalloc: cheaper than glibc malloc for many small, short-lived, cross-thread allocations.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod authed;
mod report;
mod snapshot;
mod workload;

use std::time::Duration;

use clap::{Parser, ValueEnum};

/// What to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// Puts of random keys.
    Put,
    /// Single-key gets (linearizable unless --serializable).
    Range,
    /// Gets of 100 keys under one prefix.
    RangePrefix,
    /// Compare mod_revision then put (Kubernetes' update pattern), each client on its own key.
    TxnCas,
    /// 90% gets, 10% puts.
    Mixed,
    /// Grant a lease, put a key with it, revoke it.
    Lease,
    /// Keep-alives for `--leases` leases.
    LeaseKeepalive,
    /// Lock and unlock, every client on its own lock.
    Lock,
    /// Lock and unlock, every client on the same lock.
    LockContended,
    /// One writer, `--watchers` watchers: delivered events/s and put-to-delivery latency.
    Watch,
    /// `--watchers` watchers, each of its own key, and `--clients` writers putting to them at
    /// random: every event goes to one watcher. Delivered events/s and put-to-delivery latency.
    WatchKeys,
    /// Writes every key of the key space once (to load a server), then stops.
    Load,
    /// Streams one `Maintenance.Snapshot` from the first endpoint, keeps nothing, checks its
    /// digest, and prints its size and time as JSON.
    Snapshot,
}

/// Flags.
#[derive(Parser, Debug, Clone)]
#[command(name = "concord-bench", about = "Load generator for the etcd v3 API")]
pub struct Args {
    /// The workload.
    #[arg(value_enum)]
    pub workload: Workload,
    /// Client URLs, comma-separated (connections are spread over them).
    #[arg(long, default_value = "http://127.0.0.1:2379", value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// gRPC connections.
    #[arg(long, default_value_t = 8)]
    pub conns: usize,
    /// Concurrent clients (requests in flight).
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// How long to measure (after a one-second warm-up); at most 10 minutes.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Offered load in operations per second over all clients (0: as fast as possible).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000)]
    pub key_space: usize,
    /// The read workloads' keys are already there (written by `load` with the same
    /// `--key-space`): they are not written first.
    #[arg(long)]
    pub no_prefill: bool,
    /// Print each operation slower than this many milliseconds to stderr, with when it was
    /// meant to start (seconds into the run): where in a run its stalls lie.
    #[arg(long)]
    pub slow_ms: Option<u64>,
    /// Value size in bytes.
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
    /// Serializable reads (range, range-prefix, mixed).
    #[arg(long)]
    pub serializable: bool,
    /// Leases kept alive (lease-keepalive).
    #[arg(long, default_value_t = 1000)]
    pub leases: usize,
    /// Watchers (watch, watch-keys).
    #[arg(long, default_value_t = 1000)]
    pub watchers: usize,
    /// Server pids whose peak RSS and CPU time to report (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub server_pids: Vec<u32>,
    /// CA certificate that signs the servers' certificates (`https://` endpoints).
    #[arg(long)]
    pub cacert: Option<std::path::PathBuf>,
    /// Client certificate to present over TLS.
    #[arg(long)]
    pub cert: Option<std::path::PathBuf>,
    /// The client certificate's key.
    #[arg(long)]
    pub key: Option<std::path::PathBuf>,
    /// Log in as `name:password` and send the token with every request (auth on).
    #[arg(long)]
    pub user: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Connect as an ordinary tonic client does (plain `http://` only): no write coalescing,
    /// and a unary request's END_STREAM in a frame of its own (grpc-go's clients put it on the
    /// data frame, as this tool does by default).
    #[arg(long)]
    pub plain: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = concord::config::parse_duration(s)?;
    if d > Duration::from_secs(600) {
        return Err("at most 10m".into());
    }
    Ok(d)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.workload == Workload::Snapshot {
        println!("{}", snapshot::stream(&args).await?);
        return Ok(());
    }
    let before = report::ProcStats::read(&args.server_pids);
    let result = workload::run(&args).await?;
    let after = report::ProcStats::read(&args.server_pids);
    let line = report::Report::new(&args, result, before, after);
    if args.json {
        println!("{}", line.json());
    } else {
        println!("{}", line.text());
    }
    Ok(())
}
