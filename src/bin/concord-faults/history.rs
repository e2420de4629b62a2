//! What the clients saw: every operation with its invocation and completion time (µs since the
//! run began) and its result. Checkers read only this; a failing run saves it as JSON.
//!
//! Beside what the checkers read, two availability records (read by `avail.rs` only): every
//! client call with its plain outcome (ok, an error, or a timeout, which the checkers' records
//! do not tell apart), and the dedicated write probes.

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use serde::Serialize;

/// Completion time of an operation whose outcome is unknown (timed out or failed): it may take
/// effect at any point after its invocation.
pub const NEVER: u64 = u64::MAX;

/// Microseconds since the run began.
#[derive(Clone, Copy)]
pub struct Clock(Instant);

impl Clock {
    /// A clock starting now.
    pub fn start() -> Clock {
        Clock(Instant::now())
    }

    /// Microseconds since the start.
    pub fn now(&self) -> u64 {
        self.0.elapsed().as_micros() as u64
    }
}

/// A register operation's request. Values are unique numbers; 0 means "no key".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum RegInput {
    /// A linearizable get.
    Read,
    /// A put of a value.
    Write(u64),
    /// A txn: if the value is `.0` (0: the key does not exist) then put `.1`.
    Cas(u64, u64),
}

/// A register operation's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum RegOutput {
    /// The value read (0: no key).
    Read(u64),
    /// The put was acknowledged.
    Written,
    /// Whether the txn's compare held.
    Cas(bool),
    /// No answer: the operation may or may not have taken effect.
    Unknown,
}

/// One operation on one register key.
#[derive(Clone, Debug, Serialize)]
pub struct RegOp {
    /// The client that issued it.
    pub client: u32,
    /// The key.
    pub key: String,
    /// Invocation time.
    pub call: u64,
    /// Completion time, or [`NEVER`].
    pub ret: u64,
    /// The request.
    pub input: RegInput,
    /// The result.
    pub output: RegOutput,
}

/// One lock acquisition that succeeded.
#[derive(Clone, Debug, Serialize)]
pub struct LockGrant {
    /// The client.
    pub client: u32,
    /// The fencing token: the lock key's create_revision.
    pub token: i64,
    /// When Lock was called.
    pub call: u64,
    /// When Lock returned.
    pub ret: u64,
    /// When the client began to release it (Unlock called, or gave up on the lease).
    pub release: u64,
    /// Until when the client may rely on its lease: the latest (keep-alive sent + TTL) of a
    /// keep-alive the server confirmed.
    pub lease_safe_until: u64,
}

/// One write to the fenced resource.
#[derive(Clone, Debug, Serialize)]
pub struct FencedWrite {
    /// The client.
    pub client: u32,
    /// The token it presented.
    pub token: i64,
    /// When the resource took it.
    pub at: u64,
    /// Whether the resource accepted it.
    pub accepted: bool,
    /// Whether the writer's lease was no longer safe (by its own clock) when it wrote.
    pub lease_expired: bool,
}

/// One event a watcher received.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WatchEvent {
    /// The event's revision (the key's mod_revision).
    pub revision: i64,
    /// The key.
    pub key: String,
    /// The value (empty for a delete).
    pub value: String,
    /// Whether it is a delete.
    pub delete: bool,
}

/// Everything one watcher received, across reconnections.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WatchLog {
    /// The watcher.
    pub watcher: u32,
    /// The revision it first asked to start from.
    pub start_revision: i64,
    /// Events in the order received.
    pub events: Vec<WatchEvent>,
    /// How many times it reconnected after an error.
    pub reconnects: u32,
}

/// An acknowledged put whose revision is known.
#[derive(Clone, Debug, Serialize)]
pub struct AckedPut {
    /// The key.
    pub key: String,
    /// The value.
    pub value: String,
    /// The revision the server answered.
    pub revision: i64,
    /// When it was acknowledged.
    pub at: u64,
}

/// One lease and the key attached to it, watched until it vanished.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LeaseRecord {
    /// The lease id.
    pub lease: i64,
    /// The granted TTL, in seconds.
    pub ttl: i64,
    /// The key put with the lease (acknowledged).
    pub key: String,
    /// The lease is guaranteed alive until here: the latest (grant or keep-alive sent + TTL)
    /// the server confirmed.
    pub safe_until: u64,
    /// Reads of the key after the put: (call, ret, present).
    pub reads: Vec<(u64, u64, bool)>,
    /// Whether the key was seen gone after the keep-alives stopped.
    pub vanished: bool,
}

