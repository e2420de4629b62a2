//! `etcdserverpb.Maintenance`: Status, alarms (list, raise, clear; NOSPACE is raised by the
//! space quota), Defragment, Hash/HashKV (etcd's exact HashKV algorithm), Snapshot (a consistent
//! copy of the state followed by its SHA-256, as etcd streams it) and MoveLeader.

use std::pin::Pin;

use sha2::{Digest, Sha256};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::{current_header, status, Context};
use crate::apply::{Command, Op, Outcome};
use crate::error::Error;
use crate::pb::etcdserverpb::alarm_request::AlarmAction;
use crate::pb::etcdserverpb::maintenance_server::Maintenance;
use crate::pb::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, DefragmentRequest, DefragmentResponse,
    HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};

/// The etcd version Concord is compatible with, reported by `Status` and `/version`. Clients
/// gate features on it: Kubernetes turns watch progress requests on only from 3.5.13, and
/// Concord answers them the way 3.5.13 does (once every watch of the stream is synced).
pub const ETCD_API_VERSION: &str = "3.5.13";
/// The cluster version `/version` reports, as etcd does (major.minor.0).
pub const ETCD_CLUSTER_VERSION: &str = "3.5.0";

/// The snapshot body is padded to a multiple of this, as etcd's bbolt file is.
const SNAPSHOT_PAGE: usize = 512;

/// Bytes per snapshot message, as etcd sends them.
const SNAPSHOT_CHUNK: usize = 32 * 1024;

/// Sends the snapshot `file` as etcd does: in [`SNAPSHOT_CHUNK`] messages, padded to whole
/// [`SNAPSHOT_PAGE`]s (etcdctl expects the checksum after a bbolt page) and followed by the
/// SHA-256 of everything before it; read from disk as it goes, so memory stays a few chunks
/// whatever the size. Stops when the client goes away.
fn stream_snapshot(
    file: std::fs::File,
    header: Option<crate::pb::etcdserverpb::ResponseHeader>,
    tx: &tokio::sync::mpsc::Sender<Result<SnapshotResponse, Status>>,
) {
    use std::io::Read;
    let fail = |e: std::io::Error| {
        tracing::warn!(error = %e, "reading the snapshot");
        let _ = tx.blocking_send(Err(Status::internal(e.to_string())));
    };
    let len = match file.metadata() {
        Ok(m) => m.len() as usize,
        Err(e) => return fail(e),
    };
    // The bytes sent: the file, zeros up to `padded`, then the digest up to `total`.
    let padded = len.div_ceil(SNAPSHOT_PAGE) * SNAPSHOT_PAGE;
    let total = padded + 32;
    tracing::info!(bytes = total, "sending snapshot");
    let mut input = file;
    let mut hasher = Sha256::new();
    let mut pos = 0;
    while pos < total {
        let end = (pos + SNAPSHOT_CHUNK).min(total);
        let mut blob = Vec::with_capacity(end - pos);
        if pos < len {
            let want = end.min(len) - pos;
            if let Err(e) = (&mut input).take(want as u64).read_to_end(&mut blob) {
                return fail(e);
            }
            if blob.len() != want {
                return fail(std::io::Error::other(
                    "the snapshot file is shorter than its size",
                ));
            }
        }
        let zeros = end.min(padded).saturating_sub(pos.max(len));
        blob.resize(blob.len() + zeros, 0);
        hasher.update(&blob);
        if end > padded {
            let digest = hasher.clone().finalize();
            blob.extend_from_slice(
                digest
                    .get(pos.max(padded) - padded..end - padded)
                    .unwrap_or_default(),
            );
        }
        pos = end;
        let message = SnapshotResponse {
            header,
            remaining_bytes: (total - pos) as u64,
            blob,
        };
        if tx.blocking_send(Ok(message)).is_err() {
            return;
        }
    }
}

/// The Maintenance service.
pub struct MaintenanceService {
    ctx: Context,
}

impl MaintenanceService {
    /// A Maintenance service over `ctx`.
    pub fn new(ctx: Context) -> Self {
        MaintenanceService { ctx }
    }
}

/// An alarm as etcd prints it in `Status.errors` (protobuf text of `AlarmMember`).
fn alarm_text(member: u64, alarm: i32) -> String {
    let name = AlarmType::try_from(alarm).map_or("UNKNOWN", |a| a.as_str_name());
    format!("memberID:{member} alarm:{name} ")
}

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

