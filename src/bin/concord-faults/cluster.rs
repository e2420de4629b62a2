//! Real member processes (`concord`, or etcd: see `server.rs`), each in its own network
//! namespace, with data on disk: start, `kill -9`, SIGSTOP/SIGCONT, a slow disk (Concord's
//! failpoint; nothing on etcd), and leader discovery.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

use crate::client::Clients;
use crate::net::Net;
use crate::server::{self, Server};

/// Election timing for the suite: slow enough for debug builds on 2 busy cores.
pub const HEARTBEAT_MS: u64 = 100;
/// See [`HEARTBEAT_MS`].
pub const ELECTION_MS: u64 = 1000;

/// The members of one run.
pub struct Cluster {
    /// The network the members live in.
    pub net: Net,
    dir: PathBuf,
    server: Server,
    procs: Vec<Option<Child>>,
    paused: Vec<bool>,
}

impl Cluster {
    /// Starts `members` members of a new cluster under `dir`.
    pub fn start(net: Net, members: usize, server: &Server, dir: &Path) -> Result<Cluster> {
        let mut c = Cluster {
            net,
            dir: dir.to_path_buf(),
            server: server.clone(),
            procs: (0..members).map(|_| None).collect(),
            paused: vec![false; members],
        };
        for m in 0..members {
            if c.server.slow_disk() {
                std::fs::create_dir_all(c.failpoints(m))?;
            }
            c.spawn(m)?;
        }
        Ok(c)
    }

    /// The server the members run.
    pub fn server(&self) -> &Server {
        &self.server
    }

    /// How many members the cluster has.
    pub fn size(&self) -> usize {
        self.procs.len()
    }

    /// Client URLs, by member.
    pub fn client_urls(&self) -> Vec<String> {
        (0..self.size())
            .map(|m| format!("http://{}:2379", self.net.ip(m)))
            .collect()
    }

    fn failpoints(&self, m: usize) -> PathBuf {
        self.dir.join(format!("failpoints-m{m}"))
    }

    /// Starts member `m` on its data dir (a restart if it ran before).
    pub fn spawn(&mut self, m: usize) -> Result<()> {
        if self.procs.get(m).is_some_and(Option::is_some) {
            return Ok(());
        }
        let initial = (0..self.size())
            .map(|i| format!("m{i}=http://{}:2380", self.net.ip(i)))
            .collect::<Vec<_>>()
            .join(",");
        let ip = self.net.ip(m);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("m{m}.log")))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.net.ns(m)]);
        self.server.command(
            &mut cmd,
            &server::Member {
                name: &format!("m{m}"),
                ip: &ip,
                data_dir: &self.dir.join(format!("m{m}")),
                initial_cluster: &initial,
                failpoints: &self.failpoints(m),
            },
        );
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.server.name()))?;
        if let Some(slot) = self.procs.get_mut(m) {
            *slot = Some(child);
        }
        if let Some(p) = self.paused.get_mut(m) {
            *p = false;
        }
        Ok(())
    }

    /// `kill -9` of member `m`.
    pub fn kill(&mut self, m: usize) -> Result<()> {
        if let Some(mut child) = self.procs.get_mut(m).and_then(Option::take) {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Whether member `m` is running (possibly paused).
    pub fn running(&self, m: usize) -> bool {
        self.procs.get(m).is_some_and(Option::is_some)
    }

    fn signal(&self, m: usize, sig: &str) -> Result<()> {
        let pid = self
            .procs
            .get(m)
            .and_then(Option::as_ref)
            .map(Child::id)
            .ok_or_else(|| anyhow!("member {m} is not running"))?;
        let st = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()?;
        if !st.success() {
            return Err(anyhow!("kill {sig} {pid} failed"));
        }
        Ok(())
    }

    /// SIGSTOP of member `m`: the process freezes with its sockets open.
    pub fn pause(&mut self, m: usize) -> Result<()> {
        self.signal(m, "-STOP")?;
        if let Some(p) = self.paused.get_mut(m) {
            *p = true;
        }
        Ok(())
    }

    /// SIGCONT of member `m`.
    pub fn resume(&mut self, m: usize) -> Result<()> {
        if self.paused.get(m).copied().unwrap_or(false) {
            self.signal(m, "-CONT")?;
            if let Some(p) = self.paused.get_mut(m) {
                *p = false;
            }
        }
        Ok(())
    }

    /// Makes every log fsync of member `m` take `ms` milliseconds longer (0: normal disk).
    /// Does nothing on a server without the failpoint (etcd).
    pub fn slow_disk(&self, m: usize, ms: u64) -> Result<()> {
        if !self.server.slow_disk() {
            return Ok(());
        }
        let file = self.failpoints(m).join("fsync-delay-ms");
        if ms == 0 {
            if file.exists() {
                std::fs::remove_file(file)?;
            }
            return Ok(());
        }
        std::fs::write(file, ms.to_string())?;
        Ok(())
    }

    /// Heals everything: no cuts, nobody paused, every member running, normal disks.
    pub fn heal_all(&mut self) -> Result<()> {
        self.net.heal()?;
        for m in 0..self.size() {
            self.resume(m)?;
            self.slow_disk(m, 0)?;
            self.spawn(m)?;
        }
        Ok(())
    }

    /// The member every responding member names as leader, if they agree and it answers too.
    pub async fn leader(&self, clients: &Clients) -> Option<usize> {
        let mut ids = vec![None; self.size()];
        let mut named = Vec::new();
        for (m, id) in ids.iter_mut().enumerate() {
            if !self.running(m) || self.paused.get(m).copied().unwrap_or(true) {
                continue;
            }
            if let Some((member_id, leader)) = clients.status(m, Duration::from_millis(500)).await {
                *id = Some(member_id);
                named.push(leader);
            }
        }
        let first = *named.first()?;
        if first == 0 || named.iter().any(|l| *l != first) {
            return None;
        }
        ids.iter().position(|id| *id == Some(first))
    }

    /// Waits up to `limit` for a leader every running member agrees on.
    pub async fn wait_leader(&self, clients: &Clients, limit: Duration) -> Result<usize> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(l) = self.leader(clients).await {
                return Ok(l);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(anyhow!("no agreed leader within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops every member (SIGKILL) and waits for them.
    pub fn kill_all(&mut self) -> Result<()> {
        for m in 0..self.size() {
            self.resume(m)?;
            self.kill(m)?;
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.kill_all();
    }
}
