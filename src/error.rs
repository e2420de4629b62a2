//! Domain errors of Concord. No gRPC here: `rpc::status` maps each variant to etcd's gRPC code
//! and exact message, which clients match on.

/// Every error a client request can end in. Each has a stable numeric code so that a follower
/// can carry the leader's answer across the peer protocol unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The requested revision was compacted away (`mvcc.ErrCompacted`).
    #[error("mvcc: required revision has been compacted")]
    Compacted,
    /// The requested revision is above the current revision (`mvcc.ErrFutureRev`).
    #[error("mvcc: required revision is a future revision")]
    FutureRevision,
    /// A request without a key.
    #[error("key is not provided")]
    EmptyKey,
    /// `ignore_value`/`ignore_lease` on a key that does not exist.
    #[error("key not found")]
    KeyNotFound,
    /// `ignore_value` together with a value.
    #[error("value is provided")]
    ValueProvided,
    /// `ignore_lease` together with a lease.
    #[error("lease is provided")]
    LeaseProvided,
    /// A txn with more compares or ops than `--max-txn-ops`.
    #[error("too many operations in txn request")]
    TooManyOps,
    /// A txn that writes one key twice (or puts a key it also deletes).
    #[error("duplicate key given in txn request")]
    DuplicateKey,
    /// A sort order or target outside the enum.
    #[error("invalid sort option")]
    InvalidSortOption,
    /// The lease named in a request does not exist.
    #[error("requested lease not found")]
    LeaseNotFound,
    /// The request is bigger than `--max-request-bytes`.
    #[error("request is too large")]
    RequestTooLarge,
    /// This member knows no leader.
    #[error("no leader")]
    NoLeader,
    /// The leader changed while the request was in flight.
    #[error("leader changed")]
    LeaderChanged,
    /// The request did not complete in time.
    #[error("request timed out")]
    Timeout,
    /// A lease with the requested id already exists.
    #[error("lease already exists")]
    LeaseExists,
    /// A lease TTL above etcd's maximum.
    #[error("too large lease TTL")]
    LeaseTtlTooLarge,
    /// A lock waiter's lease expired before it got the lock.
    #[error("session is expired")]
    SessionExpired,
    /// Proclaim by a candidate that no longer leads.
    #[error("election: not leader")]
    ElectionNotLeader,
    /// Nobody leads the election.
    #[error("election: no leader")]
    ElectionNoLeader,
    /// Too many proposals are waiting.
    #[error("too many requests")]
    TooManyRequests,
    /// The member is shutting down.
    #[error("server stopped")]
    Stopped,
    /// The storage failed; the member can no longer serve.
    #[error("storage failure")]
    Storage,
    /// The member is installing a snapshot from its leader; its state is readable again when
    /// that ends (reads are refused, not served from a half-replaced state).
    #[error("installing a snapshot")]
    Installing,
    /// A member ID that is not in the cluster.
    #[error("member not found")]
    MemberNotFound,
    /// A new or updated member's peer URLs belong to another member.
    #[error("Peer URLs already exists")]
    PeerUrlExists,
    /// Peer URLs that are not `http(s)://host:port`.
    #[error("given member URLs are invalid")]
    MemberBadUrls,
    /// Promotion of a member that already votes.
    #[error("can only promote a learner member")]
    MemberNotLearner,
    /// Promotion of a learner that has not caught up with the leader.
    #[error("can only promote a learner member which is in sync with leader")]
    LearnerNotReady,
    /// More learners than etcd allows (one).
    #[error("too many learner members in cluster")]
    TooManyLearners,
    /// A request a learner does not serve.
    #[error("rpc not supported for learner")]
    NotSupportedForLearner,
    /// A request only the leader serves (MoveLeader), sent to another member.
    #[error("not leader")]
    NotLeader,
    /// A leadership transfer to a member that cannot lead.
    #[error("bad leader transferee")]
    BadLeaderTransferee,
    /// The cluster cannot take the change now (another membership change is in flight).
    #[error("unhealthy cluster")]
    Unhealthy,
    /// The store is above `--quota-backend-bytes` (the NOSPACE alarm is raised).
    #[error("mvcc: database space exceeded")]
    NoSpace,
    /// The member found its data diverged from the cluster's (the CORRUPT alarm).
    #[error("corrupt cluster")]
    Corrupt,
    /// A membership change that would leave fewer started voters than a quorum.
    #[error("re-configuration failed due to not enough started members")]
    MemberNotEnoughStarted,
    /// MoveLeader did not complete in time.
    #[error("request timed out, leader transfer took too long")]
    LeaderTransferTimeout,
    /// AuthEnable without a `root` user.
    #[error("root user does not exist")]
    RootUserNotExist,
    /// AuthEnable while the `root` user lacks the `root` role.
    #[error("root user does not have root role")]
    RootRoleNotExist,
    /// UserAdd of a user that exists.
    #[error("user name already exists")]
    UserAlreadyExist,
    /// A request without a user (no token while auth is on, or an empty name).
    #[error("user name is empty")]
    UserEmpty,
    /// A user that does not exist.
    #[error("user name not found")]
    UserNotFound,
    /// RoleAdd of a role that exists.
    #[error("role name already exists")]
    RoleAlreadyExist,
    /// A role that does not exist.
    #[error("role name not found")]
    RoleNotFound,
    /// RoleAdd with an empty name.
    #[error("role name is empty")]
    RoleEmpty,
    /// RoleGrantPermission without a permission.
    #[error("permission not given")]
    PermissionNotGiven,
    /// A wrong user name or password.
    #[error("authentication failed, invalid user ID or password")]
    AuthFailed,
    /// The user lacks the permission the request needs.
    #[error("permission denied")]
    PermissionDenied,
    /// UserRevokeRole of a role the user does not have.
    #[error("role is not granted to the user")]
    RoleNotGranted,
    /// RoleRevokePermission of a permission the role does not have.
    #[error("permission is not granted to the role")]
    PermissionNotGranted,
    /// Authenticate while auth is off.
    #[error("authentication is not enabled")]
    AuthNotEnabled,
    /// A token that is unknown, expired or malformed.
    #[error("invalid auth token")]
    InvalidAuthToken,
    /// Deleting `root`, taking `root` from `root`, or an invalid permission range.
    #[error("invalid auth management")]
    InvalidAuthMgmt,
    /// The auth store changed since the request's credentials were checked.
    #[error("revision of auth store is old")]
    AuthOldRevision,
    /// Authenticate with a password for a user added with `no_password`.
    #[error("authentication failed, password was given for no password user")]
    NoPasswordUser,
    /// A login answered by a member that has the JWT public key only.
    #[error("token signing attempted with verify-only key")]
    JwtVerifyOnly,
}

