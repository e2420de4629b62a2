//! Plain HTTP on the client port (and on `--listen-metrics-urls`), beside gRPC, as etcd serves
//! it: `/metrics` (Prometheus), `/health` (etcd's JSON, with `?serializable=true` and
//! `?exclude=<alarm>`), `/version`, `/livez` and `/readyz`, and the JSON gateway (`/v3/...`,
//! see `gateway`). A tower layer answers these paths and passes everything else to the gRPC
//! services, except what a learner must refuse.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tonic::body::Body;
use tower::Service;

use super::gateway::Gateway;
use crate::metrics;
use crate::pb::etcdserverpb::AlarmType;
use crate::raft::RaftNode;

/// Wraps the gRPC router with the HTTP endpoints.
#[derive(Clone)]
pub struct HttpEndpoints<S> {
    inner: S,
    node: Arc<RaftNode>,
    gateway: Option<Gateway>,
}

/// The layer that adds [`HttpEndpoints`], and the JSON gateway when given one.
pub fn layer<S>(
    node: Arc<RaftNode>,
    gateway: Option<Gateway>,
) -> impl tower::Layer<S, Service = HttpEndpoints<S>> + Clone {
    tower::layer::layer_fn(move |inner| HttpEndpoints {
        inner,
        node: node.clone(),
        gateway: gateway.clone(),
    })
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Body> {
    let mut resp = Response::new(Body::new(Full::new(Bytes::from(body))));
    *resp.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    resp
}

/// etcd's `/health`, checked in etcd 3.5's order: unhealthy with a raised alarm (unless
/// `?exclude=NOSPACE` / `?exclude=CORRUPT`), without a leader, or (unless `?serializable=true`,
/// as kubeadm's probes ask) when a linearizable read does not complete within a second.
async fn health(node: &RaftNode, query: &str) -> Response<Body> {
    let serializable = query.split('&').any(|pair| pair == "serializable=true");
    let excluded: Vec<&str> = query
        .split('&')
        .filter_map(|pair| pair.strip_prefix("exclude="))
        .collect();
    let alarm = node.mvcc().alarms().into_iter().find_map(|(_, a)| {
        let name = AlarmType::try_from(a).map_or("UNKNOWN", |t| t.as_str_name());
        (!excluded.contains(&name)).then(|| format!("ALARM {name}"))
    });
    let reason = if alarm.is_some() {
        alarm
    } else if node.leader().is_none() {
        Some("RAFT NO LEADER".to_string())
    } else if serializable {
        None
    } else {
        match tokio::time::timeout(std::time::Duration::from_secs(1), node.read_index()).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("QGET ERROR:{e}")),
            Err(_) => Some("QGET ERROR:context deadline exceeded".to_string()),
        }
    };
    let (status, health, reason) = match reason {
        None => (StatusCode::OK, "true", String::new()),
        Some(r) => (StatusCode::SERVICE_UNAVAILABLE, "false", r),
    };
    let reason = reason.replace('\\', "\\\\").replace('"', "\\\"");
    reply(
        status,
        "application/json",
        format!(r#"{{"health":"{health}","reason":"{reason}"}}"#),
    )
}

/// What a learner serves, as in etcd: Status, and Range (serializable only; `KvService`
/// checks that), plus gRPC health checks.
const LEARNER_RPCS: [&str; 4] = [
    "/etcdserverpb.Maintenance/Status",
    "/etcdserverpb.KV/Range",
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
];

/// The answer for an HTTP endpoint path, or `None` for gRPC traffic.
fn endpoint(node: &RaftNode, path: &str) -> Option<Response<Body>> {
    let has_leader = node.leader().is_some();
    let text = "text/plain; charset=utf-8";
    Some(match path {
        "/metrics" => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            metrics::render(&node.metrics_snapshot()),
        ),
        "/version" => reply(
            StatusCode::OK,
            "application/json",
            format!(
                r#"{{"etcdserver":"{}","etcdcluster":"{}"}}"#,
                super::maintenance::ETCD_API_VERSION,
                super::maintenance::ETCD_CLUSTER_VERSION
            ),
        ),
        "/livez" => reply(StatusCode::OK, text, "ok\n".into()),
        "/readyz" if has_leader => reply(StatusCode::OK, text, "ok\n".into()),
        "/readyz" => reply(StatusCode::SERVICE_UNAVAILABLE, text, "no leader\n".into()),
        _ => return None,
    })
}

impl<S, E> Service<Request<Body>> for HttpEndpoints<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = E> + Clone + Send + 'static,
    S::Future: Send + 'static,
    E: Send + 'static,
{
    type Response = Response<Body>;
    type Error = E;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let is_grpc = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        if is_grpc && self.node.is_learner() && !LEARNER_RPCS.contains(&req.uri().path()) {
            let refused = super::status::status(crate::error::Error::NotSupportedForLearner);
            return Box::pin(async move { Ok(refused.into_http()) });
        }
        if let Some(gateway) = self.gateway.clone().filter(|_| !is_grpc) {
            if req.method() == http::Method::POST && Gateway::handles(req.uri().path()) {
                return Box::pin(async move {
                    use http_body_util::BodyExt;
                    let path = req.uri().path().to_string();
                    let token = req.headers().get(http::header::AUTHORIZATION).cloned();
                    let body = match req.into_body().collect().await {
                        Ok(b) => b.to_bytes(),
                        Err(_) => Bytes::new(),
                    };
                    Ok(gateway.handle(&path, body, token).await)
                });
            }
        }
        if !is_grpc && req.uri().path() == "/health" {
            let node = self.node.clone();
            let query = req.uri().query().unwrap_or_default().to_string();
            return Box::pin(async move { Ok(health(&node, &query).await) });
        }
        if !is_grpc {
            if let Some(resp) = endpoint(&self.node, req.uri().path()) {
                return Box::pin(async move { Ok(resp) });
            }
        }
        if !is_grpc {
            return Box::pin(self.inner.call(req));
        }
        // grpc_server_started_total / grpc_server_handled_total: the code is in the response
        // headers for errors (trailers-only answers), else the call succeeded (streams: as
        // far as their start).
        let Some(method) = metrics::grpc_method(req.uri().path()) else {
            // Not a method this server has: tonic answers Unimplemented; nothing to count.
            return Box::pin(self.inner.call(req));
        };
        metrics::record_grpc(method, None);
        let started = std::time::Instant::now();
        let call = self.inner.call(req);
        Box::pin(async move {
            let resp = call.await?;
            let code = resp
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            metrics::record_grpc(method, Some((code, started.elapsed())));
            Ok(resp)
        })
    }
}
