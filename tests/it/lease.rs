//! Leases: expiry deletes attached keys at one revision on every member, keep-alives (also
//! through a follower) keep them, a leader kill never expires a kept-alive lease, and thousands
//! of leases expiring together are revoked without stalling writes.

use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::lease_client::LeaseClient;
use concord::pb::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest,
    LeaseTimeToLiveResponse, PutRequest, RangeRequest,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::cluster::{grant, Cluster, TestResult};

async fn lease_client(c: &Cluster, member: usize) -> TestResult<LeaseClient<Channel>> {
    Ok(LeaseClient::connect(c.client_url(member)?).await?)
}

/// TimeToLive of lease `id` through `member`.
async fn time_to_live(
    c: &Cluster,
    member: usize,
    id: i64,
    keys: bool,
) -> TestResult<LeaseTimeToLiveResponse> {
    let req = LeaseTimeToLiveRequest { id, keys };
    Ok(lease_client(c, member)
        .await?
        .lease_time_to_live(req)
        .await?
        .into_inner())
}

pub(crate) async fn put_leased(c: &Cluster, member: usize, key: &str, lease: i64) -> TestResult {
    c.kv(member)
        .await?
        .put(PutRequest {
            key: key.into(),
            value: b"v".to_vec(),
            lease,
            ..Default::default()
        })
        .await?;
    Ok(())
}

