//! etcd-compatible configuration: the same flags, `ETCD_*` environment variables and defaults,
//! so that `concord` with no flags behaves like `etcd` with no flags.
//!
//! [`etcd_flags`] lists every flag of etcd 3.5 and what Concord does with it; [`go_args`] reads a
//! command line and the environment the way etcd (Go's `flag` package) does, [`file`] etcd's
//! YAML configuration file; [`validate`] makes etcd's start-up checks; [`Config`] is the typed
//! result, with the derived settings.

pub mod etcd_flags;
pub mod file;
pub mod go_args;
pub mod validate;

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
    #[arg(long, default_value = "default")]
    pub name: String,
    /// Path to the data directory (default: `<name>.concord`).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// URLs to listen on for client traffic.
    #[arg(long, default_value = "http://localhost:2379")]
    pub listen_client_urls: String,
    /// Client URLs advertised to the rest of the cluster.
    #[arg(long, default_value = "http://localhost:2379")]
    pub advertise_client_urls: String,
    /// URLs to listen on for peer traffic.
    #[arg(long, default_value = "http://localhost:2380")]
    pub listen_peer_urls: String,
    /// This member's peer URLs, advertised to the rest of the cluster.
    #[arg(long, default_value = "http://localhost:2380")]
    pub initial_advertise_peer_urls: String,
    /// Initial cluster configuration for bootstrapping: `name=peer-url,...`
    /// (default: `<name>=<initial-advertise-peer-urls>`).
    #[arg(long)]
    pub initial_cluster: Option<String>,
    /// `new` to bootstrap a new cluster, `existing` to join one.
    #[arg(long, default_value = "new")]
    pub initial_cluster_state: ClusterState,
    /// Initial cluster token, mixed into member and cluster ids.
    #[arg(long, default_value = "etcd-cluster")]
    pub initial_cluster_token: String,
    /// Maximum client request size in bytes the server will accept.
    #[arg(long, default_value_t = 1_572_864)]
    pub max_request_bytes: usize,
    /// URLs for HTTP-only client traffic (the JSON gateway, `/health`, `/metrics`, `/version`);
    /// when given, the client URLs serve gRPC only (etcd 3.5's `--listen-client-http-urls`).
    #[arg(long, default_value = "")]
    pub listen_client_http_urls: String,
    /// Extra URLs to serve `/metrics` and `/health` on (plain HTTP), besides the client URLs.
    #[arg(long, default_value = "")]
    pub listen_metrics_urls: String,
    /// Raise the NOSPACE alarm when the backend size exceeds this many bytes (0: etcd's default
    /// of 2 GiB).
    #[arg(long, default_value_t = 0)]
    pub quota_backend_bytes: i64,
    /// Maximum number of operations permitted in a transaction.
    #[arg(long, default_value_t = 128)]
    pub max_txn_ops: usize,
    /// Time (in milliseconds) of a heartbeat interval.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Time (in milliseconds) for an election to timeout.
    #[arg(long, default_value_t = 1000)]
    pub election_timeout: u64,
    /// Number of committed entries that trigger a snapshot and log compaction.
    #[arg(long, default_value_t = 100_000)]
    pub snapshot_count: u64,
    /// Concord's own: the largest piece of a snapshot sent to a member in one message (a
    /// member far behind is sent the whole state this way, read from disk and written to disk
    /// piece by piece).
    #[arg(long, default_value_t = 3 << 20)]
    pub snapshot_chunk_bytes: u64,
    /// Concord's own: the memory for caching the state database's blocks (the kernel's page
    /// cache holds them too). Resident memory is this, the key index, and the memtables.
    #[arg(long, default_value_t = crate::storage::DEFAULT_CACHE_BYTES)]
    pub storage_cache_bytes: u64,
    /// Interval between progress notifications to watches that asked for them.
    #[arg(
        long = "experimental-watch-progress-notify-interval",
        default_value = "10m",
        value_parser = parse_duration
    )]
    pub watch_progress_notify_interval: Duration,
    /// How often the leader records remaining lease TTLs in the log (etcd's default, 5m),
    /// bounding how long an unrenewed lease can outlive its TTL across a leader change.
    #[arg(
        long = "experimental-lease-checkpoint-interval",
        default_value = "5m",
        value_parser = parse_duration
    )]
    pub lease_checkpoint_interval: Duration,
    /// How often the leader compares its HashKV with every member's and raises CORRUPT on a
    /// mismatch (0s: never, etcd's default).
    #[arg(
        long = "experimental-corrupt-check-time",
        default_value = "0s",
        value_parser = parse_duration
    )]
    pub corrupt_check_time: Duration,
    /// Whether the leader checks that every member's store hashes alike at the last
    /// compaction's revision (etcd 3.5's compaction hash check).
    #[arg(
        long = "experimental-compact-hash-check-enabled",
        action = clap::ArgAction::Set,
        default_value_t = false
    )]
    pub compact_hash_check_enabled: bool,
    /// How often the compaction hash check runs.
    #[arg(
        long = "experimental-compact-hash-check-time",
        default_value = "1m",
        value_parser = parse_duration
    )]
    pub compact_hash_check_time: Duration,
    /// Auto compaction: `periodic` (keep `--auto-compaction-retention` of time) or `revision`
    /// (keep that many revisions).
    #[arg(long, default_value = "periodic")]
    pub auto_compaction_mode: CompactionMode,
    /// Auto compaction retention: a duration (`1h`, `30m`; a bare number is hours) in periodic
    /// mode, a revision count in revision mode; 0 turns auto compaction off.
    #[arg(long, default_value = "0")]
    pub auto_compaction_retention: String,
    /// Log level: debug, info, warn, error.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Path to the client server TLS cert file.
    #[arg(long, default_value = "")]
    pub cert_file: String,
    /// Path to the client server TLS key file.
    #[arg(long, default_value = "")]
    pub key_file: String,
    /// Path to the client server TLS trusted CA cert file.
    #[arg(long, default_value = "")]
    pub trusted_ca_file: String,
    /// Enable client cert authentication.
    #[arg(long, action = clap::ArgAction::Set, default_value_t = false)]
    pub client_cert_auth: bool,
    /// Path to the client certificate revocation list file.
    #[arg(long, default_value = "")]
    pub client_crl_file: String,
    /// Comma-separated list of allowed SAN hostnames for client cert authentication.
    #[arg(long, default_value = "")]
    pub client_cert_allowed_hostname: String,
    /// Client TLS using generated certificates.
    #[arg(long, action = clap::ArgAction::Set, default_value_t = false)]
    pub auto_tls: bool,
    /// Path to the peer server TLS cert file.
    #[arg(long, default_value = "")]
    pub peer_cert_file: String,
    /// Path to the peer server TLS key file.
    #[arg(long, default_value = "")]
    pub peer_key_file: String,
    /// Path to an explicit peer client TLS cert file (else the peer cert file is used).
    #[arg(long, default_value = "")]
    pub peer_client_cert_file: String,
    /// Path to an explicit peer client TLS key file (else the peer key file is used).
    #[arg(long, default_value = "")]
    pub peer_client_key_file: String,
    /// Enable peer client cert authentication.
    #[arg(long, action = clap::ArgAction::Set, default_value_t = false)]
    pub peer_client_cert_auth: bool,
    /// Path to the peer server TLS trusted CA file.
    #[arg(long, default_value = "")]
    pub peer_trusted_ca_file: String,
    /// Comma-separated list of allowed CNs for inter-peer TLS authentication.
    #[arg(long, default_value = "")]
    pub peer_cert_allowed_cn: String,
    /// Comma-separated list of allowed SAN hostnames for inter-peer TLS authentication.
    #[arg(long, default_value = "")]
    pub peer_cert_allowed_hostname: String,
    /// Peer TLS using generated certificates.
    #[arg(long, action = clap::ArgAction::Set, default_value_t = false)]
    pub peer_auto_tls: bool,
    /// The validity period of the client and peer certificates, unit is year.
    #[arg(long, default_value_t = 1)]
    pub self_signed_cert_validity: u64,
    /// Path to the peer certificate revocation list file.
    #[arg(long, default_value = "")]
    pub peer_crl_file: String,
    /// Comma-separated list of supported TLS cipher suites (empty: the defaults).
    #[arg(long, default_value = "")]
    pub cipher_suites: String,
    /// Minimum TLS version: TLS1.2 or TLS1.3.
    #[arg(long, default_value = "TLS1.2")]
    pub tls_min_version: String,
    /// Maximum TLS version: TLS1.2 or TLS1.3 (empty: the highest supported).
    #[arg(long, default_value = "")]
    pub tls_max_version: String,
    /// Maximum concurrent streams that each client can open at a time.
    #[arg(long, default_value_t = u32::MAX)]
    pub max_concurrent_streams: u32,
    /// The shortest interval between a client's pings: a client that pings more often is
    /// sent GOAWAY (`too_many_pings`) and disconnected, as grpc-go's server does.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub grpc_keepalive_min_time: Duration,
    /// Frequency of server-to-client pings that check a connection is alive.
    #[arg(long, default_value = "2h", value_parser = parse_duration)]
    pub grpc_keepalive_interval: Duration,
    /// How long a ping may go unanswered before the connection is closed.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub grpc_keepalive_timeout: Duration,
    /// Compare this member's HashKV with its peers' before serving, and refuse to start on a
    /// mismatch.
    #[arg(long, action = clap::ArgAction::Set, default_value_t = false)]
    pub experimental_initial_corrupt_check: bool,
    /// Fast-forward the first election timeout after a restart (etcd's default): after a full
    /// restart a leader is elected within about a heartbeat.
    #[arg(long, action = clap::ArgAction::Set, default_value_t = true)]
    pub initial_election_tick_advance: bool,
    /// Applies slower than this are logged (`apply request took too long`) and counted.
    #[arg(
        long = "experimental-warning-apply-duration",
        default_value = "100ms",
        value_parser = parse_duration
    )]
    pub warning_apply_duration: Duration,
    /// How clients' tokens are made: `simple` (etcd's default), or
    /// `jwt,pub-key=FILE,priv-key=FILE,sign-method=RS256|...|EdDSA,ttl=5m`.
    #[arg(long, default_value = "simple")]
    pub auth_token: String,
    /// Seconds a simple token lives after its last use.
    #[arg(long, default_value_t = 300)]
    pub auth_token_ttl: u64,
    /// bcrypt's cost for password hashes (4 to 31; others fall back to 10, as in etcd).
    #[arg(long, default_value_t = 10)]
    pub bcrypt_cost: u32,
    /// Reject membership changes that would leave fewer started (or reachable) voters than a
    /// quorum.
    #[arg(long, action = clap::ArgAction::Set, default_value_t = true)]
    pub strict_reconfig_check: bool,
    /// Restart this member as the only member of its cluster, keeping its data (etcd's
    /// disaster recovery after losing a quorum for good).
    #[arg(long, action = clap::ArgAction::Set, default_value_t = false)]
    pub force_new_cluster: bool,
    /// Serve the JSON gateway on the client URLs.
    #[arg(long, action = clap::ArgAction::Set, default_value_t = true)]
    pub enable_grpc_gateway: bool,
    /// Set `SO_REUSEPORT` on listeners (several processes may bind one address).
    #[arg(long, action = clap::ArgAction::Set, default_value_t = false)]
    pub socket_reuse_port: bool,
    /// Where logs go: `default` (stderr), `stderr`, `stdout` or file paths, comma-separated.
    #[arg(long, default_value = "default")]
    pub log_outputs: String,
    /// Log format: `json` (etcd's default: one JSON object per line) or `text` (`console` is
    /// etcd's name for it).
    #[arg(long, value_enum, default_value = "json")]
    pub log_format: LogFormat,
}

