//! The member's listeners: peers, clients (gRPC, the JSON gateway and the HTTP endpoints) and
//! metrics, each plain or TLS by its URL's scheme, and the in-process server the JSON gateway
//! calls.

use std::sync::Arc;

use anyhow::{anyhow, Context as _};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::StreamExt as _;
use tonic::service::Routes;
use tonic::transport::Server;

use crate::config;
use crate::pb::etcdserverpb::auth_server::AuthServer;
use crate::pb::etcdserverpb::cluster_server::ClusterServer;
use crate::pb::etcdserverpb::kv_server::KvServer;
use crate::pb::etcdserverpb::lease_server::LeaseServer;
use crate::pb::etcdserverpb::maintenance_server::MaintenanceServer;
use crate::pb::etcdserverpb::watch_server::WatchServer;
use crate::pb::v3electionpb::election_server::ElectionServer;
use crate::pb::v3lockpb::lock_server::LockServer;
use crate::raft::RaftNode;
use crate::rpc::{
    auth::AuthService, cluster::ClusterService, election::ElectionService, kv::KvService,
    lease::LeaseService, lock::LockService, maintenance::MaintenanceService, watch::WatchService,
    Context,
};

/// A listening socket.
pub enum Listener {
    /// TCP (`http://`, `https://`).
    Tcp(TcpListener),
    /// A Unix socket (`unix://name` or, with TLS, `unixs://name`; etcd's form: the socket file
    /// is `name`).
    Unix(tokio::net::UnixListener),
}

/// A bound listener and the URL it was asked for.
pub struct Bound {
    /// The URL (its scheme says plain or TLS).
    pub url: String,
    /// The socket.
    pub listener: Listener,
}

impl Bound {
    /// The TCP address, if it is a TCP listener.
    pub fn tcp_addr(&self) -> Option<std::net::SocketAddr> {
        match &self.listener {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix(_) => None,
        }
    }
}

/// Socket options for TCP listeners (`--socket-reuse-port`; `SO_REUSEADDR` is always set, as
/// Go, and so etcd, sets it on every listener on Linux).
#[derive(Clone, Copy, Debug, Default)]
pub struct SocketOpts {
    /// `SO_REUSEPORT`: other processes may bind the same address (rolling restarts).
    pub reuse_port: bool,
}

/// Binds every URL of a comma-separated list (`http://host:port`, `https://host:port`,
/// `unix://name` or `unixs://name`).
///
/// # Errors
/// When a host does not resolve or an address cannot be bound.
pub async fn bind_all(urls: &str, opts: SocketOpts) -> anyhow::Result<Vec<Bound>> {
    let mut out = Vec::new();
    for url in config::split_urls(urls) {
        if let Some(path) = config::unix_socket(&url) {
            // As etcd: a socket file left by an earlier run is replaced.
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(anyhow!("cannot listen on {url}: {e}")),
            }
            let listener = tokio::net::UnixListener::bind(path)
                .with_context(|| format!("cannot listen on {url}"))?;
            out.push(Bound {
                url: url.clone(),
                listener: Listener::Unix(listener),
            });
            continue;
        }
        let hostport = url
            .split_once("://")
            .map_or(url.as_str(), |(_, rest)| rest)
            .trim_end_matches('/');
        let addr = tokio::net::lookup_host(hostport)
            .await
            .with_context(|| format!("cannot resolve {url}"))?
            .next()
            .ok_or_else(|| anyhow!("no address for {url}"))?;
        let listener = bind_tcp(addr, opts).with_context(|| format!("cannot listen on {url}"))?;
        out.push(Bound {
            url,
            listener: Listener::Tcp(listener),
        });
    }
    Ok(out)
}

fn bind_tcp(addr: std::net::SocketAddr, opts: SocketOpts) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // Go (and so etcd) sets SO_REUSEADDR on every listener on Linux; tokio's bind does too.
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(opts.reuse_port)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Resolves once `rx` says stop.
pub async fn stopped(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// The TLS server configuration a listener at `url` needs, if any.
///
/// # Errors
/// When the URL is `https://` and its side has no TLS.
pub fn tls_for(
    url: &str,
    side: Option<&Arc<crate::tls::Side>>,
) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
    if !crate::tls::is_https(url) {
        return Ok(None);
    }
    let side = side.ok_or_else(|| anyhow!("no TLS certificate for {url}"))?;
    Ok(Some(side.server_config().map_err(|e| anyhow!(e))?))
}

