//! The registry of watchers and the fan-out of published events.
//!
//! Lock order: the hub lock is taken after the MVCC state lock has been released (publish runs
//! after the apply batch committed); the sync task reads history without holding the hub lock.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc, Notify};

use crate::mvcc::KeyRange;
use crate::pb::mvccpb::event::EventType;
use crate::pb::mvccpb::Event;

/// What a watch asks for.
#[derive(Clone, Debug)]
pub struct WatchSpec {
    /// The watch id the client sees.
    pub watch_id: i64,
    /// The keys watched.
    pub range: KeyRange,
    /// Drop PUT events (`NOPUT` filter).
    pub no_put: bool,
    /// Drop DELETE events (`NODELETE` filter).
    pub no_delete: bool,
    /// Attach the previous key-value to events.
    pub prev_kv: bool,
    /// Split responses bigger than the request limit.
    pub fragment: bool,
    /// Send periodic progress notifications.
    pub progress_notify: bool,
}

impl WatchSpec {
    pub(super) fn wants(&self, e: &Event) -> bool {
        let key_ok = e.kv.as_ref().is_some_and(|kv| self.range.contains(&kv.key));
        let type_ok = match EventType::try_from(e.r#type) {
            Ok(EventType::Put) => !self.no_put,
            Ok(EventType::Delete) => !self.no_delete,
            Err(_) => false,
        };
        key_ok && type_ok
    }
}

/// A message for one watch stream, in the order it must reach the client.
#[derive(Debug)]
pub enum StreamMsg {
    /// Events of one revision (or, from history, of several; `revision` is the header's).
    Events {
        /// The watch they belong to.
        spec: Arc<WatchSpec>,
        /// The header revision.
        revision: i64,
        /// The events, in revision order.
        events: Vec<Event>,
    },
    /// The watch's start revision was compacted: etcd cancels it with `compact_revision`.
    Compacted {
        /// The watch canceled.
        watch_id: i64,
        /// The compacted revision.
        compact_revision: i64,
    },
    /// A response made by the stream itself (created, canceled), kept in order with events.
    Control(crate::pb::etcdserverpb::WatchResponse),
    /// A progress notification: every event up to `revision` has been sent.
    Progress {
        /// `-1` for a stream-wide progress request, else the watch's id.
        watch_id: i64,
        /// The header revision.
        revision: i64,
    },
}

/// A stream's sending half and its identity.
pub type StreamTx = mpsc::Sender<StreamMsg>;

pub(super) struct Watcher {
    pub(super) stream: u64,
    pub(super) spec: Arc<WatchSpec>,
    /// The first revision not yet sent.
    pub(super) next_rev: i64,
    pub(super) tx: StreamTx,
}

#[derive(Default)]
pub(super) struct HubState {
    /// The last revision published.
    pub(super) published: i64,
    pub(super) synced: HashMap<u64, Watcher>,
    /// Synced single-key watchers by key, for fan-out without scanning every watcher.
    by_key: HashMap<Vec<u8>, HashSet<u64>>,
    /// Synced watchers of ranges.
    ranged: HashSet<u64>,
    pub(super) unsynced: HashMap<u64, Watcher>,
    /// Streams waiting for a progress answer until all their watchers are synced.
    pub(super) pending_progress: HashMap<u64, StreamTx>,
    /// Batches handed to the publishing task and not yet published: progress is answered
    /// only when none is, so that its revision counts every write already answered.
    queued: usize,
    next_id: u64,
    next_stream: u64,
}

impl HubState {
    pub(super) fn add_synced(&mut self, id: u64, w: Watcher) {
        match &w.spec.range {
            KeyRange::Single(k) => {
                self.by_key.entry(k.clone()).or_default().insert(id);
            }
            _ => {
                self.ranged.insert(id);
            }
        }
        self.synced.insert(id, w);
    }

    /// Removes a watch, synced or not, and answers its stream's pending progress request if
    /// it was the last one holding it back; returns whether it existed.
    pub(super) fn cancel(&mut self, id: u64) -> bool {
        let stream = match self.remove_synced(id).or_else(|| self.unsynced.remove(&id)) {
            Some(w) => w.stream,
            None => return false,
        };
        self.answer_pending_progress(stream);
        true
    }