/// The short usage text printed after a command-line error (as etcd prints its usage line).
pub fn usage() -> &'static str {
    "Usage:

  concord [flags]
    Start a Concord server (etcd 3.5's flags and ETCD_* variables).

  concord --version
    Show the version of Concord.

  concord -h | --help
    Show the help information about Concord.

  concord snapshot save|restore|status ...
    Work with snapshot files."
}

/// The `--help` text: the usage and every implemented flag.
pub fn help() -> String {
    use clap::CommandFactory;
    let flags = Config::command().render_long_help();
    format!(
        "{}\n\n{flags}\nEvery other flag of etcd 3.5 is accepted; those without effect in Concord are \
         logged at start with the reason.",
        usage()
    )
}

/// Logs what reading the command line noticed (once logging is set up): flags without effect,
/// and `ETCD_*` variables used, shadowed or unrecognized (etcd logs the same). Values are not
/// logged: a variable may hold a secret.
pub fn log_notes(notes: &[go_args::Note]) {
    use go_args::Note;
    for note in notes {
        match note {
            Note::NoEffect { flag, reason } => {
                tracing::warn!(flag = %format!("--{flag}"), reason, "flag has no effect in Concord");
            }
            Note::EnvUsed { var } => {
                tracing::info!(variable_name = %var, "recognized and used environment variable");
            }
            Note::EnvShadowed { var } => {
                tracing::warn!(
                    variable_name = %var,
                    "ignored environment variable: the command line sets its flag"
                );
            }
            Note::ConfigFile { path, unknown } => {
                tracing::info!(
                    path = %path,
                    "loaded server configuration, other configuration command line flags and environment variables will be ignored if provided"
                );
                for key in unknown {
                    tracing::warn!(path = %path, key = %key, "unknown key in the configuration file, ignored");
                }
            }
            Note::EnvUnrecognized { var } => {
                tracing::warn!(environment_variable = %var, "unrecognized environment variable");
            }
        }
    }
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Startup {
    /// Serve with this configuration; log these notes first.
    Run(Box<Config>, Vec<go_args::Note>),
    /// Print the usage.
    Help,
    /// Print the version.
    Version,
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
    /// Reads the process's command line and `ETCD_*` variables the way etcd does.
    ///
    /// # Errors
    /// What etcd would print for a command line it refuses, and its exit code.
    pub fn from_env_and_args() -> Result<Startup, go_args::ArgError> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let env: Vec<(String, String)> = std::env::vars().collect();
        match go_args::parse(&args, &env)? {
            go_args::Parsed::Help => Ok(Startup::Help),
            go_args::Parsed::Version => Ok(Startup::Version),
            go_args::Parsed::Run(canonical, notes) => {
                let cfg = Config::try_parse_from(canonical).map_err(|e| go_args::ArgError {
                    message: e.to_string().trim_end().to_string(),
                    usage: false,
                    code: 2,
                })?;
                validate::validate(&cfg).map_err(|message| go_args::ArgError {
                    message,
                    usage: false,
                    code: 1,
                })?;
                Ok(Startup::Run(Box::new(cfg), notes))
            }
        }
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

/// Parses a Go duration (`time.ParseDuration`): a sequence of decimal numbers, each with a unit
/// (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), like `300ms`, `1.5h` or `2h45m`; `0` needs none.
///
/// # Errors
/// When the text is not such a duration, or is negative.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?}");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("missing unit in duration {s:?}"))?;
        let (num, tail) = rest.split_at(num_len);
        let n: f64 = num.parse().map_err(|_| bad())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let nanos = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(format!("missing unit in duration {s:?}")),
            _ => return Err(format!("unknown unit {unit:?} in duration {s:?}")),
        };
        total += n * nanos;
        rest = tail;
    }
    Ok(Duration::from_nanos(total.round() as u64))
}

