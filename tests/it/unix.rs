//! `unix://` and `unixs://` (TLS) client and peer URLs (etcd's `unix://name` form: a socket
//! file `name` in the working directory).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::kv_client::KvClient;
use concord::pb::etcdserverpb::{PutRequest, RangeRequest};
use tonic::transport::{Channel, Endpoint};

use crate::cluster::{Procs, TestResult};

async fn kv(
    socket: std::path::PathBuf,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> TestResult<KvClient<Channel>> {
    let connector = concord::transport::unix_connector(
        socket.to_string_lossy().into_owned(),
        Duration::from_secs(2),
        tls,
    );
    let channel = Endpoint::from_static("http://unix.socket")
        .connect_with_connector(connector)
        .await?;
    Ok(KvClient::new(channel))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_serves_clients_and_peers_over_unix_sockets() -> TestResult {
    let dir = tempfile::tempdir()?;
    three_members(dir.path(), "unix", &[], None, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_serves_clients_and_peers_over_tls_on_unix_sockets() -> TestResult {
    let dir = tempfile::tempdir()?;
    let pki = crate::tls::pki::Pki::new(dir.path())?;
    pki.issue("member", "member", true)?;
    pki.issue("client", "client", false)?;
    let (crt, key, ca) = (
        pki.path("member.crt"),
        pki.path("member.key"),
        pki.path("ca.crt"),
    );
    let flags = [
        format!("--cert-file={crt}"),
        format!("--key-file={key}"),
        format!("--trusted-ca-file={ca}"),
        "--client-cert-auth".to_string(),
        format!("--peer-cert-file={crt}"),
        format!("--peer-key-file={key}"),
        format!("--peer-trusted-ca-file={ca}"),
        "--peer-client-cert-auth".to_string(),
    ];
    let (good, no_cert) = (pki.client(Some("client"))?, pki.client(None)?);
    three_members(dir.path(), "unixs", &flags, Some(good), Some(no_cert)).await
}

/// Three members in `dir` whose client and peer URLs are `<scheme>://localhost:1n` sockets
/// (the TLS server name is the host part); a put through the first is read on the third, and a
/// client with `refused_tls` is refused.
async fn three_members(
    dir: &std::path::Path,
    scheme: &str,
    flags: &[String],
    client_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    refused_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> TestResult {
    let run = tempfile::tempdir_in(dir)?;
    let initial =
        format!("u0={scheme}://localhost:10,u1={scheme}://localhost:11,u2={scheme}://localhost:12");
    let mut procs = Procs(Vec::new());
    for i in 0..3 {
        let log = std::fs::File::create(run.path().join(format!("u{i}.log")))?;
        procs.0.push(
            Command::new(env!("CARGO_BIN_EXE_concord"))
                .current_dir(run.path())
                .args([
                    &format!("--name=u{i}"),
                    &format!("--data-dir=d{i}"),
                    &format!("--listen-client-urls={scheme}://localhost:2{i}"),
                    &format!("--advertise-client-urls={scheme}://localhost:2{i}"),
                    &format!("--listen-peer-urls={scheme}://localhost:1{i}"),
                    &format!("--initial-advertise-peer-urls={scheme}://localhost:1{i}"),
                    &format!("--initial-cluster={initial}"),
                    "--heartbeat-interval=100",
                    "--election-timeout=1000",
                    "--log-level=warn",
                ])
                .args(flags)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()?,
        );
    }
    // Generous: three members forming over TLS on a machine running many tests at once.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let put = async {
            kv(run.path().join("localhost:20"), client_tls.clone())
                .await?
                .put(PutRequest {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                    ..Default::default()
                })
                .await?;
            TestResult::Ok(())
        };
        match put.await {
            Ok(()) => break,
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    // The third member may still be catching up (a linearizable read waits for it); retried.
    let got = loop {
        let range = async {
            let got = kv(run.path().join("localhost:22"), client_tls.clone())
                .await?
                .range(RangeRequest {
                    key: b"k".to_vec(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            TestResult::Ok(got)
        };
        match range.await {
            Ok(got) => break got,
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert_eq!(
        got.kvs.first().map(|kv| kv.value.to_vec()),
        Some(b"v".to_vec())
    );
    if let Some(tls) = refused_tls {
        let put = async {
            kv(run.path().join("localhost:21"), Some(tls))
                .await?
                .put(PutRequest {
                    key: b"k".to_vec(),
                    ..Default::default()
                })
                .await?;
            TestResult::Ok(())
        };
        assert!(put.await.is_err(), "served a client without a certificate");
    }
    Ok(())
}
