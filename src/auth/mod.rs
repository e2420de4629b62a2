//! Authentication and role-based access control, as etcd 3.5 has them.
//!
//! - [`state`]: users, roles, the enabled flag and the auth revision; every change as etcd
//!   makes it. Written only by the apply path ([`AuthStore::apply`]), so every member holds the
//!   same auth store at the same log position; carried by snapshots (replicated metadata).
//! - [`perm`]: a user's permissions merged into sorted key intervals (cached per auth state).
//! - [`needs`]: which key ranges each KV request reads or writes.
//! - [`token`]: simple tokens; [`jwt`]: signed tokens; [`password`]: bcrypt off the async
//!   runtime.
//!
//! The RPC edge turns a request's token into a [`Caller`] ([`AuthStore::caller`]) and checks
//! reads, watches and admin-only RPCs at once; writes carry the caller through Raft and are
//! checked when applied, against the auth store at that point of the log (a role revoked just
//! before a write's entry denies it), with etcd's `revision of auth store is old` when the
//! store changed since the caller's token was checked.

mod es512;
pub mod jwt;
pub mod needs;
pub mod password;
pub mod perm;
pub mod state;
pub mod token;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use crate::pb::concordpb::Caller;
pub use needs::{Access, Need};
pub use state::{AuthState, ROOT};

use crate::error::{Error, Result};
use crate::mvcc::WriteTxn;
use crate::pb::concordpb::command::Op;
use crate::storage::{Space, Storage, StorageResult};

/// `--auth-token`, `--auth-token-ttl` and `--bcrypt-cost`.
#[derive(Debug, Clone)]
pub struct AuthOptions {
    /// How long a simple token lives after its last use.
    pub token_ttl: Duration,
    /// bcrypt's cost for new password hashes.
    pub bcrypt_cost: u32,
    /// JWT tokens instead of simple ones (`--auth-token jwt,...`).
    pub jwt: Option<Arc<jwt::Jwt>>,
}

impl Default for AuthOptions {
    fn default() -> Self {
        AuthOptions {
            token_ttl: token::DEFAULT_TTL,
            bcrypt_cost: password::DEFAULT_COST,
            jwt: None,
        }
    }
}

impl AuthOptions {
    /// Reads `--auth-token`: `simple`, or `jwt,` and etcd's JWT options.
    ///
    /// # Errors
    /// An unknown token kind, or bad JWT options or keys (etcd's messages).
    pub fn with_token_kind(mut self, kind: &str) -> Result<Self, String> {
        let (name, options) = kind.split_once(',').unwrap_or((kind, ""));
        match name {
            "simple" => {
                tracing::warn!("simple token is not cryptographically signed");
                self.jwt = None;
            }
            "jwt" => {
                self.jwt = Some(Arc::new(
                    jwt::Jwt::from_options(options).map_err(|e| e.to_string())?,
                ));
            }
            other => return Err(format!("auth: unknown token type {other:?}")),
        }
        Ok(self)
    }
}

/// How long a failed password check holds back the next check of the same user.
pub const FAILED_LOGIN_DELAY: Duration = Duration::from_millis(250);

/// How long a login waits for its turn behind other checks of the same user before it is
/// refused with `too many requests`.
pub const LOGIN_WAIT: Duration = Duration::from_secs(2);

/// The auth store of one member: the replicated state and this member's live tokens.
#[derive(Debug)]
pub struct AuthStore {
    state: RwLock<Arc<AuthState>>,
    /// `state.enabled`, readable without the lock: with auth off, a request's whole check is
    /// this one load.
    enabled: AtomicBool,
    tokens: token::SimpleTokens,
    options: AuthOptions,
    /// Per user: held while its password is checked (see [`AuthStore::check_password`]).
    login_turns: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

fn load(storage: &Storage) -> StorageResult<AuthState> {
    let records = storage.scan_prefix(Space::Meta, state::key::PREFIX)?;
    AuthState::load(records.iter().map(|(k, v)| (k.as_slice(), v.as_slice())))
        .map_err(|e| crate::storage::StorageError(format!("auth store: {e}")))
}

impl AuthStore {
    /// Loads the auth store from `storage`.
    ///
    /// # Errors
    /// On a read failure or a record that does not decode.
    pub fn open(storage: &Storage, options: AuthOptions) -> StorageResult<Self> {
        let mut options = options;
        if !password::COST_RANGE.contains(&options.bcrypt_cost) {
            tracing::warn!(
                given = options.bcrypt_cost,
                "use default bcrypt cost instead of the invalid given cost"
            );
            options.bcrypt_cost = password::DEFAULT_COST;
        }
        let state = load(storage)?.with_perms();
        Ok(AuthStore {
            enabled: AtomicBool::new(state.enabled),
            state: RwLock::new(Arc::new(state)),
            tokens: token::SimpleTokens::new(options.token_ttl),
            options,
            login_turns: Default::default(),
        })
    }

