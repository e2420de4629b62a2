//! Permission checks of client commands when they are applied, against the auth store at that
//! point of the log (etcd's auth applier): a user whose role was revoked by an earlier entry is
//! denied even if the edge let the request through.

use crate::auth::{self, needs, AuthState, Caller, Need};
use crate::error::Result;
use crate::mvcc::WriteTxn;
use crate::pb::concordpb::command::Op;

/// Writes to every key already attached to the leases in `leases` (a put that attaches a key to
/// a lease, or a revoke, changes what those keys' lease does), unless the caller is root.
fn lease_needs(w: &WriteTxn<'_>, s: &AuthState, caller: &Caller, leases: &[i64]) -> Vec<Need> {
    if s.is_root(&caller.user) {
        return Vec::new();
    }
    needs::keys(
        auth::Access::Write,
        leases.iter().flat_map(|id| w.lease_keys(*id)),
    )
}

/// Checks that `caller` may apply `op` (auth commands check themselves: see
/// [`auth::AuthStore::apply`]).
///
/// # Errors
/// Those of [`auth::check`] and [`auth::check_admin`].
pub fn check(w: &WriteTxn<'_>, s: &AuthState, caller: &Caller, op: &Op) -> Result<()> {
    if !s.enabled {
        return Ok(());
    }
    let who = Some(caller);
    match op {
        Op::Put(r) => {
            let mut n = needs::put(r);
            if r.lease != 0 {
                n.extend(lease_needs(w, s, caller, &[r.lease]));
            }
            auth::check(s, who, &n)
        }
        Op::DeleteRange(r) => auth::check(s, who, &needs::delete_range(r)),
        Op::Txn(r) => {
            let mut n = needs::txn(r);
            n.extend(lease_needs(w, s, caller, &needs::txn_leases(r)));
            auth::check(s, who, &n)
        }
        Op::LeaseRevoke(r) => {
            let n = lease_needs(w, s, caller, &[r.id]);
            if n.is_empty() && !caller.user.is_empty() {
                return Ok(());
            }
            auth::check(s, who, &n)
        }
        // etcd 3.5.28 and on: any authenticated user may grant a lease.
        Op::LeaseGrant(_) if caller.user.is_empty() => Err(crate::error::Error::UserEmpty),
        // etcd 3.5.28 and on: compaction and alarm changes are for root.
        Op::Compaction(_) | Op::Alarm(_) => auth::check_admin(s, who),
        _ => Ok(()),
    }
}
