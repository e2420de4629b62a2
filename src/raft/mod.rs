//! Replication with openraft 0.9: the only module that imports openraft.
//!
//! [`RaftNode`] is what the RPC layer sees of a member: [`RaftNode::propose`] for writes (any
//! member; followers forward to the leader), [`RaftNode::read_index`] for linearizable reads
//! (batched), and the leader/term facts for response headers and `hasleader`.

// openraft's storage traits fix `StorageError` (224 bytes) as the error type.
#![allow(clippy::result_large_err)]

mod corruption;
mod election;
mod lease;
mod log_store;
mod maintenance;
mod membership;
mod mux;
mod network;
mod peer;
mod propose;
mod quota;
mod read;
mod replicate;
mod route;
mod session;
mod snapshot_data;
mod snapshot_file;
mod snapshot_piece;
mod snapshot_send;
pub mod snapshots;
mod state_machine;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;

pub use log_store::LogStore;
pub use membership::{bootstrapped_elsewhere, discover_identity, first_url, REMOVED_MESSAGE};
pub use network::NetworkFactory;
pub use peer::PeerService;
pub use state_machine::StateMachine;

use crate::apply::{CommandResult, EncodedCommand};
use crate::mvcc::MvccStore;
use crate::storage::{Storage, StorageError};
use crate::watch::WatchHub;

openraft::declare_raft_types!(
    /// Concord's openraft type configuration.
    pub TypeConfig:
        D = EncodedCommand,
        R = CommandResult,
        NodeId = u64,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = snapshot_data::SnapshotData,
        AsyncRuntime = openraft::TokioRuntime,
);

/// How long a leader waits for one snapshot piece to be taken, the last one installed
/// included (openraft's default, 200 ms, is far less than installing a large state takes; a
/// member that is gone is noticed sooner by the connection's own timeout).
const SNAPSHOT_INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// The openraft handle.
pub type Raft = openraft::Raft<TypeConfig>;

/// openraft's metrics: its view of leader, term, log and membership.
type Metrics = openraft::RaftMetrics<u64, BasicNode>;

/// Timing and limits of the Raft member, from etcd's flags.
#[derive(Clone, Debug)]
pub struct RaftOptions {
    /// Heartbeat interval (`--heartbeat-interval`).
    pub heartbeat: Duration,
    /// Minimum election timeout (`--election-timeout`).
    pub election: Duration,
    /// How long a proposal or read may take before `request timed out`.
    pub request_timeout: Duration,
    /// Largest encoded request accepted (`--max-request-bytes`).
    pub max_request_bytes: usize,
    /// Entries between snapshots.
    pub snapshot_every: u64,
    /// Bytes per snapshot message to a lagging member (`--snapshot-chunk-bytes`).
    pub snapshot_chunk: u64,
    /// Interval of progress notifications to `progress_notify` watches.
    pub progress_interval: Duration,
    /// How often the leader checkpoints remaining lease TTLs through the log.
    pub lease_checkpoint_interval: Duration,
    /// The backend size above which writes raise NOSPACE (`--quota-backend-bytes`).
    pub quota_bytes: u64,
    /// How to dial `https://` peers.
    pub peer_tls: Option<Arc<rustls::ClientConfig>>,
    /// `--force-new-cluster`: this member's peer URL, to restart as the only member.
    pub force_new_cluster: Option<String>,
    /// `--strict-reconfig-check`: refuse membership changes that could lose quorum.
    pub strict_reconfig_check: bool,
    /// `--experimental-warning-apply-duration`: applies slower than this are logged.
    pub warning_apply_duration: Duration,
    /// `--initial-election-tick-advance`: the first election timeout after a restart on the
    /// member's own data is fast-forwarded to about a heartbeat.
    pub initial_election_tick_advance: bool,
    /// `--auth-token-ttl` and `--bcrypt-cost`.
    pub auth: crate::auth::AuthOptions,
}

