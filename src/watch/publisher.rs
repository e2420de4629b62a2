//! Live events handed to watchers off the apply path.
//!
//! The state machine queues each committed batch here and returns at once, so a write's
//! response is not queued behind its watchers' deliveries (one put watched by 100 streams
//! wakes 100 tasks); a task of its own publishes the batches to the [`WatchHub`] in order,
//! after yielding once so that the tasks woken before it (the responses) run first. Watchers
//! still see exactly the committed events, in revision order: the hub's published revision
//! only lags the store's until the task has run, and progress requests wait for it. With no
//! watcher and nothing queued, a batch is published on the spot (no task hop). The queue is
//! bounded: an apply path that outruns the publishing (thousands of watchers of every write)
//! waits for it, as it did when it published itself, instead of growing the queue.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::WatchHub;
use crate::pb::mvccpb::Event;

/// What the publishing task does next, in the order the apply path asked.
enum Batch {
    /// A committed batch: `events` in revision order, `revision` the batch's last.
    Events { revision: i64, events: Vec<Event> },
    /// A snapshot replaced the store at `revision`: every watcher catches up from history.
    Resync(i64),
}

impl Batch {
    /// Publishes a batch the hub counted as queued.
    fn publish(self, hub: &WatchHub) {
        match self {
            Batch::Events { revision, events } => hub.publish_queued(revision, &events),
            Batch::Resync(revision) => hub.resync_queued(revision),
        }
    }
}

/// Batches queued at most; more wait for room.
const QUEUE: usize = 256;

/// The apply path's handle on the publishing task.
pub struct Publisher {
    hub: Arc<WatchHub>,
    tx: mpsc::Sender<Batch>,
}

impl Publisher {
    /// Starts the task that publishes queued batches to `hub`. Needs a Tokio runtime.
    pub fn spawn(hub: Arc<WatchHub>) -> Self {
        let (tx, mut rx) = mpsc::channel::<Batch>(QUEUE);
        let task_hub = hub.clone();
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                // Let the tasks already woken (the writes' responses) run first.
                tokio::task::yield_now().await;
                first.publish(&task_hub);
                while let Ok(next) = rx.try_recv() {
                    next.publish(&task_hub);
                }
            }
        });
        Publisher { hub, tx }
    }

    /// Publishes a committed batch: on the spot when no watcher waits and nothing is queued,
    /// else through the task, after every batch queued before it (waiting while the queue is
    /// full).
    pub async fn publish(&self, revision: i64, events: Vec<Event>) {
        if !self.hub.publish_if_idle(revision) {
            self.send(Batch::Events { revision, events }).await;
        }
    }

    /// After a snapshot replaced the store: every watcher catches up from history, after the
    /// batches queued before.
    pub async fn resync_all(&self, revision: i64) {
        self.send(Batch::Resync(revision)).await;
    }

    /// Queues `batch` once there is room; it counts as queued only then, so an apply whose
    /// wait is cancelled leaves no count behind.
    async fn send(&self, batch: Batch) {
        let room = self.tx.reserve().await;
        self.hub.queue();
        match room {
            Ok(room) => room.send(batch),
            // The task is gone only when the runtime shuts down: publish here rather than lose it.
            Err(_) => batch.publish(&self.hub),
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;
    use tokio::task::unconstrained;

    use super::*;
    use crate::mvcc::KeyRange;
    use crate::watch::WatchSpec;

    /// On a current-thread runtime the publishing task runs only when the test waits, so the
    /// queue's bound shows (outside Tokio's per-task budget, which would also make a send
    /// wait): `QUEUE` batches go in at once, the next one waits for room, and all of them are
    /// published.
    #[tokio::test(flavor = "current_thread")]
    async fn a_full_queue_makes_the_apply_path_wait() {
        let hub = WatchHub::new(0);
        let (tx, mut rx) = mpsc::channel(4 * QUEUE);
        let spec = WatchSpec {
            watch_id: 1,
            range: KeyRange::new(b"a", b"b"),
            no_put: false,
            no_delete: false,
            prev_kv: false,
            fragment: false,
            progress_notify: false,
        };
        hub.watch(hub.new_stream(), spec, 1, tx);
        let publisher = Publisher::spawn(hub.clone());
        let queue = i64::try_from(QUEUE).unwrap_or(i64::MAX);
        for revision in 1..=queue {
            assert!(
                unconstrained(publisher.publish(revision, Vec::new()))
                    .now_or_never()
                    .is_some(),
                "batch {revision} had room"
            );
        }
        assert_eq!(hub.published(), 0, "nothing published before the task ran");
        let mut full = Box::pin(unconstrained(publisher.publish(queue + 1, Vec::new())));
        assert!((&mut full).now_or_never().is_none(), "a full queue waits");
        full.await;
        while hub.published() < queue + 1 {
            tokio::task::yield_now().await;
        }
        assert!(rx.try_recv().is_err(), "empty batches send no events");
    }
}
