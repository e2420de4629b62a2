//! `etcdserverpb.KV`: Range, RangeStream, Put, DeleteRange, Txn, Compact.

use std::pin::Pin;

use futures::Stream;
use tonic::{Request, Response, Status};

use super::{
    bulk_reads, disk_reads, fill_header, require_leader, status::status, validate, Context,
};
use crate::apply::{txn, Command, Op, Outcome};
use crate::auth::{needs, Caller};
use crate::error::Error;
use crate::mvcc;
use crate::pb::etcdserverpb::kv_server::Kv;
use crate::pb::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RangeStreamResponse, TxnRequest, TxnResponse,
};

/// Bytes of key-values per `RangeStream` chunk.
const STREAM_CHUNK_BYTES: usize = 1 << 20;

/// The KV service.
pub struct KvService {
    ctx: Context,
}

impl KvService {
    /// A KV service over `ctx`.
    pub fn new(ctx: Context) -> Self {
        KvService { ctx }
    }

    /// A range for `caller`: its read access is checked once this member has applied
    /// everything acknowledged before the read (a permission revoked before it is seen). One that
    /// reads many values reads them on a bulk thread, below the writes' priority (`bulk_reads`).
    async fn read_range(
        &self,
        caller: Option<&Caller>,
        r: &RangeRequest,
    ) -> Result<RangeResponse, Status> {
        validate::range(r).map_err(status)?;
        let corrupt = crate::pb::etcdserverpb::AlarmType::Corrupt as i32;
        if self.ctx.node.mvcc().has_alarm(corrupt) {
            return Err(status(crate::error::Error::Corrupt));
        }
        if !r.serializable {
            self.ctx.node.read_index().await.map_err(status)?;
        }
        self.ctx.check(caller, || needs::range(r))?;
        let mvcc = self.ctx.node.mvcc();
        // While reads wait for the disk, every range reads off the state's lock (small ones
        // right here, off the worker); otherwise only those reading many values.
        let started = disk_reads::run(|slow| {
            let pending_from = if slow { 0 } else { bulk_reads::BULK_VALUES };
            match mvcc.range_start(r, pending_from)? {
                mvcc::RangeStart::Pending(p) if p.values(r) < bulk_reads::BULK_VALUES => {
                    p.finish(r).map(mvcc::RangeStart::Done)
                }
                started => Ok(started),
            }
        });
        let mut resp = match started.map_err(status)? {
            mvcc::RangeStart::Done(resp) => resp,
            mvcc::RangeStart::Pending(pending) => {
                let req = r.clone();
                // The pending range (its view) comes back to be dropped here, not on a thread
                // of low priority (see `PendingRange::finish`).
                let (read, pending) = bulk_reads::run(move || (pending.finish(&req), pending))
                    .await
                    .ok_or_else(unexpected)?;
                drop(pending);
                read.map_err(status)?
            }
        };
        fill_header(&self.ctx.node, &mut resp.header);
        Ok(resp)
    }

    /// Proposes a client's write; applying it checks the caller's permissions.
    async fn write(&self, caller: Option<Caller>, op: Op) -> Result<Outcome, Status> {
        self.ctx
            .node
            .propose(Command::from_client(op, caller))
            .await
            .map_err(status)
    }
}

fn unexpected() -> Status {
    status(Error::Storage)
}

