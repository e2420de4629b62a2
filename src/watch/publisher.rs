//! Live events handed to watchers off the apply path.
//!
//! The state machine queues each committed batch here and returns at once, so a write's
//! response is not queued behind its watchers' deliveries (one put watched by 100 streams
//! wakes 100 tasks); a task of its own publishes the batches to the [`WatchHub`] in order,
//! after yielding once so that the tasks woken before it (the responses) run first. Watchers
//! still see exactly the committed events, in revision order: the hub's published revision
//! only lags the store's until the task has run, and progress requests wait for it. With no
//! watcher and nothing queued, a batch is published on the spot (no task hop).

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

/// The apply path's handle on the publishing task.
pub struct Publisher {
    hub: Arc<WatchHub>,
    tx: mpsc::UnboundedSender<Batch>,
}

impl Publisher {
    /// Starts the task that publishes queued batches to `hub`. Needs a Tokio runtime.
    pub fn spawn(hub: Arc<WatchHub>) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Batch>();
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
    /// else through the task, after every batch queued before it.
    pub fn publish(&self, revision: i64, events: Vec<Event>) {
        if !self.hub.publish_if_idle(revision) {
            self.send(Batch::Events { revision, events });
        }
    }

    /// After a snapshot replaced the store: every watcher catches up from history, after the
    /// batches queued before.
    pub fn resync_all(&self, revision: i64) {
        self.hub.queue();
        self.send(Batch::Resync(revision));
    }

    fn send(&self, batch: Batch) {
        if let Err(mpsc::error::SendError(batch)) = self.tx.send(batch) {
            // The task is gone only when the runtime shuts down: publish here rather than lose it.
            batch.publish(&self.hub);
        }
    }
}
