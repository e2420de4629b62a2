//! Prometheus metrics under etcd's names, rendered in the text exposition format on
//! `/metrics`. Counters and histograms are process-wide atomics updated on the hot paths;
//! gauges are read from the member's state when scraped.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// A histogram with fixed upper bounds (seconds), as Prometheus expects: cumulative buckets.
pub struct Histogram {
    bounds: &'static [f64],
    counts: [AtomicU64; 16],
    sum_micros: AtomicU64,
    total: AtomicU64,
}

impl Histogram {
    const fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: [const { AtomicU64::new(0) }; 16],
            sum_micros: AtomicU64::new(0),
            total: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b) {
            if let Some(c) = self.counts.get(i) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        self.render_series(out, name, "");
    }

    /// The series of one histogram with `labels` (`a="x",` form, possibly empty).
    fn render_series(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{bound}\"}} {cumulative}");
        }
        let total = self.total.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {total}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let plain = labels.trim_end_matches(',');
        let braced = if plain.is_empty() {
            String::new()
        } else {
            format!("{{{plain}}}")
        };
        let _ = writeln!(
            out,
            "{name}_sum{braced} {sum}\n{name}_count{braced} {total}"
        );
    }
}

/// etcd's disk histograms: 1 ms doubling to about 8 s.
const DISK_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096,
    8.192,
];

/// `etcd_disk_wal_fsync_duration_seconds`: Raft log syncs.
pub static WAL_FSYNC: Histogram = Histogram::new(DISK_BUCKETS);
/// `etcd_disk_backend_commit_duration_seconds`: state-machine batch commits.
pub static BACKEND_COMMIT: Histogram = Histogram::new(DISK_BUCKETS);
/// `etcd_server_leader_changes_seen_total`.
pub static LEADER_CHANGES: AtomicU64 = AtomicU64::new(0);
/// `etcd_network_peer_round_trip_time_seconds`, by peer: Raft message round trips.
static PEER_RTT: Mutex<BTreeMap<u64, Histogram>> = Mutex::new(BTreeMap::new());
include!(concat!(env!("OUT_DIR"), "/grpc_methods.rs"));

/// gRPC server counters of each method in [`GRPC_METHODS`], at the same index. Only served
/// methods are counted (as grpc-go's interceptors never see an unknown one): a client cannot
/// grow the metrics by calling made-up paths, and counting takes no lock.
static GRPC: [GrpcCounts; GRPC_METHODS.len()] = [const { GrpcCounts::new() }; GRPC_METHODS.len()];

/// gRPC status codes (0 OK to 16 Unauthenticated).
const GRPC_CODES: usize = 17;

/// What `/metrics` reports of one gRPC method.
struct GrpcCounts {
    started: AtomicU64,
    /// Handled calls by status code.
    handled: [AtomicU64; GRPC_CODES],
    /// `grpc_server_handling_seconds`: time to the answer (to the start of a stream's).
    latency: Histogram,
}

impl GrpcCounts {
    const fn new() -> Self {
        GrpcCounts {
            started: AtomicU64::new(0),
            handled: [const { AtomicU64::new(0) }; GRPC_CODES],
            latency: Histogram::new(GRPC_BUCKETS),
        }
    }
}

/// grpc-prometheus' default latency buckets (seconds).
const GRPC_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// etcd's network histogram buckets: 0.1 ms doubling to about 0.8 s.
const NETWORK_BUCKETS: &[f64] = &[
    0.0001, 0.0002, 0.0004, 0.0008, 0.0016, 0.0032, 0.0064, 0.0128, 0.0256, 0.0512, 0.1024, 0.2048,
    0.4096, 0.8192,
];

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Records one Raft message round trip to peer `to`.
pub fn observe_peer_rtt(to: u64, d: Duration) {
    locked(&PEER_RTT)
        .entry(to)
        .or_insert_with(|| Histogram::new(NETWORK_BUCKETS))
        .observe(d);
}

/// How a whole snapshot transfer with one peer ended, as etcd counts them.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SnapshotTransfer {
    /// `etcd_network_snapshot_send_success`: a peer took and installed one.
    Sent,
    /// `etcd_network_snapshot_send_failures`: given up (the peer unreachable, a piece refused).
    SendFailed,
    /// `etcd_network_snapshot_receive_success`: received whole (its last piece accepted).
    Received,
    /// `etcd_network_snapshot_receive_failures`: its last piece refused.
    ReceiveFailed,
}

impl SnapshotTransfer {
    const ALL: [SnapshotTransfer; 4] = [
        SnapshotTransfer::Sent,
        SnapshotTransfer::SendFailed,
        SnapshotTransfer::Received,
        SnapshotTransfer::ReceiveFailed,
    ];

