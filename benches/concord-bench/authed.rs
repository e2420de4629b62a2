//! `--user name:password`: the bench logs in once and sends the token with every request (as
//! clientv3 does, in the `token` metadata), so that a server with auth on checks each one.

use std::task::{Context, Poll};

use concord::pb::etcdserverpb::auth_client::AuthClient;
use concord::pb::etcdserverpb::AuthenticateRequest;
use concord::transport::EagerChannel;

/// A channel that adds the token (if any) to every request.
#[derive(Clone)]
pub struct WithToken {
    inner: EagerChannel,
    token: Option<http::HeaderValue>,
}

impl tower::Service<http::Request<tonic::body::Body>> for WithToken {
    type Response = <EagerChannel as tower::Service<http::Request<tonic::body::Body>>>::Response;
    type Error = <EagerChannel as tower::Service<http::Request<tonic::body::Body>>>::Error;
    type Future = <EagerChannel as tower::Service<http::Request<tonic::body::Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<tonic::body::Body>) -> Self::Future {
        if let Some(t) = &self.token {
            req.headers_mut().insert("token", t.clone());
        }
        self.inner.call(req)
    }
}

/// Wraps `channels` with the token of `user` (`name:password`), logging in through the first.
///
/// # Errors
/// When the login fails.
pub async fn authed(
    channels: Vec<EagerChannel>,
    user: Option<&str>,
) -> anyhow::Result<Vec<WithToken>> {
    let token = match (user, channels.first()) {
        (Some(user), Some(first)) => {
            let (name, password) = user.split_once(':').unwrap_or((user, ""));
            let resp = AuthClient::new(first.clone())
                .authenticate(AuthenticateRequest {
                    name: name.into(),
                    password: password.into(),
                })
                .await?;
            Some(resp.into_inner().token.parse()?)
        }
        _ => None,
    };
    Ok(channels
        .into_iter()
        .map(|inner| WithToken {
            inner,
            token: token.clone(),
        })
        .collect())
}