type RangeStreamOut = Pin<Box<dyn Stream<Item = Result<RangeStreamResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Kv for KvService {
    #[tracing::instrument(skip_all)]
    async fn range(&self, req: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        if !req.get_ref().serializable && self.ctx.node.is_learner() {
            return Err(super::status::status(Error::NotSupportedForLearner));
        }
        let caller = self.ctx.caller(&req).await?;
        let resp = self.read_range(caller.as_ref(), req.get_ref()).await?;
        Ok(Response::new(resp))
    }

    /// Streams a range in chunks, all read at one revision; `header`, `more` and `count` ride on
    /// the last chunk, so concatenating the chunks gives exactly the `Range` answer.
    async fn range_stream(
        &self,
        req: Request<RangeRequest>,
    ) -> Result<Response<RangeStreamOut>, Status> {
        require_leader(&self.ctx.node, &req)?;
        let caller = self.ctx.caller(&req).await?;
        let mut full = self.read_range(caller.as_ref(), req.get_ref()).await?;
        let mut chunks = Vec::new();
        let mut current = Vec::new();
        let mut size = 0;
        for kv in std::mem::take(&mut full.kvs) {
            size += kv.key.len() + kv.value.len() + 32;
            current.push(kv);
            if size >= STREAM_CHUNK_BYTES {
                chunks.push(std::mem::take(&mut current));
                size = 0;
            }
        }
        let mut responses: Vec<Result<RangeStreamResponse, Status>> = chunks
            .into_iter()
            .map(|kvs| {
                Ok(RangeStreamResponse {
                    range_response: Some(RangeResponse {
                        kvs,
                        ..Default::default()
                    }),
                })
            })
            .collect();
        full.kvs = current;
        responses.push(Ok(RangeStreamResponse {
            range_response: Some(full),
        }));
        Ok(Response::new(Box::pin(futures::stream::iter(responses))))
    }

    #[tracing::instrument(skip_all)]
    async fn put(&self, req: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        let caller = self.ctx.caller(&req).await?;
        let r = req.into_inner();
        validate::put(&r).map_err(status)?;
        let Outcome::Put(mut resp) = self.write(caller, Op::Put(r)).await? else {
            return Err(unexpected());
        };
        fill_header(&self.ctx.node, &mut resp.header);
        Ok(Response::new(resp))
    }

    #[tracing::instrument(skip_all)]
    async fn delete_range(
        &self,
        req: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        let caller = self.ctx.caller(&req).await?;
        let r = req.into_inner();
        validate::delete_range(&r).map_err(status)?;
        let Outcome::DeleteRange(mut resp) = self.write(caller, Op::DeleteRange(r)).await? else {
            return Err(unexpected());
        };
        fill_header(&self.ctx.node, &mut resp.header);
        Ok(Response::new(resp))
    }

    #[tracing::instrument(skip_all)]
    async fn txn(&self, req: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        let caller = self.ctx.caller(&req).await?;
        let r = req.into_inner();
        validate::txn(&r, self.ctx.max_txn_ops).map_err(status)?;
        let mut resp = if txn::is_read_only(&r) {
            // Read-only txns are served like ranges: after the read index, from the local store.
            if !is_serializable(&r) {
                self.ctx.node.read_index().await.map_err(status)?;
            }
            self.ctx.check(caller.as_ref(), || needs::txn(&r))?;
            let mvcc = self.ctx.node.mvcc();
            disk_reads::run(|_| txn::execute(&mut mvcc.read()?, &r)).map_err(status)?
        } else {
            let Outcome::Txn(resp) = self.write(caller, Op::Txn(r)).await? else {
                return Err(unexpected());
            };
            resp
        };
        fill_header(&self.ctx.node, &mut resp.header);
        Ok(Response::new(resp))
    }

    #[tracing::instrument(skip_all)]
    async fn compact(
        &self,
        req: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        let caller = self.ctx.caller(&req).await?;
        let req = req.into_inner();
        let (physical, revision) = (req.physical, req.revision);
        let Outcome::Compaction(mut resp) = self.write(caller, Op::Compaction(req)).await? else {
            return Err(unexpected());
        };
        // etcd's `physical`: answered once this member has applied the compaction and its
        // compacted revisions are gone from its disk too (they are deleted in the background,
        // in batches). Bounded, in case the deleting thread is gone.
        let mvcc = self.ctx.node.mvcc();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(300);
        while physical
            && (mvcc.compacted_revision() < revision || mvcc.compaction_pending() > 0)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        fill_header(&self.ctx.node, &mut resp.header);
        Ok(Response::new(resp))
    }
}

/// As etcd's `isTxnSerializable`: every range of both branches is serializable.
fn is_serializable(r: &TxnRequest) -> bool {
    use crate::pb::etcdserverpb::request_op::Request as R;
    r.success
        .iter()
        .chain(&r.failure)
        .all(|op| match &op.request {
            Some(R::RequestRange(q)) => q.serializable,
            _ => false,
        })
}
