//! The only writer of the state machine: turns one committed [`Command`] into changes of the
//! MVCC store and a [`CommandResult`]. Deterministic (no clocks, no randomness, no I/O besides
//! the store), so every member produces the same revisions and the same answers. (The one
//! exception: an applied login registers its token in this member's memory, as in etcd.)
//!
//! Client commands are checked against the auth store first ([`access`]); auth commands
//! change it ([`crate::auth::AuthStore::apply`]).

pub mod access;
pub mod command;
pub mod kv;
pub mod txn;

pub use command::{
    Command, CommandBatch, CommandResult, CommandResults, EncodedCommand, Op, Outcome,
};

use prost::Message;

use crate::auth::AuthStore;
use crate::error::Error;
use crate::mvcc::WriteTxn;
use crate::pb::concordpb::AuthResult;
use crate::pb::etcdserverpb::alarm_request::AlarmAction;
use crate::pb::etcdserverpb::request_op::Request as RequestOp;
use crate::pb::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, CompactionResponse,
    LeaseCheckpointResponse, LeaseGrantResponse, LeaseRevokeResponse, ResponseHeader, TxnRequest,
};
use crate::storage::meta_key;

/// What kind of request `cmd` is, for logs (never its keys or values).
pub fn kind(cmd: &Command) -> &'static str {
    cmd.op.as_ref().map_or("none", kind_of)
}

/// What kind of request `op` is, for logs (never its keys, values or passwords).
pub fn kind_of(op: &Op) -> &'static str {
    match op {
        Op::Put(_) => "put",
        Op::DeleteRange(_) => "delete_range",
        Op::Txn(_) => "txn",
        Op::Compaction(_) => "compaction",
        Op::LeaseGrant(_) => "lease_grant",
        Op::LeaseCheckpoint(_) => "lease_checkpoint",
        Op::LeaseRevoke(_) => "lease_revoke",
        Op::MemberAttributes(_) => "member_attributes",
        Op::Alarm(_) => "alarm",
        Op::Batch(_) => "batch",
        Op::AuthEnable(_) => "auth_enable",
        Op::AuthDisable(_) => "auth_disable",
        Op::Authenticate(_) => "authenticate",
        Op::UserAdd(_) => "user_add",
        Op::UserDelete(_) => "user_delete",
        Op::UserChangePassword(_) => "user_change_password",
        Op::UserGrantRole(_) => "user_grant_role",
        Op::UserRevokeRole(_) => "user_revoke_role",
        Op::RoleAdd(_) => "role_add",
        Op::RoleDelete(_) => "role_delete",
        Op::RoleGrantPermission(_) => "role_grant_permission",
        Op::RoleRevokePermission(_) => "role_revoke_permission",
    }
}

/// A storage failure while a command was applied (a record that could not be read back, or
/// did not decode). The member cannot answer the command as the other members do, nor leave
/// out what the command writes after the failure, nor keep what it wrote before: its state no
/// longer follows the log. It must stop, as etcd panics there; the batch `w` is dropped
/// uncommitted (see [`WriteTxn`]'s drop), and a restart applies the entry again from the log.
#[derive(Debug, thiserror::Error)]
#[error("storage failure while applying a {request} request of log entry {index}")]
pub struct ApplyFailed {
    /// The kind of request ([`kind_of`]).
    pub request: &'static str,
    /// The log entry holding it.
    pub index: u64,
}

/// Applies one command inside the apply batch `w` and closes its request (a batch: each of its
/// commands in order, each closing its own request).
///
/// `index` is the command's Raft log index (a login's token names it).
///
/// # Errors
/// [`ApplyFailed`] on a storage failure: the member must stop.
pub fn apply(
    w: &mut WriteTxn<'_>,
    auth: &AuthStore,
    index: u64,
    cmd: &Command,
) -> Result<CommandResult, ApplyFailed> {
    if let Some(Op::Batch(batch)) = &cmd.op {
        w.reserve_events(batch.commands.len());
        let results = batch
            .commands
            .iter()
            .map(|c| apply(w, auth, index, c))
            .collect::<Result<_, _>>()?;
        return Ok(CommandResult {
            result: Some(Outcome::Batch(CommandResults { results })),
        });
    }
    // A client's command is checked against the auth store at this point of the log; the
    // member's own commands carry no caller.
    if let (Some(op), Some(caller)) = (&cmd.op, &cmd.caller) {
        if auth.enabled() {
            if let Err(e) = access::check(w, &auth.current(), caller, op) {
                w.end_request();
                return Ok(CommandResult {
                    result: Some(Outcome::Error(e.code())),
                });
            }
        }
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
        Some(
            op @ (Op::AuthEnable(_)
            | Op::AuthDisable(_)
            | Op::Authenticate(_)
            | Op::UserAdd(_)
            | Op::UserDelete(_)
            | Op::UserChangePassword(_)
            | Op::UserGrantRole(_)
            | Op::UserRevokeRole(_)
            | Op::RoleAdd(_)
            | Op::RoleDelete(_)
            | Op::RoleGrantPermission(_)
            | Op::RoleRevokePermission(_)),
        ) => auth.apply(w, op, cmd.caller.as_ref(), index).map(|token| {
            Outcome::Auth(AuthResult {
                token: token.unwrap_or_default(),
            })
        }),
        Some(Op::Batch(_)) | None => Ok(Outcome::Error(Error::Storage.code())),
    };
    if matches!(outcome, Err(Error::Storage)) {
        return Err(ApplyFailed {
            request: kind(cmd),
            index,
        });
    }
    let revision = w.end_request();
    let outcome = match outcome {
        Ok(mut o) => {
            set_revision(&mut o, revision);
            o
        }
        Err(e) => Outcome::Error(e.code()),
    };
    Ok(CommandResult {
        result: Some(outcome),
    })
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
        Outcome::Error(_) | Outcome::Batch(_) | Outcome::Done(_) | Outcome::Auth(_) => return,
    };
    header.get_or_insert_with(Default::default).revision = revision;
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod auth_tests;

#[cfg(test)]
mod txn_tests;
