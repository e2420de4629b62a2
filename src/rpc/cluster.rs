//! `etcdserverpb.Cluster`: the member list and etcd's membership changes (add, remove, update,
//! promote), made by the leader through Raft; see `raft::membership`.

use tonic::{Request, Response, Status};

use super::{fill_header, status, Context};
use crate::pb::concordpb::member_change::Change;
use crate::pb::concordpb::MemberChange;
use crate::pb::etcdserverpb::cluster_server::Cluster;
use crate::pb::etcdserverpb::ResponseHeader;
use crate::pb::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};

/// The Cluster service.
pub struct ClusterService {
    ctx: Context,
}

impl ClusterService {
    /// A Cluster service over `ctx`.
    pub fn new(ctx: Context) -> Self {
        ClusterService { ctx }
    }

    /// The members, with the initial members' names from `--initial-cluster` and this member's
    /// client URLs until the members have published their own.
    fn members(&self) -> Vec<Member> {
        let mut members = self.ctx.node.member_list();
        for m in &mut members {
            if m.name.is_empty() {
                if let Some(name) = self.ctx.member_names.get(&m.id) {
                    m.name.clone_from(name);
                }
            }
            if m.id == self.ctx.node.id && m.client_ur_ls.is_empty() {
                m.client_ur_ls.clone_from(&self.ctx.client_urls);
            }
        }
        members
    }

    /// etcd's Cluster answers carry no revision: cluster, member and term only.
    fn header(&self) -> Option<ResponseHeader> {
        let mut header = None;
        fill_header(&self.ctx.node, &mut header);
        header
    }

    async fn change(&self, change: Change) -> Result<(Member, Vec<Member>), Status> {
        self.ctx
            .node
            .change_members(MemberChange {
                change: Some(change),
            })
            .await
            .map_err(status::status)
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        req: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        self.ctx.require_admin(&req).await?;
        let (member, members) = self.change(Change::Add(req.into_inner())).await?;
        Ok(Response::new(MemberAddResponse {
            header: self.header(),
            member: Some(member),
            members,
        }))
    }

    async fn member_remove(
        &self,
        req: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        self.ctx.require_admin(&req).await?;
        let (_, members) = self.change(Change::Remove(req.into_inner())).await?;
        Ok(Response::new(MemberRemoveResponse {
            header: self.header(),
            members,
        }))
    }

    async fn member_update(
        &self,
        req: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        self.ctx.require_admin(&req).await?;
        let (_, members) = self.change(Change::Update(req.into_inner())).await?;
        Ok(Response::new(MemberUpdateResponse {
            header: self.header(),
            members,
        }))
    }

    async fn member_list(
        &self,
        req: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        // etcd 3.5.28 and on: an authenticated user.
        let caller = self.ctx.caller(&req).await?;
        self.ctx.check(caller.as_ref(), Vec::new)?;
        if req.get_ref().linearizable {
            self.ctx.node.read_index().await.map_err(status::status)?;
        }
        Ok(Response::new(MemberListResponse {
            header: self.header(),
            members: self.members(),
        }))
    }

    async fn member_promote(
        &self,
        req: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        self.ctx.require_admin(&req).await?;
        let (_, members) = self.change(Change::Promote(req.into_inner())).await?;
        Ok(Response::new(MemberPromoteResponse {
            header: self.header(),
            members,
        }))
    }
}
