//! `etcdserverpb.Lease`: LeaseGrant, LeaseRevoke, LeaseKeepAlive, LeaseTimeToLive, LeaseLeases.
//! Grants and revokes go through the Raft log; keep-alives and remaining TTLs are answered by the
//! leader's lease clock (followers forward them).

use std::pin::Pin;

use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::{current_header, fill_header, require_leader, status::status, Context};
use crate::apply::{Command, Op, Outcome};
use crate::auth::{needs, Access, Caller};
use crate::error::Error;
use crate::lease::MAX_LEASE_TTL;
use crate::pb::etcdserverpb::lease_server::Lease;
use crate::pb::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};

/// The Lease service.
pub struct LeaseService {
    ctx: Context,
}

impl LeaseService {
    /// A Lease service over `ctx`.
    pub fn new(ctx: Context) -> Self {
        LeaseService { ctx }
    }
}

type KeepAliveOut = Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        req: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        let caller = self.ctx.caller(&req).await?;
        let mut r = req.into_inner();
        let node = &self.ctx.node;
        if r.ttl > MAX_LEASE_TTL {
            return Err(status(Error::LeaseTtlTooLarge));
        }
        r.ttl = node.lessor().granted_ttl(r.ttl);
        if r.id == 0 {
            r.id = node.lessor().next_id();
        }
        let (id, ttl) = (r.id, r.ttl);
        let Outcome::LeaseGrant(mut resp) = node
            .propose(Command::from_client(Op::LeaseGrant(r), caller))
            .await
            .map_err(status)?
        else {
            return Err(status(Error::Storage));
        };
        // The granting leader starts the lease's clock now (if it has taken the leases over;
        // else its expiry loop starts it at its next tick).
        if let (true, Some(term)) = (node.leader() == Some(node.id), node.lessor().term()) {
            node.lessor().renew(id, ttl, term);
        }
        fill_header(node, &mut resp.header);
        Ok(Response::new(resp))
    }

    async fn lease_revoke(
        &self,
        req: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        let caller = self.ctx.caller(&req).await?;
        let node = &self.ctx.node;
        let Outcome::LeaseRevoke(mut resp) = node
            .propose(Command::from_client(
                Op::LeaseRevoke(req.into_inner()),
                caller,
            ))
            .await
            .map_err(status)?
        else {
            return Err(status(Error::Storage));
        };
        fill_header(node, &mut resp.header);
        Ok(Response::new(resp))
    }

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<KeepAliveOut>, Status> {
        require_leader(&self.ctx.node, &req)?;
        self.ctx.caller(&req).await?;
        // Resolved again for every keep-alive, as etcd checks each request.
        let credentials = self.ctx.credentials(&req);
        let mut incoming = req.into_inner();
        let ctx = self.ctx.clone();
        let node = self.ctx.node.clone();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            while let Ok(Some(r)) = incoming.message().await {
                let allowed =
                    node.auth()
                        .resolve(&credentials)
                        .map_err(status)
                        .and_then(|caller| {
                            check_lease_keys(&ctx, caller.as_ref(), r.id, Access::Write)
                        });
                let renewed = match allowed {
                    Ok(()) => node.lease_renew(r.id).await.map_err(status),
                    Err(e) => Err(e),
                };
                let reply = match renewed {
                    Ok(ttl) => Ok(LeaseKeepAliveResponse {
                        header: current_header(&node),
                        id: r.id,
                        ttl,
                    }),
                    Err(e) => Err(e),
                };
                let failed = reply.is_err();
                if tx.send(reply).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        let caller = self.ctx.caller(&req).await?;
        let node = &self.ctx.node;
        let r = req.into_inner();
        let id = r.id;
        if r.keys {
            check_lease_keys(&self.ctx, caller.as_ref(), id, Access::Read)?;
        } else {
            self.ctx.check(caller.as_ref(), Vec::new)?;
        }
        let mut resp = match node.lease_time_to_live(r).await {
            Ok(resp) => resp,
            // As etcd: an unknown (or expired) lease is answered with TTL -1, not an error.
            Err(Error::LeaseNotFound) => LeaseTimeToLiveResponse {
                id,
                ttl: -1,
                ..Default::default()
            },
            Err(e) => return Err(status(e)),
        };
        // As etcd: the answering leader's revision, this member's ids and term.
        if resp.header.as_ref().is_some_and(|h| h.revision != 0) {
            fill_header(node, &mut resp.header);
        } else {
            resp.header = current_header(node);
        }
        Ok(Response::new(resp))
    }

    async fn lease_leases(
        &self,
        req: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        let caller = self.ctx.caller(&req).await?;
        let node = &self.ctx.node;
        node.read_index().await.map_err(status)?;
        // etcd 3.5.28 and on: root, or read access to every key of every lease.
        if self.ctx.check_admin(caller.as_ref()).is_err() {
            for (id, _) in node.mvcc().leases() {
                check_lease_keys(&self.ctx, caller.as_ref(), id, Access::Read)?;
            }
            self.ctx.check(caller.as_ref(), Vec::new)?;
        }
        let leases = node
            .mvcc()
            .leases()
            .into_iter()
            .map(|(id, _)| LeaseStatus { id })
            .collect();
        Ok(Response::new(LeaseLeasesResponse {
            header: current_header(node),
            leases,
        }))
    }
}

/// etcd's lease rules (3.5.28 and on): root, or `access` to every key attached to lease `id`
/// (an authenticated user for a lease without keys).
fn check_lease_keys(
    ctx: &Context,
    caller: Option<&Caller>,
    id: i64,
    access: Access,
) -> Result<(), Status> {
    if !ctx.node.auth().enabled() {
        return Ok(());
    }
    if caller.is_some_and(|c| ctx.node.auth().current().is_root(&c.user)) {
        return Ok(());
    }
    ctx.check(caller, || {
        let keys = ctx
            .node
            .mvcc()
            .with_lease(id, |l| l.keys.iter().cloned().collect::<Vec<_>>());
        needs::keys(access, keys.unwrap_or_default())
    })
}