/// The socket name of a `unix://name` or `unixs://name` URL (etcd's form: a socket file
/// `name`, trailing slashes dropped); `None` for any other URL.
pub fn unix_socket(url: &str) -> Option<&str> {
    url.strip_prefix("unix://")
        .or_else(|| url.strip_prefix("unixs://"))
        .map(|name| name.trim_end_matches('/'))
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
    fn durations_read_as_go() {
        let d = |s: &str| parse_duration(s).ok();
        assert_eq!(d("0"), Some(Duration::ZERO));
        assert_eq!(d("300ms"), Some(Duration::from_millis(300)));
        assert_eq!(d("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(d("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(d("20us"), Some(Duration::from_micros(20)));
        assert_eq!(d("5"), None);
        assert_eq!(d("5x"), None);
        assert_eq!(d("-1s"), None);
        assert_eq!(d(""), None);
    }

    #[test]
    fn defaults_match_etcd() {
        let c = Config::parse_from(["concord"]);
        assert_eq!(c.data_dir(), PathBuf::from("default.concord"));
        assert_eq!(c.max_request_bytes, 1_572_864);
        assert_eq!(c.max_txn_ops, 128);
        assert_eq!(c.log_format, LogFormat::Json);
        assert!(
            c.initial_election_tick_advance && c.strict_reconfig_check && c.enable_grpc_gateway
        );
        assert!(
            !Config::parse_from(["concord", "--initial-election-tick-advance=false"])
                .initial_election_tick_advance
        );
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
