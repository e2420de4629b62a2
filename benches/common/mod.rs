//! Shared by the benches: start Concord or reference etcd with the same flags on free loopback
//! ports in a temp dir, and connect to it once it serves writes.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::kv_client::KvClient;
use concord::pb::etcdserverpb::PutRequest;
use tonic::transport::Channel;

/// Errors of a bench run.
pub type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A server process, killed on drop.
pub struct Server {
    child: Child,
    /// Its client URL.
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> BoxResult<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts `binary` (concord or etcd) as a single member, data in a temp dir under `BENCH_DIR`
/// (default /tmp), so both run on the same disk.
pub fn start(binary: &str, extra: &[&str]) -> BoxResult<Server> {
    let dir = tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| "/tmp".into()))?;
    let (client, peer) = (free_port()?, free_port()?);
    let url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new(binary)
        .args([
            "--name",
            "bench",
            "--data-dir",
            &dir.path().join("data").to_string_lossy(),
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &format!("bench={peer_url}"),
            "--log-level",
            "error",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(Server {
        child,
        url,
        _dir: dir,
    })
}

/// A KV client, once the server accepts a write.
pub async fn connect(url: &str) -> BoxResult<KvClient<Channel>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut c) = KvClient::connect(url.to_string()).await {
            let ready = c
                .put(PutRequest {
                    key: b"warmup".to_vec(),
                    value: b"x".to_vec(),
                    ..Default::default()
                })
                .await;
            if ready.is_ok() {
                return Ok(c);
            }
        }
        if Instant::now() > deadline {
            return Err(format!("{url} not ready").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An environment variable as a number, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The reference etcd binary: `$ETCD_REF_BIN/etcd`, else installed by the test-tools script.
pub fn etcd_binary() -> BoxResult<String> {
    if let Ok(dir) = std::env::var("ETCD_REF_BIN") {
        return Ok(format!("{dir}/etcd"));
    }
    let out = Command::new("scripts/install-test-tools.sh").output()?;
    let dir = String::from_utf8(out.stdout)?.trim().to_string();
    Ok(format!("{dir}/etcd"))
}

/// The value at quantile `q` of sorted durations.
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).copied().unwrap_or_default()
}
