//! Watch fan-out: one writer, many watchers of the same key (default 1,000, over 10 streams),
//! on Concord and on reference etcd 3.5.1 started the same way in the same run. Reports events
//! delivered per second across all watchers and the delivery latency (from issuing the put to
//! a watcher receiving its event), p50 and p99.
//!
//! ```sh
//! cargo bench --bench watch_fanout
//! BENCH_WATCHERS=2000 BENCH_WRITES=500 cargo bench --bench watch_fanout
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::watch_client::WatchClient;
use concord::pb::etcdserverpb::watch_request::RequestUnion;
use concord::pb::etcdserverpb::{PutRequest, WatchCreateRequest, WatchRequest};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

mod common;

use common::{connect, env_usize, etcd_binary, percentile, start, BoxResult};

struct Outcome {
    events_per_sec: f64,
    p50: Duration,
    p99: Duration,
    delivered: usize,
}

async fn run(url: &str, watchers: usize, writes: usize) -> BoxResult<Outcome> {
    let streams = 10.min(watchers).max(1);
    let per_stream = watchers / streams;
    let issued: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let mut readers = Vec::new();
    let expected = per_stream * streams * writes;
    for _ in 0..streams {
        let (tx, rx) = mpsc::channel(per_stream + 1);
        // Queue the creates first: etcd (grpc-go) sends the stream's headers only with its
        // first message, and tonic's call returns once headers arrive.
        for _ in 0..per_stream {
            tx.send(WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                    key: b"fanout".to_vec(),
                    ..Default::default()
                })),
            })
            .await?;
        }
        let mut client = WatchClient::connect(url.to_string()).await?;
        let mut stream = client.watch(ReceiverStream::new(rx)).await?.into_inner();
        let mut created = 0;
        while created < per_stream {
            if stream.message().await?.is_some_and(|r| r.created) {
                created += 1;
            }
        }
        let target = per_stream * writes;
        readers.push(tokio::spawn(async move {
            let mut seen = Vec::with_capacity(target);
            while seen.len() < target {
                let Ok(Some(resp)) = stream.message().await else {
                    break;
                };
                let now = Instant::now();
                for e in resp.events {
                    seen.push((e.kv.map_or(0, |kv| kv.mod_revision), now));
                }
            }
            drop(tx);
            seen
        }));
    }
    let mut kv = connect(url).await?;
    let started = Instant::now();
    for i in 0..writes {
        let t = Instant::now();
        let rev = kv
            .put(PutRequest {
                key: b"fanout".to_vec(),
                value: format!("v{i}").into_bytes(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .header
            .map_or(0, |h| h.revision);
        if let Ok(mut m) = issued.lock() {
            m.insert(rev, t);
        }
    }
    let mut latencies = Vec::with_capacity(expected);
    let mut last = started;
    for r in readers {
        for (rev, at) in r.await? {
            last = last.max(at);
            let sent = issued.lock().ok().and_then(|m| m.get(&rev).copied());
            if let Some(sent) = sent {
                latencies.push(at.saturating_duration_since(sent));
            }
        }
    }
    latencies.sort();
    Ok(Outcome {
        events_per_sec: latencies.len() as f64 / last.duration_since(started).as_secs_f64(),
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        delivered: latencies.len(),
    })
}

#[tokio::main]
async fn main() -> BoxResult<()> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let watchers = env_usize("BENCH_WATCHERS", 1_000);
    let writes = env_usize("BENCH_WRITES", 200);
    let etcd = etcd_binary()?;
    let concord = env!("CARGO_BIN_EXE_concord").to_string();
    println!(
        "1 writer, {writes} sequential puts to one key, {watchers} watchers of it over 10 streams"
    );
    println!(
        "{:<8} {:>14} {:>10} {:>10} {:>10}",
        "server", "events/s", "p50", "p99", "delivered"
    );
    let mut rates = Vec::new();
    for (name, bin) in [("etcd", etcd.as_str()), ("concord", concord.as_str())] {
        let server = start(bin, &[])?;
        connect(&server.url).await?;
        let o = run(&server.url, watchers, writes).await?;
        println!(
            "{:<8} {:>14.0} {:>10.2?} {:>10.2?} {:>10}",
            name, o.events_per_sec, o.p50, o.p99, o.delivered
        );
        rates.push(o.events_per_sec);
    }
    if let [e, c] = rates.as_slice() {
        println!("concord/etcd events/s ratio: {:.2}x", c / e);
    }
    Ok(())
}
