//! `etcdserverpb.Maintenance`: Status, and Alarm listing (Concord raises no alarms yet: it has
//! no space quota and no corruption check, so the list is always empty). The other methods
//! answer `Unimplemented` until their issues land (alarm activation, defragment, hash, snapshot,
//! move-leader, downgrade).

use tonic::{Request, Response, Status};

use super::{current_header, Context};
use crate::pb::etcdserverpb::alarm_request::AlarmAction;
use crate::pb::etcdserverpb::maintenance_server::Maintenance;
use crate::pb::etcdserverpb::{AlarmRequest, AlarmResponse, StatusRequest, StatusResponse};

/// The etcd version Concord is compatible with, reported by `Status` and `/version`. Clients
/// gate features on it: Kubernetes turns watch progress requests on only from 3.5.13, and
/// Concord answers them the way 3.5.13 does (once every watch of the stream is synced).
pub const ETCD_API_VERSION: &str = "3.5.13";
/// The cluster version `/version` reports, as etcd does (major.minor.0).
pub const ETCD_CLUSTER_VERSION: &str = "3.5.0";

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

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(&self, req: Request<AlarmRequest>) -> Result<Response<AlarmResponse>, Status> {
        if req.get_ref().action != AlarmAction::Get as i32 {
            return Err(Status::unimplemented(
                "alarm activation is not supported yet: Concord raises no alarms",
            ));
        }
        Ok(Response::new(AlarmResponse {
            header: current_header(&self.ctx.node),
            alarms: Vec::new(),
        }))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let node = &self.ctx.node;
        let size = i64::try_from(node.disk_space()).unwrap_or(i64::MAX);
        Ok(Response::new(StatusResponse {
            header: current_header(node),
            version: ETCD_API_VERSION.into(),
            db_size: size,
            leader: node.leader().unwrap_or(0),
            raft_index: node.last_log_index(),
            raft_term: node.term(),
            raft_applied_index: node.applied_index(),
            errors: Vec::new(),
            db_size_in_use: size,
            is_learner: node.is_learner(),
        }))
    }
}
