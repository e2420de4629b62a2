//! `etcdserverpb.Cluster`: MemberList. Membership changes (add, remove, update, promote) answer
//! `Unimplemented` until their issue lands.

use tonic::{Request, Response, Status};

use super::{current_header, Context};
use crate::pb::etcdserverpb::cluster_server::Cluster;
use crate::pb::etcdserverpb::{Member, MemberListRequest, MemberListResponse};

/// The Cluster service.
pub struct ClusterService {
    ctx: Context,
}

impl ClusterService {
    /// A Cluster service over `ctx`.
    pub fn new(ctx: Context) -> Self {
        ClusterService { ctx }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_list(
        &self,
        _: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        let node = &self.ctx.node;
        let (nodes, voters) = node.members();
        let members = nodes
            .into_iter()
            .map(|(id, peer_url)| Member {
                id,
                name: self.ctx.member_names.get(&id).cloned().unwrap_or_default(),
                peer_ur_ls: vec![peer_url],
                client_ur_ls: if id == node.id {
                    self.ctx.client_urls.clone()
                } else {
                    Vec::new()
                },
                is_learner: !voters.contains(&id),
            })
            .collect();
        Ok(Response::new(MemberListResponse {
            header: current_header(node),
            members,
        }))
    }
}
