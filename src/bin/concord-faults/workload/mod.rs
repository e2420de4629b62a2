//! The concurrent client workloads. Each runs until the run stops it, spreads its requests over
//! every member, bounds every call, and records what it saw in the shared history.
//!
//! Every call to a member (puts, gets, txns, lease grants, keep-alives and revokes, unlocks) is
//! also noted with its plain outcome for the availability report (`avail.rs`); `Lock` itself is
//! not, since how long it waits depends on the other holders, not on the cluster's health.

pub mod durable;
pub mod lease;
pub mod lock;
pub mod register;
pub mod watch;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use concord::pb::etcdserverpb::{PutRequest, RangeRequest, RangeResponse};

use crate::client::{bounded, Clients, Outcome, CALL_TIMEOUT};
use crate::history::{AvailOp, CallOutcome, Clock, Recorder};

/// What every client task shares.
pub struct Ctx {
    /// Channels to the members.
    pub clients: Clients,
    /// The history being recorded.
    pub rec: Arc<Recorder>,
    /// The run's clock.
    pub clock: Clock,
    /// The fenced resource: the highest token it has accepted.
    pub fence: Mutex<i64>,
    stop: AtomicBool,
    stopped_at: std::sync::atomic::AtomicU64,
    abort: AtomicBool,
    watch_target: AtomicI64,
}

impl Ctx {
    /// A context for a new run.
    pub fn new(clients: Clients, clock: Clock) -> Arc<Ctx> {
        Arc::new(Ctx {
            clients,
            rec: Arc::new(Recorder::default()),
            clock,
            fence: Mutex::new(i64::MIN),
            stop: AtomicBool::new(false),
            stopped_at: std::sync::atomic::AtomicU64::new(0),
            abort: AtomicBool::new(false),
            watch_target: AtomicI64::new(0),
        })
    }

    /// Whether clients should finish their current operation and stop.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Asks clients to stop (the faults are over by then).
    pub fn stop(&self) {
        self.stopped_at.store(self.clock.now(), Ordering::Relaxed);
        self.stop.store(true, Ordering::Relaxed);
    }

    /// When clients were asked to stop (µs), if they were.
    pub fn stopped_at(&self) -> Option<u64> {
        self.stopped()
            .then(|| self.stopped_at.load(Ordering::Relaxed))
    }

    /// Whether clients must give up at once (the run is out of time).
    pub fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }

    /// Makes every client give up.
    pub fn abort(&self) {
        self.abort.store(true, Ordering::Relaxed);
    }

    /// The revision watchers must reach before they stop (0: not known yet).
    pub fn watch_target(&self) -> i64 {
        self.watch_target.load(Ordering::Relaxed)
    }

    /// Sets the revision watchers must reach.
    pub fn set_watch_target(&self, rev: i64) {
        self.watch_target.store(rev, Ordering::Relaxed);
    }

    /// Notes how a call to member `m`, sent at `call`, ended (availability only).
    pub fn note(&self, m: usize, kind: &'static str, call: u64, outcome: CallOutcome) {
        let ret = self.clock.now();
        self.rec.get().avail_ops.push(AvailOp {
            member: m % self.clients.len().max(1),
            kind,
            call,
            ret,
            outcome,
        });
    }

    /// A put through member `m`; the revision if acknowledged.
    pub async fn put(&self, m: usize, key: &str, value: &str, lease: i64) -> Outcome<i64> {
        let req = PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
            ..Default::default()
        };
        let call = self.clock.now();
        let out = bounded(CALL_TIMEOUT, self.clients.kv(m).put(req)).await;
        self.note(m, "put", call, out.call_outcome());
        match out {
            Outcome::Ok(r) => Outcome::Ok(r.header.map_or(0, |h| h.revision)),
            Outcome::Err(e) => Outcome::Err(e),
            Outcome::Timeout => Outcome::Timeout,
        }
    }

    /// A linearizable get of `key` through member `m`.
    pub async fn get(&self, m: usize, key: &str) -> Outcome<RangeResponse> {
        self.range(m, key.into(), Vec::new(), false).await
    }

    /// A linearizable range of every key under `prefix` through member `m`, keys only.
    pub async fn range_prefix(&self, m: usize, prefix: &str) -> Outcome<RangeResponse> {
        let end = concord::concurrency::lock::prefix_end(prefix.as_bytes());
        self.range(m, prefix.into(), end, true).await
    }

    async fn range(
        &self,
        m: usize,
        key: Vec<u8>,
        range_end: Vec<u8>,
        keys_only: bool,
    ) -> Outcome<RangeResponse> {
        let kind = if range_end.is_empty() { "get" } else { "range" };
        let req = RangeRequest {
            key,
            range_end,
            keys_only,
            ..Default::default()
        };
        let call = self.clock.now();
        let out = bounded(CALL_TIMEOUT, self.clients.kv(m).range(req)).await;
        self.note(m, kind, call, out.call_outcome());
        out
    }
}

/// A short pause between operations, so six workloads fit on two cores beside three servers.
pub async fn think(rng: &mut crate::rng::Rng, max_ms: u64) {
    tokio::time::sleep(Duration::from_millis(rng.between(1, max_ms))).await;
}
