//! Failover: a leader that stops answering (SIGSTOP: a GC-like stall, a frozen VM) is replaced
//! while it is still stopped, and it does not disturb its successor when it wakes up. The
//! partitioned-leader case needs network namespaces: `concord-faults --mode failover`.

use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use concord::pb::etcdserverpb::StatusRequest;

use crate::cluster::{grant, put, Cluster, TestResult};
use crate::gateway::post_to;
use crate::lease::{exists, keep_alive_once, put_leased};

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

/// Puts through member `m`, which may still believe it leads when the put arrives: it then
/// steps down with the put pending and answers `leader changed` (as etcd may), which a client
/// retries. Any other error is the test's failure.
async fn put_through_step_down(c: &Cluster, m: usize, key: &str, value: &str) -> TestResult {
    let deadline = Instant::now() + Duration::from_millis(5 * ELECTION_MS);
    loop {
        match put(c, m, key, value).await {
            Ok(_) => return Ok(()),
            Err(e) if e.to_string().contains("leader changed") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => return Err(e),
        }
    }
}

/// Three members with etcd's default timing.
fn start() -> TestResult<Cluster> {
    let mut c = Cluster::prepare(3, &[])?.with_timing(HEARTBEAT_MS, ELECTION_MS);
    for m in 0..3 {
        c.spawn(m)?;
    }
    Ok(c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_is_replaced_while_it_is_still_paused() -> TestResult {
    let c = start()?;
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
    put_through_step_down(&c, old, "after", "3").await?;
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

/// A JSON gateway client (say, an HA manager keeping its leader key alive) sees its calls held
/// through the election and answered, not failed with `no leader` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_calls_ride_through_the_election_of_a_new_leader() -> TestResult {
    let c = start()?;
    let old = c.wait_leader(Duration::from_secs(20)).await?;
    let (a, b) = ((old + 1) % 3, (old + 2) % 3);
    let lease = grant(&c, a, 30).await?;
    c.signal(old, "-STOP")?;
    // Calls that arrive once the followers noticed the silence (three heartbeats). One sent to
    // the leader just before it stopped may or may not have been applied: it ends with `leader
    // changed` when the next leader is known (etcd answers those with a timeout).
    tokio::time::sleep(Duration::from_millis(4 * HEARTBEAT_MS)).await;
    let window = Duration::from_millis(3 * ELECTION_MS);
    let body = format!(r#"{{"ID": "{lease}"}}"#);
    let calls = async {
        let put = post_to(&c, a, "/v3/kv/put", r#"{"key": "Zm9v", "value": "YmFy"}"#);
        let keepalive = post_to(&c, b, "/v3/lease/keepalive", &body);
        tokio::try_join!(put, keepalive)
    };
    let answered = tokio::time::timeout(window, calls).await;
    c.signal(old, "-CONT")?;
    let ((put_code, put), (ka_code, ka)) = answered.map_err(|_| "gateway calls not answered")??;
    assert_eq!(put_code, 200, "{put}");
    assert_eq!(ka_code, 200, "{ka}");
    // A chunked body: the JSON line is the one that starts with `{`.
    let line = ka.lines().find(|l| l.starts_with('{')).ok_or("no answer")?;
    let ka: serde_json::Value = serde_json::from_str(line)?;
    assert_eq!(ka["result"]["TTL"], "30", "{ka}");
    Ok(())
}

/// A leader restarted after a crash does not resume leading in its old term: its own log may
/// lack entries of that term which its followers hold (it replicates before its own fsync), so
/// it must win a new term, whose election compares logs. (openraft 0.9 restored it at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_full_crash_the_old_leader_does_not_resume_its_term() -> TestResult {
    let mut c = start()?;
    let old = c.wait_leader(Duration::from_secs(20)).await?;
    put(&c, old, "before", "1").await?;
    let (_, _, term) = status(&c, old).await?;
    for m in 0..3 {
        c.kill(m)?;
    }
    for m in 0..3 {
        c.spawn(m)?;
    }
    let leader = c.wait_leader(Duration::from_secs(20)).await?;
    let (_, _, now) = status(&c, leader).await?;
    assert!(
        now > term,
        "a leader in term {now} after a crash in term {term}"
    );
    put(&c, leader, "after", "2").await?;
    Ok(())
}

/// A leader paused past its leases' deadlines must not revoke them when it wakes up: the next
/// leader kept them alive meanwhile. (The deposed leader's expiry loop could run before it
/// noticed its lost quorum and forward its revoke to the new leader, which committed it: a
/// key gone while its keep-alives were confirmed. Fault suite, seed 5003.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_does_not_revoke_leases_its_successor_kept_alive() -> TestResult {
    const TTL: i64 = 3;
    let c = start()?;
    let mut leader = c.wait_leader(Duration::from_secs(20)).await?;
    for round in 0..2 {
        let follower = (leader + 1) % 3;
        let lease = grant(&c, leader, TTL).await?;
        let key = format!("kept-{round}");
        put_leased(&c, leader, &key, lease).await?;
        let mut confirmed = Instant::now();
        c.signal(leader, "-STOP")?;
        // Keep-alives through a follower, while the leader sleeps past the lease's deadline
        // and for a while after it wakes up; the key must be there whenever the last confirmed
        // keep-alive still covers it.
        let start = Instant::now();
        let wake = Duration::from_millis(TTL as u64 * 1000 + 2 * ELECTION_MS);
        let mut woken = false;
        while start.elapsed() < wake + Duration::from_secs(3) {
            if !woken && start.elapsed() >= wake {
                c.signal(leader, "-CONT")?;
                woken = true;
            }
            let sent = Instant::now();
            if let Ok(ttl) = keep_alive_once(&c, follower, lease).await {
                assert!(ttl > 0, "round {round}: lease {lease} gone at a keep-alive");
                confirmed = sent;
            }
            let covered = confirmed + Duration::from_secs(TTL as u64);
            let asked = Instant::now();
            if let Ok(false) = exists(&c, follower, &key).await {
                assert!(
                    asked >= covered,
                    "round {round}: {key} gone {:?} after it was paused, {:?} before its last \
                     confirmed keep-alive ran out",
                    asked - start,
                    covered - asked
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        if !woken {
            c.signal(leader, "-CONT")?;
        }
        leader = c.wait_leader(Duration::from_secs(20)).await?;
    }
    Ok(())
}
