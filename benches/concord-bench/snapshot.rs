//! `snapshot`: streams `Maintenance.Snapshot` and keeps nothing of it, checking its trailing
//! SHA-256 as `etcdctl snapshot save` does: how long the server takes to make and send its
//! snapshot, for a database the client's disk could not hold.

use std::time::Instant;

use concord::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use concord::pb::etcdserverpb::SnapshotRequest;
use sha2::{Digest, Sha256};

use crate::Args;

/// Length of the digest etcd appends to a snapshot's body.
const DIGEST: usize = 32;

/// Streams one snapshot from the first endpoint; returns a JSON line with its size, the time
/// to its first message and in all, and whether its digest matched.
///
/// # Errors
/// When the server cannot be reached, the stream fails, or the digest does not match.
pub async fn stream(args: &Args) -> anyhow::Result<String> {
    let channels = crate::workload::connect(args).await?;
    let channel = channels
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("no endpoint"))?;
    let mut client = MaintenanceClient::new(channel).max_decoding_message_size(usize::MAX);
    let started = Instant::now();
    let mut body = client.snapshot(SnapshotRequest {}).await?.into_inner();
    let mut hasher = Sha256::new();
    // The last DIGEST bytes seen are held back: they are the digest, not the database.
    let mut tail: Vec<u8> = Vec::with_capacity(2 * DIGEST);
    let mut bytes = 0u64;
    let mut messages = 0u64;
    let mut first = None;
    while let Some(part) = body.message().await? {
        first.get_or_insert_with(|| started.elapsed().as_secs_f64());
        bytes += part.blob.len() as u64;
        messages += 1;
        tail.extend_from_slice(&part.blob);
        if tail.len() > DIGEST {
            let upto = tail.len() - DIGEST;
            hasher.update(&tail[..upto]);
            tail.drain(..upto);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    if tail.len() != DIGEST || hasher.finalize().as_slice() != tail.as_slice() {
        anyhow::bail!("the snapshot's SHA-256 does not match its body ({bytes} bytes)");
    }
    Ok(format!(
        "{{\"bytes\": {bytes}, \"messages\": {messages}, \"first_message_s\": {:.3}, \"seconds\": {seconds:.3}, \"digest_ok\": true}}",
        first.unwrap_or(seconds)
    ))
}
