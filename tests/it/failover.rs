//! Failover: a leader that stops answering (SIGSTOP: a GC-like stall, a frozen VM) is replaced
//! while it is still stopped, and it does not disturb its successor when it wakes up. The
//! partitioned-leader case needs network namespaces: `concord-faults --mode failover`.

use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use concord::pb::etcdserverpb::StatusRequest;

use crate::cluster::{put, Cluster, TestResult};

/// etcd's default timing, which the target is stated in: a new leader within about two
/// election timeouts of the old one going silent.
const HEARTBEAT_MS: u64 = 100;
const ELECTION_MS: u64 = 1000;

/// Member `m`'s (member id, leader id, term).
async fn status(c: &Cluster, m: usize) -> TestResult<(u64, u64, u64)> {
    let mut client = MaintenanceClient::connect(c.client_url(m)?).await?;
    let s = client.status(StatusRequest {}).await?.into_inner();
    Ok((
        s.header.as_ref().map_or(0, |h| h.member_id),
        s.leader,
        s.raft_term,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_is_replaced_while_it_is_still_paused() -> TestResult {
    let mut c = Cluster::prepare(3, &[])?.with_timing(HEARTBEAT_MS, ELECTION_MS);
    for m in 0..3 {
        c.spawn(m)?;
    }
    let old = c.wait_leader(Duration::from_secs(20)).await?;
    put(&c, old, "before", "1").await?;
    let (old_id, _, _) = status(&c, old).await?;
    let others: Vec<usize> = (0..3).filter(|m| *m != old).collect();

    c.signal(old, "-STOP")?;
    let stopped = Instant::now();
    // A generous bound, and still one openraft's own timer could never meet: it waited its
    // lease (two election timeouts) plus an election timeout before campaigning at all.
    let window = Duration::from_millis(3 * ELECTION_MS);
    let replaced = tokio::time::timeout(window, async {
        for m in &others {
            // A put that arrives with no leader waits for the next one (as in etcd).
            loop {
                match put(&c, *m, &format!("during-{m}"), "2").await {
                    Ok(_) => break,
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
        loop {
            let mut views = Vec::new();
            for m in &others {
                views.push(status(&c, *m).await?);
            }
            let leader = views.first().map_or(0, |v| v.1);
            if leader != 0 && leader != old_id && views.iter().all(|v| v.1 == leader) {
                return TestResult::Ok(views);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let took = stopped.elapsed();
    let still_stopped = took < window;
    let result = replaced.map_err(|_| {
        format!("no new leader and writes on both other members within {window:?} of SIGSTOP")
    });
    let views = match result {
        Ok(views) => views?,
        Err(e) => {
            c.signal(old, "-CONT")?;
            return Err(e.into());
        }
    };
    assert!(still_stopped, "the old leader was stopped throughout");

    // The old leader wakes up: it follows the new one, and the new one keeps its term.
    c.signal(old, "-CONT")?;
    let (new_leader, term) = views.first().map(|v| (v.1, v.2)).ok_or("no view")?;
    put(&c, old, "after", "3").await?;
    tokio::time::sleep(Duration::from_millis(2 * ELECTION_MS)).await;
    for m in 0..3 {
        let (_, leader, t) = status(&c, m).await?;
        assert_eq!(leader, new_leader, "member {m} follows the new leader");
        assert_eq!(
            t, term,
            "member {m}: no election after the old leader woke up"
        );
    }
    Ok(())
}
