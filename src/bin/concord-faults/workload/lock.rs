//! Locks with fencing: each client takes `v3lock` Lock with its own lease, reads its key's
//! create_revision (the fencing token), writes a few times to a fenced resource that rejects
//! tokens lower than the highest it has seen, then unlocks. Keep-alives run throughout; a
//! holder knows its lease is safe only until its last confirmed keep-alive plus the TTL.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use concord::pb::v3lockpb::{LockRequest, UnlockRequest};

use super::Ctx;
use crate::client::{bounded, Outcome, CALL_TIMEOUT};
use crate::history::{FencedWrite, LockGrant};
use crate::rng::Rng;

/// The lock every client contends for.
const NAME: &str = "lock/fenced";
/// How long a client waits for the lock.
const LOCK_WAIT: Duration = Duration::from_secs(8);

/// One lock client, until stopped.
pub async fn run(ctx: Arc<Ctx>, client: u32, mut rng: Rng) {
    let n = ctx.clients.len();
    while !ctx.stopped() {
        // Short and long leases: a long one is renewed rarely, which is when a stale lease
        // checkpoint could cut it short across a leader change.
        let ttl = [3, 6, 15][rng.below(3)];
        let Some((lease, ttl, granted_until)) = super::lease::grant(&ctx, rng.below(n), ttl).await
        else {
            super::think(&mut rng, 200).await;
            continue;
        };
        let safe_until = Arc::new(AtomicU64::new(granted_until));
        let done = Arc::new(AtomicBool::new(false));
        tokio::spawn(super::lease::keeper(
            ctx.clone(),
            lease,
            ttl,
            safe_until.clone(),
            done.clone(),
            rng.fork(),
        ));
        hold_once(&ctx, client, lease, &safe_until, &mut rng).await;
        done.store(true, Ordering::Relaxed);
        super::lease::revoke(&ctx, rng.below(n), lease).await;
        super::think(&mut rng, 50).await;
    }
}

async fn hold_once(ctx: &Ctx, client: u32, lease: i64, safe_until: &AtomicU64, rng: &mut Rng) {
    let n = ctx.clients.len();
    let call = ctx.clock.now();
    let req = LockRequest {
        name: NAME.into(),
        lease,
    };
    let resp = match bounded(LOCK_WAIT, ctx.clients.lock(rng.below(n)).lock(req)).await {
        Outcome::Ok(resp) => resp,
        Outcome::Err(e) => {
            tracing::info!(client, lease, error = %e, "lock failed");
            return;
        }
        Outcome::Timeout => {
            tracing::info!(client, lease, "lock timed out");
            return;
        }
    };
    let ret = ctx.clock.now();
    let key = String::from_utf8_lossy(&resp.key).into_owned();
    // The fencing token is the key's create_revision.
    let token = match ctx.get(rng.below(n), &key).await {
        Outcome::Ok(r) => r.kvs.first().map(|kv| kv.create_revision),
        _ => None,
    };
    if let Some(token) = token {
        // Most holds are short; some last seconds, long enough for faults to strike mid-hold.
        let pause = if rng.below(4) == 0 { 1500 } else { 60 };
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(rng.between(10, pause))).await;
            let mut highest = ctx.fence.lock().unwrap_or_else(|p| p.into_inner());
            let at = ctx.clock.now();
            let accepted = token >= *highest;
            if accepted {
                *highest = token;
            }
            ctx.rec.get().fenced_writes.push(FencedWrite {
                client,
                token,
                at,
                accepted,
                lease_expired: at >= safe_until.load(Ordering::Relaxed),
            });
        }
    }
    let release = ctx.clock.now();
    let lease_safe_until = safe_until.load(Ordering::Relaxed);
    if let Some(token) = token {
        ctx.rec.get().lock_grants.push(LockGrant {
            client,
            token,
            call,
            ret,
            release,
            lease_safe_until,
        });
    }
    let m = rng.below(n);
    let call = ctx.clock.now();
    let out = bounded(
        CALL_TIMEOUT,
        ctx.clients
            .lock(m)
            .unlock(UnlockRequest { key: key.into() }),
    )
    .await;
    ctx.note(m, "unlock", call, out.call_outcome());
}