    /// Reloads the state after a snapshot replaced the metadata, forgetting every simple token.
    ///
    /// # Errors
    /// As [`AuthStore::open`].
    pub fn reload(&self, storage: &Storage) -> StorageResult<()> {
        // The snapshot may have changed or deleted users, passwords or the enabled flag behind
        // any token: every client logs in again.
        self.tokens.clear();
        self.publish(load(storage)?);
        Ok(())
    }

    fn publish(&self, s: AuthState) {
        let s = Arc::new(s.with_perms());
        let enabled = s.enabled;
        match self.state.write() {
            Ok(mut g) => *g = s,
            Err(poisoned) => *poisoned.into_inner() = s,
        }
        self.enabled.store(enabled, Ordering::Release);
    }

    /// The auth store as of the last applied entry.
    pub fn current(&self) -> Arc<AuthState> {
        match self.state.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Whether auth is on (as of the last applied entry).
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// bcrypt's cost for new hashes.
    pub fn bcrypt_cost(&self) -> u32 {
        self.options.bcrypt_cost
    }

    /// Whether tokens are JWTs (a login then registers nothing on the members).
    pub fn uses_jwt(&self) -> bool {
        self.options.jwt.is_some()
    }

    /// A JWT for `user` at auth `revision`.
    ///
    /// # Errors
    /// [`Error::JwtVerifyOnly`] on a member without the private key.
    pub fn sign_jwt(&self, user: &str, revision: u64) -> Result<String> {
        self.options
            .jwt
            .as_ref()
            .and_then(|j| j.sign(user, revision))
            .ok_or(Error::JwtVerifyOnly)
    }

    /// The caller `token` names in the auth store `s`.
    ///
    /// # Errors
    /// [`Error::InvalidAuthToken`] for a token this member does not know (never issued, expired,
    /// or its user deleted or re-passworded).
    fn token_caller(&self, s: &AuthState, token: &str) -> Result<Caller> {
        // A JWT names the revision of its login; a simple token is checked now.
        if let Some(jwt) = &self.options.jwt {
            let (user, auth_revision) = jwt.verify(token).ok_or(Error::InvalidAuthToken)?;
            return Ok(Caller {
                user,
                auth_revision,
            });
        }
        let key = token::stored_key(token).ok_or(Error::InvalidAuthToken)?;
        let user = self.tokens.user(&key).ok_or(Error::InvalidAuthToken)?;
        Ok(Caller {
            user,
            auth_revision: s.revision,
        })
    }

    /// The Raft index a simple token was issued at (what a member must have applied to know
    /// it), if the token has etcd's shape.
    pub fn token_index(token: &str) -> Option<u64> {
        let (_, index) = token.split_once('.')?;
        index.parse().ok()
    }

    /// Checks the password of `name` (bcrypt, off the runtime); returns the auth revision the
    /// check saw.
    ///
    /// # Errors
    /// [`Error::AuthNotEnabled`], [`Error::AuthFailed`], [`Error::NoPasswordUser`],
    /// [`Error::TooManyRequests`].
    ///
    /// Rate-limited per user: one check at a time, and a failed one holds the next back for
    /// [`FAILED_LOGIN_DELAY`], so a password is guessed at a few tries a second at most; a
    /// login that cannot get its turn within [`LOGIN_WAIT`] is refused (`too many requests`)
    /// rather than queued behind a flood.
    pub async fn check_password(&self, name: &str, password: &str) -> Result<u64> {
        let s = self.current();
        if !s.enabled {
            return Err(Error::AuthNotEnabled);
        }
        let Some(user) = s.user(name) else {
            tokio::time::sleep(FAILED_LOGIN_DELAY).await;
            return Err(Error::AuthFailed);
        };
        if user.options.is_some_and(|o| o.no_password) {
            return Err(Error::NoPasswordUser);
        }
        let turn = self.login_turn(name);
        // Bounded: a flood of wrong guesses must not queue a real login past its deadline.
        let Ok(_turn) = tokio::time::timeout(LOGIN_WAIT, turn.lock()).await else {
            return Err(Error::TooManyRequests);
        };
        let hash = String::from_utf8_lossy(&user.password).into_owned();
        if password::verify(password.to_string(), hash).await {
            Ok(s.revision)
        } else {
            tracing::info!(user_name = name, "invalid password");
            tokio::time::sleep(FAILED_LOGIN_DELAY).await;
            Err(Error::AuthFailed)
        }
    }

    /// The lock that serializes password checks of user `name` (one per existing user).
    fn login_turn(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = match self.login_turns.lock() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        };
        let users = self.current();
        turns.retain(|n, _| users.user(n).is_some());
        turns.entry(name.to_string()).or_default().clone()
    }
}

/// etcd's `IsAdminPermitted`: nothing to check while auth is off; otherwise a caller with the
/// `root` role (its token's revision does not matter here).
///
/// # Errors
/// [`Error::UserEmpty`], [`Error::UserNotFound`], [`Error::PermissionDenied`].
pub fn check_admin(s: &AuthState, caller: Option<&Caller>) -> Result<()> {
    if !s.enabled {
        return Ok(());
    }
    let caller = caller
        .filter(|c| !c.user.is_empty())
        .ok_or(Error::UserEmpty)?;
    if s.user(&caller.user).is_none() {
        return Err(Error::UserNotFound);
    }
    if !s.is_root(&caller.user) {
        return Err(Error::PermissionDenied);
    }
    Ok(())
}

/// etcd's `isOpPermitted` for every need: nothing while auth is off; otherwise a caller whose
/// credentials are as new as the auth store, with the permissions (root has all).
///
/// # Errors
/// [`Error::UserEmpty`], [`Error::AuthOldRevision`], [`Error::PermissionDenied`].
pub fn check(s: &AuthState, caller: Option<&Caller>, needs: &[Need]) -> Result<()> {
    if !s.enabled {
        return Ok(());
    }
    let caller = caller
        .filter(|c| c.auth_revision != 0)
        .ok_or(Error::UserEmpty)?;
    if caller.auth_revision < s.revision {
        tracing::warn!(
            user_name = caller.user,
            request_revision = caller.auth_revision,
            revision = s.revision,
            "request auth revision is less than current node auth revision"
        );
        return Err(Error::AuthOldRevision);
    }
    let perms = s.perms(&caller.user).ok_or(Error::PermissionDenied)?;
    let allowed = needs.iter().all(|n| match n.access {
        Access::Read => perms.can_read(&n.key, &n.range_end),
        Access::Write => perms.can_write(&n.key, &n.range_end),
    });
    if allowed {
        Ok(())
    } else {
        Err(Error::PermissionDenied)
    }
}

/// What a request presented to prove who sent it: a token, and (with `--client-cert-auth`) the
/// CN of its client certificate. Kept by long-lived calls (keep-alive streams, watches, lock
/// waits) and resolved again at each use, as etcd does per request.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// The `token` (or `authorization`) metadata.
    pub token: Option<String>,
    /// The client certificate's CN, when `--client-cert-auth` makes it the user.
    pub cert_user: Option<String>,
}

