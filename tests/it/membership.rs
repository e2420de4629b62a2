//! Membership changes on real processes: grow a cluster from one member to three (a voter, then
//! a learner that is promoted), remove the original member, and check that no write is lost and
//! that the removed member stops.

use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::cluster_client::ClusterClient;
use concord::pb::etcdserverpb::{
    Member, MemberAddRequest, MemberListRequest, MemberPromoteRequest, MemberRemoveRequest,
    RangeRequest,
};
use tonic::transport::Channel;

use crate::cluster::{put, Cluster, TestResult};

async fn cluster_client(c: &Cluster, i: usize) -> TestResult<ClusterClient<Channel>> {
    Ok(ClusterClient::connect(c.client_url(i)?).await?)
}

async fn members(c: &Cluster, i: usize) -> TestResult<Vec<Member>> {
    let mut cl = cluster_client(c, i).await?;
    Ok(cl
        .member_list(MemberListRequest { linearizable: true })
        .await?
        .into_inner()
        .members)
}

/// Waits until member `i` lists `n` members, all started (named) and all voters.
async fn wait_voters(c: &Cluster, i: usize, n: usize) -> TestResult<Vec<Member>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(list) = members(c, i).await {
            if list.len() == n && list.iter().all(|m| !m.is_learner && !m.name.is_empty()) {
                return Ok(list);
            }
            if Instant::now() > deadline {
                return Err(format!("members never settled: {list:?}").into());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn value(c: &Cluster, i: usize, key: &str, serializable: bool) -> TestResult<Option<String>> {
    let mut kv = c.kv(i).await?;
    let resp = kv
        .range(RangeRequest {
            key: key.into(),
            serializable,
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(resp
        .kvs
        .first()
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
}

/// Reads `key` from member `i` until it answers `want` (a new member catches up first).
async fn wait_value(
    c: &Cluster,
    i: usize,
    key: &str,
    want: &str,
    serializable: bool,
) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match value(c, i, key, serializable).await {
            Ok(Some(v)) if v == want => return Ok(()),
            other if Instant::now() > deadline => {
                return Err(format!("{key} on member {i}: {other:?}").into())
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_from_one_to_three_promote_a_learner_and_remove_the_founder() -> TestResult {
    // A short log: the members that join later catch up from a snapshot.
    let mut c = Cluster::start_with(1, &["--snapshot-count", "20"])?;
    c.wait_leader(Duration::from_secs(20)).await?;
    put(&c, 0, "before", "1").await?;
    for i in 0..60 {
        put(&c, 0, &format!("history/{i}"), "x").await?;
    }

    // A voter: added, then started with --initial-cluster-state existing.
    let (m1, url1) = c.add_spec()?;
    let added = cluster_client(&c, 0)
        .await?
        .member_add(MemberAddRequest {
            peer_ur_ls: vec![url1.clone()],
            is_learner: false,
        })
        .await?
        .into_inner();
    let new_member = added.member.ok_or("no member in the answer")?;
    assert_eq!(new_member.peer_ur_ls, vec![url1]);
    assert!(!new_member.is_learner);
    assert!(added.members.iter().any(|m| m.id == new_member.id));
    c.spawn(m1)?;
    let list = wait_voters(&c, 0, 2).await?;
    assert!(list.iter().any(|m| m.id == new_member.id && m.name == "m1"));
    wait_value(&c, m1, "before", "1", false).await?;
    wait_value(&c, m1, "history/59", "x", false).await?;

    // A learner: it replicates, serves serializable reads only, then is promoted.
    let (m2, url2) = c.add_spec()?;
    let mut admin = cluster_client(&c, 0).await?;
    let learner = admin
        .member_add(MemberAddRequest {
            peer_ur_ls: vec![url2.clone()],
            is_learner: true,
        })
        .await?
        .into_inner()
        .member
        .ok_or("no member in the answer")?;
    assert!(learner.is_learner);
    // etcd allows one learner at a time.
    let second = admin
        .member_add(MemberAddRequest {
            peer_ur_ls: vec!["http://127.0.0.1:1".into()],
            is_learner: true,
        })
        .await
        .err()
        .ok_or("a second learner was accepted")?;
    assert_eq!(
        second.message(),
        "etcdserver: too many learner members in cluster"
    );
    // A voter cannot be "promoted".
    let not_learner = admin
        .member_promote(MemberPromoteRequest { id: new_member.id })
        .await
        .err()
        .ok_or("promoted a voter")?;
    assert_eq!(
        not_learner.message(),
        "etcdserver: can only promote a learner member"
    );
    c.spawn(m2)?;
    put(&c, 0, "during", "2").await?;
    wait_value(&c, m2, "during", "2", true).await?;
    let refused = value(&c, m2, "during", false)
        .await
        .err()
        .ok_or("a learner served a linearizable read")?;
    assert!(
        refused
            .to_string()
            .contains("rpc not supported for learner"),
        "{refused}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match admin
            .member_promote(MemberPromoteRequest { id: learner.id })
            .await
        {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline && e.message().contains("in sync") => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let list = wait_voters(&c, m2, 3).await?;
    let founder = list.iter().find(|m| m.name == "m0").ok_or("no m0")?.id;

    // Remove the founding member (possibly the leader) through another member: the cluster
    // goes on with two, every write is still there, and the removed member stops.
    cluster_client(&c, m1)
        .await?
        .member_remove(MemberRemoveRequest { id: founder })
        .await?;
    assert!(
        c.wait_exit(0, Duration::from_secs(20)).await?,
        "the removed member still runs"
    );
    wait_voters(&c, m1, 2).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while put(&c, m2, "after", "3").await.is_err() {
        assert!(Instant::now() < deadline, "no write after the removal");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (key, want) in [("before", "1"), ("during", "2"), ("after", "3")] {
        for i in [m1, m2] {
            wait_value(&c, i, key, want, false).await?;
        }
    }
    Ok(())
}

/// etcd's `--force-new-cluster` (disaster recovery after losing a quorum for good): one member
/// restarts as a cluster of one, with all its data at the same revisions, and stays one after a
/// plain restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_new_cluster_restarts_one_member_alone_with_its_data() -> TestResult {
    let mut c = Cluster::start(3)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let mut last = 0;
    for i in 0..20 {
        last = put(&c, 0, &format!("k{i}"), "v").await?;
    }
    // Every member has applied everything (the survivor is not necessarily the leader).
    tokio::time::sleep(Duration::from_secs(1)).await;
    for m in 0..3 {
        c.kill(m)?;
    }
    c.spawn_with(0, &["--force-new-cluster"])?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let rev = loop {
        match put(&c, 0, "after", "1").await {
            Ok(rev) => break rev,
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    assert_eq!(rev, last + 1, "the history continues where it stopped");
    assert_eq!(members(&c, 0).await?.len(), 1, "the others are gone");
    let got = c
        .kv(0)
        .await?
        .range(concord::pb::etcdserverpb::RangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            count_only: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(got.count, 20);
    // A plain restart keeps it a cluster of one.
    c.terminate(0)?;
    c.spawn(0)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while put(&c, 0, "again", "2").await.is_err() {
        assert!(
            Instant::now() < deadline,
            "no service after a plain restart"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(members(&c, 0).await?.len(), 1);
    Ok(())
}

/// `--strict-reconfig-check` (etcd's default: on) refuses to add a voter when the new
/// configuration would have fewer started members than a quorum (here: one of three members
/// never started); `--strict-reconfig-check=false` lets the operator do it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_strict_reconfiguration_check_can_be_turned_off() -> TestResult {
    for strict in [true, false] {
        let flag = format!("--strict-reconfig-check={strict}");
        let mut c = Cluster::prepare(3, &[&flag])?;
        c.spawn(0)?;
        c.spawn(1)?;
        c.wait_leader(Duration::from_secs(20)).await?;
        let added = cluster_client(&c, 0)
            .await?
            .member_add(MemberAddRequest {
                peer_ur_ls: vec!["http://127.0.0.1:1".into()],
                is_learner: false,
            })
            .await;
        match (strict, added) {
            (true, Err(e)) => assert!(e.message().contains("not enough started members"), "{e}"),
            (true, Ok(_)) => {
                return Err("the strict check let a voter be added with too few started".into())
            }
            (false, Ok(_)) => {}
            (false, Err(e)) => return Err(format!("not strict, yet refused: {e}").into()),
        }
    }
    Ok(())
}

/// As etcd: a member whose data is gone is not bootstrapped again with `new` while its peers
/// remember it running (it would come back with an empty log and no memory of its votes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_lost_its_data_is_not_bootstrapped_again() -> TestResult {
    let mut c = Cluster::start(3)?;
    let leader = c.wait_leader(Duration::from_secs(20)).await?;
    crate::cluster::put(&c, leader, "k", "v").await?;
    let lost = (leader + 1) % 3;
    // Wait until every member has published its client URLs (it has run).
    let deadline = Instant::now() + Duration::from_secs(20);
    while !members(&c, leader)
        .await?
        .iter()
        .all(|m| !m.client_ur_ls.is_empty())
    {
        if Instant::now() > deadline {
            return Err("members never published their client URLs".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.kill(lost)?;
    std::fs::remove_dir_all(c.data_dir(lost)?)?;
    c.spawn(lost)?;
    assert!(
        c.wait_exit(lost, Duration::from_secs(20)).await?,
        "bootstrapped again"
    );
    // Its log ends in the error and the backtrace under it.
    let tails = c.log_tails(500);
    assert!(tails.contains("has already been bootstrapped"), "{tails}");
    Ok(())
}
