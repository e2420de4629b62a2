//! Large entries through the log.
//!
//! A member far behind catches up through the log, not a snapshot, with large values: the
//! leader's appends carry a bounded number of bytes, so neither the leader nor the newcomer
//! holds memory in proportion to what is sent. (With 300 entries per append whatever their
//! size, each append timed out and was sent again, and the leader grew to gigabytes.) And an
//! append that takes longer than a heartbeat interval to be synced is waited for.

use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::cluster_client::ClusterClient;
use concord::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use concord::pb::etcdserverpb::{HashKvRequest, MemberAddRequest, StatusRequest};

use crate::cluster::{put_big_values, rss_mib, Cluster, TestResult};

/// The revision member `i` has applied, if it answers.
async fn applied_revision(c: &Cluster, i: usize) -> Option<i64> {
    let mut m = MaintenanceClient::connect(c.client_url(i).ok()?)
        .await
        .ok()?;
    let status = m.status(StatusRequest {}).await.ok()?.into_inner();
    status.header.map(|h| h.revision)
}

/// HashKV of member `i` at `revision`.
async fn hash_at(c: &Cluster, i: usize, revision: i64) -> TestResult<u32> {
    let mut m = MaintenanceClient::connect(c.client_url(i)?).await?;
    Ok(m.hash_kv(HashKvRequest { revision })
        .await?
        .into_inner()
        .hash)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_catches_up_through_the_log_without_either_member_growing() -> TestResult {
    // etcd's default snapshot count: the whole history stays in the log, which is what the
    // newcomer is sent. A small block cache, so that what is measured is the transfer's memory.
    let mut c = Cluster::start_with(1, &["--storage-cache-bytes", "4194304"])?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let leader = c.pid(0).ok_or("not running")?;
    // 96 MiB of values, 96 KiB each, from 8 writers: entries of several puts each.
    let (values, size) = (1024usize, 96 << 10);
    put_big_values(&c, values, size).await?;
    let state_mib = (values * size) as u64 >> 20;
    let revision = applied_revision(&c, 0).await.ok_or("no status")?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let steady = rss_mib(leader);

    let (m1, url1) = c.add_spec()?;
    ClusterClient::connect(c.client_url(0)?)
        .await?
        .member_add(MemberAddRequest {
            peer_ur_ls: vec![url1],
            is_learner: false,
        })
        .await?;
    c.spawn(m1)?;
    let newcomer = c.pid(m1).ok_or("newcomer not running")?;
    let (mut leader_peak, mut newcomer_peak) = (steady, 0);
    let deadline = Instant::now() + Duration::from_secs(120);
    while applied_revision(&c, m1).await.is_none_or(|r| r < revision) {
        if Instant::now() > deadline {
            return Err(format!("the newcomer never caught up\n{}", c.log_tails(30)).into());
        }
        leader_peak = leader_peak.max(rss_mib(leader));
        newcomer_peak = newcomer_peak.max(rss_mib(newcomer));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "{state_mib} MiB sent through the log: leader {steady} -> peak {leader_peak} MiB, \
         newcomer peak {newcomer_peak} MiB"
    );
    assert_eq!(c.snapshots_installed(m1).await?, 0, "sent a snapshot");
    assert_eq!(
        hash_at(&c, m1, revision).await?,
        hash_at(&c, 0, revision).await?
    );
    let grew = leader_peak.saturating_sub(steady);
    assert!(
        grew * 2 < state_mib,
        "the leader grew by {grew} MiB (from {steady}) to send {state_mib} MiB through its log"
    );
    assert!(
        newcomer_peak < 2 * state_mib + 64,
        "the newcomer peaked at {newcomer_peak} MiB to receive {state_mib} MiB"
    );
    Ok(())
}

/// An append that carries a MiB or more to followers whose disks take longer than a heartbeat
/// interval to sync is answered, not abandoned: openraft gave every append one heartbeat
/// interval and then sent it again from the same index, each time too late (RELIABILITY.md,
/// bug 8: 99 such timeouts in 8 s of 1 MB puts, 12 puts a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_appends_to_followers_with_slow_disks_are_not_abandoned() -> TestResult {
    // etcd's default timing; every log fsync takes 150 ms, half again a heartbeat interval.
    let (c, _) = Cluster::three_with_slow_disks(150).await?;
    // Values of 1 MiB from 8 writers: entries of one or two of them.
    put_big_values(&c, 24, 1 << 20).await?;
    let revision = applied_revision(&c, 0).await.ok_or("no status")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    for m in 1..3 {
        while applied_revision(&c, m).await.is_none_or(|r| r < revision) {
            if Instant::now() > deadline {
                return Err(format!("member {m} never caught up\n{}", c.log_tails(30)).into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            hash_at(&c, m, revision).await?,
            hash_at(&c, 0, revision).await?
        );
    }
    let mut abandoned = 0;
    for m in 0..3 {
        abandoned += c.log_of(m)?.matches("when AppendEntries").count();
    }
    assert_eq!(abandoned, 0, "appends abandoned\n{}", c.log_tails(10));
    Ok(())
}