impl MaintenanceService {
    /// Root only, failing as etcd's maintenance server does for these RPCs: with the auth
    /// store's own error text and code Unknown.
    async fn require_admin_raw<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let caller = match self.ctx.caller(req).await {
            Ok(c) => c,
            Err(_) => return Err(status::auth_raw(Error::InvalidAuthToken)),
        };
        crate::auth::check_admin(&self.ctx.node.auth().current(), caller.as_ref())
            .map_err(status::auth_raw)
    }
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(&self, req: Request<AlarmRequest>) -> Result<Response<AlarmResponse>, Status> {
        let node = &self.ctx.node;
        let caller = self.ctx.caller(&req).await?;
        let req = req.into_inner();
        if req.action == AlarmAction::Get as i32 {
            // etcd 3.5.28 and on: listing alarms needs an authenticated user.
            self.ctx.check(caller.as_ref(), Vec::new)?;
            let alarms = node
                .mvcc()
                .alarms()
                .into_iter()
                .filter(|(_, a)| req.alarm == AlarmType::None as i32 || *a == req.alarm)
                .map(|(member_id, alarm)| AlarmMember { member_id, alarm })
                .collect();
            return Ok(Response::new(AlarmResponse {
                header: current_header(node),
                alarms,
            }));
        }
        // Raising or clearing one is for root (checked when applied).
        match node
            .propose(Command::from_client(Op::Alarm(req), caller))
            .await
        {
            Ok(Outcome::Alarm(mut resp)) => {
                super::fill_header(node, &mut resp.header);
                Ok(Response::new(resp))
            }
            Ok(_) => Err(status::status(Error::Storage)),
            Err(e) => Err(status::status(e)),
        }
    }

    async fn status(
        &self,
        req: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        // etcd 3.5.28 and on: for root.
        self.ctx.require_admin(&req).await?;
        let node = &self.ctx.node;
        let size = i64::try_from(node.state_size()).unwrap_or(i64::MAX);
        let errors = node
            .mvcc()
            .alarms()
            .into_iter()
            .map(|(m, a)| alarm_text(m, a))
            .collect();
        Ok(Response::new(StatusResponse {
            header: current_header(node),
            version: ETCD_API_VERSION.into(),
            db_size: size,
            leader: node.leader().unwrap_or(0),
            raft_index: node.last_log_index(),
            raft_term: node.term(),
            raft_applied_index: node.applied_index(),
            errors,
            db_size_in_use: size,
            is_learner: node.is_learner(),
        }))
    }

    async fn defragment(
        &self,
        req: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        self.require_admin_raw(&req).await?;
        let node = self.ctx.node.clone();
        let before = node.state_size();
        let started = std::time::Instant::now();
        tokio::task::spawn_blocking(move || node.defragment())
            .await
            .map_err(|_| status::status(Error::Stopped))?
            .map_err(status::status)?;
        tracing::info!(
            before,
            after = self.ctx.node.state_size(),
            took = ?started.elapsed(),
            "defragmented"
        );
        Ok(Response::new(DefragmentResponse {
            header: current_header(&self.ctx.node),
        }))
    }

    async fn hash(&self, req: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        self.require_admin_raw(&req).await?;
        let node = &self.ctx.node;
        let hash = node.state_hash().map_err(status::status)?;
        Ok(Response::new(HashResponse {
            header: current_header(node),
            hash,
        }))
    }

    async fn hash_kv(
        &self,
        req: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        self.require_admin_raw(&req).await?;
        let node = &self.ctx.node;
        let (hash, compact_revision, _) = node
            .mvcc()
            .hash_kv(req.get_ref().revision)
            .map_err(status::status)?;
        Ok(Response::new(HashKvResponse {
            header: current_header(node),
            hash,
            compact_revision,
        }))
    }

    async fn snapshot(
        &self,
        req: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        self.require_admin_raw(&req).await?;
        let node = &self.ctx.node;
        let file = node.snapshot_file().await.map_err(status::status)?;
        let header = current_header(node);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::task::spawn_blocking(move || stream_snapshot(file, header, &tx));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn move_leader(
        &self,
        req: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        // etcd 3.5.28 and on: for root.
        self.ctx.require_admin(&req).await?;
        let node = &self.ctx.node;
        node.move_leader(req.get_ref().target_id)
            .await
            .map_err(status::status)?;
        Ok(Response::new(MoveLeaderResponse {
            header: current_header(node),
        }))
    }
}
