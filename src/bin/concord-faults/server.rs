//! The server under test and its command line: `concord`, or reference etcd driven with the
//! same seed and schedule (`--etcd PATH`), so the two can be compared fault for fault.
//!
//! Both get etcd's flags with the same values. What only one of them has:
//! - Concord's slow-disk failpoint (`CONCORD_FAILPOINT_DIR`): etcd has none, so on etcd the
//!   slow-disk faults inject nothing (the schedule and its random draws stay the same).
//! - Lease checkpoints every 2 s: Concord's `--experimental-lease-checkpoint-interval`. etcd 3.5
//!   needs `--experimental-enable-lease-checkpoint`; its interval flag (and the persist flag of
//!   later 3.5 releases) are passed only when `etcd --help` lists them (3.5.1 has neither, and
//!   checkpoints every 5 minutes).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::cluster::{ELECTION_MS, HEARTBEAT_MS};

/// Which server the suite drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Concord.
    Concord,
    /// Reference etcd.
    Etcd,
}

/// A server binary and what it supports.
#[derive(Clone, Debug)]
pub struct Server {
    /// Which server it is.
    pub kind: Kind,
    /// The binary.
    pub path: PathBuf,
    /// Flags this binary accepts beyond the common ones (lease checkpoints).
    extra: Vec<String>,
}

/// What one member's command line needs.
pub struct Member<'a> {
    /// Its name (`m0`, `m1`, ...).
    pub name: &'a str,
    /// Its address.
    pub ip: &'a str,
    /// Its data dir (reused by restarts).
    pub data_dir: &'a Path,
    /// `name=peer-url,...` of every member.
    pub initial_cluster: &'a str,
    /// Where Concord's failpoints live.
    pub failpoints: &'a Path,
}

/// The workloads' channels ping every second (`client.rs`) to notice a dead member quickly;
/// both servers are told to allow it (etcd's and Concord's default minimum is 5 s).
const ALLOW_CLIENT_PINGS: [&str; 2] = ["--grpc-keepalive-min-time", "1s"];

impl Server {
    /// The `concord` binary at `path`.
    pub fn concord(path: &Path) -> Result<Server> {
        Ok(Server {
            kind: Kind::Concord,
            path: std::fs::canonicalize(path)
                .with_context(|| format!("no concord binary at {}", path.display()))?,
            extra: [
                "--experimental-lease-checkpoint-interval",
                "2s",
                ALLOW_CLIENT_PINGS[0],
                ALLOW_CLIENT_PINGS[1],
            ]
            .map(String::from)
            .to_vec(),
        })
    }

    /// The `etcd` binary at `path`; asks it which lease-checkpoint flags it has.
    pub fn etcd(path: &Path) -> Result<Server> {
        let path = std::fs::canonicalize(path)
            .with_context(|| format!("no etcd binary at {}", path.display()))?;
        let help = Command::new(&path)
            .arg("--help")
            .output()
            .with_context(|| format!("running {} --help", path.display()))?;
        let help = format!(
            "{}{}",
            String::from_utf8_lossy(&help.stdout),
            String::from_utf8_lossy(&help.stderr)
        );
        let mut extra = vec!["--experimental-enable-lease-checkpoint".to_string()];
        extra.extend(ALLOW_CLIENT_PINGS.map(String::from));
        if help.contains("--experimental-lease-checkpoint-interval") {
            extra.extend([
                "--experimental-lease-checkpoint-interval".into(),
                "2s".into(),
            ]);
        }
        if help.contains("--experimental-enable-lease-checkpoint-persist") {
            extra.push("--experimental-enable-lease-checkpoint-persist".into());
        }
        Ok(Server {
            kind: Kind::Etcd,
            path,
            extra,
        })
    }

    /// `concord` or `etcd`, for reports.
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Concord => "concord",
            Kind::Etcd => "etcd",
        }
    }

    /// Whether the slow-disk failpoint exists (Concord only).
    pub fn slow_disk(&self) -> bool {
        self.kind == Kind::Concord
    }

    /// Appends the server binary and its flags for member `m` to `cmd` (which runs it inside
    /// the member's namespace). The same flags start a member and restart it on its data dir.
    pub fn command(&self, cmd: &mut Command, m: &Member<'_>) {
        let client = format!("http://{}:2379", m.ip);
        let peer = format!("http://{}:2380", m.ip);
        cmd.arg(&self.path)
            .args(["--name", m.name])
            .arg("--data-dir")
            .arg(m.data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", m.initial_cluster])
            .args(["--initial-cluster-token", "concord-faults"])
            .args(["--initial-cluster-state", "new"])
            .args(["--heartbeat-interval", &HEARTBEAT_MS.to_string()])
            .args(["--election-timeout", &ELECTION_MS.to_string()])
            .args(["--log-level", "info"])
            .args(&self.extra);
        match self.kind {
            Kind::Concord => {
                cmd.env("CONCORD_FAILPOINT_DIR", m.failpoints)
                    .env_remove("RUST_LOG");
            }
            Kind::Etcd => {
                // etcd reads ETCD_* variables as flags: none from the caller's environment.
                for (k, _) in std::env::vars_os() {
                    if k.to_string_lossy().starts_with("ETCD_") {
                        cmd.env_remove(k);
                    }
                }
            }
        }
    }
}
