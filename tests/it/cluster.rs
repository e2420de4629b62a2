//! Real `concord` processes on loopback: start, kill -9, restart, and gRPC clients to them.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::kv_client::KvClient;
use concord::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use concord::pb::etcdserverpb::{PutRequest, StatusRequest};
use tonic::transport::Channel;

pub type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Puts `key` through `member`; returns the revision.
pub async fn put(
    c: &Cluster,
    member: usize,
    key: &str,
    value: impl AsRef<[u8]>,
) -> TestResult<i64> {
    let mut kv = c.kv(member).await?;
    let resp = kv
        .put(PutRequest {
            key: key.into(),
            value: value.as_ref().to_vec(),
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(resp.header.map_or(0, |h| h.revision))
}

/// Puts, retrying through any running member until acknowledged or the deadline passes;
/// returns the revision.
pub async fn put_retrying(c: &Cluster, key: &str, value: impl AsRef<[u8]>) -> TestResult<i64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for m in c.alive() {
            if let Ok(rev) = put(c, m, key, value.as_ref()).await {
                return Ok(rev);
            }
        }
        if Instant::now() > deadline {
            return Err(format!("put {key} never acknowledged").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Puts `k<i>` = `v<i>` (`i` zero-padded to three digits) for each `i` of `numbers` through any
/// member (retried through elections), and records each acknowledged one in `acked`.
pub async fn put_numbered(
    c: &Cluster,
    numbers: std::ops::Range<usize>,
    acked: &mut std::collections::BTreeMap<String, String>,
) -> TestResult {
    for i in numbers {
        let (k, v) = (format!("k{i:03}"), format!("v{i}"));
        put_retrying(c, &k, &v).await?;
        acked.insert(k, v);
    }
    Ok(())
}

/// The `k…` keys (`[k, l)`) as member `member` serves them; `serializable` reads its own
/// state alone.
pub async fn range_k(
    c: &Cluster,
    member: usize,
    serializable: bool,
) -> TestResult<concord::pb::etcdserverpb::RangeResponse> {
    let mut kv = c.kv(member).await?;
    Ok(kv
        .range(concord::pb::etcdserverpb::RangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            serializable,
            ..Default::default()
        })
        .await?
        .into_inner())
}

/// Key-values as a map of strings.
pub fn as_strings(
    kvs: &[concord::pb::mvccpb::KeyValue],
) -> std::collections::BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(&kv.key).into_owned(),
                String::from_utf8_lossy(&kv.value).into_owned(),
            )
        })
        .collect()
}

/// Grants a lease of `ttl` seconds through `member`; returns its id.
pub async fn grant(c: &Cluster, member: usize, ttl: i64) -> TestResult<i64> {
    let url = c.client_url(member)?;
    let mut leases = concord::pb::etcdserverpb::lease_client::LeaseClient::connect(url).await?;
    let resp = leases
        .lease_grant(concord::pb::etcdserverpb::LeaseGrantRequest { ttl, id: 0 })
        .await?
        .into_inner();
    Ok(resp.id)
}

/// GETs `path` over plain HTTP/1.1 from 127.0.0.1:`port`; returns the body.
pub async fn http_get(port: u16, path: &str) -> TestResult<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    conn.write_all(req.as_bytes()).await?;
    let mut raw = String::new();
    conn.read_to_string(&mut raw).await?;
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok(body.to_string())
}

/// Member processes started outside a [`Cluster`] (custom command lines), killed when dropped.
pub struct Procs(pub Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Puts `count` distinct values of `size` bytes each (`big/00000`…) through member 0, from 8
/// writers at once (so that entries carry several puts each).
pub async fn put_big_values(c: &Cluster, count: usize, size: usize) -> TestResult {
    let mut writers = Vec::new();
    for w in 0..8 {
        let mut kv = c.kv(0).await?;
        writers.push(tokio::spawn(async move {
            for i in (w..count).step_by(8) {
                let value: Vec<u8> = (0..size).map(|j| (i * 31 + j) as u8).collect();
                kv.put(PutRequest {
                    key: format!("big/{i:05}").into_bytes(),
                    value,
                    ..Default::default()
                })
                .await?;
            }
            Ok::<(), tonic::Status>(())
        }));
    }
    for w in writers {
        w.await??;
    }
    Ok(())
}

/// Resident memory of process `pid` in MiB (0 once it is gone).
pub fn rss_mib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024)
}

