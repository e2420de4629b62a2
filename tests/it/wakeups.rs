//! Requests must not wake threads they have no business with. The process's main thread only
//! waits for the member to end (a signal, its removal, a fatal error in the Raft core): a
//! waiter there that woke at every change of openraft's metrics (every log write and apply)
//! cost each request a thread switch and served 0.57x the ranges per second (2026-11-29). These
//! count the main thread's switches over many requests; they assert counts, not times.

use std::time::Duration;

use concord::pb::etcdserverpb::{PutRequest, RangeRequest};

use crate::cluster::{Cluster, TestResult};

/// Requests of each kind the test sends.
const REQUESTS: u64 = 2_000;

/// How often thread `tid` of process `pid` has been switched out (waited, or was preempted).
fn switches(pid: u32, tid: u32) -> TestResult<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))?;
    let mut total = 0;
    for line in status.lines() {
        if let Some(n) = line
            .strip_prefix("voluntary_ctxt_switches:")
            .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
        {
            total += n.trim().parse::<u64>()?;
        }
    }
    Ok(total)
}

#[tokio::test]
async fn requests_do_not_wake_the_main_thread() -> TestResult {
    let mut c = Cluster::prepare(1, &[])?;
    c.spawn(0)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let pid = c.pid(0).ok_or("member 0 does not run")?;
    let mut kv = c.kv(0).await?;
    // Warm: the first requests set up connections and tasks.
    kv.put(PutRequest {
        key: b"warm".to_vec(),
        ..Default::default()
    })
    .await?;

    let before = switches(pid, pid)?;
    for i in 0..REQUESTS {
        let key = format!("k{}", i % 100).into_bytes();
        kv.put(PutRequest {
            key: key.clone(),
            value: i.to_le_bytes().to_vec(),
            ..Default::default()
        })
        .await?;
        kv.range(RangeRequest {
            key,
            ..Default::default()
        })
        .await?;
    }
    let woken = switches(pid, pid)? - before;
    // Nothing in these requests concerns it: one switch per ten requests is far above what it
    // needs and far below one per request.
    let bound = 2 * REQUESTS / 10;
    assert!(
        woken < bound,
        "the main thread was switched {woken} times over {} requests (bound {bound})",
        2 * REQUESTS
    );
    c.kill(0)?;
    Ok(())
}