/// Whether `key` exists on `member`, read serializably (the member's own applied state).
pub(crate) async fn exists(c: &Cluster, member: usize, key: &str) -> TestResult<bool> {
    let r = c
        .kv(member)
        .await?
        .range(RangeRequest {
            key: key.into(),
            serializable: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(r.count == 1)
}

/// Keeps `lease` alive through `member` every 300 ms until the returned sender is dropped.
async fn keep_alive(c: &Cluster, member: usize, lease: i64) -> TestResult<mpsc::Sender<()>> {
    let (stop_tx, mut stop) = mpsc::channel::<()>(1);
    let (tx, rx) = mpsc::channel(4);
    let mut client = lease_client(c, member).await?;
    tx.send(LeaseKeepAliveRequest { id: lease }).await?;
    let mut replies = client
        .lease_keep_alive(ReceiverStream::new(rx))
        .await?
        .into_inner();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.recv() => return,
                _ = tokio::time::sleep(Duration::from_millis(300)) => {
                    if tx.send(LeaseKeepAliveRequest { id: lease }).await.is_err() {
                        return;
                    }
                }
                r = replies.message() => if !matches!(r, Ok(Some(_))) { return },
            }
        }
    });
    Ok(stop_tx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_deletes_keys_on_every_member_and_keepalive_through_a_follower_keeps_them(
) -> TestResult {
    let c = Cluster::start(3)?;
    let leader = c.wait_leader(Duration::from_secs(20)).await?;
    let follower = (leader + 1) % 3;
    // The minimum TTL with a 500 ms election timeout is 1 s.
    let short = grant(&c, follower, 1).await?;
    let kept = grant(&c, follower, 1).await?;
    put_leased(&c, follower, "short/a", short).await?;
    put_leased(&c, follower, "short/b", short).await?;
    put_leased(&c, leader, "kept/a", kept).await?;
    let stop = keep_alive(&c, follower, kept).await?;

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut gone = true;
        for m in 0..3 {
            gone &= !exists(&c, m, "short/a").await? && !exists(&c, m, "short/b").await?;
        }
        if gone {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "expired lease's keys still there"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Both keys went in one revision, by one delete request: at the revoke's revision both are
    // gone, one revision earlier both were there.
    let mut kv = c.kv(leader).await?;
    let count_at = |revision: i64| RangeRequest {
        key: b"short/".to_vec(),
        range_end: b"short0".to_vec(),
        revision,
        count_only: true,
        ..Default::default()
    };
    let now = kv.range(count_at(0)).await?.into_inner();
    let revoked_at = now.header.map_or(0, |h| h.revision);
    assert_eq!(now.count, 0);
    assert_eq!(
        kv.range(count_at(revoked_at - 1)).await?.into_inner().count,
        2
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    for m in 0..3 {
        assert!(
            exists(&c, m, "kept/a").await?,
            "kept-alive lease expired on {m}"
        );
    }
    let ttl = time_to_live(&c, follower, kept, true).await?;
    assert_eq!(ttl.granted_ttl, 1);
    assert_eq!(ttl.keys, vec![b"kept/a".to_vec()]);
    let gone = time_to_live(&c, leader, short, false).await?;
    assert_eq!(gone.ttl, -1, "an expired lease reports TTL -1");

    // Stopping the keep-alive lets it expire too.
    drop(stop);
    let deadline = Instant::now() + Duration::from_secs(10);
    while exists(&c, leader, "kept/a").await? {
        assert!(Instant::now() < deadline, "lease outlived its TTL");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_kill_does_not_expire_a_kept_alive_lease() -> TestResult {
    let mut c = Cluster::start(3)?;
    let leader = c.wait_leader(Duration::from_secs(20)).await?;
    let follower = (leader + 1) % 3;
    let lease = grant(&c, follower, 3).await?;
    put_leased(&c, follower, "held", lease).await?;
    let keep = keep_alive(&c, follower, lease).await?;
    c.kill(leader)?;
    let new_leader = c.wait_leader(Duration::from_secs(20)).await?;
    // Through the election and well past the TTL, the key stays while keep-alives continue.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        assert!(exists(&c, new_leader, "held").await?, "lease expired early");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    drop(keep);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_leases_expire_in_batches_without_stalling_writes() -> TestResult {
    let c = Cluster::start(1)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let mut client = lease_client(&c, 0).await?;
    let count = 2000;
    for i in 0..count {
        let id = client
            .lease_grant(LeaseGrantRequest { ttl: 1, id: 0 })
            .await?
            .into_inner()
            .id;
        put_leased(&c, 0, &format!("many/{i:05}"), id).await?;
    }
    // Writes keep succeeding quickly while the leases go.
    let mut kv = c.kv(0).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        tokio::time::timeout(
            Duration::from_secs(5),
            kv.put(PutRequest {
                key: b"unrelated".to_vec(),
                value: b"x".to_vec(),
                ..Default::default()
            }),
        )
        .await
        .map_err(|_| "a write stalled behind lease revokes")??;
        let left = kv
            .range(RangeRequest {
                key: b"many/".to_vec(),
                range_end: b"many0".to_vec(),
                count_only: true,
                ..Default::default()
            })
            .await?
            .into_inner()
            .count;
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} leased keys never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let err = client
        .lease_revoke(LeaseRevokeRequest { id: 12345 })
        .await
        .err()
        .ok_or("revoking an unknown lease succeeded")?;
    assert_eq!(err.message(), "etcdserver: requested lease not found");

    // A client-chosen id, granted once only; etcd's TTL ceiling.
    let mine = client
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 777 })
        .await?
        .into_inner();
    assert_eq!((mine.id, mine.ttl), (777, 60));
    let again = client
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 777 })
        .await
        .err()
        .ok_or("a duplicate lease id was granted")?;
    assert_eq!(
        (again.code(), again.message()),
        (
            tonic::Code::FailedPrecondition,
            "etcdserver: lease already exists"
        )
    );
    let huge = client
        .lease_grant(LeaseGrantRequest {
            ttl: 9_000_000_001,
            id: 0,
        })
        .await
        .err()
        .ok_or("a TTL over the maximum was granted")?;
    assert_eq!(huge.message(), "etcdserver: too large lease TTL");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_keep_a_lease_from_outliving_its_ttl_across_a_leader_change() -> TestResult {
    let mut c = Cluster::start_with(3, &["--experimental-lease-checkpoint-interval", "500ms"])?;
    let leader = c.wait_leader(Duration::from_secs(20)).await?;
    let follower = (leader + 1) % 3;
    let granted = Instant::now();
    let lease = grant(&c, follower, 10).await?;
    put_leased(&c, follower, "orphan", lease).await?;
    // No keep-alive (the client died). Halfway through its TTL the leader dies.
    tokio::time::sleep(Duration::from_secs(5)).await;
    c.kill(leader)?;
    // The new leader resumes from the checkpointed remaining TTL (~5 s) rather than restarting
    // the full 10 s; it reports it once elected.
    c.wait_leader(Duration::from_secs(20)).await?;
    let left = time_to_live(&c, follower, lease, false).await?;
    assert_eq!(left.granted_ttl, 10);
    assert!(left.ttl < 10, "the new leader restarted the TTL: {left:?}");
    // ~5 s were checkpointed; plus the 0.5 s promotion extension. A restarted TTL would be ~10.
    assert!(
        left.ttl <= 7,
        "the new leader ignored the checkpoint: {left:?}"
    );
    let deadline = granted + Duration::from_secs(20);
    while exists(&c, follower, "orphan").await? {
        assert!(Instant::now() < deadline, "lease never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Safety: never gone before its TTL (a later expiry is only slower, never wrong).
    let lived = granted.elapsed();
    assert!(
        lived >= Duration::from_millis(9_500),
        "expired early: {lived:?}"
    );
    Ok(())
}

/// One keep-alive through `member`; the TTL it answers.
pub(crate) async fn keep_alive_once(c: &Cluster, member: usize, lease: i64) -> TestResult<i64> {
    let mut client = lease_client(c, member).await?;
    let requests = futures::stream::iter(vec![LeaseKeepAliveRequest { id: lease }]);
    let mut replies = client.lease_keep_alive(requests).await?.into_inner();
    let reply = replies.message().await?.ok_or("no keep-alive reply")?;
    Ok(reply.ttl)
}

/// Regression: a checkpoint records a lease's remaining TTL; a keep-alive then renews it to the
/// full TTL on the leader only. If the leader dies before its next checkpoint, the new leader
/// must not resume from the stale checkpoint, or the lease expires before the TTL the
/// keep-alive promised (a second lock holder while the first still holds a live lease). As
/// etcd, a renewal clears the checkpoint through the log before it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_after_a_checkpoint_is_honoured_by_the_next_leader() -> TestResult {
    let mut c = Cluster::start_with(3, &["--experimental-lease-checkpoint-interval", "3s"])?;
    let leader = c.wait_leader(Duration::from_secs(20)).await?;
    let follower = (leader + 1) % 3;
    let lease = grant(&c, follower, 30).await?;
    put_leased(&c, follower, "kept", lease).await?;
    // Let checkpoints record a remaining TTL of at most 24 s (one within the last 3 s).
    tokio::time::sleep(Duration::from_secs(9)).await;
    let renewed = Instant::now();
    assert_eq!(keep_alive_once(&c, follower, lease).await?, 30);
    c.kill(leader)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let left = time_to_live(&c, follower, lease, false).await?.ttl;
    let promised = 30 - renewed.elapsed().as_secs() as i64;
    assert!(
        left >= promised - 1,
        "the new leader cut the renewed lease short: {left} s left, {promised} s promised"
    );
    Ok(())
}