/// A free TCP port on 127.0.0.1.
///
/// Taken below Linux's ephemeral range (32768 and up): a port the kernel handed out for port 0
/// is free only until an outgoing connection of some other test takes it as its local port,
/// and a member started later then fails to bind (seen as a cluster that never elected).
/// Ports are handed out in turn from a per-process starting point, each checked by binding.
pub fn free_port() -> TestResult<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let start = (std::process::id().wrapping_mul(7919)) % SPAN;
    let _ = NEXT.compare_exchange(u32::MAX, start, Ordering::Relaxed, Ordering::Relaxed);
    for _ in 0..SPAN {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free port below the ephemeral range".into())
}

struct Spec {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// `--initial-cluster-state`: `new` for the bootstrapping members, `existing` for members
    /// added later.
    state: &'static str,
}

/// A cluster of real member processes sharing one temp dir.
pub struct Cluster {
    dir: tempfile::TempDir,
    specs: Vec<Spec>,
    procs: Vec<Option<Child>>,
    extra_args: Vec<String>,
    /// `--heartbeat-interval` and `--election-timeout`, in ms.
    timing: (u64, u64),
}

impl Cluster {
    /// Starts `n` members that bootstrap one cluster.
    pub fn start(n: usize) -> TestResult<Self> {
        Self::start_with(n, &[])
    }

    /// Starts `n` members with extra flags for every member.
    pub fn start_with(n: usize, extra_args: &[&str]) -> TestResult<Self> {
        let mut c = Self::prepare(n, extra_args)?;
        for i in 0..n {
            c.spawn(i)?;
        }
        Ok(c)
    }

    /// Starts three members at etcd's default timing (heartbeat 100 ms, election 1 s), waits for
    /// a leader, then makes every member's log fsync take `fsync_ms` (the slow-disk failpoint).
    /// Returns the cluster and its leader.
    pub async fn three_with_slow_disks(fsync_ms: u64) -> TestResult<(Self, usize)> {
        let mut c = Self::prepare(3, &[])?.with_timing(100, 1000);
        for i in 0..3 {
            c.spawn(i)?;
        }
        let leader = c.wait_leader(Duration::from_secs(20)).await?;
        for i in 0..3 {
            c.set_fsync_delay(i, fsync_ms)?;
        }
        Ok((c, leader))
    }

    /// Plans `n` bootstrapping members (ports, names, data dirs) without starting them.
    pub fn prepare(n: usize, extra_args: &[&str]) -> TestResult<Self> {
        let mut specs = Vec::new();
        for i in 0..n {
            specs.push(Spec {
                name: format!("m{i}"),
                client_port: free_port()?,
                peer_port: free_port()?,
                state: "new",
            });
        }
        Ok(Cluster {
            dir: tempfile::tempdir()?,
            procs: specs.iter().map(|_| None).collect(),
            specs,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            timing: (50, 500),
        })
    }

    /// Uses `heartbeat_ms` and `election_ms` for members started from now on.
    pub fn with_timing(mut self, heartbeat_ms: u64, election_ms: u64) -> Self {
        self.timing = (heartbeat_ms, election_ms);
        self
    }

