//! The gRPC edge: one file per etcd service. Each handler validates, then proposes (writes) or
//! reads (after the read index unless serializable), and maps domain errors through
//! [`status`], the single catalogue of etcd's wire errors.

pub mod cluster;
pub mod election;
pub mod gateway;
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

use crate::error::Error;
use crate::pb::etcdserverpb::ResponseHeader;
use crate::raft::RaftNode;

/// The gRPC metadata key etcd clients set with `WithRequireLeader`.
pub const HAS_LEADER_KEY: &str = "hasleader";

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
    /// This member's advertised client URLs.
    pub client_urls: Vec<String>,
    /// Names of the initial members by id.
    pub member_names: std::collections::BTreeMap<u64, String>,
}
