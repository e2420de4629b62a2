//! Maintenance on real processes: HashKV agrees across members and survives a snapshot restore
//! into a new cluster (users and roles too); the NOSPACE alarm under a tiny quota and its
//! recovery; MoveLeader.

use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::alarm_request::AlarmAction;
use concord::pb::etcdserverpb::auth_client::AuthClient;
use concord::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use concord::pb::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmType, CompactionRequest, DefragmentRequest, DeleteRangeRequest,
    HashKvRequest, MoveLeaderRequest, PutRequest, SnapshotRequest, StatusRequest,
};
use concord::pb::etcdserverpb::{
    AuthRoleAddRequest, AuthRoleListRequest, AuthUserAddRequest, AuthUserListRequest,
};
use tonic::transport::Channel;

use crate::cluster::{grant, http_get, put, Cluster, TestResult};

async fn maintenance(c: &Cluster, i: usize) -> TestResult<MaintenanceClient<Channel>> {
    Ok(MaintenanceClient::connect(c.client_url(i)?).await?)
}

/// HashKV of every member at `revision`, waiting for them to have applied it.
async fn hashes(c: &Cluster, members: &[usize], revision: i64) -> TestResult<Vec<u32>> {
    let mut out = Vec::new();
    for &i in members {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = maintenance(c, i)
                .await?
                .hash_kv(HashKvRequest { revision })
                .await;
            match r {
                Ok(r) => {
                    out.push(r.into_inner().hash);
                    break;
                }
                Err(e) if Instant::now() > deadline => return Err(e.into()),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restores_into_a_new_cluster_with_the_same_hashkv() -> TestResult {
    let c = Cluster::start(3)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    for i in 0..20 {
        put(&c, i % 3, &format!("k{i}"), &format!("v{i}")).await?;
    }
    let mut kv = c.kv(0).await?;
    kv.delete_range(DeleteRangeRequest {
        key: b"k1".to_vec(),
        range_end: b"k2".to_vec(),
        ..Default::default()
    })
    .await?;
    kv.compact(CompactionRequest {
        revision: 10,
        physical: true,
    })
    .await?;
    grant(&c, 1, 600).await?;
    // Users and roles travel with the snapshot (auth stays off: HashKV and Snapshot are root's
    // once it is on).
    let mut auth = AuthClient::connect(c.client_url(0)?).await?;
    auth.user_add(AuthUserAddRequest {
        name: "alice".into(),
        password: "pw".into(),
        ..Default::default()
    })
    .await?;
    auth.role_add(AuthRoleAddRequest { name: "r".into() })
        .await?;
    let revision = put(&c, 2, "last", "x").await?;
    let source = hashes(&c, &[0, 1, 2], revision).await?;
    assert!(
        source.iter().all(|h| *h == source[0]),
        "members diverge: {source:?}"
    );

    // etcdctl snapshot save: the stream, concatenated. As etcd sends it: the database in
    // 32 KiB messages, each telling the bytes still to come, then its SHA-256 alone.
    let mut stream = maintenance(&c, 1)
        .await?
        .snapshot(SnapshotRequest {})
        .await?
        .into_inner();
    let mut messages = Vec::new();
    while let Some(msg) = stream.message().await? {
        messages.push((msg.remaining_bytes, msg.blob));
    }
    let (checksum, body) = messages.split_last().ok_or("no snapshot message")?;
    assert_eq!(checksum.0, 0);
    let file: Vec<u8> = body.iter().flat_map(|(_, blob)| blob.clone()).collect();
    assert_eq!(file.len() % 4096, 0, "whole bbolt pages");
    let mut sent = 0;
    for (remaining, blob) in body {
        assert!(blob.len() <= 32 << 10);
        sent += blob.len();
        assert_eq!(*remaining as usize, file.len() - sent);
    }
    {
        use sha2::Digest;
        assert_eq!(checksum.1, sha2::Sha256::digest(&file).to_vec());
    }
    let file = [file, checksum.1.clone()].concat();
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("snap.db");
    std::fs::write(&path, &file)?;

    let mut restored = Cluster::prepare(3, &[])?;
    for i in 0..3 {
        let out = restored.restore(i, &path, &[])?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
        .args(["snapshot", "status", "-w", "json"])
        .arg(&path)
        .output()?;
    // The file is etcd's database: its status hash is etcdutl's (of the file's buckets, not
    // HashKV; the differential tests compare it with etcdutl's), its revision the store's.
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(status.contains("\"hash\":"), "{status}");
    assert!(
        status.contains(&format!("\"revision\":{revision}")),
        "{status}"
    );
    for i in 0..3 {
        restored.spawn(i)?;
    }
    restored.wait_leader(Duration::from_secs(20)).await?;
    let copies = hashes(&restored, &[0, 1, 2], revision).await?;
    assert_eq!(copies, source, "the restored cluster differs");
    // The restored cluster goes on from the snapshot's revision.
    assert_eq!(put(&restored, 0, "after", "y").await?, revision + 1);
    let mut auth = AuthClient::connect(restored.client_url(2)?).await?;
    let users = auth
        .user_list(AuthUserListRequest {})
        .await?
        .into_inner()
        .users;
    assert_eq!(users, vec!["alice".to_string()]);
    let roles = auth
        .role_list(AuthRoleListRequest {})
        .await?
        .into_inner()
        .roles;
    assert_eq!(roles, vec!["r".to_string()]);

    // A member added later gets the restored state too (as a snapshot: the log of the new
    // cluster starts after it).
    let (new, peer_url) = restored.add_spec()?;
    let mut cluster =
        concord::pb::etcdserverpb::cluster_client::ClusterClient::connect(restored.client_url(0)?)
            .await?;
    // Just started, the members may not all count as started yet: etcd's strict reconfig
    // check then refuses, as etcd does, until they do.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let added = cluster
            .member_add(concord::pb::etcdserverpb::MemberAddRequest {
                peer_ur_ls: vec![peer_url.clone()],
                is_learner: false,
            })
            .await;
        match added {
            Ok(_) => break,
            Err(e)
                if e.code() == tonic::Code::FailedPrecondition
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    restored.spawn(new)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(h) = hashes(&restored, &[new], revision).await {
            if h == source[..1] {
                break;
            }
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "the added member never got the restored state\n{}",
                restored.log_tails(30)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_under_a_tiny_quota_until_compact_defrag_and_disarm() -> TestResult {
    let metrics_port = crate::cluster::free_port()?;
    let metrics_url = format!("http://127.0.0.1:{metrics_port}");
    let c = Cluster::start_with(
        1,
        &[
            "--quota-backend-bytes",
            "200000",
            "--listen-metrics-urls",
            &metrics_url,
        ],
    )?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let mut kv = c.kv(0).await?;
    // Incompressible values: the quota counts bytes on disk.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    };
    let mut refused = None;
    for i in 0..100 {
        let r = kv
            .put(PutRequest {
                key: format!("k{}", i % 4).into(),
                value: noise(20_000),
                ..Default::default()
            })
            .await;
        if let Err(e) = r {
            refused = Some(e);
            break;
        }
    }
    let refused = refused.ok_or("the quota never refused a write")?;
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert_eq!(
        refused.message(),
        "etcdserver: mvcc: database space exceeded"
    );

    let mut m = maintenance(&c, 0).await?;
    let status = m.status(StatusRequest {}).await?.into_inner();
    let member_id = status.header.map_or(0, |h| h.member_id);
    assert_eq!(
        status.errors,
        vec![format!("memberID:{member_id} alarm:NOSPACE ")]
    );
    let alarms = m
        .alarm(AlarmRequest {
            action: AlarmAction::Get as i32,
            member_id: 0,
            alarm: AlarmType::None as i32,
        })
        .await?
        .into_inner()
        .alarms;
    let nospace = AlarmMember {
        member_id,
        alarm: AlarmType::Nospace as i32,
    };
    assert_eq!(alarms, vec![nospace]);
    // /health reports the alarm unless told to exclude it, on the client and metrics URLs.
    assert_eq!(
        c.http_get(0, "/health").await?,
        r#"{"health":"false","reason":"ALARM NOSPACE"}"#
    );
    assert_eq!(
        http_get(metrics_port, "/health?exclude=NOSPACE").await?,
        r#"{"health":"true","reason":""}"#
    );
    assert!(http_get(metrics_port, "/metrics")
        .await?
        .contains("etcd_server_has_leader 1"));
    // Deletes still work; puts do not, even small ones.
    kv.delete_range(DeleteRangeRequest {
        key: b"k3".to_vec(),
        ..Default::default()
    })
    .await?;
    assert!(put(&c, 0, "small", "1").await.is_err());

    let revision = status.header.map_or(0, |h| h.revision) + 1;
    kv.compact(CompactionRequest {
        revision,
        physical: true,
    })
    .await?;
    m.defragment(DefragmentRequest {}).await?;
    let disarmed = m
        .alarm(AlarmRequest {
            action: AlarmAction::Deactivate as i32,
            member_id,
            alarm: AlarmType::Nospace as i32,
        })
        .await?
        .into_inner()
        .alarms;
    assert_eq!(disarmed, vec![nospace]);
    put(&c, 0, "small", "1").await?;
    assert!(m
        .status(StatusRequest {})
        .await?
        .into_inner()
        .errors
        .is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_hands_leadership_to_the_chosen_member() -> TestResult {
    let c = Cluster::start(3)?;
    let leader = c.wait_leader(Duration::from_secs(20)).await?;
    put(&c, 0, "before", "1").await?;
    let follower = (leader + 1) % 3;
    let follower_id = maintenance(&c, follower)
        .await?
        .status(StatusRequest {})
        .await?
        .into_inner()
        .header
        .map_or(0, |h| h.member_id);

    let not_leader = maintenance(&c, follower)
        .await?
        .move_leader(MoveLeaderRequest {
            target_id: follower_id,
        })
        .await
        .err()
        .ok_or("a follower moved the leader")?;
    assert_eq!(not_leader.message(), "etcdserver: not leader");
    let bad = maintenance(&c, leader)
        .await?
        .move_leader(MoveLeaderRequest { target_id: 42 })
        .await
        .err()
        .ok_or("moved the leader to nobody")?;
    assert_eq!(bad.message(), "etcdserver: bad leader transferee");

    maintenance(&c, leader)
        .await?
        .move_leader(MoveLeaderRequest {
            target_id: follower_id,
        })
        .await?;
    assert_eq!(c.wait_leader(Duration::from_secs(20)).await?, follower);
    let revision = put(&c, leader, "after", "2").await?;
    let all = hashes(&c, &[0, 1, 2], revision).await?;
    assert!(all.iter().all(|h| *h == all[0]), "members diverge: {all:?}");

    // The metrics saw it all: two leaders, peer round trips, gRPC calls by method and code.
    let scrape = |page: String| -> std::collections::BTreeMap<String, f64> {
        page.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
            .collect()
    };
    let old_leader = scrape(c.http_get(leader, "/metrics").await?);
    assert!(old_leader["etcd_server_leader_changes_seen_total"] >= 2.0);
    let rtt = format!("etcd_network_peer_round_trip_time_seconds_count{{To=\"{follower_id:x}\"}}");
    assert!(old_leader.get(&rtt).is_some_and(|n| *n > 0.0), "no {rtt}");
    let ok_put = "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}";
    assert!(
        old_leader.get(ok_put).is_some_and(|n| *n >= 1.0),
        "no {ok_put}"
    );
    let refused = scrape(c.http_get(follower, "/metrics").await?);
    let refused_move = "grpc_server_handled_total{grpc_code=\"FailedPrecondition\",grpc_method=\"MoveLeader\",grpc_service=\"etcdserverpb.Maintenance\",grpc_type=\"unary\"}";
    assert_eq!(refused.get(refused_move), Some(&1.0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_auto_compaction_keeps_only_the_retention_window() -> TestResult {
    let c = Cluster::start_with(
        1,
        &[
            "--auto-compaction-mode",
            "periodic",
            "--auto-compaction-retention",
            "1s",
        ],
    )?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let first = put(&c, 0, "k", "1").await?;
    put(&c, 0, "k", "2").await?;
    let mut kv = c.kv(0).await?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let old = kv
            .range(concord::pb::etcdserverpb::RangeRequest {
                key: b"k".to_vec(),
                revision: first,
                ..Default::default()
            })
            .await;
        match old {
            Err(e) if e.message() == "etcdserver: mvcc: required revision has been compacted" => {
                break
            }
            _ if Instant::now() > deadline => return Err("history never compacted".into()),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_corruption_check_raises_corrupt_when_a_member_diverges() -> TestResult {
    let mut c = Cluster::start_with(3, &["--experimental-corrupt-check-time", "300ms"])?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let first = put(&c, 0, "k", "original").await?;
    put(&c, 0, "other", "x").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let clean = alarms(&c).await?;
    assert!(clean.is_empty(), "alarm on a healthy cluster: {clean:?}");

    // Tamper with one member's copy of the first write, behind Raft's back.
    c.terminate(2)?;
    tamper(&c, 2, first)?;
    c.spawn(2)?;
    wait_corrupt(&c).await?;
    // Every read and write is refused now, as in etcd.
    let refused = put(&c, 0, "k", "new")
        .await
        .err()
        .ok_or("a write went through")?;
    assert!(
        refused.to_string().contains("etcdserver: corrupt cluster"),
        "{refused}"
    );
    let read = c
        .kv(1)
        .await?
        .range(concord::pb::etcdserverpb::RangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        })
        .await
        .err()
        .ok_or("a read went through")?;
    assert_eq!(read.code(), tonic::Code::DataLoss);
    Ok(())
}

/// etcd 3.5's compaction hash check: after a compaction, the leader compares the members'
/// hashes at the compaction's revision and raises CORRUPT for the cluster (member 0) when one
/// differs. (The periodic check at the current revision stays off here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compaction_hash_check_raises_corrupt_for_a_diverged_member() -> TestResult {
    let mut c = Cluster::start_with(
        3,
        &[
            "--experimental-compact-hash-check-enabled=true",
            "--experimental-compact-hash-check-time=300ms",
        ],
    )?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let first = put(&c, 0, "k", "original").await?;
    put(&c, 0, "other", "x").await?;
    c.terminate(2)?;
    tamper(&c, 2, first)?;
    c.spawn(2)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    // Nothing is compared before a compaction.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let none = alarms(&c).await?;
    assert!(none.is_empty(), "{none:?}");
    let last = put(&c, 1, "last", "y").await?;
    c.kv(0)
        .await?
        .compact(CompactionRequest {
            revision: last,
            physical: true,
        })
        .await?;
    let raised = wait_corrupt(&c).await?;
    assert_eq!(raised.member_id, 0, "the cluster, not one member");
    Ok(())
}

/// The alarms raised in the cluster, as member 0 lists them.
async fn alarms(c: &Cluster) -> TestResult<Vec<AlarmMember>> {
    let req = AlarmRequest::default();
    Ok(maintenance(c, 0)
        .await?
        .alarm(req)
        .await?
        .into_inner()
        .alarms)
}

/// Waits up to 20 s for a CORRUPT alarm; returns it.
async fn wait_corrupt(c: &Cluster) -> TestResult<AlarmMember> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let corrupt = AlarmType::Corrupt as i32;
        if let Some(a) = alarms(c).await?.into_iter().find(|a| a.alarm == corrupt) {
            return Ok(a);
        }
        if Instant::now() > deadline {
            return Err("no CORRUPT alarm".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Rewrites member `m`'s copy of the write at revision `rev` (key `k`) behind Raft's back; the
/// member must be stopped.
fn tamper(c: &Cluster, m: usize, rev: i64) -> TestResult {
    use prost::Message;
    let storage = concord::storage::Storage::open(&c.data_dir(m)?)?;
    let tampered = concord::pb::mvccpb::KeyValue {
        key: b"k".to_vec(),
        value: b"tampered".to_vec().into(),
        create_revision: rev,
        mod_revision: rev,
        version: 1,
        lease: 0,
    };
    let mut record = vec![b'p'];
    tampered.encode(&mut record)?;
    let mut batch = storage.batch();
    let key = concord::mvcc::Revision::new(rev, 0).to_bytes();
    batch.insert(concord::storage::Space::Kv, &key, &record);
    batch.commit()?;
    storage.persist_state()?;
    Ok(())
}

/// etcd's `--experimental-initial-corrupt-check` (kubeadm turns it on): a member whose data
/// differs from its peers' refuses to start; a healthy one starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diverged_member_refuses_to_start_with_the_initial_corruption_check() -> TestResult {
    let mut c = Cluster::start_with(3, &["--experimental-initial-corrupt-check=true"])?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let first = put(&c, 0, "k", "original").await?;
    put(&c, 0, "other", "x").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.terminate(2)?;
    tamper(&c, 2, first)?;
    c.spawn(2)?;
    assert!(
        c.wait_exit(2, Duration::from_secs(30)).await?,
        "a member with diverged data started serving"
    );
    let log = std::fs::read_to_string(c.data_dir(2)?.with_extension("log"))?;
    assert!(
        log.contains("found data inconsistency with peers"),
        "no inconsistency reported: {log}"
    );
    // A member whose data matches restarts with the check on, and serves.
    c.terminate(1)?;
    c.spawn(1)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while put(&c, 1, "after", "ok").await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the healthy member did not come back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// `--experimental-warning-apply-duration`: applies slower than it are counted in
/// `etcd_server_slow_apply_total` (and logged). With a limit of 1 ns every apply is slow, which
/// needs no timing assumption.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_applies_are_counted() -> TestResult {
    let c = Cluster::start_with(1, &["--experimental-warning-apply-duration", "1ns"])?;
    c.wait_leader(Duration::from_secs(20)).await?;
    put(&c, 0, "k", "v").await?;
    let metrics = c.http_get(0, "/metrics").await?;
    let count: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("etcd_server_slow_apply_total "))
        .and_then(|n| n.trim().parse().ok())
        .ok_or("no etcd_server_slow_apply_total")?;
    assert!(count > 0, "the put was not counted as slow");
    Ok(())
}