    fn remove_synced(&mut self, id: u64) -> Option<Watcher> {
        let w = self.synced.remove(&id)?;
        match &w.spec.range {
            KeyRange::Single(k) => {
                if let Some(set) = self.by_key.get_mut(k) {
                    set.remove(&id);
                    if set.is_empty() {
                        self.by_key.remove(k);
                    }
                }
            }
            _ => {
                self.ranged.remove(&id);
            }
        }
        Some(w)
    }

    /// See [`WatchHub::publish`]; returns whether a watcher now waits for the sync task.
    fn publish(&mut self, revision: i64, events: &[Event]) -> bool {
        let mut slow = Vec::new();
        for group in events.chunk_by(|a, b| mod_rev(a) == mod_rev(b)) {
            let rev = group.first().map_or(revision, mod_rev);
            let mut targets: BTreeSet<u64> = BTreeSet::new();
            for e in group {
                if let Some(ids) = e.kv.as_ref().and_then(|kv| self.by_key.get(&kv.key)) {
                    targets.extend(ids);
                }
            }
            targets.extend(&self.ranged);
            for id in &targets {
                let Some(w) = self.synced.get_mut(id) else {
                    continue;
                };
                if rev < w.next_rev {
                    continue;
                }
                let mine: Vec<Event> = group.iter().filter(|e| w.spec.wants(e)).cloned().collect();
                if mine.is_empty() {
                    w.next_rev = rev + 1;
                    continue;
                }
                let msg = StreamMsg::Events {
                    spec: w.spec.clone(),
                    revision: rev,
                    events: mine,
                };
                match w.tx.try_send(msg) {
                    Ok(()) => w.next_rev = rev + 1,
                    Err(mpsc::error::TrySendError::Full(_)) => slow.push(*id),
                    Err(mpsc::error::TrySendError::Closed(_)) => slow.push(*id),
                }
            }
            // A watcher that fell behind stops receiving live events from here on.
            for id in slow.drain(..) {
                if let Some(w) = self.remove_synced(id) {
                    self.unsynced.insert(id, w);
                }
            }
        }
        // Watchers that got nothing are still up to date through `revision`.
        for w in self.synced.values_mut() {
            w.next_rev = w.next_rev.max(revision + 1);
        }
        self.published = self.published.max(revision);
        !self.unsynced.is_empty()
    }

    /// See [`WatchHub::resync_all`].
    fn resync_all(&mut self, revision: i64) {
        let ids: Vec<u64> = self.synced.keys().copied().collect();
        for id in ids {
            if let Some(w) = self.remove_synced(id) {
                self.unsynced.insert(id, w);
            }
        }
        self.published = revision;
    }

    /// One queued batch published; once none is left, answers the progress requests that
    /// waited for it.
    fn unqueue(&mut self) {
        self.queued = self.queued.saturating_sub(1);
        if self.queued == 0 {
            let waiting: Vec<u64> = self.pending_progress.keys().copied().collect();
            for stream in waiting {
                self.answer_pending_progress(stream);
            }
        }
    }

    /// Whether every watcher of `stream` is synced.
    pub(super) fn stream_synced(&self, stream: u64) -> bool {
        !self.unsynced.values().any(|w| w.stream == stream)
    }

    /// Answers `stream`'s deferred progress request if its watchers are all synced now and
    /// no batch waits to be published.
    pub(super) fn answer_pending_progress(&mut self, stream: u64) {
        if self.queued == 0 && self.stream_synced(stream) {
            if let Some(tx) = self.pending_progress.remove(&stream) {
                let _ = tx.try_send(StreamMsg::Progress {
                    watch_id: -1,
                    revision: self.published,
                });
            }
        }
    }
}

/// Counters for metrics.
#[derive(Default, Debug, Clone, Copy)]
pub struct HubStats {
    /// Watchers registered.
    pub watchers: usize,
    /// Watchers catching up.
    pub slow_watchers: usize,
}

/// The watch hub of one member.
pub struct WatchHub {
    state: Mutex<HubState>,
    /// Wakes the sync task when a watcher becomes unsynced.
    pub(super) wake: Notify,
}

