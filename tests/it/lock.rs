//! Locks: no two holders at once, fencing tokens (the lock key's create_revision) strictly
//! increase across holders, an expired holder loses the lock to the next waiter, and a waiter
//! whose lease expired is never told it holds the lock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use concord::pb::etcdserverpb::RangeRequest;
use concord::pb::v3lockpb::lock_client::LockClient;
use concord::pb::v3lockpb::{LockRequest, UnlockRequest};

use crate::cluster::{grant, Cluster, TestResult};

/// A resource protected by fencing: it rejects any token lower than the highest it has seen,
/// and records whether two holders were ever inside at once.
#[derive(Default)]
struct Fenced {
    highest: i64,
    inside: bool,
    overlaps: usize,
    order: Vec<i64>,
}

impl Fenced {
    fn enter(&mut self, token: i64) -> bool {
        if token < self.highest {
            return false;
        }
        if self.inside {
            self.overlaps += 1;
        }
        self.highest = token;
        self.inside = true;
        self.order.push(token);
        true
    }

    fn leave(&mut self) {
        self.inside = false;
    }
}

/// The fencing token of a held lock: its key's create_revision.
async fn token(c: &Cluster, member: usize, key: &[u8]) -> TestResult<i64> {
    let mut kv = c.kv(member).await?;
    let r = kv
        .range(RangeRequest {
            key: key.to_vec(),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(r.kvs.first().ok_or("lock key missing")?.create_revision)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_contenders_never_overlap_and_tokens_strictly_increase() -> TestResult {
    let c = Arc::new(Cluster::start(3)?);
    c.wait_leader(Duration::from_secs(20)).await?;
    let fenced = Arc::new(Mutex::new(Fenced::default()));
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (c, fenced) = (c.clone(), fenced.clone());
        tasks.push(tokio::spawn(async move {
            let member = i % 3;
            let lease = grant(&c, member, 60).await.map_err(|e| e.to_string())?;
            let mut locks = LockClient::connect(c.client_url(member).map_err(|e| e.to_string())?)
                .await
                .map_err(|e| e.to_string())?;
            let key = locks
                .lock(LockRequest {
                    name: b"fence".to_vec(),
                    lease,
                })
                .await
                .map_err(|e| e.to_string())?
                .into_inner()
                .key;
            let t = token(&c, member, &key).await.map_err(|e| e.to_string())?;
            let accepted = fenced.lock().map_err(|e| e.to_string())?.enter(t);
            tokio::time::sleep(Duration::from_millis(5)).await;
            fenced.lock().map_err(|e| e.to_string())?.leave();
            locks
                .unlock(UnlockRequest { key })
                .await
                .map_err(|e| e.to_string())?;
            Ok::<bool, String>(accepted)
        }));
    }
    for t in tasks {
        assert!(
            t.await??,
            "a holder's token was lower than one already seen"
        );
    }
    let f = fenced.lock().map_err(|e| e.to_string())?;
    assert_eq!(f.overlaps, 0, "two holders at once");
    assert_eq!(f.order.len(), 50);
    assert!(f.order.windows(2).all(|w| w[0] < w[1]), "{:?}", f.order);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_holder_loses_the_lock_and_its_late_write_is_fenced_off() -> TestResult {
    let c = Cluster::start(1)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let mut locks = LockClient::connect(c.client_url(0)?).await?;
    // A holds with a 1 s lease and no keep-alive (a paused process).
    let a_lease = grant(&c, 0, 1).await?;
    let a_key = locks
        .lock(LockRequest {
            name: b"res".to_vec(),
            lease: a_lease,
        })
        .await?
        .into_inner()
        .key;
    let a_token = token(&c, 0, &a_key).await?;
    let mut fenced = Fenced::default();
    assert!(fenced.enter(a_token));
    fenced.leave();
    // B waits; A's lease expires; B gets the lock with a larger token.
    let b_lease = grant(&c, 0, 60).await?;
    let b_key = tokio::time::timeout(
        Duration::from_secs(15),
        locks.lock(LockRequest {
            name: b"res".to_vec(),
            lease: b_lease,
        }),
    )
    .await??
    .into_inner()
    .key;
    let b_token = token(&c, 0, &b_key).await?;
    assert!(b_token > a_token);
    // The server, not only the fence: A's key went with its lease before B was granted.
    let a_left = c
        .kv(0)
        .await?
        .range(RangeRequest {
            key: a_key.clone(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(
        a_left.count, 0,
        "the expired holder's key outlived its lease"
    );
    assert!(fenced.enter(b_token));
    // A wakes up and writes with its old token: rejected.
    assert!(
        !fenced.enter(a_token),
        "a stale holder's write was accepted"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_lease_expired_is_not_told_it_holds_the_lock() -> TestResult {
    let c = Cluster::start(1)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let mut a_locks = LockClient::connect(c.client_url(0)?).await?;
    let a_key = a_locks
        .lock(LockRequest {
            name: b"j".to_vec(),
            lease: grant(&c, 0, 60).await?,
        })
        .await?
        .into_inner()
        .key;
    let b_lease = grant(&c, 0, 1).await?;
    let url = c.client_url(0)?;
    let waiter = tokio::spawn(async move {
        let mut b_locks = LockClient::connect(url).await.map_err(|e| e.to_string())?;
        b_locks
            .lock(LockRequest {
                name: b"j".to_vec(),
                lease: b_lease,
            })
            .await
            .map(|r| r.into_inner().key)
            .map_err(|e| e.message().to_string())
    });
    // B's lease expires while it waits; then A releases.
    tokio::time::sleep(Duration::from_secs(3)).await;
    a_locks.unlock(UnlockRequest { key: a_key }).await?;
    let outcome = tokio::time::timeout(Duration::from_secs(10), waiter).await??;
    assert_eq!(outcome, Err("mutex: session is expired".to_string()));
    Ok(())
}
