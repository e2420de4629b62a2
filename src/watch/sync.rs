//! The catch-up task: moves unsynced watchers forward through the store's history, in chunks,
//! without ever blocking (a stream that is still full is retried on the next tick), and moves
//! each back to the synced set once it has everything up to the published revision.

use std::sync::Arc;
use std::time::Duration;

use super::hub::{mod_rev, StreamMsg, StreamTx, WatchHub, WatchSpec};
use crate::error::Error;
use crate::mvcc::MvccStore;
use crate::pb::mvccpb::Event;

/// Revisions read from history per round.
const CHUNK_REVISIONS: i64 = 5_000;
/// Most events per catch-up message (split only between revisions).
const EVENTS_PER_MESSAGE: usize = 1_000;
/// How often a watcher whose stream was full is retried.
const RETRY: Duration = Duration::from_millis(100);

/// Starts the catch-up and progress-notification task.
pub fn spawn(hub: Arc<WatchHub>, mvcc: Arc<MvccStore>, progress_interval: Duration) {
    tokio::spawn(async move {
        let mut progress = tokio::time::interval(progress_interval);
        progress.tick().await;
        loop {
            tokio::select! {
                _ = hub.wake.notified() => {}
                _ = tokio::time::sleep(RETRY) => {}
                _ = progress.tick() => hub.notify_progress(),
            }
            // Keep going while rounds make progress.
            while catch_up_round(&hub, &mvcc) {
                tokio::task::yield_now().await;
            }
        }
    });
}

struct Work {
    id: u64,
    next_rev: i64,
    spec: Arc<WatchSpec>,
    tx: StreamTx,
}

/// One round over every unsynced watcher; returns whether any made progress.
fn catch_up_round(hub: &WatchHub, mvcc: &MvccStore) -> bool {
    let (upto, work) = {
        let s = hub.lock();
        let work: Vec<Work> = s
            .unsynced
            .iter()
            .map(|(id, w)| Work {
                id: *id,
                next_rev: w.next_rev,
                spec: w.spec.clone(),
                tx: w.tx.clone(),
            })
            .collect();
        (s.published, work)
    };
    let Some(min) = work.iter().map(|w| w.next_rev).min() else {
        return false;
    };
    let to = upto.min(min.saturating_add(CHUNK_REVISIONS));
    let events = match mvcc.history(min, to) {
        Ok(e) => e,
        Err(Error::Compacted) => return cancel_compacted(hub, mvcc, &work),
        Err(e) => {
            tracing::warn!(error = %e, "watch catch-up cannot read history");
            return false;
        }
    };
    let mut progressed = false;
    let mut advanced = Vec::new();
    for w in &work {
        let next = deliver(hub, w, &events, to);
        progressed |= next > w.next_rev;
        advanced.push((w.id, next));
    }
    let mut s = hub.lock();
    for (id, next) in advanced {
        let Some(w) = s.unsynced.get_mut(&id) else {
            continue;
        };
        w.next_rev = next;
        if next > s.published {
            if let Some(w) = s.unsynced.remove(&id) {
                let stream = w.stream;
                s.add_synced(id, w);
                s.answer_pending_progress(stream);
                progressed = true;
            }
        }
    }
    progressed
}

/// What became of a message for an unsynced watcher.
enum Delivery {
    Sent,
    /// The stream's buffer is full: try again in a later round.
    Full,
    /// The watcher was canceled meanwhile (by its client): nothing more goes to it.
    Gone,
}

/// Sends `msg` to watcher `id` if it is still unsynced, checked and sent under the hub's lock:
/// a client's cancel takes that lock too, so nothing of a watch follows its cancel's answer.
/// With `remove`, a watcher the message went to leaves the hub (a compaction's cancel).
fn send_to_unsynced(
    hub: &WatchHub,
    id: u64,
    tx: &StreamTx,
    msg: StreamMsg,
    remove: bool,
) -> Delivery {
    let mut s = hub.lock();
    if !s.unsynced.contains_key(&id) {
        return Delivery::Gone;
    }
    if tx.try_send(msg).is_err() {
        return Delivery::Full;
    }
    if remove {
        s.cancel(id);
    }
    Delivery::Sent
}

/// Sends `w` its events with revision in `[w.next_rev, to]`; returns the first revision not
/// sent (`to + 1` when everything went out, or when the watcher is gone).
fn deliver(hub: &WatchHub, w: &Work, events: &[Event], to: i64) -> i64 {
    if w.next_rev > to {
        return w.next_rev;
    }
    let mine: Vec<&Event> = events
        .iter()
        .filter(|e| mod_rev(e) >= w.next_rev && w.spec.wants(e))
        .collect();
    let mut start = 0;
    while start < mine.len() {
        // Take up to EVENTS_PER_MESSAGE, extended to the end of the last revision.
        let mut end = (start + EVENTS_PER_MESSAGE).min(mine.len());
        while end < mine.len()
            && mine
                .get(end)
                .zip(mine.get(end - 1))
                .is_some_and(|(a, b)| mod_rev(a) == mod_rev(b))
        {
            end += 1;
        }
        let chunk: Vec<Event> = mine
            .get(start..end)
            .unwrap_or_default()
            .iter()
            .map(|e| (*e).clone())
            .collect();
        let first_rev = chunk.first().map_or(w.next_rev, mod_rev);
        let msg = StreamMsg::Events {
            spec: w.spec.clone(),
            revision: to,
            events: chunk,
        };
        match send_to_unsynced(hub, w.id, &w.tx, msg, false) {
            Delivery::Sent => {}
            Delivery::Full => return first_rev.max(w.next_rev),
            Delivery::Gone => return to + 1,
        }
        start = end;
    }
    to + 1
}

/// Cancels, with etcd's `compact_revision` answer, every watcher that starts below the
/// compacted revision.
fn cancel_compacted(hub: &WatchHub, mvcc: &MvccStore, work: &[Work]) -> bool {
    let compacted = mvcc.compacted_revision();
    let mut progressed = false;
    for w in work.iter().filter(|w| w.next_rev < compacted) {
        let msg = StreamMsg::Compacted {
            watch_id: w.spec.watch_id,
            compact_revision: compacted,
        };
        if let Delivery::Sent = send_to_unsynced(hub, w.id, &w.tx, msg, true) {
            progressed = true;
        }
    }
    progressed
}
