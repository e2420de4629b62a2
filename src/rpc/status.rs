//! THE catalogue: every domain error as etcd 3.5 puts it on the wire (gRPC code and exact
//! `etcdserver: ...` text; clients match on both).

use tonic::{Code, Status};

use crate::error::Error;

/// etcd's gRPC code and message for a domain error.
pub fn code_and_message(e: Error) -> (Code, &'static str) {
    match e {
        Error::Compacted => (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted",
        ),
        Error::FutureRevision => (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision",
        ),
        Error::EmptyKey => (Code::InvalidArgument, "etcdserver: key is not provided"),
        Error::KeyNotFound => (Code::InvalidArgument, "etcdserver: key not found"),
        Error::ValueProvided => (Code::InvalidArgument, "etcdserver: value is provided"),
        Error::LeaseProvided => (Code::InvalidArgument, "etcdserver: lease is provided"),
        Error::TooManyOps => (
            Code::InvalidArgument,
            "etcdserver: too many operations in txn request",
        ),
        Error::DuplicateKey => (
            Code::InvalidArgument,
            "etcdserver: duplicate key given in txn request",
        ),
        Error::InvalidSortOption => (Code::InvalidArgument, "etcdserver: invalid sort option"),
        Error::LeaseNotFound => (Code::NotFound, "etcdserver: requested lease not found"),
        Error::RequestTooLarge => (Code::InvalidArgument, "etcdserver: request is too large"),
        Error::NoLeader => (Code::Unavailable, "etcdserver: no leader"),
        Error::LeaderChanged => (Code::Unavailable, "etcdserver: leader changed"),
        Error::Timeout => (Code::Unavailable, "etcdserver: request timed out"),
        Error::Stopped => (Code::Unavailable, "etcdserver: server stopped"),
        Error::TooManyRequests => (Code::ResourceExhausted, "etcdserver: too many requests"),
        Error::Storage => (Code::Unknown, "etcdserver: storage failure"),
        // Not an etcd error (etcd swaps its database in at once): Unavailable, which clients
        // retry, on this member or another.
        Error::Installing => (Code::Unavailable, "etcdserver: installing a snapshot"),
        Error::LeaseExists => (Code::FailedPrecondition, "etcdserver: lease already exists"),
        Error::LeaseTtlTooLarge => (Code::OutOfRange, "etcdserver: too large lease TTL"),
        // Not an etcdserver error: etcd's v3lock returns clientv3/concurrency's error as is.
        Error::SessionExpired => (Code::Unknown, "mutex: session is expired"),
        // As etcd's v3election: clientv3/concurrency's errors.
        Error::ElectionNotLeader => (Code::Unknown, "election: not leader"),
        Error::ElectionNoLeader => (Code::Unknown, "election: no leader"),
        Error::MemberNotFound => (Code::NotFound, "etcdserver: member not found"),
        Error::PeerUrlExists => (
            Code::FailedPrecondition,
            "etcdserver: Peer URLs already exists",
        ),
        Error::MemberBadUrls => (
            Code::InvalidArgument,
            "etcdserver: given member URLs are invalid",
        ),
        Error::MemberNotLearner => (
            Code::FailedPrecondition,
            "etcdserver: can only promote a learner member",
        ),
        Error::LearnerNotReady => (
            Code::FailedPrecondition,
            "etcdserver: can only promote a learner member which is in sync with leader",
        ),
        Error::TooManyLearners => (
            Code::FailedPrecondition,
            "etcdserver: too many learner members in cluster",
        ),
        Error::NotSupportedForLearner => (
            Code::FailedPrecondition,
            "etcdserver: rpc not supported for learner",
        ),
        Error::NotLeader => (Code::FailedPrecondition, "etcdserver: not leader"),
        Error::BadLeaderTransferee => (
            Code::FailedPrecondition,
            "etcdserver: bad leader transferee",
        ),
        Error::Unhealthy => (Code::Unavailable, "etcdserver: unhealthy cluster"),
        Error::NoSpace => (
            Code::ResourceExhausted,
            "etcdserver: mvcc: database space exceeded",
        ),
        Error::Corrupt => (Code::DataLoss, "etcdserver: corrupt cluster"),
        Error::MemberNotEnoughStarted => (
            Code::FailedPrecondition,
            "etcdserver: re-configuration failed due to not enough started members",
        ),
        Error::RootUserNotExist => (
            Code::FailedPrecondition,
            "etcdserver: root user does not exist",
        ),
        Error::RootRoleNotExist => (
            Code::FailedPrecondition,
            "etcdserver: root user does not have root role",
        ),
        Error::UserAlreadyExist => (
            Code::FailedPrecondition,
            "etcdserver: user name already exists",
        ),
        Error::UserEmpty => (Code::InvalidArgument, "etcdserver: user name is empty"),
        Error::UserNotFound => (Code::FailedPrecondition, "etcdserver: user name not found"),
        Error::RoleAlreadyExist => (
            Code::FailedPrecondition,
            "etcdserver: role name already exists",
        ),
        Error::RoleNotFound => (Code::FailedPrecondition, "etcdserver: role name not found"),
        Error::RoleEmpty => (Code::InvalidArgument, "etcdserver: role name is empty"),
        Error::PermissionNotGiven => (Code::InvalidArgument, "etcdserver: permission not given"),
        Error::AuthFailed => (
            Code::InvalidArgument,
            "etcdserver: authentication failed, invalid user ID or password",
        ),
        Error::PermissionDenied => (Code::PermissionDenied, "etcdserver: permission denied"),
        Error::RoleNotGranted => (
            Code::FailedPrecondition,
            "etcdserver: role is not granted to the user",
        ),
        Error::PermissionNotGranted => (
            Code::FailedPrecondition,
            "etcdserver: permission is not granted to the role",
        ),
        Error::AuthNotEnabled => (
            Code::FailedPrecondition,
            "etcdserver: authentication is not enabled",
        ),
        Error::InvalidAuthToken => (Code::Unauthenticated, "etcdserver: invalid auth token"),
        Error::InvalidAuthMgmt => (Code::InvalidArgument, "etcdserver: invalid auth management"),
        Error::AuthOldRevision => (
            Code::InvalidArgument,
            "etcdserver: revision of auth store is old",
        ),
        // Not in etcd's gRPC error table: clients get the auth store's own text, code Unknown.
        Error::NoPasswordUser => (
            Code::Unknown,
            "auth: authentication failed, password was given for no password user",
        ),
        Error::JwtVerifyOnly => (
            Code::Unknown,
            "auth: token signing attempted with verify-only key",
        ),
        // Not in etcd's gRPC error table: it reaches clients as Unknown with its text.
        Error::LeaderTransferTimeout => (
            Code::Unknown,
            "etcdserver: request timed out, leader transfer took too long",
        ),
    }
}

