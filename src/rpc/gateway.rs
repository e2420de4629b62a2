//! etcd's gRPC gateway: the v3 API as JSON over HTTP on the client URL (`POST /v3/kv/range`,
//! `/v3/watch`, ...), for `curl` users and JSON-only clients.
//!
//! As etcd's gateway does, each request is decoded from JSON (proto field names, bytes in base64,
//! 64-bit integers as strings or numbers), sent to this member's own gRPC services over a
//! loopback connection, and the answer encoded back the same way, defaults omitted. Streaming
//! calls (`/v3/watch`, `/v3/lease/keepalive`, `/v3/maintenance/snapshot`,
//! `/v3/election/observe`) read one or more JSON requests from the body and answer with one
//! `{"result": ...}` object per line while the stream lasts. Errors are grpc-gateway's
//! `{"error": ..., "code": ..., "message": ...}` with the matching HTTP status.

use std::future::Future;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::{Response, StatusCode};
use http_body_util::{Full, StreamBody};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::body::Body;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::pb::etcdserverpb::cluster_client::ClusterClient;
use crate::pb::etcdserverpb::kv_client::KvClient;
use crate::pb::etcdserverpb::lease_client::LeaseClient;
use crate::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::pb::etcdserverpb::watch_client::WatchClient;
use crate::pb::v3electionpb::election_client::ElectionClient;
use crate::pb::v3lockpb::lock_client::LockClient;

/// The gateway of one client listener: a lazily connected channel to that listener's gRPC.
#[derive(Clone)]
pub struct Gateway {
    channel: Channel,
}

impl Gateway {
    /// A gateway calling this member's gRPC services through `connector` (in process: see
    /// `transport::in_process`).
    ///
    /// # Errors
    /// Never in practice (the endpoint is a constant).
    pub fn new(
        connector: impl tower::Service<
                http::Uri,
                Response = hyper_util::rt::TokioIo<tokio::io::DuplexStream>,
                Error = std::io::Error,
                Future = impl Send + 'static,
            > + Clone
            + Send
            + 'static,
    ) -> Result<Self, tonic::transport::Error> {
        let channel =
            Endpoint::from_static("http://in-process").connect_with_connector_lazy(connector);
        Ok(Gateway { channel })
    }

    /// Whether `path` is a gateway route.
    pub fn handles(path: &str) -> bool {
        path.starts_with("/v3/")
    }

