//! The auth store's changes against etcd's rules: checks, errors, revision bumps, orders,
//! and records that load back.

use super::*;
use crate::pb::authpb::permission::Type;

fn add_user(s: &AuthState, name: &str) -> AuthState {
    let req = AuthUserAddRequest {
        name: name.into(),
        hashed_password: "$2b$04$hash".into(),
        ..Default::default()
    };
    s.user_add(&req, &mut Vec::new())
        .unwrap_or_else(|e| panic!("{e}"))
}

fn grant(s: &AuthState, role: &str, key: &str, end: &str, t: Type) -> Result<AuthState> {
    let req = AuthRoleGrantPermissionRequest {
        name: role.into(),
        perm: Some(Permission {
            perm_type: t as i32,
            key: key.into(),
            range_end: end.into(),
        }),
    };
    s.role_grant_permission(&req, &mut Vec::new())
}

#[test]
fn enable_needs_root_with_the_root_role_and_does_not_bump() -> Result<()> {
    let s = AuthState::new();
    assert_eq!(s.revision, 1);
    assert_eq!(
        s.enable(&mut Vec::new()).err(),
        Some(Error::RootUserNotExist)
    );
    let s = add_user(&s, ROOT);
    assert_eq!(s.revision, 2);
    assert_eq!(
        s.enable(&mut Vec::new()).err(),
        Some(Error::RootRoleNotExist)
    );
    let s = s
        .user_grant_role(ROOT, ROOT, &mut Vec::new())?
        .ok_or(Error::Storage)?;
    assert_eq!(s.revision, 3, "root is granted without existing as a role");
    let s = s.enable(&mut Vec::new())?.ok_or(Error::Storage)?;
    assert!(s.enabled && s.revision == 3);
    assert!(s.enable(&mut Vec::new())?.is_none());
    assert_eq!(
        s.user_delete(ROOT, &mut Vec::new()).err(),
        Some(Error::InvalidAuthMgmt)
    );
    assert_eq!(
        s.user_revoke_role(ROOT, ROOT, &mut Vec::new()).err(),
        Some(Error::InvalidAuthMgmt)
    );
    let off = s.disable(&mut Vec::new()).ok_or(Error::Storage)?;
    assert!(!off.enabled && off.revision == 4);
    Ok(())
}

#[test]
fn users_and_roles_keep_etcds_errors_and_orders() -> Result<()> {
    let s = add_user(&AuthState::new(), "bob");
    let dup = AuthUserAddRequest {
        name: "bob".into(),
        ..Default::default()
    };
    assert_eq!(
        s.user_add(&dup, &mut Vec::new()).err(),
        Some(Error::UserAlreadyExist)
    );
    let empty = AuthUserAddRequest::default();
    assert_eq!(
        s.user_add(&empty, &mut Vec::new()).err(),
        Some(Error::UserEmpty)
    );
    assert_eq!(
        s.role_add("", &mut Vec::new()).err(),
        Some(Error::RoleEmpty)
    );
    let s = s
        .role_add("b", &mut Vec::new())?
        .role_add("a", &mut Vec::new())?;
    assert_eq!(s.role_names(), ["a", "b"]);
    assert_eq!(
        s.user_grant_role("bob", "zzz", &mut Vec::new()).err(),
        Some(Error::RoleNotFound)
    );
    let s = s
        .user_grant_role("bob", "b", &mut Vec::new())?
        .ok_or(Error::Storage)?;
    let s = s
        .user_grant_role("bob", "a", &mut Vec::new())?
        .ok_or(Error::Storage)?;
    let rev = s.revision;
    assert!(s.user_grant_role("bob", "a", &mut Vec::new())?.is_none());
    assert_eq!(
        s.user("bob").map(|u| u.roles.clone()),
        Some(vec!["a".into(), "b".into()])
    );
    let s = s.role_delete("a", &mut Vec::new())?;
    assert_eq!(s.revision, rev + 1);
    assert_eq!(
        s.user("bob").map(|u| u.roles.clone()),
        Some(vec!["b".into()])
    );
    assert_eq!(
        s.user_revoke_role("bob", "a", &mut Vec::new()).err(),
        Some(Error::RoleNotGranted)
    );
    Ok(())
}