/// The status etcd's maintenance server answers auth failures of Defragment, Snapshot, Hash
/// and HashKV with: the auth store's own error text, code Unknown (not the gRPC catalogue).
pub fn auth_raw(e: Error) -> Status {
    let text = match e {
        Error::UserEmpty => "auth: user name is empty",
        Error::UserNotFound => "auth: user not found",
        Error::InvalidAuthToken => "auth: invalid auth token",
        _ => "auth: permission denied",
    };
    Status::new(Code::Unknown, text)
}

/// The gRPC status for a domain error.
pub fn status(e: Error) -> Status {
    let (code, msg) = code_and_message(e);
    Status::new(code, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_an_etcdserver_message() {
        for e in Error::ALL {
            let (code, msg) = code_and_message(e);
            assert!(
                msg.starts_with("etcdserver: ")
                    || matches!(
                        e,
                        Error::SessionExpired
                            | Error::ElectionNotLeader
                            | Error::ElectionNoLeader
                            | Error::NoPasswordUser
                            | Error::JwtVerifyOnly
                    ),
                "{e:?}"
            );
            assert_ne!(code, Code::Ok);
            assert!(msg.ends_with(&e.to_string()), "{e:?}: {msg}");
        }
    }

    #[test]
    fn well_known_codes_match_etcd() {
        assert_eq!(code_and_message(Error::Compacted).0, Code::OutOfRange);
        assert_eq!(code_and_message(Error::LeaseNotFound).0, Code::NotFound);
        assert_eq!(code_and_message(Error::NoLeader).0, Code::Unavailable);
        assert_eq!(
            code_and_message(Error::DuplicateKey).0,
            Code::InvalidArgument
        );
    }
}
