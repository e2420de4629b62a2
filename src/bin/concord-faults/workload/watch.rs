//! Watches: one writer puts under `w/`; watchers watch the prefix from a start revision and,
//! after any error or a long silence, reconnect to another member from their last revision + 1.
//! At the end they keep going until they reach the final revision of the prefix.

use std::sync::Arc;
use std::time::Duration;

use concord::pb::etcdserverpb::{watch_request, WatchCreateRequest, WatchRequest};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::Ctx;
use crate::client::Outcome;
use crate::history::{AckedPut, WatchEvent, WatchLog};
use crate::rng::Rng;

/// The watched prefix.
pub const PREFIX: &str = "w/";
/// Silence after which a watcher tries another member.
const SILENCE: Duration = Duration::from_secs(3);

/// The writer, until stopped.
pub async fn writer(ctx: Arc<Ctx>, mut rng: Rng) {
    let mut n = 0u64;
    while !ctx.stopped() {
        n += 1;
        let (key, value) = (format!("{PREFIX}{}", n % 8), format!("v{n}"));
        if let Outcome::Ok(revision) = ctx.put(rng.below(ctx.clients.len()), &key, &value, 0).await
        {
            let at = ctx.clock.now();
            ctx.rec.get().watched_puts.push(AckedPut {
                key,
                value,
                revision,
                at,
            });
        }
        super::think(&mut rng, 20).await;
    }
}

/// One watcher: from revision 1, or (odd ids) from the revision current after a random delay,
/// with `hasleader` required on odd ids.
pub async fn watcher(ctx: Arc<Ctx>, id: u32, mut rng: Rng) {
    let mut start = 1;
    if id % 2 == 1 {
        tokio::time::sleep(Duration::from_millis(rng.between(500, 8000))).await;
        loop {
            if let Outcome::Ok(r) = ctx.get(rng.below(ctx.clients.len()), PREFIX).await {
                start = r.header.map_or(0, |h| h.revision) + 1;
                break;
            }
            if ctx.aborted() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let mut log = WatchLog {
        watcher: id,
        start_revision: start,
        ..Default::default()
    };
    let mut next = start;
    loop {
        let target = ctx.watch_target();
        if ctx.aborted() || (target > 0 && next > target) {
            break;
        }
        let m = rng.below(ctx.clients.len());
        match follow(&ctx, m, PREFIX, next, None, id % 2 == 1, &mut log.events).await {
            Ok(n) | Err(n) => next = n.max(next),
        }
        log.reconnects += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    log.reconnects = log.reconnects.saturating_sub(1);
    ctx.rec.get().watches.push(log);
}

/// Every event under `prefix` from revision 1 through `target`, from one stream on member `m`
/// (the reference history). `None` if the stream ended first.
pub async fn history(ctx: &Ctx, m: usize, prefix: &str, target: i64) -> Option<Vec<WatchEvent>> {
    let mut events = Vec::new();
    let next = match follow(ctx, m, prefix, 1, Some(target), false, &mut events).await {
        Ok(n) | Err(n) => n,
    };
    (next > target).then_some(events)
}

/// Follows one watch stream on member `m` from `next` until it fails, goes silent, or passes
/// `target` (`None`: the watchers' target); returns the next revision wanted (`Err` when the
/// stream failed).
async fn follow(
    ctx: &Ctx,
    m: usize,
    prefix: &str,
    mut next: i64,
    target: Option<i64>,
    require_leader: bool,
    events: &mut Vec<WatchEvent>,
) -> Result<i64, i64> {
    let (tx, rx) = mpsc::channel(1);
    let create = WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(
            WatchCreateRequest {
                key: prefix.into(),
                range_end: concord::concurrency::lock::prefix_end(prefix.as_bytes()),
                start_revision: next,
                ..Default::default()
            },
        )),
    };
    if tx.send(create).await.is_err() {
        return Err(next);
    }
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    if require_leader {
        req.metadata_mut().insert(
            "hasleader",
            tonic::metadata::MetadataValue::from_static("true"),
        );
    }
    let opened =
        tokio::time::timeout(Duration::from_secs(2), ctx.clients.watch(m).watch(req)).await;
    let Ok(Ok(resp)) = opened else {
        return Err(next);
    };
    let mut stream = resp.into_inner();
    loop {
        let target = target.unwrap_or_else(|| ctx.watch_target());
        if ctx.aborted() || (target > 0 && next > target) {
            return Ok(next);
        }
        let msg = match tokio::time::timeout(SILENCE, stream.message()).await {
            Err(_) => return Ok(next),
            Ok(Ok(Some(msg))) => msg,
            Ok(_) => return Err(next),
        };
        if msg.canceled {
            return Err(next);
        }
        for ev in msg.events {
            let Some(kv) = ev.kv else { continue };
            events.push(WatchEvent {
                revision: kv.mod_revision,
                key: String::from_utf8_lossy(&kv.key).into_owned(),
                value: String::from_utf8_lossy(&kv.value).into_owned(),
                delete: ev.r#type == 1,
            });
            next = next.max(kv.mod_revision + 1);
        }
    }
}
