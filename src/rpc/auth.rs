//! `etcdserverpb.Auth`: turning auth on and off, logins, users, roles and permissions.
//!
//! Changes go through the Raft log as commands of the caller (applying checks it has the `root`
//! role once auth is on). Passwords are hashed here, on the member that received them, and
//! never enter the log. Reads (status, gets, lists) are answered after the read index, with
//! etcd's access rules: root for everything, and a user may also read its own record and the
//! roles it holds.

use base64::Engine as _;
use tonic::{Request, Response, Status};

use super::{current_header, require_leader, status::status, Context};
use crate::apply::{Command, Op, Outcome};
use crate::auth::{password, token, Caller};
use crate::error::Error;
use crate::pb::concordpb::Authenticated;
use crate::pb::etcdserverpb::auth_server::Auth;
use crate::pb::etcdserverpb::ResponseHeader;
use crate::pb::etcdserverpb::{
    AuthDisableRequest, AuthDisableResponse, AuthEnableRequest, AuthEnableResponse,
    AuthRoleAddRequest, AuthRoleAddResponse, AuthRoleDeleteRequest, AuthRoleDeleteResponse,
    AuthRoleGetRequest, AuthRoleGetResponse, AuthRoleGrantPermissionRequest,
    AuthRoleGrantPermissionResponse, AuthRoleListRequest, AuthRoleListResponse,
    AuthRoleRevokePermissionRequest, AuthRoleRevokePermissionResponse, AuthStatusRequest,
    AuthStatusResponse, AuthUserAddRequest, AuthUserAddResponse, AuthUserChangePasswordRequest,
    AuthUserChangePasswordResponse, AuthUserDeleteRequest, AuthUserDeleteResponse,
    AuthUserGetRequest, AuthUserGetResponse, AuthUserGrantRoleRequest, AuthUserGrantRoleResponse,
    AuthUserListRequest, AuthUserListResponse, AuthUserRevokeRoleRequest,
    AuthUserRevokeRoleResponse, AuthenticateRequest, AuthenticateResponse,
};

/// How often a login is retried when the auth store changed between the password check and
/// the login's entry (etcd retries until it did not).
const LOGIN_ATTEMPTS: usize = 5;

/// The Auth service.
pub struct AuthService {
    ctx: Context,
}

impl AuthService {
    /// An Auth service over `ctx`.
    pub fn new(ctx: Context) -> Self {
        AuthService { ctx }
    }

    /// Proposes the auth change `op` makes of `req` on behalf of its sender; answers `reply`
    /// with the response header.
    async fn change<T, R>(
        &self,
        req: Request<T>,
        op: impl FnOnce(T) -> Op,
        reply: impl FnOnce(Option<ResponseHeader>) -> R,
    ) -> Result<Response<R>, Status> {
        let caller = self.ctx.caller(&req).await?;
        self.propose_change(caller, op(req.into_inner()), reply)
            .await
    }

    async fn propose_change<R>(
        &self,
        caller: Option<Caller>,
        op: Op,
        reply: impl FnOnce(Option<ResponseHeader>) -> R,
    ) -> Result<Response<R>, Status> {
        match self
            .ctx
            .node
            .propose(Command::from_client(op, caller))
            .await
            .map_err(status)?
        {
            Outcome::Auth(_) => Ok(Response::new(reply(header(&self.ctx)))),
            _ => Err(status(Error::Storage)),
        }
    }

    /// The caller of a read, once this member has applied everything acknowledged before it.
    async fn reader<T>(&self, req: &Request<T>) -> Result<Option<Caller>, Status> {
        require_leader(&self.ctx.node, req)?;
        let caller = self.ctx.caller(req).await?;
        self.ctx.node.read_index().await.map_err(status)?;
        Ok(caller)
    }

    fn hash_cost(&self) -> u32 {
        self.ctx.node.auth().bcrypt_cost()
    }
}

