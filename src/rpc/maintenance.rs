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

/// Bytes per snapshot message, as etcd sends them.
const SNAPSHOT_CHUNK: usize = 32 * 1024;

/// A snapshot's bytes on their way to the client, as etcd sends them: messages of
/// [`SNAPSHOT_CHUNK`] bytes, each telling how many are still to come, then one message with the
/// SHA-256 of them all. It holds one message's bytes; the channel a few messages.
struct SnapshotSender {
    tx: tokio::sync::mpsc::Sender<Result<SnapshotResponse, Status>>,
    header: Option<crate::pb::etcdserverpb::ResponseHeader>,
    chunk: Vec<u8>,
    hasher: Sha256,
    remaining: u64,
}

impl SnapshotSender {
    /// A sender of `size` bytes.
    fn new(
        tx: tokio::sync::mpsc::Sender<Result<SnapshotResponse, Status>>,
        header: Option<crate::pb::etcdserverpb::ResponseHeader>,
        size: u64,
    ) -> Self {
        SnapshotSender {
            tx,
            header,
            chunk: Vec::with_capacity(SNAPSHOT_CHUNK),
            hasher: Sha256::new(),
            remaining: size,
        }
    }

    fn send(&self, blob: Vec<u8>, remaining_bytes: u64) -> std::io::Result<()> {
        let message = SnapshotResponse {
            header: self.header,
            remaining_bytes,
            blob,
        };
        self.tx.blocking_send(Ok(message)).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
        })
    }

    fn send_chunk(&mut self) -> std::io::Result<()> {
        let blob = std::mem::replace(&mut self.chunk, Vec::with_capacity(SNAPSHOT_CHUNK));
        self.hasher.update(&blob);
        self.remaining = self
            .remaining
            .checked_sub(blob.len() as u64)
            .ok_or_else(|| std::io::Error::other("the snapshot is longer than its size"))?;
        self.send(blob, self.remaining)
    }

    /// Sends what is left and the checksum.
    fn finish(mut self) -> std::io::Result<()> {
        if !self.chunk.is_empty() {
            self.send_chunk()?;
        }
        if self.remaining != 0 {
            return Err(std::io::Error::other(
                "the snapshot is shorter than its size",
            ));
        }
        let digest = std::mem::take(&mut self.hasher).finalize();
        self.send(digest.to_vec(), 0)
    }
}

impl std::io::Write for SnapshotSender {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(SNAPSHOT_CHUNK - self.chunk.len());
        self.chunk
            .extend_from_slice(buf.get(..n).unwrap_or_default());
        if self.chunk.len() == SNAPSHOT_CHUNK {
            self.send_chunk()?;
        }
        Ok(n)
    }

    /// Whole messages leave as they fill; [`SnapshotSender::finish`] sends the last.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Streams `export` to `tx` (blocking), as etcd's server streams its database. Stops when the
/// client goes away.
fn stream_snapshot(
    export: crate::etcd_db::Export,
    header: Option<crate::pb::etcdserverpb::ResponseHeader>,
    tx: tokio::sync::mpsc::Sender<Result<SnapshotResponse, Status>>,
) {
    let started = std::time::Instant::now();
    tracing::info!(bytes = export.size(), "sending database snapshot to client");
    let sender = SnapshotSender::new(tx.clone(), header, export.size());
    match export
        .write_to(sender)
        .and_then(|(sender, written)| sender.finish().map(|()| written))
    {
        Ok(written) => tracing::info!(
            bytes = written.size,
            revisions = written.changes,
            took_ms = started.elapsed().as_millis() as u64,
            "sent database snapshot"
        ),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            tracing::info!("the snapshot's client went away");
        }
        Err(e) => {
            tracing::warn!(error = %e, "sending the snapshot");
            let _ = tx.blocking_send(Err(Status::internal(e.to_string())));
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
        let export = node.snapshot_export().await.map_err(status::status)?;
        let header = current_header(node);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::task::spawn_blocking(move || stream_snapshot(export, header, tx));
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
