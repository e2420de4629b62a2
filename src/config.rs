//! etcd-compatible configuration: the same flags, `ETCD_*` environment variables and defaults,
//! so that `concord` with no flags behaves like `etcd` with no flags.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// Command-line flags, named as etcd's.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "concord",
    version,
    about = "An etcd v3 API-compatible key-value store"
)]
pub struct Config {
    /// Human-readable name for this member.
    #[arg(long, env = "ETCD_NAME", default_value = "default")]
    pub name: String,
    /// Path to the data directory (default: `<name>.concord`).
    #[arg(long, env = "ETCD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// URLs to listen on for client traffic.
    #[arg(
        long,
        env = "ETCD_LISTEN_CLIENT_URLS",
        default_value = "http://localhost:2379"
    )]
    pub listen_client_urls: String,
    /// Client URLs advertised to the rest of the cluster.
    #[arg(
        long,
        env = "ETCD_ADVERTISE_CLIENT_URLS",
        default_value = "http://localhost:2379"
    )]
    pub advertise_client_urls: String,
    /// URLs to listen on for peer traffic.
    #[arg(
        long,
        env = "ETCD_LISTEN_PEER_URLS",
        default_value = "http://localhost:2380"
    )]
    pub listen_peer_urls: String,
    /// This member's peer URLs, advertised to the rest of the cluster.
    #[arg(
        long,
        env = "ETCD_INITIAL_ADVERTISE_PEER_URLS",
        default_value = "http://localhost:2380"
    )]
    pub initial_advertise_peer_urls: String,
    /// Initial cluster configuration for bootstrapping: `name=peer-url,...`
    /// (default: `<name>=<initial-advertise-peer-urls>`).
    #[arg(long, env = "ETCD_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,
    /// `new` to bootstrap a new cluster, `existing` to join one.
    #[arg(long, env = "ETCD_INITIAL_CLUSTER_STATE", default_value = "new")]
    pub initial_cluster_state: ClusterState,
    /// Initial cluster token, mixed into member and cluster ids.
    #[arg(
        long,
        env = "ETCD_INITIAL_CLUSTER_TOKEN",
        default_value = "etcd-cluster"
    )]
    pub initial_cluster_token: String,
    /// Maximum client request size in bytes the server will accept.
    #[arg(long, env = "ETCD_MAX_REQUEST_BYTES", default_value_t = 1_572_864)]
    pub max_request_bytes: usize,
    /// Extra URLs to serve `/metrics` and `/health` on (plain HTTP), besides the client URLs.
    #[arg(long, env = "ETCD_LISTEN_METRICS_URLS", default_value = "")]
    pub listen_metrics_urls: String,
    /// Raise the NOSPACE alarm when the backend size exceeds this many bytes (0: etcd's default
    /// of 2 GiB).
    #[arg(long, env = "ETCD_QUOTA_BACKEND_BYTES", default_value_t = 0)]
    pub quota_backend_bytes: i64,
    /// Maximum number of operations permitted in a transaction.
    #[arg(long, env = "ETCD_MAX_TXN_OPS", default_value_t = 128)]
    pub max_txn_ops: usize,
    /// Time (in milliseconds) of a heartbeat interval.
    #[arg(long, env = "ETCD_HEARTBEAT_INTERVAL", default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Time (in milliseconds) for an election to timeout.
    #[arg(long, env = "ETCD_ELECTION_TIMEOUT", default_value_t = 1000)]
    pub election_timeout: u64,
    /// Number of committed entries that trigger a snapshot and log compaction.
    #[arg(long, env = "ETCD_SNAPSHOT_COUNT", default_value_t = 100_000)]
    pub snapshot_count: u64,
    /// Interval between progress notifications to watches that asked for them.
    #[arg(
        long = "experimental-watch-progress-notify-interval",
        env = "ETCD_EXPERIMENTAL_WATCH_PROGRESS_NOTIFY_INTERVAL",
        default_value = "10m",
        value_parser = parse_duration
    )]
    pub watch_progress_notify_interval: Duration,
    /// How often the leader records remaining lease TTLs in the log (etcd's default, 5m),
    /// bounding how long an unrenewed lease can outlive its TTL across a leader change.
    #[arg(
        long = "experimental-lease-checkpoint-interval",
        env = "ETCD_EXPERIMENTAL_LEASE_CHECKPOINT_INTERVAL",
        default_value = "5m",
        value_parser = parse_duration
    )]
    pub lease_checkpoint_interval: Duration,
    /// How often the leader compares its HashKV with every member's and raises CORRUPT on a
    /// mismatch (0s: never, etcd's default).
    #[arg(
        long = "experimental-corrupt-check-time",
        env = "ETCD_EXPERIMENTAL_CORRUPT_CHECK_TIME",
        default_value = "0s",
        value_parser = parse_duration
    )]
    pub corrupt_check_time: Duration,
    /// Auto compaction: `periodic` (keep `--auto-compaction-retention` of time) or `revision`
    /// (keep that many revisions).
    #[arg(long, env = "ETCD_AUTO_COMPACTION_MODE", default_value = "periodic")]
    pub auto_compaction_mode: CompactionMode,
    /// Auto compaction retention: a duration (`1h`, `30m`; a bare number is hours) in periodic
    /// mode, a revision count in revision mode; 0 turns auto compaction off.
    #[arg(long, env = "ETCD_AUTO_COMPACTION_RETENTION", default_value = "0")]
    pub auto_compaction_retention: String,
    /// Log level: debug, info, warn, error.
    #[arg(long, env = "ETCD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log format: `json` (etcd's default: one JSON object per line) or `text` (`console` is
    /// etcd's name for it).
    #[arg(long, env = "ETCD_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
}

