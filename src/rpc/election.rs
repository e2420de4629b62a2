//! `v3electionpb.Election`: Campaign, Proclaim, Leader, Observe, Resign, over the in-process
//! client (see `concurrency::election`).

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{fill_header, require_leader, status::status, Context};
use crate::concurrency::client::LocalClient;
use crate::concurrency::election;
use crate::pb::etcdserverpb::ResponseHeader;
use crate::pb::v3electionpb::election_server::Election;
use crate::pb::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};

/// etcd's error when a request lacks its leader key.
const MISSING_LEADER: &str = "\"leader\" field must be provided";

/// The Election service.
pub struct ElectionService {
    ctx: Context,
    client: LocalClient,
}

impl ElectionService {
    /// An Election service over `ctx`.
    pub fn new(ctx: Context) -> Self {
        let client = LocalClient::new(ctx.node.clone());
        ElectionService { ctx, client }
    }

    fn header(&self, h: ResponseHeader) -> Option<ResponseHeader> {
        let mut header = Some(h);
        fill_header(&self.ctx.node, &mut header);
        header
    }
}

fn leader_key(k: Option<LeaderKey>) -> Result<LeaderKey, Status> {
    k.ok_or_else(|| Status::invalid_argument(MISSING_LEADER))
}

type ObserveOut = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Election for ElectionService {
    async fn campaign(
        &self,
        req: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        // Checked now (a token of a login not yet applied here is waited for), resolved
        // again at each step of the operation.
        self.ctx.caller(&req).await?;
        let client = self.client.for_caller(self.ctx.credentials(&req));
        let r = req.into_inner();
        let (header, leader) = election::campaign(&client, &r.name, r.lease, &r.value)
            .await
            .map_err(status)?;
        Ok(Response::new(CampaignResponse {
            header: self.header(header),
            leader: Some(leader),
        }))
    }

    async fn proclaim(
        &self,
        req: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        // Checked now (a token of a login not yet applied here is waited for), resolved
        // again at each step of the operation.
        self.ctx.caller(&req).await?;
        let client = self.client.for_caller(self.ctx.credentials(&req));
        let r = req.into_inner();
        let leader = leader_key(r.leader)?;
        let header = election::proclaim(&client, &leader, &r.value)
            .await
            .map_err(status)?;
        Ok(Response::new(ProclaimResponse {
            header: self.header(header),
        }))
    }

    async fn leader(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        // Checked now (a token of a login not yet applied here is waited for), resolved
        // again at each step of the operation.
        self.ctx.caller(&req).await?;
        let client = self.client.for_caller(self.ctx.credentials(&req));
        let mut resp = election::leader(&client, &req.into_inner().name)
            .await
            .map_err(status)?;
        resp.header = self.header(resp.header.unwrap_or_default());
        Ok(Response::new(resp))
    }

    async fn observe(&self, req: Request<LeaderRequest>) -> Result<Response<ObserveOut>, Status> {
        require_leader(&self.ctx.node, &req)?;
        // Checked now (a token of a login not yet applied here is waited for), resolved
        // again at each step of the operation.
        self.ctx.caller(&req).await?;
        let client = self.client.for_caller(self.ctx.credentials(&req));
        let node = self.ctx.node.clone();
        let rx = election::observe(client, req.into_inner().name);
        let stream = ReceiverStream::new(rx).map(move |r| {
            r.map(|mut resp| {
                fill_header(&node, &mut resp.header);
                resp
            })
            .map_err(status)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn resign(
        &self,
        req: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        // Checked now (a token of a login not yet applied here is waited for), resolved
        // again at each step of the operation.
        self.ctx.caller(&req).await?;
        let client = self.client.for_caller(self.ctx.credentials(&req));
        let leader = leader_key(req.into_inner().leader)?;
        let header = election::resign(&client, &leader).await.map_err(status)?;
        Ok(Response::new(ResignResponse {
            header: self.header(header),
        }))
    }
}