/// Serves `router` on `listener` (a [`Listener`]), through TLS when `tls` is given, until
/// `shutdown`; with `ping`, clients pinging more often than that get GOAWAY (see
/// [`crate::transport::PingPolicy`]).
macro_rules! serve_on {
    // Every accepted connection: writes coalesced, pings policed.
    (@incoming $router:expr, $incoming:expr, $ping:expr, $shutdown:expr) => {
        $router
            .serve_with_incoming_shutdown(
                $incoming.map(|conn| {
                    conn.map(|c| {
                        $crate::transport::PingPolicy::new(
                            $crate::transport::Coalesced::new(c),
                            $ping,
                        )
                    })
                }),
                $shutdown,
            )
            .await
    };
    ($router:expr, $listener:expr, $tls:expr, $shutdown:expr) => {
        $crate::server::listeners::serve_on!($router, $listener, $tls, $shutdown, None)
    };
    ($router:expr, $listener:expr, $tls:expr, $shutdown:expr, $ping:expr) => {{
        use $crate::server::listeners::Listener;
        use $crate::tls::accept::incoming;
        match ($listener, $tls) {
            (Listener::Tcp(l), None) => {
                let plain = tonic::transport::server::TcpIncoming::from(l);
                let plain = plain.with_nodelay(Some(true));
                $crate::server::listeners::serve_on!(@incoming $router, plain, $ping, $shutdown)
            }
            (Listener::Tcp(l), Some(tls)) => {
                let secure = incoming(l, tls);
                $crate::server::listeners::serve_on!(@incoming $router, secure, $ping, $shutdown)
            }
            (Listener::Unix(l), None) => {
                let plain = tokio_stream::wrappers::UnixListenerStream::new(l);
                $crate::server::listeners::serve_on!(@incoming $router, plain, $ping, $shutdown)
            }
            (Listener::Unix(l), Some(tls)) => {
                let secure = incoming(l, tls);
                $crate::server::listeners::serve_on!(@incoming $router, secure, $ping, $shutdown)
            }
        }
    }};
}
pub(crate) use serve_on;

/// The client gRPC services of a member (KV, Watch, Lease, Lock, Election, Cluster,
/// Maintenance, Auth), with etcd's message size limits.
pub fn client_routes(ctx: &Context, max_recv: usize, stop: &watch::Receiver<bool>) -> Routes {
    let kv = KvServer::new(KvService::new(ctx.clone()))
        .max_decoding_message_size(max_recv)
        .max_encoding_message_size(usize::MAX);
    let watch = WatchServer::new(WatchService::new(ctx.clone(), stop.clone()))
        .max_decoding_message_size(max_recv)
        .max_encoding_message_size(usize::MAX);
    Routes::new(kv)
        .add_service(watch)
        .add_service(MaintenanceServer::new(MaintenanceService::new(ctx.clone())))
        .add_service(ClusterServer::new(ClusterService::new(ctx.clone())))
        .add_service(LeaseServer::new(LeaseService::new(ctx.clone())))
        .add_service(LockServer::new(LockService::new(ctx.clone())))
        .add_service(ElectionServer::new(ElectionService::new(ctx.clone())))
        .add_service(AuthServer::new(AuthService::new(ctx.clone())))
}

