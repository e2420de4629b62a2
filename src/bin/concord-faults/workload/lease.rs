//! Leases: grant, put a key with the lease, keep it alive for a while, stop, and read the key
//! until it vanishes. The key must not vanish before the TTL has passed since the last
//! confirmed keep-alive, and must vanish after.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use concord::pb::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest};

use super::Ctx;
use crate::client::{bounded, Outcome, CALL_TIMEOUT};
use crate::history::{CallOutcome, LeaseRecord};
use crate::rng::Rng;

/// How long after the faults end (and its lease became expirable) a key may linger, beyond its
/// TTL, before it counts as immortal. While faults go on, a lease may outlive its TTL: every
/// new leader resumes it from its last checkpoint plus an election timeout (etcd's rule), so
/// leader changes every few seconds can postpone its expiry (a liveness cost, never a safety
/// one).
const VANISH_SLACK_US: u64 = 20_000_000;

/// Grants a lease of `ttl` seconds through member `m`: (id, TTL, safe until).
pub async fn grant(ctx: &Ctx, m: usize, ttl: i64) -> Option<(i64, i64, u64)> {
    let call = ctx.clock.now();
    let out = bounded(
        CALL_TIMEOUT,
        ctx.clients
            .lease(m)
            .lease_grant(LeaseGrantRequest { ttl, id: 0 }),
    )
    .await;
    ctx.note(m, "lease grant", call, out.call_outcome());
    let resp = out.ok()?;
    if resp.error.is_empty() && resp.ttl > 0 {
        Some((resp.id, resp.ttl, call + resp.ttl as u64 * 1_000_000))
    } else {
        None
    }
}

/// Revokes a lease, retrying on other members for up to ten seconds (a lease left behind
/// would hold its keys, and a lock, until its TTL runs out).
pub async fn revoke(ctx: &Ctx, m: usize, id: i64) {
    for attempt in 0..5 {
        let mut leases = ctx.clients.lease(m + attempt);
        let call = ctx.clock.now();
        let out = bounded(CALL_TIMEOUT, leases.lease_revoke(LeaseRevokeRequest { id })).await;
        // "lease not found" is an answer: the lease is gone already.
        let noted = match &out {
            Outcome::Err(e) if e.message().contains("lease not found") => CallOutcome::Ok,
            other => other.call_outcome(),
        };
        ctx.note(m + attempt, "lease revoke", call, noted);
        match out {
            Outcome::Ok(_) => return,
            Outcome::Err(e) if e.message().contains("lease not found") => return,
            _ if ctx.aborted() => return,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// One keep-alive through member `m`: the time it was sent plus the TTL the server confirmed,
/// or `Some(0)` if the server says the lease is gone, `None` if no answer.
pub async fn keep_alive_once(ctx: &Ctx, m: usize, id: i64) -> Option<u64> {
    let sent = ctx.clock.now();
    let requests = futures::stream::iter(vec![LeaseKeepAliveRequest { id }]);
    let call = async {
        let mut stream = ctx
            .clients
            .lease(m)
            .lease_keep_alive(requests)
            .await?
            .into_inner();
        stream.message().await
    };
    let out = tokio::time::timeout(CALL_TIMEOUT, call).await;
    let noted = match &out {
        Ok(Ok(Some(_))) => CallOutcome::Ok,
        Ok(_) => CallOutcome::Failed,
        Err(_) => CallOutcome::Timeout,
    };
    ctx.note(m, "lease keep-alive", sent, noted);
    match out {
        Ok(Ok(Some(resp))) if resp.ttl > 0 => Some(sent + resp.ttl as u64 * 1_000_000),
        Ok(Ok(Some(_))) => Some(0),
        _ => None,
    }
}

/// Keeps lease `id` alive every third of its TTL until `done`, raising `safe_until` with every
/// confirmed keep-alive; stops early if the server says the lease is gone. Like a real client it
/// sticks to one member, and moves to another only when that one fails to answer.
pub async fn keeper(
    ctx: Arc<Ctx>,
    id: i64,
    ttl: i64,
    safe_until: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    mut rng: Rng,
) {
    let period = Duration::from_millis(ttl as u64 * 1000 / 3);
    let mut m = rng.below(ctx.clients.len());
    while !done.load(Ordering::Relaxed) && !ctx.aborted() {
        tokio::time::sleep(period).await;
        if done.load(Ordering::Relaxed) {
            return;
        }
        match keep_alive_once(&ctx, m, id).await {
            Some(0) => return,
            Some(until) => {
                safe_until.fetch_max(until, Ordering::Relaxed);
            }
            None => m = rng.below(ctx.clients.len()),
        }
    }
}

/// One lease client, until stopped.
pub async fn run(ctx: Arc<Ctx>, client: u32, mut rng: Rng) {
    let mut seq = 0;
    while !ctx.stopped() {
        seq += 1;
        let n = ctx.clients.len();
        let ttl = [2, 5, 10][rng.below(3)];
        let Some((lease, ttl, granted_until)) = grant(&ctx, rng.below(n), ttl).await else {
            super::think(&mut rng, 200).await;
            continue;
        };
        let key = format!("l/{client}/{seq}");
        let m = rng.below(n);
        if !matches!(
            ctx.put(m, &key, "leased", lease).await,
            crate::client::Outcome::Ok(_)
        ) {
            revoke(&ctx, m, lease).await;
            continue;
        }
        let mut record = LeaseRecord {
            lease,
            ttl,
            key: key.clone(),
            safe_until: granted_until,
            ..Default::default()
        };
        // Keep it alive for 0–6 s, reading the key now and then.
        let keep_until = ctx.clock.now() + rng.between(0, 6_000_000);
        while ctx.clock.now() < keep_until && !ctx.aborted() {
            tokio::time::sleep(Duration::from_millis(ttl as u64 * 1000 / 3)).await;
            if let Some(until) = keep_alive_once(&ctx, rng.below(n), lease).await {
                record.safe_until = record.safe_until.max(until);
            }
            read(&ctx, &mut record, rng.below(n)).await;
        }
        // Then stop and watch it vanish, until well after the faults are over.
        let limit = VANISH_SLACK_US + ttl as u64 * 1_000_000;
        let expired = |ctx: &Ctx, safe_until: u64| {
            ctx.stopped_at()
                .is_some_and(|stop| ctx.clock.now() > stop.max(safe_until) + limit)
        };
        while !record.vanished && !expired(&ctx, record.safe_until) && !ctx.aborted() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            read(&ctx, &mut record, rng.below(n)).await;
        }
        ctx.rec.get().leases.push(record);
    }
}

async fn read(ctx: &Ctx, record: &mut LeaseRecord, m: usize) {
    let call = ctx.clock.now();
    if let Outcome::Ok(r) = ctx.get(m, &record.key).await {
        let present = !r.kvs.is_empty();
        record.reads.push((call, ctx.clock.now(), present));
        if !present {
            record.vanished = true;
        }
    }
}