#[test]
fn permissions_are_validated_sorted_updated_and_revoked_as_etcd() -> Result<()> {
    let s = AuthState::new().role_add("r", &mut Vec::new())?;
    assert_eq!(
        grant(&s, "r", "", "", Type::Read).err(),
        Some(Error::InvalidAuthMgmt)
    );
    assert_eq!(
        grant(&s, "r", "b", "a", Type::Read).err(),
        Some(Error::InvalidAuthMgmt)
    );
    assert_eq!(
        grant(&s, "r", "b", "b", Type::Read).err(),
        Some(Error::InvalidAuthMgmt)
    );
    assert_eq!(
        grant(&s, "x", "a", "", Type::Read).err(),
        Some(Error::RoleNotFound)
    );
    let s = grant(&s, "r", "m", "", Type::Read)?;
    let s = grant(&s, "r", "c", "\0", Type::Write)?;
    let s = grant(&s, "r", "m", "", Type::Readwrite)?;
    let perms = s
        .role("r")
        .map(|r| r.key_permission.clone())
        .unwrap_or_default();
    assert_eq!(perms.len(), 2, "same key and end: the type changes");
    assert_eq!(perms[0].key, b"c");
    assert_eq!(perms[1].perm_type, Type::Readwrite as i32);
    let rev = s.revision;
    let s = grant(&s, "r", "m", "", Type::Readwrite)?;
    assert_eq!(s.revision, rev + 1, "an identical grant still bumps");
    let revoke = |key: &str, end: &str| AuthRoleRevokePermissionRequest {
        role: "r".into(),
        key: key.into(),
        range_end: end.into(),
    };
    assert_eq!(
        s.role_revoke_permission(&revoke("m", "n"), &mut Vec::new())
            .err(),
        Some(Error::PermissionNotGranted)
    );
    let s = s.role_revoke_permission(&revoke("m", ""), &mut Vec::new())?;
    assert_eq!(s.role("r").map(|r| r.key_permission.len()), Some(1));
    Ok(())
}

#[test]
fn the_records_written_load_back_to_the_same_state() -> Result<()> {
    let mut writes = Vec::new();
    let s = AuthState::new();
    let s = s.user_add(
        &AuthUserAddRequest {
            name: ROOT.into(),
            hashed_password: "h".into(),
            ..Default::default()
        },
        &mut writes,
    )?;
    let s = s.role_add("r", &mut writes)?;
    let s = s
        .user_grant_role(ROOT, ROOT, &mut writes)?
        .ok_or(Error::Storage)?;
    let s = s.enable(&mut writes)?.ok_or(Error::Storage)?;
    let mut records = BTreeMap::new();
    for (k, v) in writes {
        match v {
            Some(v) => records.insert(k, v),
            None => records.remove(&k),
        };
    }
    let back = AuthState::load(records.iter().map(|(k, v)| (k.as_slice(), v.as_slice())))?;
    assert_eq!(back.enabled, s.enabled);
    assert_eq!(back.revision, s.revision);
    assert_eq!(back.user_names(), s.user_names());
    assert_eq!(back.role_names(), s.role_names());
    assert!(back.is_root(ROOT));
    Ok(())
}

#[test]
fn perms_merge_the_roles_of_a_user() -> Result<()> {
    let s = add_user(&AuthState::new(), "u");
    let s = s
        .role_add("r1", &mut Vec::new())?
        .role_add("r2", &mut Vec::new())?;
    let s = grant(&s, "r1", "a", "c", Type::Read)?;
    let s = grant(&s, "r2", "c", "e", Type::Read)?;
    let s = s
        .user_grant_role("u", "r1", &mut Vec::new())?
        .ok_or(Error::Storage)?;
    let s = s
        .user_grant_role("u", "r2", &mut Vec::new())?
        .ok_or(Error::Storage)?;
    let p = s.perms("u").ok_or(Error::Storage)?;
    assert!(p.can_read(b"a", b"e") && !p.can_write(b"a", b""));
    assert!(s.perms("nobody").is_none());
    Ok(())
}
