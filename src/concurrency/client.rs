//! An in-process client of this member: the same paths a gRPC request takes (validation,
//! proposal or read index, the watch hub), without the network.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::apply::{txn, Command, Op, Outcome};
use crate::auth::{needs, Caller, Credentials, Need};
use crate::error::{Error, Result};
use crate::mvcc::{self, KeyRange};
use crate::pb::etcdserverpb::{
    DeleteRangeRequest, DeleteRangeResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use crate::pb::mvccpb::event::EventType;
use crate::pb::mvccpb::Event;
use crate::raft::RaftNode;
use crate::watch::{StreamMsg, WatchSpec};

/// A client of the local member.
#[derive(Clone)]
pub struct LocalClient {
    node: Arc<RaftNode>,
    /// Whose requests these are: `None` for the member's own, `Some(credentials)` for a
    /// client's (resolved at each request and checked as that client's own requests are).
    acting_for: Option<Credentials>,
}

impl LocalClient {
    /// A client of `node` acting for the member itself (no permission checks).
    pub fn new(node: Arc<RaftNode>) -> Self {
        LocalClient {
            node,
            acting_for: None,
        }
    }

    /// The same client acting for the sender of a Lock or Election request: its reads are
    /// checked here and its writes when applied, as if it had sent them itself (etcd's lock
    /// and election services call the KV API with the caller's credentials). The credentials
    /// are resolved at each request, so a wait that outlives an auth change is judged by the
    /// auth store of its moment.
    pub fn for_caller(&self, credentials: Credentials) -> Self {
        LocalClient {
            node: self.node.clone(),
            acting_for: Some(credentials),
        }
    }

    fn caller(&self) -> Result<Option<Caller>> {
        match &self.acting_for {
            Some(credentials) => self.node.auth().resolve(credentials),
            None => Ok(None),
        }
    }

    /// Checks reads after the read index (a permission revoked before the read is seen);
    /// `needs` is built only when there is something to check.
    fn check(&self, needs: impl FnOnce() -> Vec<Need>) -> Result<()> {
        if self.acting_for.is_none() || !self.node.auth().enabled() {
            return Ok(());
        }
        let caller = self.caller()?;
        crate::auth::check(&self.node.auth().current(), caller.as_ref(), &needs())
    }

    fn command(&self, op: Op) -> Result<Command> {
        Ok(match &self.acting_for {
            Some(_) => Command::from_client(op, self.caller()?),
            None => Command::new(op),
        })
    }

    /// A linearizable range.
    ///
    /// # Errors
    /// Those of the read index and of the range.
    pub async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        self.node.read_index().await?;
        self.check(|| needs::range(&req))?;
        let read = self.node.mvcc().read()?;
        mvcc::range(&read, &req)
    }

    /// Several ranges at one linearizable point: one read index for all of them.
    ///
    /// # Errors
    /// Those of the read index and of the ranges.
    pub async fn ranges<const N: usize>(
        &self,
        reqs: [&RangeRequest; N],
    ) -> Result<[RangeResponse; N]> {
        self.node.read_index().await?;
        for req in reqs {
            self.check(|| needs::range(req))?;
        }
        let read = self.node.mvcc().read()?;
        let mut out: [RangeResponse; N] = std::array::from_fn(|_| RangeResponse::default());
        for (slot, req) in out.iter_mut().zip(reqs) {
            *slot = mvcc::range(&read, req)?;
        }
        Ok(out)
    }

    /// A txn: read-only ones after the read index, others through the log.
    ///
    /// # Errors
    /// Those of the txn.
    pub async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        if txn::is_read_only(&req) {
            self.node.read_index().await?;
            self.check(|| needs::txn(&req))?;
            let mut read = self.node.mvcc().read()?;
            return txn::execute(&mut read, &req);
        }
        match self.node.propose(self.command(Op::Txn(req))?).await? {
            Outcome::Txn(r) => Ok(r),
            _ => Err(Error::Storage),
        }
    }

    /// Deletes one key.
    ///
    /// # Errors
    /// Those of the proposal.
    pub async fn delete(&self, key: &[u8]) -> Result<DeleteRangeResponse> {
        let req = DeleteRangeRequest {
            key: key.to_vec(),
            ..Default::default()
        };
        match self
            .node
            .propose(self.command(Op::DeleteRange(req))?)
            .await?
        {
            Outcome::DeleteRange(r) => Ok(r),
            _ => Err(Error::Storage),
        }
    }

    /// Watches `range` from revision `start` on the local hub (not checked: the lock and
    /// election paths watch only what they read, checked, just before).
    pub fn watch(&self, range: KeyRange, start: i64) -> LocalWatch {
        let hub = self.node.hub().clone();
        let stream = hub.new_stream();
        let (tx, rx) = mpsc::channel(64);
        let spec = WatchSpec {
            watch_id: 0,
            range,
            no_put: false,
            no_delete: false,
            prev_kv: false,
            fragment: false,
            progress_notify: false,
        };
        let id = hub.watch(stream, spec, start, tx);
        LocalWatch {
            rx,
            _guard: DropWatch { hub, stream, id },
        }
    }

    /// Waits until `key` is deleted at a revision after `after` (returns at once if history
    /// from there was compacted: the caller re-reads).
    ///
    /// # Errors
    /// [`Error::Stopped`] if the hub goes away.
    pub async fn wait_delete(&self, key: &[u8], after: i64) -> Result<()> {
        let mut w = self.watch(KeyRange::Single(key.to_vec()), after + 1);
        loop {
            match w.next().await? {
                None => return Ok(()),
                Some(events) if events.iter().any(|e| e.r#type == EventType::Delete as i32) => {
                    return Ok(())
                }
                Some(_) => {}
            }
        }
    }
}

/// A private watch on the local hub.
pub struct LocalWatch {
    rx: mpsc::Receiver<StreamMsg>,
    _guard: DropWatch,
}

impl LocalWatch {
    /// The next batch of events, in revision order; `None` if the start was compacted.
    ///
    /// # Errors
    /// [`Error::Stopped`] if the hub goes away.
    pub async fn next(&mut self) -> Result<Option<Vec<Event>>> {
        loop {
            match self.rx.recv().await.ok_or(Error::Stopped)? {
                StreamMsg::Events { events, .. } => return Ok(Some(events)),
                StreamMsg::Compacted { .. } => return Ok(None),
                _ => {}
            }
        }
    }
}

/// Removes a private watch when its waiter finishes or is dropped (client gone).
struct DropWatch {
    hub: Arc<crate::watch::WatchHub>,
    stream: u64,
    id: u64,
}

impl Drop for DropWatch {
    fn drop(&mut self) {
        self.hub.drop_stream(self.stream, &[self.id]);
    }
}
