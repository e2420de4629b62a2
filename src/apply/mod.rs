//! The only writer of the state machine: turns one committed [`Command`] into changes of the
//! MVCC store and a [`CommandResult`]. Deterministic (no clocks, no randomness, no I/O besides
//! the store), so every member produces the same revisions and the same answers.

pub mod command;
pub mod kv;
pub mod txn;

pub use command::{Command, CommandBatch, CommandResult, CommandResults, Op, Outcome};

use crate::error::Error;
use crate::mvcc::WriteTxn;
use crate::pb::etcdserverpb::{
    CompactionResponse, LeaseCheckpointResponse, LeaseGrantResponse, LeaseRevokeResponse,
    ResponseHeader,
};

/// Applies one command inside the apply batch `w` and closes its request (a batch: each of its
/// commands in order, each closing its own request).
pub fn apply(w: &mut WriteTxn<'_>, cmd: &Command) -> CommandResult {
    if let Some(Op::Batch(batch)) = &cmd.op {
        let results = batch.commands.iter().map(|c| apply(w, c)).collect();
        return CommandResult {
            result: Some(Outcome::Batch(CommandResults { results })),
        };
    }
    let outcome = match &cmd.op {
        Some(Op::Put(req)) => kv::put(w, req).map(Outcome::Put),
        Some(Op::DeleteRange(req)) => kv::delete_range(w, req).map(Outcome::DeleteRange),
        Some(Op::Txn(req)) => txn::execute(w, req).map(Outcome::Txn),
        Some(Op::Compaction(req)) => w.compact(req.revision).map(|()| {
            Outcome::Compaction(CompactionResponse {
                header: Some(ResponseHeader::default()),
            })
        }),
        Some(Op::LeaseGrant(req)) => w.grant_lease(req.id, req.ttl).map(|()| {
            Outcome::LeaseGrant(LeaseGrantResponse {
                header: Some(ResponseHeader::default()),
                id: req.id,
                ttl: req.ttl,
                error: String::new(),
            })
        }),
        Some(Op::LeaseCheckpoint(req)) => {
            for c in &req.checkpoints {
                w.checkpoint_lease(c.id, c.remaining_ttl);
            }
            Ok(Outcome::LeaseCheckpoint(LeaseCheckpointResponse {
                header: Some(ResponseHeader::default()),
            }))
        }
        Some(Op::LeaseRevoke(req)) => w.revoke_lease(req.id).map(|()| {
            Outcome::LeaseRevoke(LeaseRevokeResponse {
                header: Some(ResponseHeader::default()),
            })
        }),
        Some(Op::Batch(_)) | None => Ok(Outcome::Error(Error::Storage.code())),
    };
    let revision = w.end_request();
    let outcome = match outcome {
        Ok(mut o) => {
            set_revision(&mut o, revision);
            o
        }
        Err(e) => Outcome::Error(e.code()),
    };
    CommandResult {
        result: Some(outcome),
    }
}

fn set_revision(o: &mut Outcome, revision: i64) {
    let header = match o {
        Outcome::Put(r) => &mut r.header,
        Outcome::DeleteRange(r) => &mut r.header,
        Outcome::Txn(r) => &mut r.header,
        Outcome::Compaction(r) => &mut r.header,
        Outcome::LeaseGrant(r) => &mut r.header,
        Outcome::LeaseRevoke(r) => &mut r.header,
        Outcome::LeaseCheckpoint(r) => &mut r.header,
        Outcome::Error(_) | Outcome::Batch(_) => return,
    };
    header.get_or_insert_with(Default::default).revision = revision;
}

#[cfg(test)]
mod tests;