impl AuthStore {
    /// The caller `credentials` name now: its token's user, else its certificate's CN (`None`
    /// while auth is off or without either).
    ///
    /// # Errors
    /// [`Error::InvalidAuthToken`] for a token this member does not know (any more).
    pub fn resolve(&self, credentials: &Credentials) -> Result<Option<Caller>> {
        if !self.enabled() {
            return Ok(None);
        }
        let s = self.current();
        match &credentials.token {
            Some(token) => self.token_caller(&s, token).map(Some),
            None => Ok(credentials.cert_user.clone().map(|user| Caller {
                user,
                auth_revision: s.revision,
            })),
        }
    }
}

/// What an applied auth command answers besides success: a login's token.
pub type Applied = Option<String>;

impl AuthStore {
    /// Applies one auth command at log `index` inside the apply batch `w`: checks the caller
    /// (admin for every change), changes the state, stages its records and publishes it.
    ///
    /// # Errors
    /// The auth store's refusals (etcd's), [`Error::Storage`] for a command that is not an
    /// auth command.
    pub fn apply(
        &self,
        w: &mut WriteTxn<'_>,
        op: &Op,
        caller: Option<&Caller>,
        index: u64,
    ) -> Result<Applied> {
        let s = self.current();
        let mut writes = Vec::new();
        let admin = || check_admin(&s, caller);
        let next: Result<Option<AuthState>> = match op {
            // Root is asked for only once auth is on (then enabling again changes nothing).
            Op::AuthEnable(_) => admin().and_then(|()| s.enable(&mut writes)),
            Op::AuthDisable(_) => admin().map(|()| s.disable(&mut writes)),
            Op::Authenticate(a) => return self.authenticate(&s, &a.name, &a.simple_token, index),
            Op::UserAdd(r) => admin().and_then(|()| s.user_add(r, &mut writes).map(Some)),
            Op::UserDelete(r) => {
                admin().and_then(|()| s.user_delete(&r.name, &mut writes).map(Some))
            }
            Op::UserChangePassword(r) => admin().and_then(|()| {
                s.user_change_password(&r.name, &r.hashed_password, &mut writes)
                    .map(Some)
            }),
            Op::UserGrantRole(r) => {
                admin().and_then(|()| s.user_grant_role(&r.user, &r.role, &mut writes))
            }
            Op::UserRevokeRole(r) => {
                admin().and_then(|()| s.user_revoke_role(&r.name, &r.role, &mut writes).map(Some))
            }
            Op::RoleAdd(r) => admin().and_then(|()| s.role_add(&r.name, &mut writes).map(Some)),
            Op::RoleDelete(r) => {
                admin().and_then(|()| s.role_delete(&r.role, &mut writes).map(Some))
            }
            Op::RoleGrantPermission(r) => {
                admin().and_then(|()| s.role_grant_permission(r, &mut writes).map(Some))
            }
            Op::RoleRevokePermission(r) => {
                admin().and_then(|()| s.role_revoke_permission(r, &mut writes).map(Some))
            }
            // Not an auth command: the apply path never sends one here.
            _ => Err(Error::Storage),
        };
        let next = next?;
        for (k, v) in writes {
            match v {
                Some(v) => w.set_meta(&k, &v),
                None => w.remove_meta(&k),
            }
        }
        if let Some(next) = next {
            match op {
                Op::AuthDisable(_) => self.tokens.clear(),
                Op::UserDelete(r) => self.tokens.invalidate_user(&r.name),
                Op::UserChangePassword(r) => self.tokens.invalidate_user(&r.name),
                _ => {}
            }
            tracing::info!(
                change = crate::apply::kind_of(op),
                auth_revision = next.revision,
                enabled = next.enabled,
                "auth store changed"
            );
            self.publish(next);
        }
        Ok(None)
    }