/// A request sent to a member cut off in a minority.
#[derive(Clone, Debug, Serialize)]
pub struct MinorityProbe {
    /// The member.
    pub member: usize,
    /// "put" or "linearizable get".
    pub kind: String,
    /// When it was sent (after the partition was in place).
    pub call: u64,
    /// When it ended (before the partition healed).
    pub ret: u64,
    /// Whether it succeeded (a violation).
    pub succeeded: bool,
}

/// A fault the nemesis injected.
#[derive(Clone, Debug, Serialize)]
pub struct FaultRecord {
    /// What it was.
    pub kind: String,
    /// Which members it hit.
    pub members: Vec<usize>,
    /// When it began (right before the injection).
    pub start: u64,
    /// When the injection was complete (every cut in place, the process killed or stopped):
    /// only probes sent from here on can tell whether the fault stops service.
    pub in_place: u64,
    /// When it was healed (right after the heal, before waiting for a leader).
    pub end: u64,
    /// Whether anything was injected: a slow disk on a server without the failpoint (etcd)
    /// is not.
    pub injected: bool,
}

/// How a client call ended, for availability (the checkers read their own records).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum CallOutcome {
    /// The server answered.
    Ok,
    /// An error answer (from the server or the transport).
    Failed,
    /// No answer within the call's deadline: indeterminate.
    Timeout,
}

/// One client call, for availability.
#[derive(Clone, Debug, Serialize)]
pub struct AvailOp {
    /// The member it was sent to.
    pub member: usize,
    /// What it was ("put", "get", "txn", "lease grant", ...).
    pub kind: &'static str,
    /// When it was sent.
    pub call: u64,
    /// When it ended (answer, error or deadline).
    pub ret: u64,
    /// How it ended.
    pub outcome: CallOutcome,
}

/// One write probe: a put to `avail/<member>/<n>`, sent every 100 ms to every member.
#[derive(Clone, Debug, Serialize)]
pub struct Probe {
    /// The member.
    pub member: usize,
    /// When it was sent.
    pub call: u64,
    /// When it ended.
    pub ret: u64,
    /// How it ended.
    pub outcome: CallOutcome,
}

/// The whole history of one run.
#[derive(Default, Serialize)]
pub struct History {
    /// The run's seed.
    pub seed: u64,
    /// Register operations.
    pub registers: Vec<RegOp>,
    /// Every event under the registers' prefix, read after the final restart: tells which
    /// timed-out writes took effect.
    pub register_history: Vec<WatchEvent>,
    /// Lock acquisitions.
    pub lock_grants: Vec<LockGrant>,
    /// Writes to the fenced resource, in the order it took them.
    pub fenced_writes: Vec<FencedWrite>,
    /// Watchers.
    pub watches: Vec<WatchLog>,
    /// Acknowledged puts under the watched prefix.
    pub watched_puts: Vec<AckedPut>,
    /// The final reference history of the watched prefix (one fresh watch from revision 1).
    pub watch_reference: Vec<WatchEvent>,
    /// Leases.
    pub leases: Vec<LeaseRecord>,
    /// Acknowledged puts of unique keys, checked after the final restart.
    pub durable_puts: Vec<AckedPut>,
    /// Unique keys present after the final restart.
    pub durable_present: Vec<String>,
    /// Requests to minority members.
    pub minority_probes: Vec<MinorityProbe>,
    /// Faults.
    pub faults: Vec<FaultRecord>,
    /// Every client call's plain outcome (availability only).
    pub avail_ops: Vec<AvailOp>,
    /// The write probes (availability only).
    pub probes: Vec<Probe>,
    /// Problems seen outside the checkers (e.g. members that diverged or never recovered).
    pub harness_violations: Vec<String>,
}

/// The history shared by every client task.
#[derive(Default)]
pub struct Recorder(Mutex<History>);

impl Recorder {
    /// Locks the history for an update.
    pub fn get(&self) -> MutexGuard<'_, History> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
