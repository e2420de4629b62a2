//! Starts a member: opens storage, starts Raft, serves peers and clients (see `listeners`), and
//! shuts down gracefully on SIGTERM/SIGINT.

pub(crate) mod listeners;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{anyhow, Context as _};
use tokio::sync::watch;
use tokio_stream::StreamExt as _;
use tonic::transport::Server;

use crate::config::{self, ClusterState, Config};
use crate::pb::concordpb::raft_peer_server::RaftPeerServer;
use crate::raft::{RaftNode, RaftOptions};
use crate::rpc::Context;
use crate::storage::Storage;

/// gRPC's own framing overhead that etcd allows above `--max-request-bytes`.
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// A running member; dropping it does not stop it, [`Member::shutdown`] does.
pub struct Member {
    /// The Raft node.
    pub node: Arc<RaftNode>,
    /// The addresses the client servers are bound to.
    pub client_addrs: Vec<SocketAddr>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    storage: Storage,
}

impl Member {
    /// Stops serving, stops Raft and syncs storage.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        tracing::info!("listeners closed");
        self.node.shutdown().await;
        tracing::info!("raft stopped");
        if let Err(e) = self
            .storage
            .persist_state()
            .and_then(|()| self.storage.persist_log())
        {
            tracing::error!(error = %e, "final sync failed");
        }
    }
}

