//! The gRPC edge: one file per etcd service. Each handler validates, then proposes (writes) or
//! reads (after the read index unless serializable), and maps domain errors through
//! [`status`], the single catalogue of etcd's wire errors.

pub mod auth;
pub mod bulk_reads;
pub mod cluster;
pub mod disk_reads;
pub mod election;
pub mod gateway;
mod gateway_auth;
pub mod http;
pub mod kv;
pub mod lease;
pub mod limits;
pub mod lock;
pub mod maintenance;
pub mod status;
pub mod validate;
pub mod watch;

use std::sync::Arc;

use tonic::Status;

use crate::auth::{AuthStore, Caller, Credentials};
use crate::error::Error;
use crate::pb::etcdserverpb::ResponseHeader;
use crate::raft::RaftNode;

/// The gRPC metadata key etcd clients set with `WithRequireLeader`.
pub const HAS_LEADER_KEY: &str = "hasleader";

/// The gRPC metadata keys a client's auth token travels in: clientv3's, then the JSON
/// gateway's (`Authorization` header, taken verbatim as etcd does).
pub const TOKEN_KEYS: [&str; 2] = ["token", "authorization"];

/// Fails with `etcdserver: no leader` when the client asked for a leader and this member has
/// none.
///
/// # Errors
/// [`Error::NoLeader`] as a gRPC status.
pub fn require_leader<T>(node: &RaftNode, req: &tonic::Request<T>) -> Result<(), Status> {
    let wants = req
        .metadata()
        .get(HAS_LEADER_KEY)
        .is_some_and(|v| v.as_bytes() == b"true");
    if wants && node.leader().is_none() {
        return Err(status::status(Error::NoLeader));
    }
    Ok(())
}

/// Completes a response header with the cluster, member and term, keeping its revision.
pub fn fill_header(node: &RaftNode, header: &mut Option<ResponseHeader>) {
    let h = header.get_or_insert_with(ResponseHeader::default);
    h.cluster_id = node.cluster_id;
    h.member_id = node.id;
    h.raft_term = node.term();
}

/// A header for a response with no revision of its own: the store's current one.
pub fn current_header(node: &RaftNode) -> Option<ResponseHeader> {
    let mut h = Some(ResponseHeader {
        revision: node.mvcc().current_revision(),
        ..Default::default()
    });
    fill_header(node, &mut h);
    h
}

/// State shared by all client-facing services.
#[derive(Clone)]
pub struct Context {
    /// This member's Raft node.
    pub node: Arc<RaftNode>,
    /// `--max-txn-ops`.
    pub max_txn_ops: usize,
    /// `--client-cert-auth`: a request without a token is its certificate's CN's.
    pub client_cert_auth: bool,
    /// This member's advertised client URLs.
    pub client_urls: Vec<String>,
    /// Names of the initial members by id.
    pub member_names: std::collections::BTreeMap<u64, String>,
}

/// The auth token `req` carries, if any.
pub fn token_of<T>(req: &tonic::Request<T>) -> Option<String> {
    TOKEN_KEYS
        .iter()
        .find_map(|k| req.metadata().get(*k))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The CN of the client certificate `req` came with (verified: `--client-cert-auth` refuses
/// connections without a trusted one), as etcd takes it for the user; not for the JSON
/// gateway's calls, which carry the gateway's own connection.
fn cert_user<T>(req: &tonic::Request<T>) -> Option<String> {
    if req.metadata().get("grpcgateway-accept").is_some() {
        return None;
    }
    req.extensions()
        .get::<crate::tls::TlsConnectInfo>()
        .and_then(|info| info.common_name.clone())
        .filter(|cn| !cn.is_empty())
}

impl Context {
    /// Who sent `req`: the user its token names, or without a token and with
    /// `--client-cert-auth` its certificate's CN (`None` while auth is off or without either).
    /// A token issued by a login this member has not applied yet is waited for, as etcd does
    /// (its index says how far to wait).
    ///
    /// # Errors
    /// `etcdserver: invalid auth token` for a token this member does not know.
    pub async fn caller<T>(&self, req: &tonic::Request<T>) -> Result<Option<Caller>, Status> {
        let auth = self.node.auth();
        if !auth.enabled() {
            return Ok(None);
        }
        let credentials = self.credentials(req);
        let index = credentials
            .token
            .as_deref()
            .filter(|_| !auth.uses_jwt())
            .and_then(AuthStore::token_index);
        let result = match (auth.resolve(&credentials), index) {
            // Looked up again once this member has applied the login (at once if it has by
            // now: it may have applied it since the lookup failed).
            (Err(Error::InvalidAuthToken), Some(index)) => {
                self.node
                    .wait_applied(index)
                    .await
                    .map_err(status::status)?;
                auth.resolve(&credentials)
            }
            (result, _) => result,
        };
        if result.is_err() {
            tracing::warn!("invalid auth token");
        }
        result.map_err(status::status)
    }

    /// What `req` presented (its token; its certificate's CN with `--client-cert-auth`), for
    /// calls that resolve it again later (see [`Credentials`]).
    pub fn credentials<T>(&self, req: &tonic::Request<T>) -> Credentials {
        Credentials {
            token: token_of(req),
            cert_user: if self.client_cert_auth {
                cert_user(req)
            } else {
                None
            },
        }
    }

    /// Fails unless `caller` may make every access `needs` lists (built only while auth is
    /// on: with auth off a request pays one atomic load here).
    ///
    /// # Errors
    /// etcd's auth errors (`user name is empty`, `permission denied`, ...).
    pub fn check(
        &self,
        caller: Option<&Caller>,
        needs: impl FnOnce() -> Vec<crate::auth::Need>,
    ) -> Result<(), Status> {
        let auth = self.node.auth();
        if !auth.enabled() {
            return Ok(());
        }
        crate::auth::check(&auth.current(), caller, &needs()).map_err(status::status)
    }

    /// Fails unless `caller` has the `root` role (nothing is checked while auth is off).
    ///
    /// # Errors
    /// `user name is empty`, `user name not found`, `permission denied`.
    pub fn check_admin(&self, caller: Option<&Caller>) -> Result<(), Status> {
        let auth = self.node.auth();
        if !auth.enabled() {
            return Ok(());
        }
        crate::auth::check_admin(&auth.current(), caller).map_err(status::status)
    }

    /// Fails unless the sender of `req` has the `root` role.
    ///
    /// # Errors
    /// As [`Context::caller`] and [`Context::check_admin`].
    pub async fn require_admin<T>(&self, req: &tonic::Request<T>) -> Result<(), Status> {
        let caller = self.caller(req).await?;
        self.check_admin(caller.as_ref())
    }
}
