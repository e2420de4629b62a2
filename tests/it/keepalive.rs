//! `--grpc-keepalive-min-time`: a client that pings more often is sent GOAWAY with
//! `ENHANCE_YOUR_CALM` on its third early ping, unless the server sent it headers or data in
//! between (grpc-go's policy, so etcd's).

use std::time::Duration;

use crate::cluster::{Cluster, TestResult};

/// A GET of `/health` on the raw HTTP/2 connection: the server answers with headers and data.
async fn health(client: &mut h2::client::SendRequest<bytes::Bytes>, host: &str) -> TestResult {
    let request = http::Request::get(format!("http://{host}/health")).body(())?;
    let (response, _) = client.clone().ready().await?.send_request(request, true)?;
    let mut body = response.await?.into_body();
    while let Some(chunk) = body.data().await {
        chunk?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_pinging_too_often_is_sent_goaway_too_many_pings() -> TestResult {
    let c = Cluster::start_with(1, &["--grpc-keepalive-min-time", "1m"])?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let url = c.client_url(0)?;
    let host = url.trim_start_matches("http://").to_string();
    let tcp = tokio::net::TcpStream::connect(&host).await?;
    let (mut client, mut connection) = h2::client::handshake(tcp).await?;
    let mut pings = connection.ping_pong().ok_or("no ping handle")?;
    let driver = tokio::spawn(connection);

    // The first ping is free, the next two are strikes; data from the server forgives them.
    for _ in 0..3 {
        pings.ping(h2::Ping::opaque()).await?;
    }
    health(&mut client, &host).await?;
    for _ in 0..3 {
        pings.ping(h2::Ping::opaque()).await?;
    }
    health(&mut client, &host).await?;

    // Three early pings in a row: the third is answered with GOAWAY, and the connection ends.
    let mut refused = None;
    for _ in 0..4 {
        if let Err(e) = pings.ping(h2::Ping::opaque()).await {
            refused = Some(e);
            break;
        }
    }
    assert!(refused.is_some(), "all pings answered");
    let ended = tokio::time::timeout(Duration::from_secs(10), driver).await??;
    let e = ended.err().ok_or("the connection ended cleanly")?;
    assert!(e.is_go_away() && e.is_remote(), "{e:?}");
    assert_eq!(e.reason(), Some(h2::Reason::ENHANCE_YOUR_CALM), "{e:?}");

    // The server goes on serving new connections.
    c.kv(0)
        .await?
        .range(concord::pb::etcdserverpb::RangeRequest {
            key: b"a".to_vec(),
            ..Default::default()
        })
        .await?;
    Ok(())
}