/// Starts the in-process server the JSON gateway calls; returns the gateway.
///
/// # Errors
/// Never in practice.
pub fn start_gateway(
    routes: Routes,
    stop: &watch::Receiver<bool>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<crate::rpc::gateway::Gateway> {
    let (connector, incoming) = crate::transport::in_process::pipe();
    let shutdown = stopped(stop.clone());
    tasks.push(tokio::spawn(async move {
        if let Err(e) = Server::builder()
            .layer(tower::util::MapResponseLayer::new(
                crate::rpc::limits::grpc_go_size_errors,
            ))
            .add_routes(routes)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
        {
            tracing::error!(error = %e, "gateway server failed");
        }
    }));
    Ok(crate::rpc::gateway::Gateway::new(connector)?)
}

/// What a client listener serves besides the gRPC services.
pub struct ClientExtras {
    /// The JSON gateway, if enabled.
    pub gateway: Option<crate::rpc::gateway::Gateway>,
    /// `--max-concurrent-streams`.
    pub streams: u32,
    /// `--grpc-keepalive-interval` and `--grpc-keepalive-timeout`.
    pub keepalive: (std::time::Duration, std::time::Duration),
    /// `--grpc-keepalive-min-time` (`None`: any ping rate).
    pub min_ping: Option<std::time::Duration>,
    /// Whether the HTTP endpoints and the gateway are served here too (not when
    /// `--listen-client-http-urls` gives them listeners of their own).
    pub http: bool,
}

/// Serves a client listener: gRPC, the gateway and the HTTP endpoints.
pub fn serve_client(
    bound: Bound,
    tls: Option<Arc<rustls::ServerConfig>>,
    node: Arc<RaftNode>,
    routes: Routes,
    extras: ClientExtras,
    stop: &watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let shutdown = stopped(stop.clone());
    tokio::spawn(async move {
        let (health, health_svc) = tonic_health::server::health_reporter();
        health
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        let router = Server::builder()
            // One span per client request, named by its gRPC method or HTTP path.
            .trace_fn(|req| tracing::debug_span!("request", path = %req.uri().path()))
            .accept_http1(extras.http)
            .max_concurrent_streams(Some(extras.streams))
            .http2_keepalive_interval(Some(extras.keepalive.0))
            .http2_keepalive_timeout(Some(extras.keepalive.1))
            .layer(tower::util::option_layer(
                extras
                    .http
                    .then(|| crate::rpc::http::layer(node, extras.gateway)),
            ))
            .layer(tower::util::MapResponseLayer::new(
                crate::rpc::limits::grpc_go_size_errors,
            ))
            .add_routes(routes)
            .add_service(health_svc);
        if let Err(e) = serve_on!(router, bound.listener, tls, shutdown, extras.min_ping) {
            tracing::error!(error = %e, url = %bound.url, "client server failed");
        }
    })
}

/// Serves an HTTP listener: the HTTP endpoints (`/health`, `/metrics`, ...) and gRPC health,
/// and the JSON gateway if given (`--listen-client-http-urls`; not on `--listen-metrics-urls`).
pub fn serve_http(
    bound: Bound,
    tls: Option<Arc<rustls::ServerConfig>>,
    node: Arc<RaftNode>,
    gateway: Option<crate::rpc::gateway::Gateway>,
    stop: &watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let shutdown = stopped(stop.clone());
    tokio::spawn(async move {
        let (_, health_svc) = tonic_health::server::health_reporter();
        let router = Server::builder()
            .accept_http1(true)
            .layer(crate::rpc::http::layer(node, gateway))
            .add_service(health_svc);
        if let Err(e) = serve_on!(router, bound.listener, tls, shutdown) {
            tracing::error!(error = %e, url = %bound.url, "HTTP server failed");
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reuse_port_lets_two_listeners_share_an_address() -> anyhow::Result<()> {
        let shared = SocketOpts { reuse_port: true };
        let first = bind_all("http://127.0.0.1:0", shared).await?;
        let addr = first
            .first()
            .and_then(Bound::tcp_addr)
            .ok_or_else(|| anyhow!("no addr"))?;
        let url = format!("http://{addr}");
        assert!(bind_all(&url, shared).await.is_ok());
        assert!(bind_all(&url, SocketOpts::default()).await.is_err());
        let dir = tempfile::tempdir()?;
        let socket = format!("unix://{}", dir.path().join("s:1").display());
        let unix = bind_all(&socket, SocketOpts::default()).await?;
        assert!(unix.first().is_some_and(|b| b.tcp_addr().is_none()));
        // A socket file left behind is replaced.
        drop(unix);
        assert!(bind_all(&socket, SocketOpts::default()).await.is_ok());
        Ok(())
    }
}