    /// A login checked by the proposing member: the token whose random part has `digest`
    /// becomes valid on this member; answers the key it is kept under (the proposer turns it
    /// back into the token).
    fn authenticate(&self, s: &AuthState, name: &str, digest: &str, index: u64) -> Result<Applied> {
        if !s.enabled {
            return Err(Error::AuthNotEnabled);
        }
        let user = s.user(name).ok_or(Error::AuthFailed)?;
        if user.options.is_some_and(|o| o.no_password) {
            return Err(Error::AuthFailed);
        }
        // JWT logins register nothing (the proposer signs the token).
        if digest.is_empty() {
            return Ok(None);
        }
        let key = format!("{digest}.{index}");
        self.tokens.assign(&key, name);
        Ok(Some(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::etcdserverpb::{
        AuthEnableRequest, AuthUserAddRequest, AuthUserGrantRoleRequest,
    };

    /// A store with auth on and user `root` (password `pw`).
    async fn store(
    ) -> std::result::Result<(tempfile::TempDir, AuthStore), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let storage = Storage::open(dir.path())?;
        let auth = AuthStore::open(&storage, AuthOptions::default())?;
        let mvcc = crate::mvcc::MvccStore::open(storage.clone())?;
        let hash = password::hash("pw".into(), 4).await.ok_or("hash")?;
        let ops = [
            Op::UserAdd(AuthUserAddRequest {
                name: ROOT.into(),
                hashed_password: hash,
                ..Default::default()
            }),
            Op::UserGrantRole(AuthUserGrantRoleRequest {
                user: ROOT.into(),
                role: ROOT.into(),
            }),
            Op::AuthEnable(AuthEnableRequest {}),
        ];
        let mut w = mvcc.write()?;
        for op in &ops {
            auth.apply(&mut w, op, None, 1)?;
        }
        w.commit()?;
        Ok((dir, auth))
    }

    /// On tokio's paused clock (the blocking pool's bcrypt holds it; sleeps and timeouts move
    /// it), so the test checks the order the limiter imposes, not any speed.
    #[tokio::test(start_paused = true)]
    async fn failed_logins_of_a_user_are_taken_one_at_a_time_and_slowed(
    ) -> std::result::Result<(), Box<dyn std::error::Error>> {
        let (_dir, auth) = store().await?;
        let auth = Arc::new(auth);
        assert_eq!(auth.check_password(ROOT, "pw").await?, 1 + 2);
        let started = tokio::time::Instant::now();
        let tries: Vec<_> = (0..3)
            .map(|_| {
                let auth = auth.clone();
                tokio::spawn(async move { auth.check_password(ROOT, "guess").await })
            })
            .collect();
        for t in tries {
            assert_eq!(t.await?.err(), Some(Error::AuthFailed));
        }
        // The three checks did not overlap: each failure held the next back.
        assert!(started.elapsed() >= FAILED_LOGIN_DELAY * 3);
        assert_eq!(
            auth.check_password("nobody", "x").await.err(),
            Some(Error::AuthFailed)
        );
        Ok(())
    }
}
