//! `v3lockpb.Lock`: Lock and Unlock, over the in-process client (see `concurrency::lock`).

use tonic::{Request, Response, Status};

use super::{fill_header, require_leader, status::status, Context};
use crate::concurrency::client::LocalClient;
use crate::concurrency::lock;
use crate::pb::v3lockpb::lock_server::Lock;
use crate::pb::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};

/// The Lock service.
pub struct LockService {
    ctx: Context,
    client: LocalClient,
}

impl LockService {
    /// A Lock service over `ctx`.
    pub fn new(ctx: Context) -> Self {
        let client = LocalClient::new(ctx.node.clone());
        LockService { ctx, client }
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(&self, req: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        // Checked now (a token of a login not yet applied here is waited for), resolved
        // again at each step of the operation.
        self.ctx.caller(&req).await?;
        let client = self.client.for_caller(self.ctx.credentials(&req));
        let r = req.into_inner();
        let (header, key) = lock::lock(&client, &r.name, r.lease)
            .await
            .map_err(status)?;
        let mut header = Some(header);
        fill_header(&self.ctx.node, &mut header);
        Ok(Response::new(LockResponse { header, key }))
    }

    async fn unlock(
        &self,
        req: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        // Checked now (a token of a login not yet applied here is waited for), resolved
        // again at each step of the operation.
        self.ctx.caller(&req).await?;
        let client = self.client.for_caller(self.ctx.credentials(&req));
        let header = lock::unlock(&client, &req.into_inner().key)
            .await
            .map_err(status)?;
        let mut header = Some(header);
        fill_header(&self.ctx.node, &mut header);
        Ok(Response::new(UnlockResponse { header }))
    }
}
