//! Watches: derived from the apply path, never authoritative.
//!
//! The state machine hands each committed batch's events to the [`Publisher`] (in revision
//! order, after the commit), which publishes them to the [`WatchHub`] off the apply path. A *synced* watcher gets them at once through a non-blocking send to
//! its stream; a watcher whose stream is full, or that starts in the past, is *unsynced* and is
//! caught up from the MVCC store's history by the [`sync`] task until it reaches the published
//! revision, then moves back to synced under the hub lock, so that no event is missed or
//! repeated at the switch. The apply path never waits on a watcher.

mod hub;
mod publisher;
pub mod sync;

pub use hub::{StreamMsg, WatchHub, WatchSpec};
pub use publisher::Publisher;
