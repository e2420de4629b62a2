//! Live events handed to watchers off the apply path.
//!
//! The state machine queues each committed batch here and returns at once, so a write's
//! response is not queued behind its watchers' deliveries (one put watched by 100 streams
//! wakes 100 tasks); a task of its own publishes the batches to the [`WatchHub`] in order.
//! Watchers still see exactly the committed events, in revision order: the hub's published
//! revision only lags the store's until the task has run. With no watcher and nothing queued,
//! a batch is published on the spot (nothing to wake, no task hop).

use std::sync::atomic::{AtomicUsize, Ordering};
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

/// The apply path's handle on the publishing task.
pub struct Publisher {
    hub: Arc<WatchHub>,
    tx: mpsc::UnboundedSender<Batch>,
    /// Batches sent and not yet published.
    queued: Arc<AtomicUsize>,
}

impl Publisher {
    /// Starts the task that publishes queued batches to `hub`. Needs a Tokio runtime.
    pub fn spawn(hub: Arc<WatchHub>) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Batch>();
        let queued = Arc::new(AtomicUsize::new(0));
        let (task_hub, task_queued) = (hub.clone(), queued.clone());
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                // Let the tasks already woken (the writes' responses) run first.
                tokio::task::yield_now().await;
                let mut next = Some(first);
                while let Some(batch) = next {
                    match batch {
                        Batch::Events { revision, events } => task_hub.publish(revision, &events),
                        Batch::Resync(revision) => task_hub.resync_all(revision),
                    }
                    task_queued.fetch_sub(1, Ordering::AcqRel);
                    next = rx.try_recv().ok();
                }
            }
        });
        Publisher { hub, tx, queued }
    }

    /// Publishes a committed batch, on the spot when no watcher waits and nothing is queued,
    /// else through the task (after every batch queued before it).
    pub fn publish(&self, revision: i64, events: Vec<Event>) {
        // Only the apply path queues, so nothing can be queued between the check and the
        // publish; a watcher added meanwhile is handled by the hub's lock as ever.
        if self.queued.load(Ordering::Acquire) == 0 && self.hub.is_idle() {
            self.hub.publish(revision, &events);
            return;
        }
        self.send(Batch::Events { revision, events });
    }

    /// After a snapshot replaced the store: every watcher catches up from history, after the
    /// batches queued before.
    pub fn resync_all(&self, revision: i64) {
        self.send(Batch::Resync(revision));
    }

    fn send(&self, batch: Batch) {
        self.queued.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::error::SendError(batch)) = self.tx.send(batch) {
            // The task is gone only when the runtime shuts down: publish here rather than lose it.
            self.queued.fetch_sub(1, Ordering::AcqRel);
            match batch {
                Batch::Events { revision, events } => self.hub.publish(revision, &events),
                Batch::Resync(revision) => self.hub.resync_all(revision),
            }
        }
    }
}
