//! Snapshots sent in many small pieces, read from and written to disk: a member far behind
//! catches up through one even when it is killed while receiving and when its sender is
//! killed while sending.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::RangeRequest;

use crate::cluster::{put, Cluster, TestResult};

async fn put_anywhere(c: &Cluster, key: &str, value: &str) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for m in c.alive() {
            if put(c, m, key, value).await.is_ok() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(format!("put {key} never acknowledged").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every `k…` key member `m` serves on its own (serializable), if it answers.
async fn local_keys(c: &Cluster, m: usize) -> Option<BTreeMap<String, String>> {
    let mut kv = c.kv(m).await.ok()?;
    let r = kv
        .range(RangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            serializable: true,
            ..Default::default()
        })
        .await
        .ok()?
        .into_inner();
    Some(
        r.kvs
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key).into_owned(),
                    String::from_utf8_lossy(&kv.value).into_owned(),
                )
            })
            .collect(),
    )
}

/// Waits until `path` exists (a transfer to that member has begun).
async fn wait_for_file(path: &std::path::Path, within: Duration) -> TestResult {
    let deadline = Instant::now() + within;
    while !path.exists() {
        if Instant::now() > deadline {
            return Err(format!("{} never appeared", path.display()).into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_far_behind_catches_up_through_a_chunked_snapshot_despite_kills() -> TestResult {
    // 4 KiB pieces: the ~1.5 MB state below travels in hundreds of them.
    let mut c = Cluster::start_with(
        3,
        &["--snapshot-count", "50", "--snapshot-chunk-bytes", "4096"],
    )?;
    let leader = c.wait_leader(Duration::from_secs(20)).await?;
    let lagging = (leader + 1) % 3;
    c.kill(lagging)?;
    let mut acked = BTreeMap::new();
    for i in 0..1500 {
        let (k, v) = (format!("k{i:04}"), format!("{i}-{}", "v".repeat(1000)));
        put_anywhere(&c, &k, &v).await?;
        acked.insert(k, v);
    }
    let receiving = c.data_dir(lagging)?.join("snapshot.recv");

    // The receiver dies while pieces arrive.
    c.spawn(lagging)?;
    wait_for_file(&receiving, Duration::from_secs(30)).await?;
    c.kill(lagging)?;
    assert!(
        !c.data_dir(lagging)?.join("snapshot.bin").exists(),
        "killed after the transfer, not during it"
    );
    // Its partial file is left behind; removed so that its return marks the next transfer.
    std::fs::remove_file(&receiving)?;

    // The sender dies while sending: another member becomes leader and sends its own.
    c.spawn(lagging)?;
    wait_for_file(&receiving, Duration::from_secs(30)).await?;
    let sender = c.wait_leader(Duration::from_secs(5)).await?;
    c.kill(sender)?;

    let deadline = Instant::now() + Duration::from_secs(60);
    while local_keys(&c, lagging).await.as_ref() != Some(&acked) {
        if Instant::now() > deadline {
            return Err(format!("the lagging member never caught up\n{}", c.log_tails(30)).into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(c.data_dir(lagging)?.join("snapshot.bin").exists());
    assert!(!receiving.exists(), "the received file became snapshot.bin");

    // Writes go on, and the killed sender comes back with everything too.
    put_anywhere(&c, "k9999", "after").await?;
    acked.insert("k9999".into(), "after".into());
    c.spawn(sender)?;
    for m in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(30);
        while local_keys(&c, m).await.as_ref() != Some(&acked) {
            if Instant::now() > deadline {
                return Err(format!("member {m} does not serve every acknowledged write").into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}