/// Starts a member from `cfg` and returns once it is serving.
///
/// # Errors
/// When the data dir cannot be opened, the configuration is inconsistent, or a URL cannot be
/// bound.
pub async fn start(cfg: &Config) -> anyhow::Result<Member> {
    let data_dir = cfg.data_dir();
    let members = cfg.initial_members().map_err(|e| anyhow!(e))?;
    let sockets = listeners::SocketOpts {
        reuse_port: cfg.socket_reuse_port,
    };
    // TLS first: a bad certificate flag fails before anything is written.
    let client_tls = crate::tls::Side::client(cfg).map_err(|e| anyhow!(e))?;
    let peer_tls = crate::tls::Side::peer(cfg).map_err(|e| anyhow!(e))?;
    let peer_dial = match &peer_tls {
        Some(side) => Some(side.client_config().map_err(|e| anyhow!(e))?),
        None => None,
    };
    // Listening before the data is loaded, as etcd does: a client or peer that connects while
    // this member starts waits for its answer (the kernel queues the connection) instead of
    // being refused, which would cost a gRPC client its reconnect backoff (1 s at first).
    let peer_listeners = listeners::bind_all(&cfg.listen_peer_urls, sockets).await?;
    let client_listeners = listeners::bind_all(&cfg.listen_client_urls, sockets).await?;
    let http_listeners = listeners::bind_all(&cfg.listen_client_http_urls, sockets).await?;
    let metrics_listeners = listeners::bind_all(&cfg.listen_metrics_urls, sockets).await?;
    let opening = std::time::Instant::now();
    let storage = Storage::open_with_cache(&data_dir, cfg.storage_cache_bytes)
        .context("opening the data dir")?;
    tracing::info!(
        elapsed_ms = opening.elapsed().as_millis() as u64,
        "storage opened"
    );
    let retention = cfg.retention().map_err(|e| anyhow!(e))?;
    let (id, cluster_id) = identity(cfg, &members, &storage, peer_dial.clone()).await?;
    let options = RaftOptions {
        heartbeat: std::time::Duration::from_millis(cfg.heartbeat_interval),
        election: std::time::Duration::from_millis(cfg.election_timeout),
        request_timeout: cfg.request_timeout(),
        max_request_bytes: cfg.max_request_bytes,
        snapshot_every: cfg.snapshot_count,
        snapshot_chunk: cfg.snapshot_chunk_bytes.max(1),
        progress_interval: cfg.watch_progress_notify_interval,
        lease_checkpoint_interval: cfg.lease_checkpoint_interval,
        quota_bytes: cfg.quota_bytes(),
        peer_tls: peer_dial,
        strict_reconfig_check: cfg.strict_reconfig_check,
        warning_apply_duration: cfg.warning_apply_duration,
        initial_election_tick_advance: cfg.initial_election_tick_advance,
        auth: auth_options(cfg).map_err(|e| anyhow!(e))?,
        force_new_cluster: cfg.force_new_cluster.then(|| {
            config::split_urls(&cfg.initial_advertise_peer_urls)
                .into_iter()
                .next()
                .unwrap_or_default()
        }),
    };
    let node = RaftNode::start(id, cluster_id, storage.clone(), &data_dir, options).await?;
    if *node.removed().borrow() {
        node.shutdown().await;
        return Err(anyhow!(crate::raft::REMOVED_MESSAGE));
    }
    let (stop, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();

    for bound in peer_listeners {
        let tls = listeners::tls_for(&bound.url, peer_tls.as_ref())?;
        let svc = RaftPeerServer::new(node.peer_service(stop_rx.clone()))
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let shutdown = listeners::stopped(stop_rx.clone());
        tasks.push(tokio::spawn(async move {
            let router = Server::builder().add_service(svc);
            if let Err(e) = listeners::serve_on!(router, bound.listener, tls, shutdown) {
                tracing::error!(error = %e, url = %bound.url, "peer server failed");
            }
        }));
    }

    node.greet_peers();

    if cfg.initial_cluster_state == ClusterState::New {
        let initial = members
            .iter()
            .filter_map(|(id, m)| m.peer_urls.first().map(|u| (*id, u.clone())))
            .collect();
        node.bootstrap(&initial).await?;
    }

    let ctx = Context {
        node: node.clone(),
        max_txn_ops: cfg.max_txn_ops,
        client_cert_auth: cfg.client_cert_auth,
        client_urls: config::split_urls(&cfg.advertise_client_urls),
        member_names: members
            .iter()
            .map(|(id, m)| (*id, m.name.clone()))
            .collect(),
    };
    node.publish_attributes(cfg.name.clone(), ctx.client_urls.clone());
    crate::compactor::spawn(node.clone(), retention, stop_rx.clone());
    node.spawn_corruption_check(cfg.corrupt_check_time, stop_rx.clone());
    if cfg.compact_hash_check_enabled {
        node.spawn_compact_hash_check(cfg.compact_hash_check_time, stop_rx.clone());
    }
    if cfg.experimental_initial_corrupt_check {
        if let Err(e) = node.initial_corruption_check().await {
            let _ = stop.send(true);
            node.shutdown().await;
            return Err(anyhow!(e));
        }
    }
    let mut removed = node.removed();
    let stop_on_removal = stop.clone();
    let shutdown = listeners::stopped(stop_rx.clone());
    tasks.push(tokio::spawn(async move {
        tokio::select! {
            r = removed.wait_for(|r| *r) => if r.is_ok() {
                tracing::error!("{}", crate::raft::REMOVED_MESSAGE);
                let _ = stop_on_removal.send(true);
            },
            () = shutdown => {}
        }
    }));
    let max_recv = cfg.max_request_bytes.saturating_add(GRPC_OVERHEAD_BYTES);
    let routes = listeners::client_routes(&ctx, max_recv, &stop_rx);
    let gateway = if cfg.enable_grpc_gateway {
        Some(listeners::start_gateway(
            routes.clone(),
            &stop_rx,
            &mut tasks,
        )?)
    } else {
        None
    };
    let mut client_addrs = Vec::new();
    for bound in client_listeners {
        client_addrs.extend(bound.tcp_addr());
        let tls = listeners::tls_for(&bound.url, client_tls.as_ref())?;
        let extras = listeners::ClientExtras {
            gateway: gateway.clone(),
            streams: cfg.max_concurrent_streams,
            keepalive: (cfg.grpc_keepalive_interval, cfg.grpc_keepalive_timeout),
            min_ping: Some(cfg.grpc_keepalive_min_time).filter(|t| !t.is_zero()),
            http: cfg.listen_client_http_urls.is_empty(),
        };
        tasks.push(listeners::serve_client(
            bound,
            tls,
            node.clone(),
            routes.clone(),
            extras,
            &stop_rx,
        ));
    }
    for bound in http_listeners {
        let tls = listeners::tls_for(&bound.url, client_tls.as_ref())?;
        let http = listeners::serve_http(bound, tls, node.clone(), gateway.clone(), &stop_rx);
        tasks.push(http);
    }
    for bound in metrics_listeners {
        let tls = listeners::tls_for(&bound.url, client_tls.as_ref())?;
        tasks.push(listeners::serve_http(
            bound,
            tls,
            node.clone(),
            None,
            &stop_rx,
        ));
    }
    tracing::info!(
        name = %cfg.name,
        member_id = format!("{id:x}"),
        cluster_id = format!("{cluster_id:x}"),
        data_dir = %data_dir.display(),
        clients = %cfg.listen_client_urls,
        peers = %cfg.listen_peer_urls,
        "serving"
    );
    Ok(Member {
        node,
        client_addrs,
        stop,
        tasks,
        storage,
    })
}

/// This member's (member ID, cluster ID): recorded in the data dir when it was created; for a
/// new data dir, derived from `--initial-cluster` (state `new`) or learned from the running
/// cluster, which must already list this member (state `existing`, after `member add`).
async fn identity(
    cfg: &Config,
    members: &std::collections::BTreeMap<u64, config::InitialMember>,
    storage: &Storage,
    peer_tls: Option<Arc<rustls::ClientConfig>>,
) -> anyhow::Result<(u64, u64)> {
    if let Some(known) = storage.identity()? {
        return Ok(known);
    }
    // The other members, asked about this one for a new data dir.
    let own = config::split_urls(&cfg.initial_advertise_peer_urls);
    let peers: Vec<String> = members
        .values()
        .flat_map(|m| m.peer_urls.clone())
        .filter(|u| !own.contains(u))
        .collect();
    let (id, cluster_id) = match cfg.initial_cluster_state {
        ClusterState::New => {
            let id = cfg.member_id();
            if !members.contains_key(&id) {
                return Err(anyhow!(
                    "couldn't find local name {:?} in the initial cluster configuration",
                    cfg.name
                ));
            }
            let patience = std::time::Duration::from_secs(1);
            if crate::raft::bootstrapped_elsewhere(&peers, id, patience, peer_tls).await {
                return Err(anyhow!("member {id:x} has already been bootstrapped"));
            }
            (id, config::cluster_id(members.keys()))
        }
        ClusterState::Existing => crate::raft::discover_identity(
            &peers,
            &own,
            std::time::Duration::from_secs(30),
            peer_tls,
        )
        .await
        .map_err(|e| anyhow!(e))?,
    };
    storage.save_identity(id, cluster_id)?;
    Ok((id, cluster_id))
}

/// Runs a member until SIGTERM or SIGINT, until it is removed from the cluster, or until its
/// Raft core stops on a fatal error (a storage failure), then shuts it down gracefully.
///
/// # Errors
/// Those of [`start`]; removal from the cluster; the fatal error that stopped Raft.
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    let member = start(&cfg).await?;
    let mut removed = member.node.removed();
    let ended = tokio::select! {
        () = wait_for_signal() => Ok(()),
        r = removed.wait_for(|r| *r) => if r.is_ok() {
            Err(anyhow!(crate::raft::REMOVED_MESSAGE))
        } else {
            Ok(())
        },
        // As etcd exits when a write to its WAL or its database fails: a member whose Raft core
        // stopped serves nothing, and a supervisor restarting it makes the failure visible.
        why = member.node.core_failed() => {
            tracing::error!(error = %why, "raft stopped on a fatal error; exiting");
            Err(anyhow!("raft stopped on a fatal error: {why}"))
        },
    };
    tracing::info!("shutting down");
    member.shutdown().await;
    ended
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// `--auth-token`, `--auth-token-ttl` and `--bcrypt-cost` (a TTL of 0 means etcd's 300 s).
fn auth_options(cfg: &Config) -> Result<crate::auth::AuthOptions, String> {
    crate::auth::AuthOptions {
        token_ttl: match cfg.auth_token_ttl {
            0 => crate::auth::token::DEFAULT_TTL,
            s => std::time::Duration::from_secs(s),
        },
        bcrypt_cost: cfg.bcrypt_cost,
        jwt: None,
    }
    .with_token_kind(&cfg.auth_token)
}
