//! Coordination throughput: lease grants, lease keep-alives, and lock acquire+release cycles,
//! uncontended and contended, on Concord and on reference etcd 3.5.1 started the same way in
//! the same run.
//!
//! ```sh
//! cargo bench --bench coordination
//! BENCH_OPS=4000 BENCH_CLIENTS=32 cargo bench --bench coordination
//! ```

use std::time::Instant;

use concord::pb::etcdserverpb::lease_client::LeaseClient;
use concord::pb::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest};
use concord::pb::v3lockpb::lock_client::LockClient;
use concord::pb::v3lockpb::{LockRequest, UnlockRequest};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

mod common;

use common::{connect, env_usize, etcd_binary, start, BoxResult};

#[derive(Clone, Copy)]
enum Workload {
    LeaseGrant,
    KeepAlive,
    LockUncontended,
    LockContended,
}

/// Runs `ops` operations over `clients` concurrent clients; returns operations per second.
async fn run(url: &str, w: Workload, clients: usize, ops: usize) -> BoxResult<f64> {
    let per_client = (ops / clients).max(1);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let url = url.to_string();
        tasks.push(tokio::spawn(async move {
            let mut leases = LeaseClient::connect(url.clone()).await?;
            let lease = leases
                .lease_grant(LeaseGrantRequest { ttl: 300, id: 0 })
                .await?
                .into_inner()
                .id;
            match w {
                Workload::LeaseGrant => {
                    for _ in 0..per_client {
                        leases
                            .lease_grant(LeaseGrantRequest { ttl: 300, id: 0 })
                            .await?;
                    }
                }
                Workload::KeepAlive => {
                    let (tx, rx) = mpsc::channel(1);
                    tx.send(LeaseKeepAliveRequest { id: lease }).await?;
                    let mut replies = leases
                        .lease_keep_alive(ReceiverStream::new(rx))
                        .await?
                        .into_inner();
                    for i in 0..per_client {
                        replies.message().await?.ok_or("keep-alive stream ended")?;
                        if i + 1 < per_client {
                            tx.send(LeaseKeepAliveRequest { id: lease }).await?;
                        }
                    }
                }
                Workload::LockUncontended | Workload::LockContended => {
                    let mut locks = LockClient::connect(url).await?;
                    for i in 0..per_client {
                        let name = match w {
                            Workload::LockContended => "contended".to_string(),
                            _ => format!("free/{c}/{i}"),
                        };
                        let key = locks
                            .lock(LockRequest {
                                name: name.into_bytes(),
                                lease,
                            })
                            .await?
                            .into_inner()
                            .key;
                        locks.unlock(UnlockRequest { key }).await?;
                    }
                }
            }
            Ok::<usize, Box<dyn std::error::Error + Send + Sync>>(per_client)
        }));
    }
    let mut done = 0;
    for t in tasks {
        done += t.await??;
    }
    Ok(done as f64 / started.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let clients = env_usize("BENCH_CLIENTS", 16);
    let ops = env_usize("BENCH_OPS", 2000);
    let etcd = etcd_binary()?;
    let concord = env!("CARGO_BIN_EXE_concord").to_string();
    println!("{ops} operations per workload over {clients} concurrent clients");
    println!(
        "{:<22} {:>12} {:>14} {:>8}",
        "workload", "etcd ops/s", "concord ops/s", "ratio"
    );
    for (name, w) in [
        ("lease grant", Workload::LeaseGrant),
        ("lease keep-alive", Workload::KeepAlive),
        ("lock+unlock, free", Workload::LockUncontended),
        ("lock+unlock, 1 lock", Workload::LockContended),
    ] {
        let mut rates = Vec::new();
        for bin in [etcd.as_str(), concord.as_str()] {
            let server = start(bin, &[])?;
            connect(&server.url).await?;
            rates.push(run(&server.url, w, clients, ops).await?);
        }
        if let [e, c] = rates.as_slice() {
            println!("{name:<22} {e:>12.0} {c:>14.0} {:>7.2}x", c / e);
        }
    }
    Ok(())
}