fn header(ctx: &Context) -> Option<ResponseHeader> {
    current_header(&ctx.node)
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(
        &self,
        req: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        self.change(req, Op::AuthEnable, |header| AuthEnableResponse { header })
            .await
    }

    async fn auth_disable(
        &self,
        req: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        self.change(req, Op::AuthDisable, |header| AuthDisableResponse {
            header,
        })
        .await
    }

    async fn auth_status(
        &self,
        req: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        let caller = self.reader(&req).await?;
        self.ctx.check_admin(caller.as_ref())?;
        let s = self.ctx.node.auth().current();
        Ok(Response::new(AuthStatusResponse {
            header: header(&self.ctx),
            enabled: s.enabled,
            auth_revision: s.revision,
        }))
    }

    async fn authenticate(
        &self,
        req: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        require_leader(&self.ctx.node, &req)?;
        let r = req.into_inner();
        let node = &self.ctx.node;
        for _ in 0..LOGIN_ATTEMPTS {
            node.read_index().await.map_err(status)?;
            let checked = match node.auth().check_password(&r.name, &r.password).await {
                Ok(revision) => revision,
                Err(e) => {
                    if e != Error::AuthNotEnabled {
                        tracing::warn!(user = r.name, error = %e, "invalid authentication was requested");
                    }
                    return Err(status(e));
                }
            };
            let jwt = node.auth().uses_jwt();
            let prefix = token::new_prefix();
            let login = Op::Authenticate(Authenticated {
                name: r.name.clone(),
                simple_token: if jwt {
                    String::new()
                } else {
                    token::digest(&prefix)
                },
            });
            // The member's own command: the password was checked here, and only the name and
            // a digest of the token's random part enter the log.
            let Outcome::Auth(done) = node.propose(Command::new(login)).await.map_err(status)?
            else {
                return Err(status(Error::Storage));
            };
            if node.auth().current().revision == checked {
                let token = if jwt {
                    node.auth().sign_jwt(&r.name, checked).map_err(status)?
                } else {
                    // The members keep `<digest>.<index>`; the client gets the token itself.
                    let (_, index) = done
                        .token
                        .split_once('.')
                        .ok_or_else(|| status(Error::Storage))?;
                    format!("{prefix}.{index}")
                };
                return Ok(Response::new(AuthenticateResponse {
                    header: header(&self.ctx),
                    token,
                }));
            }
            tracing::info!(
                user = r.name,
                "revision when password checked became stale; retrying"
            );
        }
        Err(status(Error::AuthOldRevision))
    }

    async fn user_add(
        &self,
        req: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        let caller = self.ctx.caller(&req).await?;
        // Refused before the (deliberately slow) hash; checked again when applied.
        self.ctx.check_admin(caller.as_ref())?;
        let mut r = req.into_inner();
        let pw = std::mem::take(&mut r.password);
        r.hashed_password = if r.options.is_some_and(|o| o.no_password) {
            String::new()
        } else {
            password::hash(pw, self.hash_cost())
                .await
                .ok_or_else(|| status(Error::Storage))?
        };
        self.propose_change(caller, Op::UserAdd(r), |header| AuthUserAddResponse {
            header,
        })
        .await
    }

    async fn user_get(
        &self,
        req: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        let caller = self.reader(&req).await?;
        let name = &req.get_ref().name;
        // A user may read its own record.
        if caller.as_ref().is_none_or(|c| &c.user != name) {
            self.ctx.check_admin(caller.as_ref())?;
        }
        let s = self.ctx.node.auth().current();
        let user = s.user(name).ok_or_else(|| status(Error::UserNotFound))?;
        Ok(Response::new(AuthUserGetResponse {
            header: header(&self.ctx),
            roles: user.roles.clone(),
        }))
    }

    async fn user_list(
        &self,
        req: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        let caller = self.reader(&req).await?;
        self.ctx.check_admin(caller.as_ref())?;
        Ok(Response::new(AuthUserListResponse {
            header: header(&self.ctx),
            users: self.ctx.node.auth().current().user_names(),
        }))
    }

    async fn user_delete(
        &self,
        req: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        self.change(req, Op::UserDelete, |header| AuthUserDeleteResponse {
            header,
        })
        .await
    }

    async fn user_change_password(
        &self,
        req: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        let caller = self.ctx.caller(&req).await?;
        self.ctx.check_admin(caller.as_ref())?;
        let mut r = req.into_inner();
        let pw = std::mem::take(&mut r.password);
        r.hashed_password = if pw.is_empty() {
            // A client may send the hash itself (base64, as etcd's clients encode it).
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(&r.hashed_password)
                .map_err(|_| status(Error::NoPasswordUser))?;
            String::from_utf8(decoded).map_err(|_| status(Error::NoPasswordUser))?
        } else {
            password::hash(pw, self.hash_cost())
                .await
                .ok_or_else(|| status(Error::Storage))?
        };
        self.propose_change(caller, Op::UserChangePassword(r), |header| {
            AuthUserChangePasswordResponse { header }
        })
        .await
    }

    async fn user_grant_role(
        &self,
        req: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        self.change(req, Op::UserGrantRole, |header| AuthUserGrantRoleResponse {
            header,
        })
        .await
    }

    async fn user_revoke_role(
        &self,
        req: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        self.change(req, Op::UserRevokeRole, |header| {
            AuthUserRevokeRoleResponse { header }
        })
        .await
    }

    async fn role_add(
        &self,
        req: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        self.change(req, Op::RoleAdd, |header| AuthRoleAddResponse { header })
            .await
    }

    async fn role_get(
        &self,
        req: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        let caller = self.reader(&req).await?;
        let role = &req.get_ref().role;
        let s = self.ctx.node.auth().current();
        // A user may read the roles it holds.
        let holds = caller
            .as_ref()
            .and_then(|c| s.user(&c.user))
            .is_some_and(|u| u.roles.iter().any(|r| r == role));
        if !holds {
            self.ctx.check_admin(caller.as_ref())?;
        }
        let found = s.role(role).ok_or_else(|| status(Error::RoleNotFound))?;
        Ok(Response::new(AuthRoleGetResponse {
            header: header(&self.ctx),
            perm: found.key_permission.clone(),
        }))
    }

    async fn role_list(
        &self,
        req: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        let caller = self.reader(&req).await?;
        self.ctx.check_admin(caller.as_ref())?;
        Ok(Response::new(AuthRoleListResponse {
            header: header(&self.ctx),
            roles: self.ctx.node.auth().current().role_names(),
        }))
    }

    async fn role_delete(
        &self,
        req: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        self.change(req, Op::RoleDelete, |header| AuthRoleDeleteResponse {
            header,
        })
        .await
    }

    async fn role_grant_permission(
        &self,
        req: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        self.change(req, Op::RoleGrantPermission, |header| {
            AuthRoleGrantPermissionResponse { header }
        })
        .await
    }

    async fn role_revoke_permission(
        &self,
        req: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        self.change(req, Op::RoleRevokePermission, |header| {
            AuthRoleRevokePermissionResponse { header }
        })
        .await
    }
}