    /// Answers one gateway request; `token` is its `Authorization` header, passed on to the
    /// gRPC call as etcd's gateway does.
    pub async fn handle(
        &self,
        path: &str,
        body: Bytes,
        token: Option<http::HeaderValue>,
    ) -> Response<Body> {
        let ch = InterceptedService::new(self.channel.clone(), WithToken(token));
        if let Some(resp) = super::gateway_auth::route(ch.clone(), path, &body).await {
            return resp;
        }
        match path {
            "/v3/kv/range" => {
                unary(&body, |r| async move {
                    KvClient::new(ch).range(tonic::Request::new(r)).await
                })
                .await
            }
            "/v3/kv/put" => {
                unary(&body, |r| async move {
                    KvClient::new(ch).put(tonic::Request::new(r)).await
                })
                .await
            }
            "/v3/kv/deleterange" => {
                unary(&body, |r| async move {
                    KvClient::new(ch).delete_range(tonic::Request::new(r)).await
                })
                .await
            }
            "/v3/kv/txn" => {
                unary(&body, |r| async move {
                    KvClient::new(ch).txn(tonic::Request::new(r)).await
                })
                .await
            }
            "/v3/kv/compaction" => {
                unary(&body, |r| async move {
                    KvClient::new(ch).compact(tonic::Request::new(r)).await
                })
                .await
            }
            "/v3/watch" => {
                let requests = requests(&body);
                streaming(async move { WatchClient::new(ch).watch(endless(requests?)).await }).await
            }
            "/v3/lease/grant" => {
                unary(&body, |r| async move {
                    LeaseClient::new(ch)
                        .lease_grant(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/lease/revoke" | "/v3/kv/lease/revoke" => {
                unary(&body, |r| async move {
                    LeaseClient::new(ch)
                        .lease_revoke(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/lease/timetolive" | "/v3/kv/lease/timetolive" => {
                unary(&body, |r| async move {
                    LeaseClient::new(ch)
                        .lease_time_to_live(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/lease/leases" | "/v3/kv/lease/leases" => {
                unary(&body, |r| async move {
                    LeaseClient::new(ch)
                        .lease_leases(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/lease/keepalive" => {
                let requests = requests(&body);
                streaming(async move {
                    let stream = tokio_stream::iter(requests?);
                    LeaseClient::new(ch).lease_keep_alive(stream).await
                })
                .await
            }
            "/v3/cluster/member/add" => {
                unary(&body, |r| async move {
                    ClusterClient::new(ch)
                        .member_add(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/cluster/member/remove" => {
                unary(&body, |r| async move {
                    ClusterClient::new(ch)
                        .member_remove(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/cluster/member/update" => {
                unary(&body, |r| async move {
                    ClusterClient::new(ch)
                        .member_update(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/cluster/member/list" => {
                unary(&body, |r| async move {
                    ClusterClient::new(ch)
                        .member_list(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/cluster/member/promote" => {
                unary(&body, |r| async move {
                    ClusterClient::new(ch)
                        .member_promote(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/maintenance/alarm" => {
                unary(&body, |r| async move {
                    MaintenanceClient::new(ch)
                        .alarm(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/maintenance/status" => {
                unary(&body, |r| async move {
                    MaintenanceClient::new(ch)
                        .status(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/maintenance/defragment" => {
                unary(&body, |r| async move {
                    MaintenanceClient::new(ch)
                        .defragment(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/maintenance/hash" => {
                unary(&body, |r| async move {
                    MaintenanceClient::new(ch)
                        .hash(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/maintenance/hashkv" => {
                unary(&body, |r| async move {
                    MaintenanceClient::new(ch)
                        .hash_kv(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/maintenance/transfer-leadership" => {
                unary(&body, |r| async move {
                    MaintenanceClient::new(ch)
                        .move_leader(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/maintenance/snapshot" => {
                let request = decode::<crate::pb::etcdserverpb::SnapshotRequest>(&body);
                streaming(async move { MaintenanceClient::new(ch).snapshot(request?).await }).await
            }
            "/v3/lock/lock" => {
                unary(&body, |r| async move {
                    LockClient::new(ch).lock(tonic::Request::new(r)).await
                })
                .await
            }
            "/v3/lock/unlock" => {
                unary(&body, |r| async move {
                    LockClient::new(ch).unlock(tonic::Request::new(r)).await
                })
                .await
            }
            "/v3/election/campaign" => {
                unary(&body, |r| async move {
                    ElectionClient::new(ch)
                        .campaign(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/election/proclaim" => {
                unary(&body, |r| async move {
                    ElectionClient::new(ch)
                        .proclaim(tonic::Request::new(r))
                        .await
                })
                .await
            }
            "/v3/election/leader" => {
                unary(&body, |r| async move {
                    ElectionClient::new(ch).leader(tonic::Request::new(r)).await
                })
                .await
            }
            "/v3/election/resign" => {
                unary(&body, |r| async move {
                    ElectionClient::new(ch).resign(tonic::Request::new(r)).await
                })
                .await
            }
            "/v3/election/observe" => {
                let request = decode::<crate::pb::v3electionpb::LeaderRequest>(&body);
                streaming(async move { ElectionClient::new(ch).observe(request?).await }).await
            }
            _ => {
                let mut resp = Response::new(Body::new(Full::new(Bytes::from("Not Found\n"))));
                *resp.status_mut() = StatusCode::NOT_FOUND;
                resp
            }
        }
    }
}

/// Adds the HTTP request's `Authorization` header to each gRPC call as `authorization`
/// metadata (where the services look for a token after clientv3's `token`).
#[derive(Clone)]
pub(super) struct WithToken(Option<http::HeaderValue>);

impl tonic::service::Interceptor for WithToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(v) = self.0.as_ref().and_then(|v| v.to_str().ok()) {
            if let Ok(v) = v.parse() {
                req.metadata_mut().insert("authorization", v);
            }
        }
        Ok(req)
    }
}

/// The channel gateway calls go through.
pub(super) type GatewayChannel = InterceptedService<Channel, WithToken>;

/// One JSON request; an empty body is the empty request.
fn decode<T: DeserializeOwned + Default>(body: &[u8]) -> Result<T, Status> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| Status::invalid_argument(e.to_string()))
}

/// The JSON requests of a streaming call's body, one after another.
fn requests<T: DeserializeOwned>(body: &[u8]) -> Result<Vec<T>, Status> {
    serde_json::Deserializer::from_slice(body)
        .into_iter::<T>()
        .collect::<Result<_, _>>()
        .map_err(|e| Status::invalid_argument(e.to_string()))
}

/// The requests, then an open end: the stream stays up until the HTTP client goes away.
fn endless<T: Send + 'static>(requests: Vec<T>) -> impl Stream<Item = T> + Send + 'static {
    tokio_stream::iter(requests).chain(futures::stream::pending())
}

pub(super) async fn unary<Req, Resp, F, Fut>(body: &[u8], call: F) -> Response<Body>
where
    Req: DeserializeOwned + Default,
    Resp: Serialize,
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let request = match decode(body) {
        Ok(r) => r,
        Err(s) => return error(&s),
    };
    match call(request).await {
        Ok(resp) => match serde_json::to_vec(resp.get_ref()) {
            Ok(json) => reply(StatusCode::OK, Bytes::from(json)),
            Err(e) => error(&Status::internal(e.to_string())),
        },
        Err(s) => error(&s),
    }
}

/// Answers a server stream as newline-separated `{"result": ...}` objects.
async fn streaming<Resp, Fut>(call: Fut) -> Response<Body>
where
    Resp: Serialize + Send + 'static,
    Fut: Future<Output = Result<tonic::Response<tonic::Streaming<Resp>>, Status>>,
{
    let mut stream = match call.await {
        Ok(s) => s.into_inner(),
        Err(s) => return error(&s),
    };
    // As grpc-gateway, the response starts with the first answer: a stream that fails before
    // it (say, a keep-alive with no leader in time) gets an HTTP error status, not a 200.
    let first = match stream.next().await {
        Some(Err(s)) => return error(&s),
        first => first,
    };
    let lines = futures::stream::iter(first).chain(stream).map(|item| {
        let line = match item {
            Ok(result) => serde_json::to_vec(&StreamResult { result }),
            Err(s) => serde_json::to_vec(&GatewayError::from(&s)),
        };
        let mut bytes = line.unwrap_or_default();
        bytes.push(b'\n');
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from(bytes)))
    });
    let mut resp = Response::new(Body::new(StreamBody::new(lines)));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

fn reply(status: StatusCode, json: Bytes) -> Response<Body> {
    let mut resp = Response::new(Body::new(Full::new(json)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// One message of a streaming answer.
#[derive(Serialize)]
struct StreamResult<T> {
    result: T,
}

/// grpc-gateway's error body, fields in its order.
#[derive(Serialize)]
struct GatewayError<'a> {
    error: &'a str,
    code: i32,
    message: &'a str,
}

impl<'a> From<&'a Status> for GatewayError<'a> {
    fn from(s: &'a Status) -> Self {
        GatewayError {
            error: s.message(),
            code: s.code() as i32,
            message: s.message(),
        }
    }
}

/// grpc-gateway's error body and HTTP status for a gRPC status.
fn error(s: &Status) -> Response<Body> {
    let status = match s.code() {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Cancelled | Code::Unknown | Code::Internal | Code::DataLoss => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    };
    let json = serde_json::to_vec(&GatewayError::from(s)).unwrap_or_default();
    reply(status, Bytes::from(json))
}
