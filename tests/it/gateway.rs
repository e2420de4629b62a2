//! The JSON gateway (`POST /v3/...`) as curl users drive it: base64 keys and values, 64-bit
//! integers as strings, etcd's error bodies, and a streaming watch.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::cluster::{Cluster, TestResult};

/// POSTs `body` to `path` on member 0; returns the status code and the body.
async fn post(c: &Cluster, path: &str, body: &str) -> TestResult<(u16, String)> {
    post_to(c, 0, path, body).await
}

/// POSTs `body` to `path` on `member`; returns the status code and the body.
pub async fn post_to(
    c: &Cluster,
    member: usize,
    path: &str,
    body: &str,
) -> TestResult<(u16, String)> {
    let url = c.client_url(member)?;
    post_addr(url.trim_start_matches("http://"), path, body).await
}

/// POSTs `body` to `path` at `addr` (host:port); returns the status code and the body.
async fn post_addr(addr: &str, path: &str, body: &str) -> TestResult<(u16, String)> {
    post_with(addr, path, body, "").await
}

/// As [`post_addr`], with `headers` (complete `Name: value\r\n` lines) added.
async fn post_with(addr: &str, path: &str, body: &str, headers: &str) -> TestResult<(u16, String)> {
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await?;
    let mut raw = String::new();
    conn.read_to_string(&mut raw).await?;
    let (head, body) = raw.split_once("\r\n\r\n").ok_or("no HTTP response")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status")?;
    Ok((status, body.to_string()))
}