    /// (metric name, help, peer label).
    fn describe(self) -> (&'static str, &'static str, &'static str) {
        match self {
            SnapshotTransfer::Sent => (
                "etcd_network_snapshot_send_success",
                "Total number of successful snapshot sends",
                "To",
            ),
            SnapshotTransfer::SendFailed => (
                "etcd_network_snapshot_send_failures",
                "Total number of snapshot send failures",
                "To",
            ),
            SnapshotTransfer::Received => (
                "etcd_network_snapshot_receive_success",
                "Total number of successful snapshot receives",
                "From",
            ),
            SnapshotTransfer::ReceiveFailed => (
                "etcd_network_snapshot_receive_failures",
                "Total number of snapshot receive failures",
                "From",
            ),
        }
    }
}

/// Snapshot transfers by how they ended and peer.
static SNAPSHOT_TRANSFERS: Mutex<BTreeMap<(SnapshotTransfer, u64), u64>> =
    Mutex::new(BTreeMap::new());

/// Counts one snapshot transfer with `peer` that ended as `how`.
pub fn count_snapshot_transfer(how: SnapshotTransfer, peer: u64) {
    *locked(&SNAPSHOT_TRANSFERS).entry((how, peer)).or_default() += 1;
}

fn render_snapshot_transfers(out: &mut String) {
    let counts = locked(&SNAPSHOT_TRANSFERS);
    for how in SnapshotTransfer::ALL {
        let (name, help, label) = how.describe();
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for ((_, peer), n) in counts.range((how, 0)..=(how, u64::MAX)) {
            let _ = writeln!(out, "{name}{{{label}=\"{peer:x}\"}} {n}");
        }
    }
}

/// The counters of the method at `path` (such as `/etcdserverpb.KV/Range`), if the server
/// serves it.
pub fn grpc_method(path: &str) -> Option<usize> {
    GRPC_METHODS.binary_search_by_key(&path, |(p, _)| p).ok()
}

/// Records a call of method `method` (from [`grpc_method`]) starting (`code` None) or handled
/// with status `code` after `took`.
pub fn record_grpc(method: usize, code: Option<(i32, Duration)>) {
    let Some(counts) = GRPC.get(method) else {
        return;
    };
    match code {
        None => {
            counts.started.fetch_add(1, Ordering::Relaxed);
        }
        Some((code, took)) => {
            let slot = usize::try_from(code)
                .ok()
                .and_then(|c| counts.handled.get(c));
            // An out-of-range code counts as Unknown (2), as grpc-go reports it.
            if let Some(n) = slot.or(counts.handled.get(2)) {
                n.fetch_add(1, Ordering::Relaxed);
            }
            counts.latency.observe(took);
        }
    }
}

/// The name grpc-go gives a status code (`grpc_code` label values).
pub fn grpc_code_name(code: i32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i).copied())
        .unwrap_or("Unknown")
}

/// `etcd_server_slow_apply_total`: applies slower than `--experimental-warning-apply-duration`.
pub static SLOW_APPLY: AtomicU64 = AtomicU64::new(0);
/// `etcd_server_proposals_failed_total`.
pub static PROPOSALS_FAILED: AtomicU64 = AtomicU64::new(0);
/// `etcd_debugging_mvcc_watch_stream_total`: open watch streams.
pub static WATCH_STREAMS: AtomicI64 = AtomicI64::new(0);
/// `etcd_debugging_mvcc_events_total`: events sent to watchers.
pub static EVENTS_SENT: AtomicU64 = AtomicU64::new(0);
/// `concord_reads_off_worker_total` (no etcd counterpart): store reads run off the runtime's
/// workers because reads were waiting for the disk (see `rpc::disk_reads`).
pub static READS_OFF_WORKER: AtomicU64 = AtomicU64::new(0);

/// Member state read at scrape time.
pub struct Snapshot {
    /// Whether a leader is known.
    pub has_leader: bool,
    /// Whether this member leads.
    pub is_leader: bool,
    /// Last log index.
    pub committed: u64,
    /// Last applied index.
    pub applied: u64,
    /// Raft term.
    pub term: u64,
    /// Current revision.
    pub revision: i64,
    /// Compacted revision.
    pub compacted: i64,
    /// Bytes on disk.
    pub db_size: u64,
    /// The space quota (`--quota-backend-bytes`, the default filled in).
    pub quota_bytes: u64,
    /// Keys with history in the index.
    pub keys: usize,
    /// The auth store's revision.
    pub auth_revision: u64,
    /// Registered watchers.
    pub watchers: usize,
    /// Watchers catching up.
    pub slow_watchers: usize,
}

