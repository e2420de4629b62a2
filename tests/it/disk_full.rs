//! A member whose disk fills up: it stops serving and exits (as etcd exits when a write to its
//! WAL or database fails) instead of running on without its Raft core, and once there is room
//! again it restarts with every acknowledged write.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use concord::pb::etcdserverpb::{PutRequest, RangeRequest};

use crate::cluster::{put_retrying, Cluster, TestResult};

/// A tmpfs of a fixed size mounted on a directory (root only), unmounted when dropped.
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    /// Mounts a tmpfs of `mib` MiB on `dir`, or `None` where the tests may not mount one.
    fn mount(dir: &Path, mib: u64) -> Option<SmallDisk> {
        std::fs::create_dir_all(dir).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| SmallDisk {
            dir: dir.to_path_buf(),
        })
    }

    /// Gives the disk `mib` MiB in all, keeping what it holds.
    fn grow(&self, mib: u64) -> TestResult {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={mib}m")])
            .arg(&self.dir)
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err("remounting the tmpfs failed".into())
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazily: a member still running on it (a failed test) must not keep it mounted.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// Put `i`'s 512 KiB value: `i`, then bytes no compression shrinks (SHA-256 blocks).
fn value_of(i: u64) -> Vec<u8> {
    use sha2::Digest;
    let mut out = i.to_le_bytes().to_vec();
    let mut block = 0u64;
    while out.len() < 512 << 10 {
        out.extend_from_slice(&sha2::Sha256::digest(block.to_le_bytes()));
        block += 1;
    }
    out.truncate(512 << 10);
    out
}

#[tokio::test]
async fn a_member_whose_disk_fills_exits_and_restarts_with_every_acknowledged_write() -> TestResult
{
    let mut c = Cluster::prepare(1, &[])?;
    let Some(disk) = SmallDisk::mount(&c.data_dir(0)?, 48) else {
        eprintln!("skipped: this machine does not let the tests mount a tmpfs (root only)");
        return Ok(());
    };
    c.spawn(0)?;
    c.wait_leader(Duration::from_secs(20)).await?;

    // 512 KiB values until a put fails: 48 MiB hold fewer than 96 of them.
    let mut kv = c.kv(0).await?;
    let mut acked = Vec::new();
    for i in 0..200u64 {
        let put = PutRequest {
            key: format!("k{i:03}").into_bytes(),
            value: value_of(i),
            ..Default::default()
        };
        match tokio::time::timeout(Duration::from_secs(10), kv.put(put)).await {
            Ok(Ok(_)) => acked.push(i),
            _ => break,
        }
    }
    assert!(
        !acked.is_empty() && acked.len() < 200,
        "{} puts acknowledged on a 48 MiB disk",
        acked.len()
    );
    assert!(
        c.wait_exit(0, Duration::from_secs(30)).await?,
        "the member kept running with a full disk\n{}",
        c.log_tails(20)
    );
    let log = c.log_of(0)?;
    assert!(
        log.contains("raft stopped on a fatal error"),
        "{}",
        c.log_tails(20)
    );

    disk.grow(256)?;
    c.spawn(0)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let mut kv = c.kv(0).await?;
    for i in &acked {
        let key = format!("k{i:03}").into_bytes();
        let got = kv
            .range(RangeRequest {
                key,
                ..Default::default()
            })
            .await?
            .into_inner();
        let value = got.kvs.first().map(|kv| kv.value.to_vec());
        assert_eq!(value, Some(value_of(*i)), "acknowledged put {i} lost");
    }
    kv.put(PutRequest {
        key: b"after".to_vec(),
        value: b"room again".to_vec(),
        ..Default::default()
    })
    .await?;
    c.kill(0)?;
    Ok(())
}

/// Puts `value_of(i)` under `k<i>` through any running member, retrying through an election.
async fn put_value(c: &Cluster, i: u64) -> TestResult {
    put_retrying(c, &format!("k{i:03}"), value_of(i)).await?;
    Ok(())
}

#[tokio::test]
async fn a_member_whose_disk_fills_leaves_the_others_serving() -> TestResult {
    let mut c = Cluster::prepare(3, &[])?;
    let Some(_disk) = SmallDisk::mount(&c.data_dir(2)?, 48) else {
        eprintln!("skipped: this machine does not let the tests mount a tmpfs (root only)");
        return Ok(());
    };
    for m in 0..3 {
        c.spawn(m)?;
    }
    c.wait_leader(Duration::from_secs(20)).await?;
    // Member 2's 48 MiB fill with fewer than 96 values of 512 KiB; the others have room.
    let mut written = 0u64;
    loop {
        put_value(&c, written).await?;
        written += 1;
        if written.is_multiple_of(8) && c.wait_exit(2, Duration::from_millis(150)).await? {
            break;
        }
        if written > 300 {
            return Err(format!(
                "member 2 still runs after {written} puts\n{}",
                c.log_tails(20)
            )
            .into());
        }
    }
    assert!(
        c.log_of(2)?.contains("raft stopped on a fatal error"),
        "{}",
        c.log_tails(20)
    );
    // The two left go on, and hold every acknowledged value.
    for i in written..written + 8 {
        put_value(&c, i).await?;
    }
    let mut kv = c.kv(0).await?;
    for i in 0..written + 8 {
        let got = kv
            .range(RangeRequest {
                key: format!("k{i:03}").into_bytes(),
                ..Default::default()
            })
            .await?
            .into_inner();
        let value = got.kvs.first().map(|kv| kv.value.to_vec());
        assert_eq!(value, Some(value_of(i)), "acknowledged put {i} lost");
    }
    c.kill(0)?;
    c.kill(1)?;
    Ok(())
}