/// One member's Raft state, shared by every RPC.
pub struct RaftNode {
    /// This member's id (etcd's member ID).
    pub id: u64,
    /// The cluster id, derived from the initial members.
    pub cluster_id: u64,
    raft: Raft,
    /// openraft's metrics channel, held: `raft.metrics()` clones a receiver (and drops it)
    /// on every call, which cost more than the read itself on every request.
    metrics: tokio::sync::watch::Receiver<Metrics>,
    mvcc: Arc<MvccStore>,
    auth: Arc<crate::auth::AuthStore>,
    hub: Arc<WatchHub>,
    options: RaftOptions,
    reads: read::ReadBatcher,
    peers: Arc<network::PeerChannels>,
    /// The session with the leader, for the requests this member forwards to it.
    sessions: Arc<session::Sessions>,
    storage: Storage,
    proposals: propose::Batcher,
    lessor: crate::lease::Lessor,
    /// Orders checkpoints against renewals: a checkpoint (writer) reflects every renewal before
    /// it, and a renewal (reader) after it clears it. See `lease.rs`.
    checkpoint_gate: tokio::sync::RwLock<()>,
    /// Serializes membership changes on the leader (openraft takes one at a time).
    membership_lock: tokio::sync::Mutex<()>,
    /// Shared with the transport: removal, quiet mode, peers' last contact.
    links: Arc<network::Links>,
    /// The backend size for the space quota.
    quota: Arc<quota::QuotaMeter>,
    /// The election timer and CheckQuorum state (shared with the transport, which hears a
    /// leader's answers too).
    elector: Arc<election::Elector>,
    /// The log, read by PreVote for its last entry.
    log: LogStore,
}

impl RaftNode {
    /// Opens the log and state machine on `storage` and starts openraft.
    ///
    /// # Errors
    /// When the stored state cannot be loaded or openraft refuses the configuration.
    pub async fn start(
        id: u64,
        cluster_id: u64,
        storage: Storage,
        data_dir: &std::path::Path,
        options: RaftOptions,
    ) -> Result<Arc<Self>, StorageError> {
        let mvcc = Arc::new(MvccStore::open(storage.clone())?);
        let hub = WatchHub::new(mvcc.current_revision());
        crate::watch::sync::spawn(hub.clone(), mvcc.clone(), options.progress_interval);
        let removed = Arc::new(tokio::sync::watch::Sender::new(false));
        let elector = Arc::new(election::Elector::new(options.election, options.heartbeat));
        let links = Arc::new(network::Links::new(
            cluster_id,
            removed.clone(),
            elector.clone(),
        ));
        let auth = Arc::new(
            crate::auth::AuthStore::open(&storage, options.auth.clone())
                .map_err(|e| StorageError(e.to_string()))?,
        );
        let snapshots = Arc::new(snapshots::SnapshotFiles::new(data_dir));
        let sm = StateMachine::open(
            id,
            storage.clone(),
            mvcc.clone(),
            auth.clone(),
            hub.clone(),
            snapshots.clone(),
            removed.clone(),
        )
        .map_err(|e| StorageError(e.to_string()))?
        .warn_slower_than(options.warning_apply_duration);
        let log = LogStore::new(storage.clone()).watching_installs(snapshots.receiving_flag());
        log.uncommit_vote()
            .map_err(|e| StorageError(e.to_string()))?;
        log.purge_below_gap()
            .map_err(|e| StorageError(e.to_string()))?;
        if let Some(addr) = &options.force_new_cluster {
            if log.last_log_id().ok().flatten().is_some() {
                let at = log
                    .force_single_member(id, addr)
                    .map_err(|e| StorageError(e.to_string()))?;
                tracing::warn!(
                    member_id = format!("{id:x}"),
                    index = at.index,
                    term = at.leader_id.term,
                    "forcing a new cluster: this member is now its only member"
                );
            }
        }
        let log_handle = log.clone();
        let election_ms = options.election.as_millis() as u64;
        let config = openraft::Config {
            cluster_name: "concord".into(),
            heartbeat_interval: options.heartbeat.as_millis().max(1) as u64,
            election_timeout_min: election_ms,
            election_timeout_max: election_ms * 2,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(options.snapshot_every),
            // Entries kept behind a snapshot so a briefly lagging follower catches up from the
            // log rather than a full snapshot (etcd's snapshot-catchup-entries: 5000).
            max_in_snapshot_log_to_keep: options.snapshot_every.min(5000),
            // A snapshot travels in pieces read from and written to disk; the last piece's
            // answer waits for the whole install, which takes time with a large state.
            snapshot_max_chunk_size: options.snapshot_chunk,
            install_snapshot_timeout: SNAPSHOT_INSTALL_TIMEOUT.as_millis() as u64,
            // Elections are started by `election.rs` (PreVote first), not by openraft's timer,
            // and need no lease of openraft's: see that module.
            enable_elect: false,
            leader_lease: Some(0),
            ..Default::default()
        };
        let config = Arc::new(config.validate().map_err(|e| StorageError(e.to_string()))?);
        let peers = Arc::new(network::PeerChannels::new(
            options.election,
            options.peer_tls.clone(),
        ));
        let network = NetworkFactory::new(links.clone(), peers.clone(), options.heartbeat);
        let raft = Raft::new(id, config, network, log, sm)
            .await
            .map_err(|e| StorageError(e.to_string()))?;
        // Restarted on its own state (not bootstrapping, not joining): see `Elector::mark_restarted`.
        let restarted = raft
            .is_initialized()
            .await
            .map_err(|e| StorageError(e.to_string()))?;
        if restarted && options.initial_election_tick_advance {
            elector.mark_restarted();
        }
        let proposals = propose::Batcher::start(raft.clone(), options.max_request_bytes);
        let (reads, read_queue) = read::ReadBatcher::new();
        let lessor = crate::lease::Lessor::new(id, options.election);
        let node = Arc::new(RaftNode {
            id,
            cluster_id,
            metrics: raft.metrics(),
            raft,
            mvcc,
            auth,
            hub,
            options,
            reads,
            peers,
            sessions: Default::default(),
            quota: quota::QuotaMeter::new(storage.clone()),
            storage,
            proposals,
            lessor,
            checkpoint_gate: tokio::sync::RwLock::new(()),
            membership_lock: tokio::sync::Mutex::new(()),
            links,
            elector,
            log: log_handle,
        });
        node.start_reads(read_queue);
        node.start_elections();
        node.start_lease_expiry();
        node.count_leader_changes();
        Ok(node)
    }

