//! `unix://` client and peer URLs (etcd's `unix://name` form: a socket file `name` in the
//! working directory).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use concord::pb::etcdserverpb::kv_client::KvClient;
use concord::pb::etcdserverpb::{PutRequest, RangeRequest};
use tonic::transport::{Channel, Endpoint};

use crate::cluster::{Procs, TestResult};

async fn kv(socket: std::path::PathBuf) -> TestResult<KvClient<Channel>> {
    let connector = concord::transport::unix_connector(
        socket.to_string_lossy().into_owned(),
        Duration::from_secs(2),
    );
    let channel = Endpoint::from_static("http://unix.socket")
        .connect_with_connector(connector)
        .await?;
    Ok(KvClient::new(channel))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_serves_clients_and_peers_over_unix_sockets() -> TestResult {
    let dir = tempfile::tempdir()?;
    let initial = "u0=unix://p0:1,u1=unix://p1:1,u2=unix://p2:1";
    let mut procs = Procs(Vec::new());
    for i in 0..3 {
        let log = std::fs::File::create(dir.path().join(format!("u{i}.log")))?;
        procs.0.push(
            Command::new(env!("CARGO_BIN_EXE_concord"))
                .current_dir(dir.path())
                .args([
                    &format!("--name=u{i}"),
                    &format!("--data-dir=d{i}"),
                    &format!("--listen-client-urls=unix://c{i}:1"),
                    &format!("--advertise-client-urls=unix://c{i}:1"),
                    &format!("--listen-peer-urls=unix://p{i}:1"),
                    &format!("--initial-advertise-peer-urls=unix://p{i}:1"),
                    &format!("--initial-cluster={initial}"),
                    "--heartbeat-interval=50",
                    "--election-timeout=500",
                    "--log-level=warn",
                ])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()?,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let put = async {
            kv(dir.path().join("c0:1"))
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
    let got = kv(dir.path().join("c2:1"))
        .await?
        .range(RangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(
        got.kvs.first().map(|kv| kv.value.clone()),
        Some(b"v".to_vec())
    );
    Ok(())
}
