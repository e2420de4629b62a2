//! Auth through the apply path: changes need root once auth is on, client writes are checked
//! against the auth store at their point of the log, the member's own commands are not.

use super::tests::Fixture;
use super::*;
use crate::auth::{Caller, ROOT};
use crate::pb::authpb::permission::Type;
use crate::pb::authpb::Permission;
use crate::pb::etcdserverpb::{
    AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
    AuthUserGrantRoleRequest, AuthUserRevokeRoleRequest, PutRequest,
};

fn caller(f: &Fixture, user: &str) -> Option<Caller> {
    Some(Caller {
        user: user.into(),
        auth_revision: f.auth.current().revision,
    })
}

fn client(f: &Fixture, op: Op, user: Option<&str>) -> Outcome {
    let who = user.and_then(|u| caller(f, u));
    f.apply_cmd(&Command::from_client(op, who))
}

fn token(t: &str) -> crate::auth::Credentials {
    crate::auth::Credentials {
        token: Some(t.into()),
        cert_user: None,
    }
}

fn put(key: &str) -> Op {
    Op::Put(PutRequest {
        key: key.into(),
        value: b"v".to_vec(),
        ..Default::default()
    })
}

fn error(o: &Outcome) -> Option<Error> {
    match o {
        Outcome::Error(code) => Some(Error::from_code(*code)),
        _ => None,
    }
}

/// root with the root role, user `u` with role `r` granted READWRITE on prefix `a/`, auth on.
fn enabled() -> Result<Fixture, Box<dyn std::error::Error>> {
    let f = Fixture::new()?;
    for name in [ROOT, "u"] {
        let add = Op::UserAdd(AuthUserAddRequest {
            name: name.into(),
            hashed_password: "$2b$04$x".into(),
            ..Default::default()
        });
        assert!(error(&client(&f, add, None)).is_none());
    }
    let steps = [
        Op::RoleAdd(AuthRoleAddRequest { name: "r".into() }),
        Op::RoleGrantPermission(AuthRoleGrantPermissionRequest {
            name: "r".into(),
            perm: Some(Permission {
                perm_type: Type::Readwrite as i32,
                key: b"a/".to_vec(),
                range_end: b"a0".to_vec(),
            }),
        }),
        Op::UserGrantRole(AuthUserGrantRoleRequest {
            user: "u".into(),
            role: "r".into(),
        }),
        Op::UserGrantRole(AuthUserGrantRoleRequest {
            user: ROOT.into(),
            role: ROOT.into(),
        }),
        Op::AuthEnable(AuthEnableRequest {}),
    ];
    for op in steps {
        assert_eq!(error(&client(&f, op, None)), None);
    }
    assert!(f.auth.enabled());
    Ok(f)
}

#[test]
fn client_writes_are_checked_against_the_applied_auth_store(
) -> Result<(), Box<dyn std::error::Error>> {
    let f = enabled()?;
    assert_eq!(error(&client(&f, put("a/1"), None)), Some(Error::UserEmpty));
    assert_eq!(
        error(&client(&f, put("b"), Some("u"))),
        Some(Error::PermissionDenied)
    );
    assert!(matches!(client(&f, put("a/1"), Some("u")), Outcome::Put(_)));
    assert!(matches!(client(&f, put("b"), Some(ROOT)), Outcome::Put(_)));
    // The member's own commands (lease expiry, compaction) are not a client's.
    assert!(matches!(f.apply(put("b")), Outcome::Put(_)));
    // Credentials checked before a change of the auth store are old after it.
    let stale = caller(&f, "u");
    let revoke = Op::UserRevokeRole(AuthUserRevokeRoleRequest {
        name: "u".into(),
        role: "r".into(),
    });
    assert_eq!(
        error(&client(&f, revoke.clone(), Some("u"))),
        Some(Error::PermissionDenied)
    );
    assert_eq!(error(&client(&f, revoke, Some(ROOT))), None);
    let late = f.apply_cmd(&Command::from_client(put("a/1"), stale));
    assert_eq!(error(&late), Some(Error::AuthOldRevision));
    assert_eq!(
        error(&client(&f, put("a/1"), Some("u"))),
        Some(Error::PermissionDenied)
    );
    Ok(())
}

#[test]
fn a_denied_write_takes_no_revision() -> Result<(), Box<dyn std::error::Error>> {
    let f = enabled()?;
    let Outcome::Put(first) = client(&f, put("a/1"), Some("u")) else {
        panic!("put refused");
    };
    assert!(error(&client(&f, put("zzz"), Some("u"))).is_some());
    let Outcome::Put(second) = client(&f, put("a/2"), Some("u")) else {
        panic!("put refused");
    };
    let rev = |h: &Option<crate::pb::etcdserverpb::ResponseHeader>| h.as_ref().map(|h| h.revision);
    assert_eq!(rev(&second.header), rev(&first.header).map(|r| r + 1));
    Ok(())
}

#[test]
fn logins_register_a_token_with_the_entry_index() -> Result<(), Box<dyn std::error::Error>> {
    let f = enabled()?;
    let login = Op::Authenticate(crate::pb::concordpb::Authenticated {
        name: "u".into(),
        simple_token: crate::auth::token::digest("abcdefghijklmnop"),
    });
    let Outcome::Auth(r) = f.apply_cmd(&Command::new(login)) else {
        panic!("login refused");
    };
    // The members keep the digest; the token itself never passed through the log.
    let key = crate::auth::token::stored_key("abcdefghijklmnop.1");
    assert_eq!(Some(r.token), key);
    let who = f
        .auth
        .resolve(&token("abcdefghijklmnop.1"))?
        .map(|c| c.user);
    assert_eq!(who.as_deref(), Some("u"));
    assert_eq!(
        f.auth.resolve(&token("nope.1")).err(),
        Some(Error::InvalidAuthToken)
    );
    Ok(())
}
