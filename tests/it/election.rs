//! Election: one leader at a time in campaign order, proclaim only while leading, and Observe
//! sees every leader (and every proclaimed value) in order.

use std::time::Duration;

use concord::pb::etcdserverpb::lease_client::LeaseClient;
use concord::pb::etcdserverpb::LeaseGrantRequest;
use concord::pb::v3electionpb::election_client::ElectionClient;
use concord::pb::v3electionpb::{CampaignRequest, LeaderRequest, ProclaimRequest, ResignRequest};
use tonic::transport::Channel;

use crate::cluster::{Cluster, TestResult};

async fn elections(c: &Cluster, member: usize) -> TestResult<ElectionClient<Channel>> {
    let url = c.client_url(member)?;
    Ok(ElectionClient::connect(url).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_sees_every_leader_in_order_and_proclaim_needs_leadership() -> TestResult {
    let c = Cluster::start(3)?;
    let leader = c.wait_leader(Duration::from_secs(20)).await?;
    let follower = (leader + 1) % 3;
    let mut e = elections(&c, follower).await?;
    let err = e
        .leader(LeaderRequest {
            name: b"svc".to_vec(),
        })
        .await
        .err()
        .ok_or("a leader with no candidate")?;
    assert_eq!(err.message(), "election: no leader");

    let mut observed = elections(&c, (leader + 2) % 3)
        .await?
        .observe(LeaderRequest {
            name: b"svc".to_vec(),
        })
        .await?
        .into_inner();

    let url = c.client_url(leader)?;
    let mut leases = LeaseClient::connect(url).await?;
    let mut expected = Vec::new();
    let mut previous = None;
    for i in 0..4 {
        let lease = leases
            .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
            .await?
            .into_inner()
            .id;
        let member = i % 3;
        let mut candidate = elections(&c, member).await?;
        // The next candidate campaigns while the current one still leads: it must wait.
        let campaign = tokio::spawn(async move {
            candidate
                .campaign(CampaignRequest {
                    name: b"svc".to_vec(),
                    lease,
                    value: format!("c{i}").into_bytes(),
                })
                .await
                .map(|r| r.into_inner().leader)
                .map_err(|s| s.message().to_string())
        });
        if let Some(prev) = previous.take() {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!campaign.is_finished(), "two leaders at once");
            e.resign(ResignRequest { leader: Some(prev) }).await?;
        }
        let me = campaign.await??.ok_or("no leader key")?;
        let current = e
            .leader(LeaderRequest {
                name: b"svc".to_vec(),
            })
            .await?
            .into_inner();
        assert_eq!(current.kv.map(|kv| kv.key), Some(me.key.clone()));
        e.proclaim(ProclaimRequest {
            leader: Some(me.clone()),
            value: format!("c{i}-updated").into_bytes(),
        })
        .await?;
        expected.push(format!("c{i}"));
        expected.push(format!("c{i}-updated"));
        previous = Some(me);
    }
    let last = previous.ok_or("no leader")?;
    e.resign(ResignRequest {
        leader: Some(last.clone()),
    })
    .await?;
    let err = e
        .proclaim(ProclaimRequest {
            leader: Some(last),
            value: b"late".to_vec(),
        })
        .await
        .err()
        .ok_or("a resigned leader proclaimed")?;
    assert_eq!(err.message(), "election: not leader");

    let mut seen = Vec::new();
    while seen.len() < expected.len() {
        let resp = tokio::time::timeout(Duration::from_secs(10), observed.message())
            .await??
            .ok_or("observe ended")?;
        let kv = resp.kv.ok_or("no kv")?;
        assert!(resp.header.map_or(0, |h| h.revision) >= kv.mod_revision);
        seen.push(String::from_utf8(kv.value.to_vec())?);
    }
    assert_eq!(seen, expected);
    Ok(())
}
