//! The auth store's data — users, roles, the enabled flag and the auth revision — and every
//! change to it, exactly as etcd 3.5 makes them (same checks in the same order, same errors,
//! same revision bumps). Pure: a change returns the new state and the records to write; the
//! caller ([`super::AuthStore::apply`]) stages those in the apply batch.
//!
//! Stored in the replicated metadata (`m/auth/...`, carried by snapshots): one protobuf
//! `authpb.User` or `authpb.Role` per record, the enabled flag and the revision.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use prost::Message;

use super::perm::UserPerms;
use crate::error::{Error, Result};
use crate::pb::authpb::{Permission, Role, User, UserAddOptions};
use crate::pb::etcdserverpb::{
    AuthRoleGrantPermissionRequest, AuthRoleRevokePermissionRequest, AuthUserAddRequest,
};

/// The `root` user and role names.
pub const ROOT: &str = "root";

/// Metadata keys of the auth store (inside the replicated `m/` prefix).
pub mod key {
    /// Every auth record starts with this.
    pub const PREFIX: &[u8] = b"m/auth/";
    /// 1 byte: 1 when auth is enabled.
    pub const ENABLED: &[u8] = b"m/auth/enabled";
    /// u64 BE: the auth revision.
    pub const REVISION: &[u8] = b"m/auth/revision";
    /// + user name → protobuf `authpb.User`.
    pub const USER: &[u8] = b"m/auth/user/";
    /// + role name → protobuf `authpb.Role`.
    pub const ROLE: &[u8] = b"m/auth/role/";
}

/// One record to write (`Some`) or delete (`None`).
pub type Write = (Vec<u8>, Option<Vec<u8>>);

/// The auth store at one point of the log. Immutable once published; a change builds a new one.
#[derive(Debug, Default)]
pub struct AuthState {
    /// Whether requests are checked.
    pub enabled: bool,
    /// Bumped by every change that can affect a permission (etcd's auth revision; 1 when new).
    pub revision: u64,
    users: BTreeMap<String, User>,
    roles: BTreeMap<String, Role>,
    /// Merged permissions per user (etcd's range permission cache), built once per state by
    /// [`AuthState::with_perms`]: a check reads it without any lock.
    perms: HashMap<String, Arc<UserPerms>>,
}

impl Clone for AuthState {
    fn clone(&self) -> Self {
        AuthState {
            enabled: self.enabled,
            revision: self.revision,
            users: self.users.clone(),
            roles: self.roles.clone(),
            perms: HashMap::new(),
        }
    }
}

fn user_key(name: &str) -> Vec<u8> {
    [key::USER, name.as_bytes()].concat()
}

fn role_key(name: &str) -> Vec<u8> {
    [key::ROLE, name.as_bytes()].concat()
}

/// etcd's rule for a granted range: a non-empty key, and a single key, "from key" (`\0`) or an
/// end above the key.
fn valid_range(key: &[u8], range_end: &[u8]) -> bool {
    !key.is_empty() && (range_end.is_empty() || range_end == [0] || key < range_end)
}

impl AuthState {
    /// A new store: disabled, revision 1, no users or roles.
    pub fn new() -> Self {
        AuthState {
            revision: 1,
            ..Default::default()
        }
    }