/// `--initial-cluster-state`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    /// Bootstrap a new cluster.
    New,
    /// Join an existing cluster.
    Existing,
}

/// One member of `--initial-cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialMember {
    /// The member's name.
    pub name: String,
    /// Its peer URLs.
    pub peer_urls: Vec<String>,
}

impl Config {
    /// Parses flags the way etcd does: Go's flag package accepts `-name` as well as `--name`.
    pub fn from_args() -> Self {
        let args = std::env::args().map(|a| {
            let is_single_dash_flag = a.starts_with('-')
                && !a.starts_with("--")
                && a.len() > 2
                && a.chars().nth(1).is_some_and(|c| c.is_ascii_alphabetic());
            if is_single_dash_flag {
                format!("-{a}")
            } else {
                a
            }
        });
        Config::parse_from(args)
    }

    /// The data directory, `<name>.concord` unless given.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("{}.concord", self.name)))
    }

    /// The request timeout etcd derives from the election timeout: 5s + 2 × election.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(5) + Duration::from_millis(2 * self.election_timeout)
    }

    /// `--initial-cluster`, parsed and keyed by member id.
    ///
    /// # Errors
    /// When an entry is not `name=url`.
    pub fn initial_members(&self) -> Result<BTreeMap<u64, InitialMember>, String> {
        let spec = self.initial_cluster.clone().unwrap_or_else(|| {
            split_urls(&self.initial_advertise_peer_urls)
                .iter()
                .map(|u| format!("{}={u}", self.name))
                .collect::<Vec<_>>()
                .join(",")
        });
        let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, url) = part
                .split_once('=')
                .ok_or_else(|| format!("invalid --initial-cluster entry {part:?}"))?;
            by_name
                .entry(name.to_string())
                .or_default()
                .push(url.to_string());
        }
        Ok(by_name
            .into_iter()
            .map(|(name, peer_urls)| {
                let id = member_id(&peer_urls, &self.initial_cluster_token);
                (id, InitialMember { name, peer_urls })
            })
            .collect())
    }

    /// The flags `snapshot restore` shares with the server, the rest at their defaults.
    pub fn for_restore(name: &str, initial_cluster: &str, token: &str, peer_urls: &str) -> Self {
        Config::parse_from([
            "concord",
            "--name",
            name,
            "--initial-cluster",
            initial_cluster,
            "--initial-cluster-token",
            token,
            "--initial-advertise-peer-urls",
            peer_urls,
        ])
    }

    /// The space quota in bytes (`--quota-backend-bytes`, 0 or negative meaning the default).
    pub fn quota_bytes(&self) -> u64 {
        match u64::try_from(self.quota_backend_bytes) {
            Ok(0) | Err(_) => DEFAULT_QUOTA_BYTES,
            Ok(q) => q,
        }
    }

    /// This member's id, from its advertised peer URLs.
    pub fn member_id(&self) -> u64 {
        member_id(
            &split_urls(&self.initial_advertise_peer_urls),
            &self.initial_cluster_token,
        )
    }
}

/// etcd's default space quota: 2 GiB.
pub const DEFAULT_QUOTA_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// Parses a Go-style duration: `500ms`, `5s`, `10m`, `1h`.
///
/// # Errors
/// When the text is not a number followed by one of those units.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("invalid duration unit in {s:?}")),
    }
}

/// Splits a comma-separated URL list.
pub fn split_urls(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(String::from)
        .collect()
}