impl Error {
    /// Every variant, for tests and for decoding codes.
    pub const ALL: [Error; 56] = [
        Error::Compacted,
        Error::FutureRevision,
        Error::EmptyKey,
        Error::KeyNotFound,
        Error::ValueProvided,
        Error::LeaseProvided,
        Error::TooManyOps,
        Error::DuplicateKey,
        Error::InvalidSortOption,
        Error::LeaseNotFound,
        Error::RequestTooLarge,
        Error::NoLeader,
        Error::LeaderChanged,
        Error::Timeout,
        Error::Stopped,
        Error::Storage,
        Error::LeaseExists,
        Error::LeaseTtlTooLarge,
        Error::SessionExpired,
        Error::ElectionNotLeader,
        Error::ElectionNoLeader,
        Error::TooManyRequests,
        Error::MemberNotFound,
        Error::PeerUrlExists,
        Error::MemberBadUrls,
        Error::MemberNotLearner,
        Error::LearnerNotReady,
        Error::TooManyLearners,
        Error::NotSupportedForLearner,
        Error::NotLeader,
        Error::BadLeaderTransferee,
        Error::Unhealthy,
        Error::NoSpace,
        Error::Corrupt,
        Error::LeaderTransferTimeout,
        Error::MemberNotEnoughStarted,
        Error::RootUserNotExist,
        Error::RootRoleNotExist,
        Error::UserAlreadyExist,
        Error::UserEmpty,
        Error::UserNotFound,
        Error::RoleAlreadyExist,
        Error::RoleNotFound,
        Error::RoleEmpty,
        Error::PermissionNotGiven,
        Error::AuthFailed,
        Error::PermissionDenied,
        Error::RoleNotGranted,
        Error::PermissionNotGranted,
        Error::AuthNotEnabled,
        Error::InvalidAuthToken,
        Error::InvalidAuthMgmt,
        Error::AuthOldRevision,
        Error::NoPasswordUser,
        Error::JwtVerifyOnly,
        Error::Installing,
    ];

    /// The stable wire code of this error (never 0, which means "no error").
    pub fn code(self) -> u32 {
        Self::ALL
            .iter()
            .position(|e| *e == self)
            .map_or(u32::MAX, |i| i as u32 + 1)
    }

    /// The error with the given wire code; unknown codes become [`Error::Storage`].
    pub fn from_code(code: u32) -> Self {
        (code as usize)
            .checked_sub(1)
            .and_then(|i| Self::ALL.get(i).copied())
            .unwrap_or(Error::Storage)
    }
}

/// Result with a domain [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_for_every_variant() {
        for e in Error::ALL {
            assert_ne!(e.code(), 0);
            assert_eq!(Error::from_code(e.code()), e);
        }
    }
}