    /// Rebuilds the state from its records (`records`: key → value under `m/auth/`).
    ///
    /// # Errors
    /// A record that does not decode ([`Error::Storage`]).
    pub fn load<'a>(records: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Result<Self> {
        let mut s = AuthState::new();
        for (k, v) in records {
            if k == key::ENABLED {
                s.enabled = v.first() == Some(&1);
            } else if k == key::REVISION {
                let bytes: [u8; 8] = v.try_into().map_err(|_| Error::Storage)?;
                s.revision = u64::from_be_bytes(bytes);
            } else if let Some(name) = k.strip_prefix(key::USER) {
                let user = User::decode(v).map_err(|_| Error::Storage)?;
                s.users
                    .insert(String::from_utf8_lossy(name).into_owned(), user);
            } else if let Some(name) = k.strip_prefix(key::ROLE) {
                let role = Role::decode(v).map_err(|_| Error::Storage)?;
                s.roles
                    .insert(String::from_utf8_lossy(name).into_owned(), role);
            }
        }
        Ok(s)
    }

    /// The user `name`.
    pub fn user(&self, name: &str) -> Option<&User> {
        self.users.get(name)
    }

    /// The role `name`.
    pub fn role(&self, name: &str) -> Option<&Role> {
        self.roles.get(name)
    }

    /// Every user name, in byte order.
    pub fn user_names(&self) -> Vec<String> {
        self.users.keys().cloned().collect()
    }

    /// Every role name, in byte order.
    pub fn role_names(&self) -> Vec<String> {
        self.roles.keys().cloned().collect()
    }

    /// Whether user `name` exists and has the `root` role.
    pub fn is_root(&self, name: &str) -> bool {
        self.users
            .get(name)
            .is_some_and(|u| u.roles.iter().any(|r| r == ROOT))
    }

    /// The merged permissions of user `name`, `None` if there is no such user.
    pub fn perms(&self, name: &str) -> Option<Arc<UserPerms>> {
        if let Some(p) = self.perms.get(name) {
            return Some(p.clone());
        }
        let user = self.users.get(name)?;
        Some(Arc::new(self.merge(user)))
    }

    fn merge(&self, user: &User) -> UserPerms {
        let root = user.roles.iter().any(|r| r == ROOT);
        let granted = user
            .roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .flat_map(|r| r.key_permission.iter());
        UserPerms::merge(root, granted)
    }

    /// This state with every user's permissions merged, ready to be published.
    pub fn with_perms(mut self) -> Self {
        self.perms = self
            .users
            .iter()
            .map(|(name, user)| (name.clone(), Arc::new(self.merge(user))))
            .collect();
        self
    }

    fn bumped(mut self, writes: &mut Vec<Write>) -> Self {
        self.revision += 1;
        writes.push((
            key::REVISION.to_vec(),
            Some(self.revision.to_be_bytes().to_vec()),
        ));
        self
    }

    fn put_user(&mut self, user: User, writes: &mut Vec<Write>) {
        let name = String::from_utf8_lossy(&user.name).into_owned();
        writes.push((user_key(&name), Some(user.encode_to_vec())));
        self.users.insert(name, user);
    }

    fn put_role(&mut self, role: Role, writes: &mut Vec<Write>) {
        let name = String::from_utf8_lossy(&role.name).into_owned();
        writes.push((role_key(&name), Some(role.encode_to_vec())));
        self.roles.insert(name, role);
    }

    /// AuthEnable: needs a `root` user with the `root` role; enabling twice changes nothing.
    ///
    /// # Errors
    /// [`Error::RootUserNotExist`], [`Error::RootRoleNotExist`].
    pub fn enable(&self, writes: &mut Vec<Write>) -> Result<Option<Self>> {
        if self.enabled {
            return Ok(None);
        }
        let root = self.users.get(ROOT).ok_or(Error::RootUserNotExist)?;
        if !root.roles.iter().any(|r| r == ROOT) {
            return Err(Error::RootRoleNotExist);
        }
        let mut s = self.clone();
        s.enabled = true;
        writes.push((key::ENABLED.to_vec(), Some(vec![1])));
        Ok(Some(s))
    }

    /// AuthDisable (nothing if already off).
    pub fn disable(&self, writes: &mut Vec<Write>) -> Option<Self> {
        if !self.enabled {
            return None;
        }
        let mut s = self.clone();
        s.enabled = false;
        writes.push((key::ENABLED.to_vec(), Some(vec![0])));
        Some(s.bumped(writes))
    }

    /// UserAdd; the request carries the bcrypt hash (`hashedPassword`), never the password.
    ///
    /// # Errors
    /// [`Error::UserEmpty`], [`Error::UserAlreadyExist`].
    pub fn user_add(&self, req: &AuthUserAddRequest, writes: &mut Vec<Write>) -> Result<Self> {
        if req.name.is_empty() {
            return Err(Error::UserEmpty);
        }
        if self.users.contains_key(&req.name) {
            return Err(Error::UserAlreadyExist);
        }
        let options = req.options.unwrap_or(UserAddOptions { no_password: false });
        let password = if options.no_password {
            Vec::new()
        } else {
            req.hashed_password.as_bytes().to_vec()
        };
        let mut s = self.clone();
        s.put_user(
            User {
                name: req.name.as_bytes().to_vec(),
                password,
                roles: Vec::new(),
                options: Some(options),
            },
            writes,
        );
        Ok(s.bumped(writes))
    }

    /// UserDelete (not `root` while auth is on).
    ///
    /// # Errors
    /// [`Error::InvalidAuthMgmt`], [`Error::UserNotFound`].
    pub fn user_delete(&self, name: &str, writes: &mut Vec<Write>) -> Result<Self> {
        if self.enabled && name == ROOT {
            return Err(Error::InvalidAuthMgmt);
        }
        if !self.users.contains_key(name) {
            return Err(Error::UserNotFound);
        }
        let mut s = self.clone();
        s.users.remove(name);
        writes.push((user_key(name), None));
        Ok(s.bumped(writes))
    }

    /// UserChangePassword to the bcrypt hash `hashed` (a no-password user keeps none).
    ///
    /// # Errors
    /// [`Error::UserNotFound`].
    pub fn user_change_password(
        &self,
        name: &str,
        hashed: &str,
        writes: &mut Vec<Write>,
    ) -> Result<Self> {
        let mut user = self.users.get(name).ok_or(Error::UserNotFound)?.clone();
        if !user.options.is_some_and(|o| o.no_password) {
            user.password = hashed.as_bytes().to_vec();
        }
        let mut s = self.clone();
        s.put_user(user, writes);
        Ok(s.bumped(writes))
    }

    /// UserGrantRole (`root` may be granted without existing as a role); a role the user
    /// already has changes nothing.
    ///
    /// # Errors
    /// [`Error::UserNotFound`], [`Error::RoleNotFound`].
    pub fn user_grant_role(
        &self,
        name: &str,
        role: &str,
        writes: &mut Vec<Write>,
    ) -> Result<Option<Self>> {
        let mut user = self.users.get(name).ok_or(Error::UserNotFound)?.clone();
        if role != ROOT && !self.roles.contains_key(role) {
            return Err(Error::RoleNotFound);
        }
        if user.roles.iter().any(|r| r == role) {
            return Ok(None);
        }
        user.roles.push(role.to_string());
        user.roles.sort();
        let mut s = self.clone();
        s.put_user(user, writes);
        Ok(Some(s.bumped(writes)))
    }

    /// UserRevokeRole (not `root` from `root` while auth is on).
    ///
    /// # Errors
    /// [`Error::InvalidAuthMgmt`], [`Error::UserNotFound`], [`Error::RoleNotGranted`].
    pub fn user_revoke_role(
        &self,
        name: &str,
        role: &str,
        writes: &mut Vec<Write>,
    ) -> Result<Self> {
        if self.enabled && name == ROOT && role == ROOT {
            return Err(Error::InvalidAuthMgmt);
        }
        let mut user = self.users.get(name).ok_or(Error::UserNotFound)?.clone();
        let before = user.roles.len();
        user.roles.retain(|r| r != role);
        if user.roles.len() == before {
            return Err(Error::RoleNotGranted);
        }
        let mut s = self.clone();
        s.put_user(user, writes);
        Ok(s.bumped(writes))
    }

    /// RoleAdd.
    ///
    /// # Errors
    /// [`Error::RoleEmpty`], [`Error::RoleAlreadyExist`].
    pub fn role_add(&self, name: &str, writes: &mut Vec<Write>) -> Result<Self> {
        if name.is_empty() {
            return Err(Error::RoleEmpty);
        }
        if self.roles.contains_key(name) {
            return Err(Error::RoleAlreadyExist);
        }
        let mut s = self.clone();
        s.put_role(
            Role {
                name: name.as_bytes().to_vec(),
                key_permission: Vec::new(),
            },
            writes,
        );
        Ok(s.bumped(writes))
    }

    /// RoleDelete (not `root` while auth is on); the role is taken from every user.
    ///
    /// # Errors
    /// [`Error::InvalidAuthMgmt`], [`Error::RoleNotFound`].
    pub fn role_delete(&self, name: &str, writes: &mut Vec<Write>) -> Result<Self> {
        if self.enabled && name == ROOT {
            return Err(Error::InvalidAuthMgmt);
        }
        if !self.roles.contains_key(name) {
            return Err(Error::RoleNotFound);
        }
        let mut s = self.clone();
        s.roles.remove(name);
        writes.push((role_key(name), None));
        let holders: Vec<User> = s
            .users
            .values()
            .filter(|u| u.roles.iter().any(|r| r == name))
            .cloned()
            .collect();
        for mut user in holders {
            user.roles.retain(|r| r != name);
            s.put_user(user, writes);
        }
        Ok(s.bumped(writes))
    }

    /// RoleGrantPermission: a permission on the same key and range end changes type; another
    /// is added, the list kept sorted by key (stable, as etcd's).
    ///
    /// # Errors
    /// [`Error::PermissionNotGiven`], [`Error::InvalidAuthMgmt`] (an invalid range),
    /// [`Error::RoleNotFound`].
    pub fn role_grant_permission(
        &self,
        req: &AuthRoleGrantPermissionRequest,
        writes: &mut Vec<Write>,
    ) -> Result<Self> {
        let perm = req.perm.as_ref().ok_or(Error::PermissionNotGiven)?;
        if !valid_range(&perm.key, &perm.range_end) {
            return Err(Error::InvalidAuthMgmt);
        }
        let mut role = self
            .roles
            .get(&req.name)
            .ok_or(Error::RoleNotFound)?
            .clone();
        let at = role
            .key_permission
            .partition_point(|p| p.key.as_slice() < perm.key.as_slice());
        match role.key_permission.get_mut(at) {
            Some(p) if p.key == perm.key && p.range_end == perm.range_end => {
                p.perm_type = perm.perm_type;
            }
            _ => {
                role.key_permission.push(Permission {
                    perm_type: perm.perm_type,
                    key: perm.key.clone(),
                    range_end: perm.range_end.clone(),
                });
                role.key_permission.sort_by(|a, b| a.key.cmp(&b.key));
            }
        }
        let mut s = self.clone();
        s.put_role(role, writes);
        Ok(s.bumped(writes))
    }

    /// RoleRevokePermission: every permission on exactly that key and range end goes.
    ///
    /// # Errors
    /// [`Error::RoleNotFound`], [`Error::PermissionNotGranted`].
    pub fn role_revoke_permission(
        &self,
        req: &AuthRoleRevokePermissionRequest,
        writes: &mut Vec<Write>,
    ) -> Result<Self> {
        let mut role = self
            .roles
            .get(&req.role)
            .ok_or(Error::RoleNotFound)?
            .clone();
        let before = role.key_permission.len();
        role.key_permission
            .retain(|p| !(p.key == req.key && p.range_end == req.range_end));
        if role.key_permission.len() == before {
            return Err(Error::PermissionNotGranted);
        }
        let mut s = self.clone();
        s.put_role(role, writes);
        Ok(s.bumped(writes))
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