fn json(text: &str) -> TestResult<serde_json::Value> {
    Ok(serde_json::from_str(text)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_gateway_speaks_etcds_json() -> TestResult {
    let c = Cluster::start(1)?;
    c.wait_leader(Duration::from_secs(20)).await?;

    // "foo" = "bar", in base64, as etcd's documentation shows it.
    let (code, put) = post(&c, "/v3/kv/put", r#"{"key": "Zm9v", "value": "YmFy"}"#).await?;
    assert_eq!(code, 200, "{put}");
    assert_eq!(json(&put)?["header"]["revision"], "2");
    let (_, range) = post(&c, "/v3/kv/range", r#"{"key": "Zm9v"}"#).await?;
    let range = json(&range)?;
    assert_eq!(range["count"], "1");
    assert_eq!(range["kvs"][0]["value"], "YmFy");
    assert_eq!(range["kvs"][0]["create_revision"], "2");

    let txn = r#"{"compare":[{"target":"CREATE","key":"Zm9v","create_revision":"2"}],
                  "success":[{"request_put":{"key":"Zm9v","value":"YmF6"}}]}"#;
    let (_, txn) = post(&c, "/v3/kv/txn", txn).await?;
    let txn = json(&txn)?;
    assert_eq!(txn["succeeded"], true);
    assert_eq!(
        txn["responses"][0]["response_put"]["header"]["revision"],
        "3"
    );

    // Errors: etcd's gRPC error as grpc-gateway's body and HTTP status.
    let (code, err) = post(&c, "/v3/kv/range", r#"{"key": ""}"#).await?;
    assert_eq!(code, 400);
    assert_eq!(
        err,
        r#"{"error":"etcdserver: key is not provided","code":3,"message":"etcdserver: key is not provided"}"#
    );
    assert_eq!(post(&c, "/v3/kv/nothing", "{}").await?.0, 404);

    // Leases.
    let (_, grant) = post(&c, "/v3/lease/grant", r#"{"TTL": 60}"#).await?;
    let id = json(&grant)?["ID"]
        .as_str()
        .ok_or("no lease id")?
        .to_string();
    let (_, ttl) = post(&c, "/v3/lease/timetolive", &format!(r#"{{"ID": "{id}"}}"#)).await?;
    assert_eq!(json(&ttl)?["grantedTTL"], "60");
    let (_, leases) = post(&c, "/v3/lease/leases", "{}").await?;
    assert_eq!(json(&leases)?["leases"][0]["ID"], id.as_str());
    assert_eq!(
        post(&c, "/v3/lease/revoke", &format!(r#"{{"ID": "{id}"}}"#))
            .await?
            .0,
        200
    );

    // Cluster and maintenance.
    let (_, members) = post(&c, "/v3/cluster/member/list", "{}").await?;
    let members = json(&members)?;
    assert_eq!(members["members"][0]["name"], "m0");
    assert!(members["header"].get("revision").is_none(), "{members}");
    let (_, status) = post(&c, "/v3/maintenance/status", "{}").await?;
    assert_eq!(json(&status)?["version"], "3.5.13");

    // A watch streams one JSON object per line.
    let url = c.client_url(0)?;
    let mut conn = tokio::net::TcpStream::connect(url.trim_start_matches("http://")).await?;
    let body = r#"{"create_request": {"key": "Zm9v"}}"#;
    let req = format!(
        "POST /v3/watch HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await?;
    let mut lines = BufReader::new(conn).lines();
    let mut results = Vec::new();
    let reading = async {
        while let Some(line) = lines.next_line().await? {
            if let Some(start) = line.find('{') {
                results.push(json(&line[start..])?);
                if results.len() == 1 {
                    post(&c, "/v3/kv/put", r#"{"key": "Zm9v", "value": "cXV4"}"#).await?;
                }
                if results.len() == 2 {
                    break;
                }
            }
        }
        TestResult::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(10), reading).await??;
    assert_eq!(results[0]["result"]["created"], true);
    let event = &results[1]["result"]["events"][0]["kv"];
    assert_eq!(event["value"], "cXV4");
    assert_eq!(event["mod_revision"], "4");
    Ok(())
}

/// etcd 3.5's `--listen-client-http-urls`: the JSON gateway and the HTTP endpoints move to
/// listeners of their own, and the client URLs serve gRPC only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_client_urls_take_the_gateway_and_endpoints_off_the_grpc_urls() -> TestResult {
    let port = crate::cluster::free_port()?;
    let http_url = format!("http://127.0.0.1:{port}");
    let c = Cluster::start_with(1, &["--listen-client-http-urls", &http_url])?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let addr = format!("127.0.0.1:{port}");
    let (code, put) = post_addr(&addr, "/v3/kv/put", r#"{"key": "Zm9v", "value": "YmFy"}"#).await?;
    assert_eq!(code, 200, "{put}");
    let health = crate::cluster::http_get(port, "/health").await?;
    assert!(health.contains("\"health\":\"true\""), "{health}");
    // gRPC stays on the client URL, and sees the gateway's write.
    let got = c
        .kv(0)
        .await?
        .range(concord::pb::etcdserverpb::RangeRequest {
            key: b"foo".to_vec(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(
        got.kvs.first().map(|kv| kv.value.to_vec()),
        Some(b"bar".to_vec())
    );
    let answered = post(&c, "/v3/kv/put", r#"{"key": "Zm9v", "value": "YmFy"}"#)
        .await
        .is_ok_and(|(code, body)| code == 200 && body.contains("revision"));
    assert!(
        !answered,
        "the gateway still answered on the gRPC client URL"
    );
    Ok(())
}

/// Auth through the gateway as curl users use it: `/v3/auth/*`, then the token in the
/// `Authorization` header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_takes_the_token_from_the_authorization_header() -> TestResult {
    let c = Cluster::start(1)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    for (path, body) in [
        ("/v3/auth/user/add", r#"{"name":"root","password":"pw"}"#),
        ("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#),
        ("/v3/auth/enable", "{}"),
    ] {
        let (status, text) = post(&c, path, body).await?;
        assert_eq!(status, 200, "{path}: {text}");
    }
    let put = r#"{"key":"Zm9v","value":"YmFy"}"#;
    let (status, text) = post(&c, "/v3/kv/put", put).await?;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("etcdserver: user name is empty"), "{text}");
    let (_, login) = post(
        &c,
        "/v3/auth/authenticate",
        r#"{"name":"root","password":"pw"}"#,
    )
    .await?;
    let token = json(&login)?["token"]
        .as_str()
        .ok_or("no token")?
        .to_string();
    let addr = c.client_url(0)?;
    let addr = addr.trim_start_matches("http://");
    let header = format!("Authorization: {token}\r\n");
    let (status, text) = post_with(addr, "/v3/kv/put", put, &header).await?;
    assert_eq!(status, 200, "{text}");
    let (status, text) = post_with(addr, "/v3/kv/put", put, "Authorization: bogus.1\r\n").await?;
    assert_eq!(status, 401, "{text}");
    let (status, text) = post_with(addr, "/v3/auth/status", "{}", &header).await?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(json(&text)?["enabled"], true);
    Ok(())
}
