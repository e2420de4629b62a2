//! The JSON gateway's `/v3/auth/...` routes (etcd's grpc-gateway paths), kept beside the
//! gateway's other routes in [`super::gateway`].

use http::Response;
use tonic::body::Body;

use super::gateway::{unary, GatewayChannel};
use crate::pb::etcdserverpb::auth_client::AuthClient;

/// Answers `path` if it is an auth route.
pub(super) async fn route(ch: GatewayChannel, path: &str, body: &[u8]) -> Option<Response<Body>> {
    macro_rules! call {
        ($method:ident) => {
            unary(body, |r| async move {
                AuthClient::new(ch).$method(tonic::Request::new(r)).await
            })
            .await
        };
    }
    let resp = match path {
        "/v3/auth/enable" => call!(auth_enable),
        "/v3/auth/disable" => call!(auth_disable),
        "/v3/auth/status" => call!(auth_status),
        "/v3/auth/authenticate" => call!(authenticate),
        "/v3/auth/user/add" => call!(user_add),
        "/v3/auth/user/get" => call!(user_get),
        "/v3/auth/user/list" => call!(user_list),
        "/v3/auth/user/delete" => call!(user_delete),
        "/v3/auth/user/changepw" => call!(user_change_password),
        "/v3/auth/user/grant" => call!(user_grant_role),
        "/v3/auth/user/revoke" => call!(user_revoke_role),
        "/v3/auth/role/add" => call!(role_add),
        "/v3/auth/role/get" => call!(role_get),
        "/v3/auth/role/list" => call!(role_list),
        "/v3/auth/role/delete" => call!(role_delete),
        "/v3/auth/role/grant" => call!(role_grant_permission),
        "/v3/auth/role/revoke" => call!(role_revoke_permission),
        _ => return None,
    };
    Some(resp)
}