/// The whole `/metrics` page.
pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, v: f64| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    };
    gauge(
        "etcd_server_has_leader",
        "Whether or not a leader exists. 1 is existence, 0 is not.",
        f64::from(u8::from(s.has_leader)),
    );
    gauge(
        "etcd_server_is_leader",
        "Whether or not this member is a leader.",
        f64::from(u8::from(s.is_leader)),
    );
    gauge(
        "etcd_server_proposals_committed_total",
        "The total number of consensus proposals committed.",
        s.committed as f64,
    );
    gauge(
        "etcd_server_proposals_applied_total",
        "The total number of consensus proposals applied.",
        s.applied as f64,
    );
    gauge("etcd_server_term", "The current Raft term.", s.term as f64);
    gauge(
        "etcd_server_quota_backend_bytes",
        "Current backend storage quota size in bytes.",
        s.quota_bytes as f64,
    );
    gauge(
        "etcd_mvcc_db_total_size_in_bytes",
        "Total size of the underlying database physically allocated in bytes.",
        s.db_size as f64,
    );
    gauge(
        "etcd_debugging_mvcc_current_revision",
        "The current revision of store.",
        s.revision as f64,
    );
    gauge(
        "etcd_debugging_mvcc_compact_revision",
        "The revision of the last compaction in store.",
        s.compacted as f64,
    );
    gauge(
        "etcd_debugging_auth_revision",
        "The current revision of auth store.",
        s.auth_revision as f64,
    );
    gauge(
        "etcd_debugging_mvcc_keys_total",
        "Total number of keys.",
        s.keys as f64,
    );
    gauge(
        "etcd_debugging_mvcc_watcher_total",
        "Total number of watchers.",
        s.watchers as f64,
    );
    gauge(
        "etcd_debugging_mvcc_slow_watcher_total",
        "Total number of unsynced slow watchers.",
        s.slow_watchers as f64,
    );
    gauge(
        "etcd_debugging_mvcc_watch_stream_total",
        "Total number of watch streams.",
        WATCH_STREAMS.load(Ordering::Relaxed) as f64,
    );
    let _ = writeln!(
        out,
        "# HELP etcd_debugging_mvcc_events_total Total number of events sent by this member.\n# TYPE etcd_debugging_mvcc_events_total counter\netcd_debugging_mvcc_events_total {}",
        EVENTS_SENT.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP etcd_server_proposals_failed_total The total number of failed proposals seen.\n# TYPE etcd_server_proposals_failed_total counter\netcd_server_proposals_failed_total {}",
        PROPOSALS_FAILED.load(Ordering::Relaxed)
    );
    WAL_FSYNC.render(
        &mut out,
        "etcd_disk_wal_fsync_duration_seconds",
        "The latency distributions of fsync called by WAL.",
    );
    BACKEND_COMMIT.render(
        &mut out,
        "etcd_disk_backend_commit_duration_seconds",
        "The latency distributions of commit called by backend.",
    );
    let _ = writeln!(
        out,
        "# HELP etcd_server_leader_changes_seen_total The number of leader changes seen.\n# TYPE etcd_server_leader_changes_seen_total counter\netcd_server_leader_changes_seen_total {}",
        LEADER_CHANGES.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP etcd_server_slow_apply_total The total number of slow apply requests (likely overloaded from slow disk).\n# TYPE etcd_server_slow_apply_total counter\netcd_server_slow_apply_total {}",
        SLOW_APPLY.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP concord_reads_off_worker_total Store reads run off the runtime's workers while reads wait for the disk.\n# TYPE concord_reads_off_worker_total counter\nconcord_reads_off_worker_total {}",
        READS_OFF_WORKER.load(Ordering::Relaxed)
    );
    let rtt = "etcd_network_peer_round_trip_time_seconds";
    let _ = writeln!(
        out,
        "# HELP {rtt} Round-Trip-Time histogram between peers\n# TYPE {rtt} histogram"
    );
    for (to, h) in locked(&PEER_RTT).iter() {
        h.render_series(&mut out, rtt, &format!("To=\"{to:x}\","));
    }
    render_snapshot_transfers(&mut out);
    render_grpc(&mut out);
    out
}

/// (service, method) of a gRPC method path.
fn grpc_labels(path: &str) -> (&str, &str) {
    path.trim_start_matches('/')
        .split_once('/')
        .unwrap_or(("unknown", path))
}