    /// The `--initial-cluster` of the bootstrapping members.
    pub fn initial_cluster(&self) -> String {
        self.specs
            .iter()
            .filter(|s| s.state == "new")
            .map(|s| format!("{}=http://127.0.0.1:{}", s.name, s.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Member `i`'s name and peer URL.
    pub fn name_and_peer_url(&self, i: usize) -> TestResult<(String, String)> {
        let s = self.specs.get(i).ok_or("no such member")?;
        Ok((s.name.clone(), format!("http://127.0.0.1:{}", s.peer_port)))
    }

    /// `concord snapshot restore` of `file` into member `i`'s data dir (with `extra` flags),
    /// as that member of this cluster.
    pub fn restore(
        &self,
        i: usize,
        file: &std::path::Path,
        extra: &[&str],
    ) -> TestResult<std::process::Output> {
        let (name, peer_url) = self.name_and_peer_url(i)?;
        Ok(std::process::Command::new(env!("CARGO_BIN_EXE_concord"))
            .args(["snapshot", "restore"])
            .arg(file)
            .args([
                "--name",
                &name,
                "--initial-cluster",
                &self.initial_cluster(),
            ])
            .args(["--initial-advertise-peer-urls", &peer_url, "--data-dir"])
            .arg(self.data_dir(i)?)
            .args(extra)
            .output()?)
    }

    /// Starts (or restarts) member `i` on its data dir.
    pub fn spawn(&mut self, i: usize) -> TestResult {
        self.spawn_with(i, &[])
    }

    /// Starts (or restarts) member `i` with `extra` flags for this start only.
    pub fn spawn_with(&mut self, i: usize, extra: &[&str]) -> TestResult {
        // Bootstrapping members list each other; a joining member lists everyone (it asks them
        // for the membership).
        let joining = self.specs.get(i).is_some_and(|me| me.state == "existing");
        let initial = self
            .specs
            .iter()
            .filter(|s| joining || s.state == "new")
            .map(|s| format!("{}=http://127.0.0.1:{}", s.name, s.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let s = self.specs.get(i).ok_or("no such member")?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", s.name)))?;
        let child = Command::new(env!("CARGO_BIN_EXE_concord"))
            .args([
                "--name",
                &s.name,
                "--data-dir",
                &self.dir.path().join(&s.name).to_string_lossy(),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{}", s.client_port),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{}", s.client_port),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{}", s.peer_port),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{}", s.peer_port),
                "--initial-cluster",
                &initial,
                "--initial-cluster-state",
                s.state,
                "--heartbeat-interval",
                &self.timing.0.to_string(),
                "--election-timeout",
                &self.timing.1.to_string(),
                "--log-level",
                "warn",
            ])
            .args(&self.extra_args)
            .args(extra)
            // The fault-injection hook (see `slow_disk_failpoint` in the log store): a member
            // reads its fsync delay from here; without the file it syncs normally.
            .env("CONCORD_FAILPOINT_DIR", self.failpoint_dir(i))
            // Elections are logged (rarely more than a few lines): a failed `wait_leader` shows
            // them.
            .env(
                "RUST_LOG",
                "warn,concord::raft::election=info,concord::raft::snapshots=info,concord::raft::snapshot_send=info,openraft::engine=info",
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        if let Some(slot) = self.procs.get_mut(i) {
            *slot = Some(child);
        }
        Ok(())
    }

    fn failpoint_dir(&self, i: usize) -> std::path::PathBuf {
        self.dir.path().join(format!("failpoints-{i}"))
    }

    /// Makes every Raft log fsync of member `i` first sleep `ms` milliseconds (0: no delay).
    pub fn set_fsync_delay(&self, i: usize, ms: u64) -> TestResult {
        let dir = self.failpoint_dir(i);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("fsync-delay-ms"), ms.to_string())?;
        Ok(())
    }

    /// Reserves ports for a member to be added to the running cluster (started with
    /// `--initial-cluster-state existing`); returns its index and peer URL. Not started.
    pub fn add_spec(&mut self) -> TestResult<(usize, String)> {
        let i = self.specs.len();
        let spec = Spec {
            name: format!("m{i}"),
            client_port: free_port()?,
            peer_port: free_port()?,
            state: "existing",
        };
        let peer_url = format!("http://127.0.0.1:{}", spec.peer_port);
        self.specs.push(spec);
        self.procs.push(None);
        Ok((i, peer_url))
    }

    /// Waits up to `within` for member `i`'s process to exit on its own; true if it did.
    pub async fn wait_exit(&mut self, i: usize, within: Duration) -> TestResult<bool> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let child = self
                .procs
                .get_mut(i)
                .and_then(Option::as_mut)
                .ok_or("not running")?;
            if child.try_wait()?.is_some() {
                if let Some(slot) = self.procs.get_mut(i) {
                    *slot = None;
                }
                return Ok(true);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(false)
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) -> TestResult {
        if let Some(mut child) = self.procs.get_mut(i).and_then(Option::take) {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Sends `signal` (`-STOP`, `-CONT`) to member `i`.
    pub fn signal(&self, i: usize, signal: &str) -> TestResult {
        let child = self
            .procs
            .get(i)
            .and_then(Option::as_ref)
            .ok_or("member is not running")?;
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()?;
        if !status.success() {
            return Err(format!("kill {signal} failed").into());
        }
        Ok(())
    }

    /// SIGTERMs member `i` and waits for it to exit.
    pub fn terminate(&mut self, i: usize) -> TestResult {
        if let Some(mut child) = self.procs.get_mut(i).and_then(Option::take) {
            Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()?;
            child.wait()?;
        }
        Ok(())
    }

    /// The process id of member `i`, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.procs.get(i).and_then(Option::as_ref).map(Child::id)
    }

    /// The data dir of member `i`.
    pub fn data_dir(&self, i: usize) -> TestResult<std::path::PathBuf> {
        let s = self.specs.get(i).ok_or("no such member")?;
        Ok(self.dir.path().join(&s.name))
    }

    /// Indices of running members.
    pub fn alive(&self) -> Vec<usize> {
        (0..self.procs.len())
            .filter(|i| self.procs.get(*i).is_some_and(Option::is_some))
            .collect()
    }

    /// GETs `path` over plain HTTP/1.1 from member `i`'s client port; returns the body.
    pub async fn http_get(&self, i: usize, path: &str) -> TestResult<String> {
        let s = self.specs.get(i).ok_or("no such member")?;
        http_get(s.client_port, path).await
    }

    /// Snapshots member `i` received and installed since it started (its
    /// `etcd_network_snapshot_receive_success` counters, summed over senders).
    pub async fn snapshots_installed(&self, i: usize) -> TestResult<u64> {
        let page = self.http_get(i, "/metrics").await?;
        Ok(page
            .lines()
            .filter(|l| l.starts_with("etcd_network_snapshot_receive_success{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum())
    }

    /// The client URL of member `i`.
    pub fn client_url(&self, i: usize) -> TestResult<String> {
        self.url(i)
    }

    fn url(&self, i: usize) -> TestResult<String> {
        let s = self.specs.get(i).ok_or("no such member")?;
        Ok(format!("http://127.0.0.1:{}", s.client_port))
    }

    /// A KV client to member `i`, retrying the connection for a few seconds.
    pub async fn kv(&self, i: usize) -> TestResult<KvClient<Channel>> {
        let url = self.url(i)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match KvClient::connect(url.clone()).await {
                Ok(c) => return Ok(c),
                Err(e) if Instant::now() > deadline => return Err(e.into()),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Waits until a running member leads and every running member knows it; returns the
    /// leader's index.
    pub async fn wait_leader(&self, within: Duration) -> TestResult<usize> {
        let deadline = Instant::now() + within;
        let mut last = Vec::new();
        while Instant::now() < deadline {
            let mut views = Vec::new();
            for i in self.alive() {
                let Ok(mut m) = MaintenanceClient::connect(self.url(i)?).await else {
                    break;
                };
                let Ok(s) = m.status(StatusRequest {}).await else {
                    break;
                };
                let s = s.into_inner();
                views.push((i, s.header.map_or(0, |h| h.member_id), s.leader));
            }
            if views.len() == self.alive().len() {
                let leader = views.first().map_or(0, |v| v.2);
                let agreed = leader != 0 && views.iter().all(|v| v.2 == leader);
                if let Some((i, _, _)) = views.iter().find(|v| v.1 == leader).filter(|_| agreed) {
                    return Ok(*i);
                }
            }
            last = views;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "no leader elected in time; last (member, id, leader) views {last:?}, alive {:?}\n{}",
            self.alive(),
            self.log_tails(40)
        )
        .into())
    }

    /// Member `i`'s whole log (every start of it).
    pub fn log_of(&self, i: usize) -> TestResult<String> {
        let s = self.specs.get(i).ok_or("no such member")?;
        Ok(std::fs::read_to_string(
            self.dir.path().join(format!("{}.log", s.name)),
        )?)
    }

    /// The last `lines` lines of every member's log, for a failure message.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for s in &self.specs {
            let log = std::fs::read_to_string(self.dir.path().join(format!("{}.log", s.name)))
                .unwrap_or_else(|e| format!("(no log: {e})"));
            let all: Vec<&str> = log.lines().collect();
            out.push_str(&format!("--- {} ---\n", s.name));
            // The head too: a member that failed to start says why in its first lines.
            let tail = all.len().saturating_sub(lines);
            for l in all.iter().take(tail.min(5)).chain(&all[tail..]) {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.procs.iter_mut().filter_map(Option::take) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
