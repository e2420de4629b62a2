//! Every server flag of etcd 3.5 (as `etcd --help` and its flag set list them), with its Go type
//! and what Concord does with it: implemented, accepted without effect (logged once at start
//! with the reason), or refused when set to anything but etcd's default (Concord cannot honour
//! it, and ignoring it would surprise). A few flags of etcd 3.6 that Concord implements are
//! listed too.

/// A flag's Go type, which decides how its value is read from the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `--flag`, `--flag=true|false` (never `--flag false`).
    Bool,
    /// Any text (strings, URL lists, enumerations).
    Text,
    /// A non-negative integer.
    Uint,
    /// A signed integer.
    Int,
    /// A Go duration (`100ms`, `5s`, `1m30s`).
    Duration,
}

/// What Concord does with a flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Has the same meaning as in etcd.
    Implemented,
    /// Accepted; has no effect, for this reason.
    NoEffect(&'static str),
    /// Accepted at etcd's default (given as text); any other value is refused at start, with
    /// this reason.
    DefaultOnly(&'static str, &'static str),
}

/// One flag.
#[derive(Clone, Copy, Debug)]
pub struct Flag {
    /// The name without dashes.
    pub name: &'static str,
    /// Its Go type.
    pub kind: Kind,
    /// What Concord does with it.
    pub support: Support,
}

use Kind::{Bool, Duration, Int, Text, Uint};
use Support::{DefaultOnly, Implemented, NoEffect};

const fn f(name: &'static str, kind: Kind, support: Support) -> Flag {
    Flag {
        name,
        kind,
        support,
    }
}

const LOG: &str = "Concord logs to stderr through tracing (--log-level, --log-format)";
const V2: &str = "Concord serves the v3 API only (etcd 3.5 deprecated v2)";
const PROXY: &str = "the v2 proxy is not part of Concord (etcd 3.5 deprecated it)";
const BOLT: &str = "Concord's storage is fjall, not bbolt: this bbolt setting does not apply";
const TRACE: &str = "Concord emits tracing spans in its logs; OpenTelemetry export is not built in";
const DISCOVERY: &str = "discovery is not supported: bootstrap with --initial-cluster";

