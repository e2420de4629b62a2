//! The only writer of the state machine: turns one committed [`Command`] into changes of the
//! MVCC store and a [`CommandResult`]. Deterministic (no clocks, no randomness, no I/O besides
//! the store), so every member produces the same revisions and the same answers.

pub mod command;
pub mod kv;
pub mod txn;

pub use command::{Command, CommandBatch, CommandResult, CommandResults, Op, Outcome};

use prost::Message;

use crate::error::Error;
use crate::mvcc::WriteTxn;
use crate::pb::etcdserverpb::alarm_request::AlarmAction;
use crate::pb::etcdserverpb::request_op::Request as RequestOp;
use crate::pb::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, CompactionResponse,
    LeaseCheckpointResponse, LeaseGrantResponse, LeaseRevokeResponse, ResponseHeader, TxnRequest,
};
use crate::storage::meta_key;

/// What kind of request `cmd` is, for logs (never its keys or values).
pub fn kind(cmd: &Command) -> &'static str {
    match &cmd.op {
        Some(Op::Put(_)) => "put",
        Some(Op::DeleteRange(_)) => "delete_range",
        Some(Op::Txn(_)) => "txn",
        Some(Op::Compaction(_)) => "compaction",
        Some(Op::LeaseGrant(_)) => "lease_grant",
        Some(Op::LeaseCheckpoint(_)) => "lease_checkpoint",
        Some(Op::LeaseRevoke(_)) => "lease_revoke",
        Some(Op::MemberAttributes(_)) => "member_attributes",
        Some(Op::Alarm(_)) => "alarm",
        Some(Op::Batch(_)) => "batch",
        None => "none",
    }
}

/// Applies one command inside the apply batch `w` and closes its request (a batch: each of its
/// commands in order, each closing its own request).
pub fn apply(w: &mut WriteTxn<'_>, cmd: &Command) -> CommandResult {
    if let Some(Op::Batch(batch)) = &cmd.op {
        w.reserve_events(batch.commands.len());
        let results = batch.commands.iter().map(|c| apply(w, c)).collect();
        return CommandResult {
            result: Some(Outcome::Batch(CommandResults { results })),
        };
    }
    let nospace = w.has_alarm(AlarmType::Nospace as i32);
    let corrupt = w.has_alarm(AlarmType::Corrupt as i32);
    let outcome = match &cmd.op {
        // With CORRUPT raised, etcd's corrupt applier refuses every key and lease change.
        Some(
            Op::Put(_)
            | Op::DeleteRange(_)
            | Op::Txn(_)
            | Op::Compaction(_)
            | Op::LeaseGrant(_)
            | Op::LeaseRevoke(_),
        ) if corrupt => Err(Error::Corrupt),
        // With NOSPACE raised, etcd's capped applier refuses whatever could grow the store.
        Some(Op::Put(_) | Op::LeaseGrant(_)) if nospace => Err(Error::NoSpace),
        Some(Op::Txn(req)) if nospace && txn_writes(req) => Err(Error::NoSpace),
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
        Some(Op::MemberAttributes(attrs)) => {
            let mut key = meta_key::MEMBER_ATTRS.to_vec();
            key.extend(attrs.id.to_be_bytes());
            w.set_meta(&key, &attrs.encode_to_vec());
            Ok(Outcome::Done(true))
        }
        Some(Op::Alarm(req)) => Ok(Outcome::Alarm(alarm(w, req))),
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

/// Whether a txn puts anything in either branch (etcd's quota cost above zero).
pub fn txn_writes(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(&req.failure)
        .any(|op| match &op.request {
            Some(RequestOp::RequestPut(_)) => true,
            Some(RequestOp::RequestTxn(t)) => txn_writes(t),
            _ => false,
        })
}

/// Raises or clears an alarm; answers with the alarm concerned, as etcd does (nothing when
/// clearing an alarm that is not raised, or raising `NONE`).
fn alarm(w: &mut WriteTxn<'_>, req: &AlarmRequest) -> AlarmResponse {
    let member = AlarmMember {
        member_id: req.member_id,
        alarm: req.alarm,
    };
    let activate = req.action == AlarmAction::Activate as i32;
    let concerned = if activate {
        req.alarm != AlarmType::None as i32
    } else {
        w.set_alarm(req.member_id, req.alarm, false)
    };
    if activate && concerned {
        w.set_alarm(req.member_id, req.alarm, true);
    }
    AlarmResponse {
        header: Some(ResponseHeader::default()),
        alarms: if concerned { vec![member] } else { Vec::new() },
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
        Outcome::Alarm(r) => &mut r.header,
        Outcome::Error(_) | Outcome::Batch(_) | Outcome::Done(_) => return,
    };
    header.get_or_insert_with(Default::default).revision = revision;
}

#[cfg(test)]
mod tests;