    /// Tells every other member that this one has started (the `Hello` peer message), so that
    /// a leader which could not reach it sends its next append at once. Each greeting is sent
    /// once, in the background, and may be lost: the leader then tries at its usual interval.
    pub fn greet_peers(&self) {
        let (nodes, _) = self.members();
        for (id, addr) in nodes {
            if id == self.id {
                continue;
            }
            let Ok(mut client) = self.peers.client(first_url(&addr)) else {
                continue;
            };
            let mut req =
                tonic::Request::new(crate::pb::concordpb::HelloRequest { member: self.id });
            req.set_timeout(self.options.election);
            network::from_cluster(&mut req, self.cluster_id);
            tokio::spawn(async move {
                if let Err(e) = client.hello(req).await {
                    tracing::debug!(peer = format!("{id:x}"), error = %e, "hello not delivered");
                }
            });
        }
    }

    /// Bootstraps a new cluster with `members` (id → peer URL) if this member has no state yet.
    /// Every initial member may call it: the same membership is written by all.
    ///
    /// # Errors
    /// When openraft fails fatally.
    pub async fn bootstrap(&self, members: &BTreeMap<u64, String>) -> Result<(), StorageError> {
        let initialized = self
            .raft
            .is_initialized()
            .await
            .map_err(|e| StorageError(e.to_string()))?;
        if initialized {
            return Ok(());
        }
        let nodes: BTreeMap<u64, BasicNode> = members
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr)))
            .collect();
        if let Err(e) = self.raft.initialize(nodes).await {
            tracing::warn!(error = %e, "cluster bootstrap skipped");
        }
        Ok(())
    }

    /// Counts the leaders this member sees (`etcd_server_leader_changes_seen_total`).
    ///
    /// Watches openraft's server metrics, which change only with the vote, the leader or the
    /// membership (its full metrics change with every log write and apply).
    fn count_leader_changes(self: &Arc<Self>) {
        let mut metrics = self.raft.server_metrics();
        tokio::spawn(async move {
            let mut seen = None;
            while metrics.changed().await.is_ok() {
                let leader = metrics.borrow().current_leader;
                if leader.is_some() && leader != seen {
                    crate::metrics::LEADER_CHANGES
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                if leader.is_some() {
                    seen = leader;
                }
            }
        });
    }

    /// The MVCC store of this member.
    pub fn mvcc(&self) -> &MvccStore {
        &self.mvcc
    }

    /// The auth store of this member.
    pub fn auth(&self) -> &Arc<crate::auth::AuthStore> {
        &self.auth
    }

    /// The watch hub fed by this member's apply path.
    pub fn hub(&self) -> &Arc<WatchHub> {
        &self.hub
    }

    /// The largest request this member accepts (`--max-request-bytes`).
    pub fn max_request_bytes(&self) -> usize {
        self.options.max_request_bytes
    }

    /// The election timeout.
    pub fn election_timeout(&self) -> Duration {
        self.options.election
    }

    /// The current Raft term.
    pub fn term(&self) -> u64 {
        self.metrics_now().current_term
    }

    /// openraft's latest metrics, read in place (through the held receiver).
    fn metrics_now(&self) -> tokio::sync::watch::Ref<'_, Metrics> {
        self.metrics.borrow()
    }

    /// The leader this member knows of, if any. A leader that has lost touch with a majority
    /// for an election timeout reports none (etcd's CheckQuorum step-down), and so does a
    /// follower whose leader has been silent that long (etcd's pre-candidate): see
    /// `election.rs`.
    pub fn leader(&self) -> Option<u64> {
        let leader = self.metrics_now().current_leader;
        let lost = if leader == Some(self.id) {
            self.elector.quorum_lost()
        } else {
            self.elector.leader_lost()
        };
        if lost {
            return None;
        }
        leader
    }

    /// The last applied log index.
    pub fn applied_index(&self) -> u64 {
        self.metrics_now().last_applied.map_or(0, |l| l.index)
    }

    /// The last log index.
    pub fn last_log_index(&self) -> u64 {
        self.metrics_now().last_log_index.unwrap_or(0)
    }

    /// Every member: id → peer URL, and the set of voters.
    pub fn members(&self) -> (BTreeMap<u64, String>, BTreeSet<u64>) {
        let metrics = self.metrics_now().clone();
        let m = metrics.membership_config.membership();
        let nodes = m.nodes().map(|(id, n)| (*id, n.addr.clone())).collect();
        let voters = m.voter_ids().collect();
        (nodes, voters)
    }

    /// Approximate bytes of the data dir on disk.
    pub fn disk_space(&self) -> u64 {
        self.storage.disk_space()
    }

    /// The member's state for `/metrics`.
    pub fn metrics_snapshot(&self) -> crate::metrics::Snapshot {
        let m = self.metrics_now().clone();
        let watch = self.hub.stats();
        let leader = self.leader();
        crate::metrics::Snapshot {
            has_leader: leader.is_some(),
            is_leader: leader == Some(self.id),
            committed: m.last_log_index.unwrap_or(0),
            applied: m.last_applied.map_or(0, |l| l.index),
            term: m.current_term,
            revision: self.mvcc.current_revision(),
            compacted: self.mvcc.compacted_revision(),
            db_size: self.storage.disk_space(),
            quota_bytes: self.options.quota_bytes,
            keys: self.mvcc.key_count(),
            auth_revision: self.auth.current().revision,
            watchers: watch.watchers,
            slow_watchers: watch.slow_watchers,
        }
    }

    /// The peer service answering other members until `stop` says `true`.
    pub fn peer_service(self: &Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) -> PeerService {
        PeerService::new(self.clone(), stop)
    }

    /// Resolves when the Raft core has stopped without being asked to: a write to the log or the
    /// state failed (a full disk, an I/O error) and openraft stopped on that fatal error. The
    /// member can then neither serve nor take part in the cluster; the answer is the error.
    ///
    /// Waits on openraft's server metrics, which change only with the vote, the leader or the
    /// membership, and whose channel closes when the core ends (it records why in the full
    /// metrics first). The full metrics change with every log write and apply: waiting on them
    /// woke the waiter, the process's main thread, for every request.
    pub async fn core_failed(&self) -> String {
        let mut server = self.raft.server_metrics();
        while server.changed().await.is_ok() {}
        match self.metrics_now().running_state.as_ref().err().cloned() {
            // Stopped: asked to (by `shutdown`), which is not a failure.
            Some(openraft::error::Fatal::Stopped) => std::future::pending().await,
            Some(fatal) => fatal.to_string(),
            None => "the Raft core ended".to_string(),
        }
    }

    /// Stops openraft.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }

    /// The peer URL of member `leader`, from the current membership.
    fn leader_addr(&self, leader: u64) -> Option<String> {
        self.metrics_now()
            .membership_config
            .membership()
            .get_node(&leader)
            .map(|n| first_url(&n.addr).to_string())
    }
}