/// etcd 3.5's flags, and Concord's extensions, sorted as etcd's help lists them.
pub const FLAGS: &[Flag] = &[
    f("config-file", Text, Implemented),
    // member
    f("name", Text, Implemented),
    f("data-dir", Text, Implemented),
    f(
        "wal-dir",
        Text,
        NoEffect("Concord keeps its Raft log inside the data dir"),
    ),
    f("snapshot-count", Uint, Implemented),
    // Concord's own (not an etcd flag).
    f("snapshot-chunk-bytes", Uint, Implemented),
    // Concord's own (not an etcd flag).
    f("storage-cache-bytes", Uint, Implemented),
    f("heartbeat-interval", Uint, Implemented),
    f("election-timeout", Uint, Implemented),
    f("initial-election-tick-advance", Bool, Implemented),
    f("listen-peer-urls", Text, Implemented),
    f("listen-client-urls", Text, Implemented),
    f("listen-client-http-urls", Text, Implemented),
    f(
        "max-snapshots",
        Uint,
        NoEffect("Concord keeps one Raft snapshot, inside the data dir"),
    ),
    f(
        "max-wals",
        Uint,
        NoEffect("Concord purges its Raft log itself after each snapshot"),
    ),
    f("quota-backend-bytes", Int, Implemented),
    f("backend-bbolt-freelist-type", Text, NoEffect(BOLT)),
    f("backend-batch-interval", Duration, NoEffect(BOLT)),
    f("backend-batch-limit", Int, NoEffect(BOLT)),
    f("max-txn-ops", Uint, Implemented),
    f("max-request-bytes", Uint, Implemented),
    f("max-concurrent-streams", Uint, Implemented),
    f("grpc-keepalive-min-time", Duration, Implemented),
    f("grpc-keepalive-interval", Duration, Implemented),
    f("grpc-keepalive-timeout", Duration, Implemented),
    f("socket-reuse-port", Bool, Implemented),
    f(
        "socket-reuse-address",
        Bool,
        NoEffect("listeners always set SO_REUSEADDR, as Go (and so etcd) does on Linux"),
    ),
    f(
        "raft-read-timeout",
        Duration,
        NoEffect("peer RPC deadlines follow --heartbeat-interval and --election-timeout"),
    ),
    f(
        "raft-write-timeout",
        Duration,
        NoEffect("peer RPC deadlines follow --heartbeat-interval and --election-timeout"),
    ),
    // clustering
    f("initial-advertise-peer-urls", Text, Implemented),
    f("initial-cluster", Text, Implemented),
    f("initial-cluster-state", Text, Implemented),
    f("initial-cluster-token", Text, Implemented),
    f("advertise-client-urls", Text, Implemented),
    f("discovery", Text, DefaultOnly("", DISCOVERY)),
    f("discovery-fallback", Text, NoEffect(DISCOVERY)),
    f("discovery-proxy", Text, DefaultOnly("", DISCOVERY)),
    f("discovery-srv", Text, DefaultOnly("", DISCOVERY)),
    f("discovery-srv-name", Text, DefaultOnly("", DISCOVERY)),
    f("strict-reconfig-check", Bool, Implemented),
    f("pre-vote", Bool, NoEffect("Concord always runs PreVote")),
    f("auto-compaction-retention", Text, Implemented),
    f("auto-compaction-mode", Text, Implemented),
    f("enable-v2", Bool, DefaultOnly("false", V2)),
    f("experimental-enable-v2v3", Text, NoEffect(V2)),
    f("v2-deprecation", Text, NoEffect(V2)),
    // proxy
    f("proxy", Text, DefaultOnly("off", PROXY)),
    f("proxy-failure-wait", Uint, NoEffect(PROXY)),
    f("proxy-refresh-interval", Uint, NoEffect(PROXY)),
    f("proxy-dial-timeout", Uint, NoEffect(PROXY)),
    f("proxy-write-timeout", Uint, NoEffect(PROXY)),
    f("proxy-read-timeout", Uint, NoEffect(PROXY)),
    // security
    f("cert-file", Text, Implemented),
    f("key-file", Text, Implemented),
    f(
        "client-cert-file",
        Text,
        NoEffect("the JSON gateway calls the server in process, not as a TLS client"),
    ),
    f(
        "client-key-file",
        Text,
        NoEffect("the JSON gateway calls the server in process, not as a TLS client"),
    ),
    f("client-cert-auth", Bool, Implemented),
    f("client-crl-file", Text, Implemented),
    f("client-cert-allowed-hostname", Text, Implemented),
    f("trusted-ca-file", Text, Implemented),
    f("auto-tls", Bool, Implemented),
    f("peer-cert-file", Text, Implemented),
    f("peer-key-file", Text, Implemented),
    f("peer-client-cert-file", Text, Implemented),
    f("peer-client-key-file", Text, Implemented),
    f("peer-client-cert-auth", Bool, Implemented),
    f("peer-trusted-ca-file", Text, Implemented),
    f("peer-cert-allowed-cn", Text, Implemented),
    f("peer-cert-allowed-hostname", Text, Implemented),
    f("peer-auto-tls", Bool, Implemented),
    f("self-signed-cert-validity", Uint, Implemented),
    f("peer-crl-file", Text, Implemented),
    f("cipher-suites", Text, Implemented),
    f("tls-min-version", Text, Implemented),
    f("tls-max-version", Text, Implemented),
    f(
        "experimental-peer-skip-client-san-verification",
        Bool,
        NoEffect("Concord does not match a peer client certificate's SANs against its address"),
    ),
    f(
        "cors",
        Text,
        NoEffect("the JSON gateway sends no CORS headers"),
    ),
    f(
        "host-whitelist",
        Text,
        NoEffect("the JSON gateway does not check the Host header"),
    ),
    // auth
    f("auth-token", Text, Implemented),
    f("bcrypt-cost", Uint, Implemented),
    f("auth-token-ttl", Uint, Implemented),
    // profiling and monitoring
    f(
        "enable-pprof",
        Bool,
        NoEffect(
            "Concord is not a Go program: profile it with perf; /metrics has its runtime numbers",
        ),
    ),
    f(
        "metrics",
        Text,
        NoEffect("/metrics always has Concord's full set"),
    ),
    f("listen-metrics-urls", Text, Implemented),
    // logging
    f("logger", Text, NoEffect(LOG)),
    f("log-outputs", Text, Implemented),
    f("log-level", Text, Implemented),
    f("enable-log-rotation", Bool, NoEffect(LOG)),
    f("log-rotation-config-json", Text, NoEffect(LOG)),
    f("log-format", Text, Implemented),
    // distributed tracing
    f(
        "experimental-enable-distributed-tracing",
        Bool,
        NoEffect(TRACE),
    ),
    f(
        "experimental-distributed-tracing-address",
        Text,
        NoEffect(TRACE),
    ),
    f(
        "experimental-distributed-tracing-service-name",
        Text,
        NoEffect(TRACE),
    ),
    f(
        "experimental-distributed-tracing-instance-id",
        Text,
        NoEffect(TRACE),
    ),
    f(
        "experimental-distributed-tracing-sampling-rate",
        Int,
        NoEffect(TRACE),
    ),
    // gateway
    f("enable-grpc-gateway", Bool, Implemented),
    // experimental
    f("experimental-initial-corrupt-check", Bool, Implemented),
    f("experimental-corrupt-check-time", Duration, Implemented),
    f("experimental-compact-hash-check-enabled", Bool, Implemented),
    f(
        "experimental-compact-hash-check-time",
        Duration,
        Implemented,
    ),
    f(
        "experimental-enable-lease-checkpoint",
        Bool,
        NoEffect("Concord always checkpoints lease TTLs through the log"),
    ),
    f(
        "experimental-enable-lease-checkpoint-persist",
        Bool,
        NoEffect("checkpointed TTLs are always part of the replicated state"),
    ),
    f(
        "experimental-lease-checkpoint-interval",
        Duration,
        Implemented,
    ),
    f(
        "experimental-compaction-batch-limit",
        Int,
        NoEffect("compaction deletes in fjall batches of its own size"),
    ),
    f(
        "experimental-compaction-sleep-interval",
        Duration,
        NoEffect("compaction deletes in fjall batches of its own size"),
    ),
    f(
        "experimental-watch-progress-notify-interval",
        Duration,
        Implemented,
    ),
    f(
        "experimental-downgrade-check-time",
        Duration,
        NoEffect("downgrades are not supported"),
    ),
    f("experimental-warning-apply-duration", Duration, Implemented),
    f("experimental-memory-mlock", Bool, NoEffect(BOLT)),
    f(
        "experimental-txn-mode-write-with-shared-buffer",
        Bool,
        NoEffect(BOLT),
    ),
    f(
        "experimental-stop-grpc-service-on-defrag",
        Bool,
        NoEffect("defragmentation does not stop service in Concord"),
    ),
    f(
        "experimental-bootstrap-defrag-threshold-megabytes",
        Uint,
        NoEffect(BOLT),
    ),
    f(
        "experimental-snapshot-catchup-entries",
        Uint,
        NoEffect("a lagging follower gets a snapshot when the log it needs was purged"),
    ),
    // unsafe
    f(
        "unsafe-no-fsync",
        Bool,
        DefaultOnly("false", "Concord always syncs what it acknowledges"),
    ),
    f("force-new-cluster", Bool, Implemented),
    // etcd's own
    f("version", Bool, Implemented),
    // ignored by etcd itself (flags of etcd 0.4)
    f("cluster-active-size", Bool, NoEffect("etcd ignores it too")),
    f(
        "cluster-remove-delay",
        Bool,
        NoEffect("etcd ignores it too"),
    ),
    f(
        "cluster-sync-interval",
        Bool,
        NoEffect("etcd ignores it too"),
    ),
    f("config", Bool, NoEffect("etcd ignores it too")),
    f("force", Bool, NoEffect("etcd ignores it too")),
    f("max-result-buffer", Bool, NoEffect("etcd ignores it too")),
    f("max-retry-attempts", Bool, NoEffect("etcd ignores it too")),
    f(
        "peer-heartbeat-interval",
        Bool,
        NoEffect("etcd ignores it too"),
    ),
    f(
        "peer-election-timeout",
        Bool,
        NoEffect("etcd ignores it too"),
    ),
    f("retry-interval", Bool, NoEffect("etcd ignores it too")),
    f("snapshot", Bool, NoEffect("etcd ignores it too")),
    f("v", Bool, NoEffect("etcd ignores it too")),
    f("vv", Bool, NoEffect("etcd ignores it too")),
];

/// The flag named `name`.
pub fn lookup(name: &str) -> Option<&'static Flag> {
    FLAGS.iter().find(|f| f.name == name)
}

/// The `ETCD_*` variable that sets flag `name` (etcd's rule: upper case, `-` becomes `_`).
pub fn env_name(name: &str) -> String {
    format!("ETCD_{}", name.to_uppercase().replace('-', "_"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_env_names_follow_etcd() {
        let mut names: Vec<&str> = FLAGS.iter().map(|f| f.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len());
        assert_eq!(
            env_name("initial-cluster-state"),
            "ETCD_INITIAL_CLUSTER_STATE"
        );
        assert!(lookup("experimental-initial-corrupt-check").is_some());
        assert!(lookup("nope").is_none());
    }

    #[test]
    fn the_readme_table_lists_every_flag() {
        let readme = include_str!("../../README.md");
        for f in FLAGS {
            assert!(
                readme.contains(&format!("| `--{}` |", f.name)),
                "--{} missing",
                f.name
            );
        }
    }
}
