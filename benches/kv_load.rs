//! Load comparison: Concord and reference etcd 3.5.1, one node each, started by this bench on the
//! same machine in the same run, driven by the same gRPC client code at the same durability
//! (both fsync their log before acknowledging). Prints throughput and latency percentiles per
//! workload and the Concord/etcd ratios.
//!
//! ```sh
//! cargo bench --bench kv_load            # needs reference etcd: scripts/install-test-tools.sh
//! BENCH_OPS=20000 BENCH_CLIENTS=64 cargo bench --bench kv_load
//! BENCH_TARGET_URL=http://127.0.0.1:2379 cargo bench --bench kv_load   # puts against one server
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::{PutRequest, RangeRequest};

mod common;

use common::{connect, env_usize, etcd_binary, percentile, start, BoxResult};

#[derive(Clone, Copy)]
enum Workload {
    Put,
    GetLinearizable,
    GetSerializable,
}

struct Outcome {
    ops_per_sec: f64,
    p50: Duration,
    p99: Duration,
}

async fn run(url: &str, w: Workload, clients: usize, ops: usize) -> BoxResult<Outcome> {
    // A few connections shared by many concurrent clients, as real clients multiplex.
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(connect(url).await?);
    }
    let value = Arc::new(vec![b'v'; 256]);
    let per_client = ops / clients;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut kv = conns[c % conns.len()].clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_client);
            for i in 0..per_client {
                let key = format!("key/{:04}", (c * per_client + i) % 1000).into_bytes();
                let t = Instant::now();
                let res = match w {
                    Workload::Put => kv
                        .put(PutRequest {
                            key,
                            value: value.to_vec(),
                            ..Default::default()
                        })
                        .await
                        .map(|_| ()),
                    Workload::GetLinearizable | Workload::GetSerializable => kv
                        .range(RangeRequest {
                            key,
                            serializable: matches!(w, Workload::GetSerializable),
                            ..Default::default()
                        })
                        .await
                        .map(|_| ()),
                };
                res.map_err(|e| e.to_string())?;
                lat.push(t.elapsed());
            }
            Ok::<_, String>(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let elapsed = started.elapsed();
    all.sort();
    Ok(Outcome {
        ops_per_sec: all.len() as f64 / elapsed.as_secs_f64(),
        p50: percentile(&all, 0.50),
        p99: percentile(&all, 0.99),
    })
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let clients = env_usize("BENCH_CLIENTS", 32);
    let ops = env_usize("BENCH_OPS", 10_000);
    if let Ok(url) = std::env::var("BENCH_TARGET_URL") {
        // Profiling mode: load one already running server, no comparison.
        let o = run(&url, Workload::Put, clients, ops).await?;
        println!(
            "put {:.0} ops/s p50 {:.2?} p99 {:.2?}",
            o.ops_per_sec, o.p50, o.p99
        );
        return Ok(());
    }
    let etcd = etcd_binary()?;
    let concord = env!("CARGO_BIN_EXE_concord").to_string();
    println!(
        "{ops} ops per workload, {clients} concurrent clients over 4 connections, 256-byte values"
    );
    println!(
        "{:<18} {:>12} {:>10} {:>10} {:>12} {:>10} {:>10} {:>8}",
        "workload", "etcd ops/s", "p50", "p99", "concord ops/s", "p50", "p99", "ratio"
    );
    for (name, w) in [
        ("put", Workload::Put),
        ("get linearizable", Workload::GetLinearizable),
        ("get serializable", Workload::GetSerializable),
    ] {
        let e = {
            let s = start(&etcd, &[])?;
            run(&s.url, w, clients, ops).await?
        };
        let c = {
            let s = start(&concord, &[])?;
            run(&s.url, w, clients, ops).await?
        };
        println!(
            "{:<18} {:>12.0} {:>10.2?} {:>10.2?} {:>12.0} {:>10.2?} {:>10.2?} {:>7.2}x",
            name,
            e.ops_per_sec,
            e.p50,
            e.p99,
            c.ops_per_sec,
            c.p50,
            c.p99,
            c.ops_per_sec / e.ops_per_sec
        );
    }
    Ok(())
}