impl WatchHub {
    /// A hub whose published revision starts at `revision` (the store's current one).
    pub fn new(revision: i64) -> Arc<Self> {
        Arc::new(WatchHub {
            state: Mutex::new(HubState {
                published: revision,
                ..Default::default()
            }),
            wake: Notify::new(),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last revision published: every event up to it has been handed to synced watchers.
    pub fn published(&self) -> i64 {
        self.lock().published
    }

    /// Publishes a committed batch at once if no watcher is registered and nothing is queued
    /// (there is nobody to wake: only the revision moves); returns false, publishing nothing,
    /// otherwise.
    pub(super) fn publish_if_idle(&self, revision: i64) -> bool {
        let mut s = self.lock();
        let idle = s.queued == 0 && s.synced.is_empty() && s.unsynced.is_empty();
        if idle {
            s.published = s.published.max(revision);
        }
        idle
    }

    /// Counts one more batch queued for the publishing task, which then publishes it with
    /// [`WatchHub::publish_queued`] or [`WatchHub::resync_queued`].
    pub(super) fn queue(&self) {
        self.lock().queued += 1;
    }

    /// [`WatchHub::publish`] for a queued batch; once none is left, answers the progress
    /// requests that waited for it.
    pub(super) fn publish_queued(&self, revision: i64, events: &[Event]) {
        let wake = {
            let mut s = self.lock();
            let wake = s.publish(revision, events);
            s.unqueue();
            wake
        };
        if wake {
            self.wake.notify_one();
        }
    }

    /// [`WatchHub::resync_all`] for a queued resync.
    pub(super) fn resync_queued(&self, revision: i64) {
        {
            let mut s = self.lock();
            s.resync_all(revision);
            s.unqueue();
        }
        self.wake.notify_one();
    }

    /// Registers a new stream and returns its id.
    pub fn new_stream(&self) -> u64 {
        let mut s = self.lock();
        s.next_stream += 1;
        s.next_stream
    }

    /// Publishes a committed batch: `events` in revision order, `revision` the batch's last.
    /// Never blocks: a watcher whose stream is full is moved aside to catch up later.
    pub fn publish(&self, revision: i64, events: &[Event]) {
        let wake = self.lock().publish(revision, events);
        if wake {
            self.wake.notify_one();
        }
    }

    /// After a snapshot replaced the store: every watcher catches up from history.
    pub fn resync_all(&self, revision: i64) {
        self.lock().resync_all(revision);
        self.wake.notify_one();
    }

    /// Adds a watch starting at `start_rev`; returns its hub id.
    pub fn watch(&self, stream: u64, spec: WatchSpec, start_rev: i64, tx: StreamTx) -> u64 {
        let mut s = self.lock();
        s.next_id += 1;
        let id = s.next_id;
        let w = Watcher {
            stream,
            spec: Arc::new(spec),
            next_rev: start_rev,
            tx,
        };
        let caught_up = start_rev > s.published;
        if caught_up {
            s.add_synced(id, w);
        } else {
            s.unsynced.insert(id, w);
        }
        drop(s);
        if !caught_up {
            self.wake.notify_one();
        }
        id
    }

    /// Removes a watch; returns whether it existed.
    pub fn cancel(&self, id: u64) -> bool {
        self.lock().cancel(id)
    }

    /// Removes every watch of a closed stream.
    pub fn drop_stream(&self, stream: u64, ids: &[u64]) {
        let mut s = self.lock();
        for id in ids {
            if s.remove_synced(*id).is_none() {
                s.unsynced.remove(id);
            }
        }
        s.pending_progress.remove(&stream);
    }

    /// A stream-wide progress request: answered (watch id -1, header revision = published) once
    /// every watcher of the stream is synced, so that every event up to that revision is already
    /// ahead of it in the stream.
    pub fn request_progress(&self, stream: u64, tx: StreamTx) {
        let mut s = self.lock();
        s.pending_progress.insert(stream, tx);
        s.answer_pending_progress(stream);
    }

    /// Sends a progress notification to every synced `progress_notify` watcher.
    pub fn notify_progress(&self) {
        let s = self.lock();
        for w in s.synced.values().filter(|w| w.spec.progress_notify) {
            let _ = w.tx.try_send(StreamMsg::Progress {
                watch_id: w.spec.watch_id,
                revision: s.published,
            });
        }
    }

    /// Watcher counts.
    pub fn stats(&self) -> HubStats {
        let s = self.lock();
        HubStats {
            watchers: s.synced.len() + s.unsynced.len(),
            slow_watchers: s.unsynced.len(),
        }
    }
}

pub(super) fn mod_rev(e: &Event) -> i64 {
    e.kv.as_ref().map_or(0, |kv| kv.mod_revision)
}