fn render_grpc(out: &mut String) {
    let used: Vec<(&str, &str, &GrpcCounts)> = GRPC_METHODS
        .iter()
        .zip(GRPC.iter())
        .filter(|(_, c)| c.started.load(Ordering::Relaxed) > 0)
        .map(|((path, kind), c)| (*path, *kind, c))
        .collect();
    let _ = writeln!(out, "# HELP grpc_server_started_total Total number of RPCs started on the server.\n# TYPE grpc_server_started_total counter");
    for (path, kind, c) in &used {
        let (service, method) = grpc_labels(path);
        let started = c.started.load(Ordering::Relaxed);
        let _ = writeln!(out, "grpc_server_started_total{{grpc_method=\"{method}\",grpc_service=\"{service}\",grpc_type=\"{kind}\"}} {started}");
    }
    let _ = writeln!(out, "# HELP grpc_server_handled_total Total number of RPCs completed on the server, regardless of success or failure.\n# TYPE grpc_server_handled_total counter");
    for (path, kind, c) in &used {
        let (service, method) = grpc_labels(path);
        for (code, n) in c.handled.iter().enumerate() {
            let n = n.load(Ordering::Relaxed);
            if n == 0 {
                continue;
            }
            let code = grpc_code_name(i32::try_from(code).unwrap_or(2));
            let _ = writeln!(out, "grpc_server_handled_total{{grpc_code=\"{code}\",grpc_method=\"{method}\",grpc_service=\"{service}\",grpc_type=\"{kind}\"}} {n}");
        }
    }
    let name = "grpc_server_handling_seconds";
    let _ = writeln!(out, "# HELP {name} Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.\n# TYPE {name} histogram");
    for (path, kind, c) in &used {
        let (service, method) = grpc_labels(path);
        let labels =
            format!("grpc_method=\"{method}\",grpc_service=\"{service}\",grpc_type=\"{kind}\",");
        c.latency.render_series(out, name, &labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_types_come_from_the_protos() {
        let kind = |path: &str| {
            grpc_method(path)
                .and_then(|i| GRPC_METHODS.get(i))
                .map(|m| m.1)
        };
        assert_eq!(kind("/etcdserverpb.KV/Range"), Some("unary"));
        assert_eq!(kind("/etcdserverpb.Watch/Watch"), Some("bidi_stream"));
        assert_eq!(
            kind("/etcdserverpb.Lease/LeaseKeepAlive"),
            Some("bidi_stream")
        );
        assert_eq!(
            kind("/etcdserverpb.Maintenance/Snapshot"),
            Some("server_stream")
        );
        assert_eq!(
            kind("/v3electionpb.Election/Observe"),
            Some("server_stream")
        );
        assert_eq!(kind("/grpc.health.v1.Health/Watch"), Some("server_stream"));
    }

    #[test]
    fn only_served_grpc_methods_are_counted() {
        assert_eq!(grpc_method("/foo.Bar/Baz"), None);
        assert_eq!(grpc_method("/etcdserverpb.KV/Bogus"), None);
        let Some(m) = grpc_method("/etcdserverpb.Maintenance/Downgrade") else {
            panic!("Downgrade is a served method");
        };
        record_grpc(m, None);
        record_grpc(m, Some((9, Duration::from_millis(2))));
        record_grpc(m, Some((99, Duration::from_millis(2))));
        let mut out = String::new();
        render_grpc(&mut out);
        let labels = "grpc_method=\"Downgrade\",grpc_service=\"etcdserverpb.Maintenance\",grpc_type=\"unary\"";
        assert!(out.contains(&format!("grpc_server_started_total{{{labels}}} 1")));
        for code in ["FailedPrecondition", "Unknown"] {
            let line = format!("grpc_server_handled_total{{grpc_code=\"{code}\",{labels}}} 1");
            assert!(out.contains(&line), "{line} missing in {out}");
        }
        assert!(out.contains(&format!("grpc_server_handling_seconds_count{{{labels}}} 2")));
        assert!(!out.contains("foo.Bar"));
    }

    #[test]
    fn renders_etcd_names_and_cumulative_buckets() {
        let h = Histogram::new(DISK_BUCKETS);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(3));
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.001\"} 1"));
        assert!(out.contains("x_bucket{le=\"0.004\"} 2"));
        assert!(out.contains("x_bucket{le=\"+Inf\"} 2"));
        assert!(out.contains("x_count 2"));
        let page = render(&Snapshot {
            has_leader: true,
            is_leader: true,
            committed: 3,
            applied: 3,
            term: 1,
            revision: 7,
            compacted: 0,
            db_size: 10,
            quota_bytes: 2 << 30,
            keys: 2,
            auth_revision: 1,
            watchers: 1,
            slow_watchers: 0,
        });
        assert!(page.contains("etcd_server_has_leader 1"));
        assert!(page.contains("etcd_server_quota_backend_bytes 2147483648"));
        assert!(page.contains("etcd_debugging_auth_revision 1"));
        assert!(page.contains("etcd_debugging_mvcc_watcher_total 1"));
        assert!(page.contains("# TYPE etcd_disk_wal_fsync_duration_seconds histogram"));
    }
}