/// A member id, as etcd derives it: a hash of the sorted peer URLs and the cluster token.
pub fn member_id(peer_urls: &[String], token: &str) -> u64 {
    let mut urls = peer_urls.to_vec();
    urls.sort();
    let id = fnv1a(format!("{}{token}", urls.concat()).as_bytes());
    id.max(1)
}

/// The cluster id: a hash of the sorted initial member ids.
pub fn cluster_id<'a>(member_ids: impl IntoIterator<Item = &'a u64>) -> u64 {
    let mut ids: Vec<u64> = member_ids.into_iter().copied().collect();
    ids.sort_unstable();
    let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_be_bytes()).collect();
    fnv1a(&bytes)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `--auto-compaction-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompactionMode {
    /// Keep a window of time.
    Periodic,
    /// Keep a number of revisions.
    Revision,
}

/// What auto compaction keeps, parsed from the mode and retention flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// Auto compaction is off.
    Off,
    /// Keep the history of this long.
    Period(Duration),
    /// Keep this many revisions.
    Revisions(i64),
}

impl Config {
    /// The auto compaction retention, as etcd reads its flags.
    ///
    /// # Errors
    /// A retention that does not parse for its mode.
    pub fn retention(&self) -> Result<Retention, String> {
        let text = self.auto_compaction_retention.trim();
        let bad = || format!("invalid --auto-compaction-retention {text:?}");
        match self.auto_compaction_mode {
            CompactionMode::Revision => match text.parse::<i64>().map_err(|_| bad())? {
                0 => Ok(Retention::Off),
                n if n > 0 => Ok(Retention::Revisions(n)),
                _ => Err(bad()),
            },
            CompactionMode::Periodic => {
                let period = match text.parse::<u64>() {
                    Ok(hours) => Duration::from_secs(hours * 3600),
                    Err(_) => parse_duration(text).map_err(|_| bad())?,
                };
                Ok(if period.is_zero() {
                    Retention::Off
                } else {
                    Retention::Period(period)
                })
            }
        }
    }
}

/// How the server writes its logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (etcd's default).
    Json,
    /// Human-readable lines; `console` is etcd's name for it.
    #[value(alias = "console")]
    Text,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_compaction_retention_reads_like_etcd() {
        let retention = |mode: &str, value: &str| {
            Config::parse_from([
                "concord",
                "--auto-compaction-mode",
                mode,
                "--auto-compaction-retention",
                value,
            ])
            .retention()
        };
        assert_eq!(retention("periodic", "0"), Ok(Retention::Off));
        assert_eq!(
            retention("periodic", "2"),
            Ok(Retention::Period(Duration::from_secs(7200)))
        );
        assert_eq!(
            retention("periodic", "30m"),
            Ok(Retention::Period(Duration::from_secs(1800)))
        );
        assert_eq!(
            retention("revision", "1000"),
            Ok(Retention::Revisions(1000))
        );
        assert_eq!(retention("revision", "0"), Ok(Retention::Off));
        assert!(retention("revision", "1h").is_err());
        assert!(retention("periodic", "soon").is_err());
    }

    #[test]
    fn defaults_match_etcd() {
        let c = Config::parse_from(["concord"]);
        assert_eq!(c.data_dir(), PathBuf::from("default.concord"));
        assert_eq!(c.max_request_bytes, 1_572_864);
        assert_eq!(c.max_txn_ops, 128);
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(
            c.lease_checkpoint_interval,
            Duration::from_secs(300),
            "etcd's 5m"
        );
        assert!(Config::try_parse_from(["concord", "--log-format", "xml"]).is_err());
        assert_eq!(
            Config::parse_from(["concord", "--log-format", "console"]).log_format,
            LogFormat::Text
        );
        let members = c.initial_members().unwrap_or_default();
        assert_eq!(members.len(), 1);
        assert!(members.contains_key(&c.member_id()));
    }

    #[test]
    fn initial_cluster_ids_are_stable_and_distinct() {
        let c = Config::parse_from([
            "concord",
            "--initial-cluster",
            "a=http://127.0.0.1:1,b=http://127.0.0.1:2,c=http://127.0.0.1:3",
            "--initial-advertise-peer-urls",
            "http://127.0.0.1:2",
        ]);
        let members = c.initial_members().unwrap_or_default();
        assert_eq!(members.len(), 3);
        assert_eq!(
            members.get(&c.member_id()).map(|m| m.name.as_str()),
            Some("b")
        );
        assert!(Config::parse_from(["concord", "--initial-cluster", "nope"])
            .initial_members()
            .is_err());
    }
}
