//! One member: bad input gets etcd's errors and the server keeps serving; SIGTERM shuts down
//! gracefully and a restart keeps the data.

use std::time::Duration;

use concord::pb::etcdserverpb::request_op::Request;
use concord::pb::etcdserverpb::{
    PutRequest, RangeRequest, RangeStreamResponse, RequestOp, TxnRequest,
};
use tonic::Code;

use crate::cluster::{Cluster, TestResult};

fn put_req(key: &str, value: Vec<u8>) -> PutRequest {
    PutRequest {
        key: key.into(),
        value,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_etcd_errors_and_restart_keeps_data() -> TestResult {
    let mut c = Cluster::start(1)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let mut kv = c.kv(0).await?;
    kv.put(put_req("a", b"1".to_vec())).await?;

    // Bigger than --max-request-bytes but within gRPC's allowance: etcd's own error.
    let err = kv
        .put(put_req("big", vec![b'x'; 1_600_000]))
        .await
        .err()
        .ok_or("oversized put accepted")?;
    assert_eq!(
        (err.code(), err.message()),
        (Code::InvalidArgument, "etcdserver: request is too large")
    );
    // Beyond gRPC's limit: rejected by the transport.
    let err = kv
        .put(put_req("huge", vec![b'x'; 3_000_000]))
        .await
        .err()
        .ok_or("huge put accepted")?;
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err
        .message()
        .starts_with("grpc: received message larger than max ("));

    let ops: Vec<RequestOp> = (0..129)
        .map(|i| RequestOp {
            request: Some(Request::RequestPut(put_req(&format!("t{i}"), vec![]))),
        })
        .collect();
    let err = kv
        .txn(TxnRequest {
            success: ops,
            ..Default::default()
        })
        .await
        .err()
        .ok_or("txn over --max-txn-ops accepted")?;
    assert_eq!(
        err.message(),
        "etcdserver: too many operations in txn request"
    );

    let err = kv
        .range(RangeRequest::default())
        .await
        .err()
        .ok_or("empty key accepted")?;
    assert_eq!(err.message(), "etcdserver: key is not provided");

    // Still serving after all of that; RangeStream chunks concatenate to the Range answer.
    let range = RangeRequest {
        key: b"a".to_vec(),
        ..Default::default()
    };
    let whole = kv.range(range.clone()).await?.into_inner();
    let mut stream = kv.range_stream(range).await?.into_inner();
    let mut chunks: Vec<RangeStreamResponse> = Vec::new();
    while let Some(chunk) = stream.message().await? {
        chunks.push(chunk);
    }
    let last = chunks
        .last()
        .and_then(|c| c.range_response.clone())
        .ok_or("no chunk")?;
    assert_eq!(last.count, whole.count);
    assert_eq!(last.kvs, whole.kvs);

    // grpc.health.v1.Health, as etcd registers it.
    let channel = tonic::transport::Channel::from_shared(c.client_url(0)?)?
        .connect()
        .await?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await?
        .into_inner();
    assert_eq!(
        status.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    c.terminate(0)?;
    c.spawn(0)?;
    c.wait_leader(Duration::from_secs(20)).await?;
    let mut kv = c.kv(0).await?;
    let got = kv
        .range(RangeRequest {
            key: b"a".to_vec(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(
        got.kvs.first().map(|kv| kv.value.to_vec()),
        Some(b"1".to_vec())
    );
    assert_eq!(got.header.map(|h| h.revision), Some(2));
    Ok(())
}
